//! The `--json` contract on failure: exactly one document on stdout, `{"schema_version": 1,
//! "error": {"code", "message", "exit_status"}}`, whose message is stderr's error line and whose
//! status is the run's. (Every document is validated against `docs/escha-convert.schema.json` by
//! `tests/python/test_json_schema.py`.)

use crate::common::{escha_convert, fixture};
use serde_json::Value;
use std::process::Output;

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    escha_convert().args(args.iter().map(AsRef::as_ref)).output().unwrap()
}

/// The one document on stdout (`serde_json` refuses anything after it), checked against the run.
fn error_document(o: &Output) -> Value {
    let doc: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    assert_eq!(doc["schema_version"], 1, "{doc}");
    let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["schema_version", "error"], "{doc}");
    let error = doc["error"].as_object().unwrap();
    assert_eq!(error.keys().collect::<Vec<_>>(), ["code", "message", "exit_status"], "{doc}");
    assert_eq!(doc["error"]["exit_status"].as_i64(), o.status.code().map(i64::from), "{doc}");
    doc
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_failing_run_prints_exactly_one_error_document() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("keep.txt"), "mine\n").unwrap();
    let missing = tmp.path().join("missing");
    let out = tmp.path().join("out");
    let dense = fixture("dense");
    let cases: [(&[&dyn AsRef<std::ffi::OsStr>], &str, i32); 5] = [
        (&[&missing, &out, &"--json"], "input_refused", 1),
        (&[&dense, &full, &"--json"], "output_refused", 1),
        (&[&"inspect", &missing, &"--json"], "input_refused", 1),
        (&[&"verify", &dense, &"--base", &missing, &"--json"], "input_refused", 2),
        (&[&"merge", &tmp.path(), &"--json"], "input_refused", 1),
    ];
    for (args, code, status) in cases {
        let o = run(args);
        assert_eq!(o.status.code(), Some(status), "{code}: {}", stderr(&o));
        let doc = error_document(&o);
        assert_eq!(doc["error"]["code"], code, "{doc}");
        // The message is stderr's error line, which is printed as ever.
        let line = format!("escha-convert: error: {}\n", doc["error"]["message"].as_str().unwrap());
        assert_eq!(stderr(&o), line);
    }
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 1, "OUT untouched");
}

#[test]
fn a_usage_error_under_json_prints_the_usage_document() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let dense = fixture("dense");
    for args in [
        &[&"convert" as &dyn AsRef<std::ffi::OsStr>, &dense, &out, &"--json", &"--frmat", &"mlx"][..],
        &[&dense, &out, &"--json", &"--bits", &"4"],
        &[&"--json"],
        &[&"convert", &"--json"],
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let doc = error_document(&o);
        assert_eq!(doc["error"]["code"], "usage", "{doc}");
        let message = doc["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty() && !message.starts_with("error:"), "{doc}");
        // clap's error paragraph, on one line.
        let said = stderr(&o).split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(said.contains(message), "{doc}: {}", stderr(&o));
    }
    // Without --json, clap's error alone, and nothing on stdout.
    let o = run(&[&"convert", &dense, &out, &"--frmat", &"mlx"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty());
    assert!(stderr(&o).starts_with("error: unexpected argument '--frmat' found"), "{}", stderr(&o));
    // After `--`, `--json` is a word, not the flag.
    let o = run(&[&"inspect", &"--", &"--json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty(), "{}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn a_failure_without_json_prints_nothing_on_stdout() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&[&tmp.path().join("missing"), &tmp.path().join("out")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    assert!(stderr(&o).starts_with("escha-convert: error: "), "{}", stderr(&o));
}

/// The one document of a run that failed with `code` while its output was being made, whose
/// message is stderr's error line.
fn failed_mid_run(o: &Output, code: &str) {
    assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
    let doc = error_document(o);
    assert_eq!(doc["error"]["code"], code, "{doc}");
    let line = format!("escha-convert: error: {}\n", doc["error"]["message"].as_str().unwrap());
    assert!(stderr(o).ends_with(&line), "{doc}: {}", stderr(o));
}

#[test]
fn an_input_truncated_mid_run_prints_input_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let input = crate::edges::slow_checkpoint(&tmp.path().join("in"));
    let out = tmp.path().join("work").join("out");
    std::fs::create_dir(out.parent().unwrap()).unwrap();
    let child = crate::edges::start_slow_with(&input, &out, &["--json"]);
    let f = std::fs::OpenOptions::new().write(true).open(input.join("model.safetensors")).unwrap();
    f.set_len(f.metadata().unwrap().len() / 3).unwrap();
    // A SIGBUS in the mapping, or the check before the commit: either way input_changed.
    failed_mid_run(&child.wait_with_output().unwrap(), "input_changed");
}

#[test]
fn something_appearing_at_out_mid_run_prints_output_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let input = crate::edges::slow_checkpoint(&tmp.path().join("in"));
    let out = tmp.path().join("work").join("out");
    std::fs::create_dir(out.parent().unwrap()).unwrap();
    let child = crate::edges::start_slow_with(&input, &out, &["--json"]);
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("precious.txt"), "mine").unwrap();
    failed_mid_run(&child.wait_with_output().unwrap(), "output_refused");
}
