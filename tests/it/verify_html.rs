//! `verify --html FILE`: the page for every fixture and base kind, written even when checks fail,
//! self-contained, and safe with hostile tensor names.

use crate::common::{fixture, stderr};
use escha_convert::verify::{render_html, verify, VerifyOptions};
use serde_json::Value;
use std::process::Output;

fn run(args: &[&std::ffi::OsStr]) -> Output {
    crate::common::escha_convert().args(args).output().unwrap()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// Nothing in the page can reach outside it.
fn assert_self_contained(page: &str, what: &str) {
    for banned in ["http://", "https://", "<link", "src=", "@import", "url(", "<iframe", "<object", "<embed", "<img"] {
        assert!(!page.contains(banned), "{what}: the page contains {banned:?}");
    }
    assert_eq!(page.matches("<script").count(), 1, "{what}: one inline script (the sorter)");
    assert!(page.contains("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none';"), "{what}");
}

/// The page of one verify run, with the JSON report of the same run.
fn page_and_report(model: &str, base: &str, extra: &[&str]) -> (Option<i32>, String, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let html = tmp.path().join("report.html");
    let (input, base) = (fixture(model), fixture(base));
    let mut args = vec![
        "verify".as_ref(),
        input.as_os_str(),
        "--base".as_ref(),
        base.as_os_str(),
        "--json".as_ref(),
        "--html".as_ref(),
        html.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    let o = run(&args);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", stderr(&o)));
    let page = std::fs::read_to_string(&html).unwrap_or_else(|e| panic!("{model} vs {}: no page: {e}", base.display()));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec!["report.html"], "temporary files left behind");
    (o.status.code(), page, report)
}

#[test]
fn every_fixture_and_base_kind_gets_a_complete_page() {
    for model in ["dense", "moe"] {
        for base in [format!("{model}-base"), format!("{model}-base-fp8")] {
            let what = format!("{model} vs {base}");
            let (code, page, r) = page_and_report(model, &base, &[]);
            assert_eq!(code, Some(0), "{what}");
            assert!(page.starts_with("<!DOCTYPE html>") && page.trim_end().ends_with("</html>"), "{what}");
            assert!(page.contains("<div class=\"badge\">PASS</div>"), "{what}");
            assert_self_contained(&page, &what);
            for section in ["coded", "int8", "norms"] {
                let rows = r[section].as_array().unwrap();
                assert!(!rows.is_empty(), "{what}: {section}");
                for row in rows {
                    let name = row["tensor"].as_str().unwrap();
                    assert!(page.contains(&format!("data-v=\"{}\"", esc(name))), "{what}: {name} not in the table");
                }
            }
            // The charts: ratio and correlation by layer with their reference lines, norm offsets,
            // and the per-expert spread for the MoE.
            for needle in ["Shannon ratio by layer", "1.0 floor (the bound)", "--max-ratio 2", "Norm offsets"] {
                assert!(page.contains(needle), "{what}: {needle}");
            }
            assert!(page.matches("<svg").count() >= 3, "{what}");
            let kinds: &[&str] = match model {
                "dense" => &["q_proj", "in_proj_qkv", "gate_proj", "up_proj", "down_proj"],
                _ => &["experts.gate_up_proj", "experts.down_proj"],
            };
            for kind in kinds {
                assert!(page.contains(&format!("class=\"legend\">{kind}</text>")), "{what}: no legend entry {kind}");
            }
            assert_eq!(page.contains("Per-expert spread"), model == "moe", "{what}");
        }
    }
}

#[test]
fn the_page_is_written_when_checks_fail_and_the_exit_code_is_kept() {
    let (code, page, r) = page_and_report("dense", "dense-base", &["--max-ratio", "1.01"]);
    assert_eq!(code, Some(1));
    assert_eq!(r["passed"], false);
    assert!(page.contains("<div class=\"badge\">FAIL</div>"));
    let failing = r["failed"].as_u64().unwrap();
    assert!(page.contains(&format!("Failing tensors ({failing})")));
    // The failure list comes before the charts.
    let first = r["coded"][0]["tensor"].as_str().unwrap();
    assert!(page.find(&format!("<code>{first}</code>")).unwrap() < page.find("<svg").unwrap());
    assert!(page.contains("&gt; 1.010 (misplaced decode?)"));
}

#[test]
fn the_text_report_still_goes_to_stdout_and_an_old_page_is_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let html = tmp.path().join("r.html");
    std::fs::write(&html, "old").unwrap();
    let (input, base) = (fixture("dense"), fixture("dense-base-fp8"));
    let o = run(&[
        "verify".as_ref(),
        input.as_os_str(),
        "--base".as_ref(),
        base.as_os_str(),
        "--html".as_ref(),
        html.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("PASS: 48 checked, 0 failed"));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("(Hugging Face layout, fp8)"));
}

#[test]
fn an_unwritable_destination_is_refused_before_checking() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, base) = (fixture("dense"), fixture("dense-base"));
    for dest in [tmp.path().join("no/such/dir/r.html"), tmp.path().to_path_buf()] {
        let o = run(&[
            "verify".as_ref(),
            input.as_os_str(),
            "--base".as_ref(),
            base.as_os_str(),
            "--html".as_ref(),
            dest.as_os_str(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", dest.display());
        assert!(o.stdout.is_empty());
    }
    // Nothing to check: no report, no page, exit 2.
    let html = tmp.path().join("r.html");
    let o = run(&[
        "verify".as_ref(),
        input.as_os_str(),
        "--base".as_ref(),
        input.as_os_str(),
        "--html".as_ref(),
        html.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!html.exists());
}

#[test]
fn hostile_names_and_messages_are_escaped() {
    const HOSTILE: &str = "model.language_model.layers.1.mlp.\"'&</script><script>alert(1)</script><img src=x onerror=alert(2)><svg onload=alert(3)>.weight";
    let opts =
        VerifyOptions { sample: Some(1), threads: Some(1), ..VerifyOptions::new(fixture("moe"), fixture("moe-base")) };
    let mut r = verify(&opts, escha_convert::codec::best_decoder()).unwrap();
    r.input = format!("<marquee>{}</marquee>", r.input);
    r.base = format!("</dd><h1>pwned</h1>{}", r.base);
    for row in &mut r.coded {
        row.tensor = HOSTILE.into();
        row.failures.push(format!("expert 0: <blink>{HOSTILE}</blink>"));
    }
    for row in &mut r.int8 {
        row.tensor = HOSTILE.into();
        row.failures.push(HOSTILE.into());
    }
    for row in &mut r.norms {
        row.tensor = HOSTILE.into();
        row.failures.push(HOSTILE.into());
    }
    r.missing_in_base.push(HOSTILE.into());
    r.passed = false;
    let page = render_html(&r);
    for raw in ["<script>alert", "<img", "<svg onload", "<marquee>", "<blink>", "<h1>pwned"] {
        assert!(!page.contains(raw), "unescaped {raw:?} in the page");
    }
    assert!(page.contains(
        "&quot;&#39;&amp;&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"
    ));
    assert_eq!(page.matches("<script").count(), 1);
    assert_eq!(page.matches("</script>").count(), 1);
    // `src=` only inside escaped text, never as an attribute.
    assert!(!page.contains(" src=\""));
}
