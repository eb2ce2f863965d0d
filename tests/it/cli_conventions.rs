//! Command-line conventions: help with every format, examples and exit codes; shell completions
//! and man pages; the long version; flags anywhere in the short form; value names in any case;
//! messages that name what is there and what to do.

use crate::common::{escha_convert, fixture};
use escha_convert::cli::{exit_codes, Cli, Page};
use std::path::Path;
use std::process::{Command, Output};

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    escha_convert().args(args.iter().map(AsRef::as_ref)).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const SUBCOMMANDS: [&str; 6] = ["convert", "inspect", "verify", "merge", "completions", "man"];

#[test]
fn every_help_lists_examples_and_its_exit_codes() {
    for page in Page::ALL {
        for flag in ["-h", "--help"] {
            let args: Vec<&str> = page.name().into_iter().chain([flag]).collect();
            let o = escha_convert().args(&args).output().unwrap();
            assert!(o.status.success(), "{args:?}");
            let help = text(&o.stdout);
            assert!(help.contains("Examples:\n") && help.contains("\n  escha-convert "), "{args:?}:\n{help}");
            assert!(help.contains("Exit codes:"), "{args:?}:\n{help}");
            for (code, meaning) in exit_codes(page) {
                assert!(help.contains(&format!("{code:>3}  {meaning}")), "{args:?} lacks exit code {code}:\n{help}");
            }
        }
    }
    // Every output format, at the top and for convert.
    for args in [&["--help"][..], &["convert", "--help"], &["convert", "-h"]] {
        let help = text(&escha_convert().args(args).output().unwrap().stdout);
        for format in ["bf16", "f16", "mlx", "gguf"] {
            assert!(help.to_lowercase().contains(format), "{args:?} does not name {format}:\n{help}");
        }
    }
    let top = text(&run(&[&"--help"]).stdout);
    assert!(top.contains("GGUF") && top.contains("escha-convert -q IN OUT"), "{top}");
    // The usage code the help names is the one clap exits with.
    let o = run(&[&"convert", &"--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(exit_codes(Page::Convert).iter().any(|(c, m)| *c == 2 && m.starts_with("usage error")));
}

/// The words a user reads first (the summary of `--help`, of `convert`, and the man pages' NAME)
/// name every output format, EXL3 among them, not only the input's trellis.
#[test]
fn the_first_words_name_every_output_format() {
    // What follows "checkpoints to" or "write": the outputs, not the input.
    let outputs = |line: &str| -> String {
        let tail = line.split_once(" to ").or_else(|| line.split_once(" write ")).map_or("", |(_, t)| t);
        tail.to_string()
    };
    let names_every_format = |what: &str, line: &str| {
        let out = outputs(line);
        for format in ["bf16", "f16", "MLX", "GGUF", "EXL3"] {
            assert!(out.contains(format), "{what} does not name {format} as an output: {line:?}");
        }
    };
    let top = text(&run(&[&"--help"]).stdout);
    names_every_format("the summary of --help", top.lines().next().unwrap());
    let convert = top.lines().find(|l| l.trim_start().starts_with("convert ")).expect("convert in the command list");
    names_every_format("convert's line in --help", convert);
    names_every_format("convert --help", text(&run(&[&"convert", &"--help"]).stdout).lines().next().unwrap());

    let tmp = tempfile::tempdir().unwrap();
    assert!(run(&[&"man", &tmp.path()]).status.success());
    for page in ["escha-convert.1", "escha-convert-convert.1"] {
        let roff = std::fs::read_to_string(tmp.path().join(page)).unwrap();
        let name = roff.split(".SH NAME\n").nth(1).and_then(|s| s.lines().next()).unwrap_or_default();
        names_every_format(&format!("the NAME of {page}"), name);
    }
}

/// The completion script for `shell`, checked to be non-empty.
fn completion(shell: &str) -> String {
    let o = run(&[&"completions", &shell]);
    assert!(o.status.success(), "{shell}: {}", text(&o.stderr));
    let script = text(&o.stdout);
    assert!(!script.trim().is_empty(), "{shell}: empty script");
    script
}

#[test]
fn completion_scripts_for_every_shell() {
    let tmp = tempfile::tempdir().unwrap();
    let bash = tmp.path().join("escha-convert.bash");
    std::fs::write(&bash, completion("bash")).unwrap();
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!("source '{}' && complete -p escha-convert", bash.display()))
        .output()
        .expect("bash runs");
    assert!(o.status.success(), "complete -p: {}{}", text(&o.stdout), text(&o.stderr));
    assert!(text(&o.stdout).contains("escha-convert"), "{}", text(&o.stdout));
    for shell in ["zsh", "fish"] {
        let script = completion(shell);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell}: {sub} missing");
        }
        assert!(script.contains("gguf") && script.contains("q4_k_m"), "{shell}: the values of --format, --gguf-type");
    }
    completion("elvish");
    completion("powershell");
    assert_eq!(completion("BASH"), completion("bash"), "the shell's name in any case");
    let o = run(&[&"completions", &"tcsh"]);
    assert_eq!(o.status.code(), Some(2));
}

/// Renders a man page as text with `man -l` or groff; `None` when neither is installed (an error
/// under CI, where .ci/run installs man-db and groff-base).
fn render_man(page: &Path) -> Option<String> {
    let rendered = |c: &mut Command| c.output().ok().filter(|o| o.status.success() && !o.stdout.is_empty());
    let man = rendered(Command::new("man").arg("-l").arg(page).env("MANPAGER", "cat").env("MANWIDTH", "100"));
    if let Some(o) = man.or_else(|| rendered(Command::new("groff").args(["-man", "-Tascii"]).arg(page))) {
        return Some(text(&o.stdout));
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "neither `man -l` nor `groff -man` renders a page: install man-db and groff-base (.ci/run does)"
    );
    eprintln!("skipped rendering the man pages: neither man (man-db) nor groff is installed");
    None
}

#[test]
fn man_pages_print_and_write_and_render() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&[&"man"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let main_page = o.stdout;
    assert!(text(&main_page).starts_with(".ie") || text(&main_page).contains(".TH"), "roff");

    let dir = tmp.path().join("man1");
    let o = run(&[&"man", &dir]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    let mut want: Vec<String> = SUBCOMMANDS.iter().map(|s| format!("escha-convert-{s}.1")).collect();
    want.push("escha-convert.1".into());
    want.sort();
    assert_eq!(names, want);
    assert_eq!(text(&o.stdout).lines().count(), want.len(), "every path written is printed");
    assert_eq!(std::fs::read(dir.join("escha-convert.1")).unwrap(), main_page, "the page printed is the one written");

    for (page, must) in [("escha-convert.1", "completions"), ("escha-convert-convert.1", "--gguf-type")] {
        let Some(rendered) = render_man(&dir.join(page)) else { return };
        assert!(rendered.contains(must), "{page}:\n{rendered}");
        assert!(rendered.contains("Exit codes"), "{page}:\n{rendered}");
    }
}

#[test]
fn the_long_version_says_what_was_built() {
    let short = text(&run(&[&"-V"]).stdout);
    assert_eq!(short, format!("escha-convert {}\n", env!("CARGO_PKG_VERSION")), "-V stays one line");
    let o = run(&[&"--version"]);
    assert!(o.status.success());
    let long = text(&o.stdout);
    let field = |name: &str| -> String {
        let line = long.lines().find(|l| l.starts_with(&format!("{name}:"))).unwrap_or_else(|| panic!("{long}"));
        line[name.len() + 1..].trim().to_string()
    };
    assert!(long.starts_with(&short), "{long}");
    let commit = field("commit");
    assert!(commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()) && commit.len() >= 7, "{long}");
    let head = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| text(&o.stdout).trim().to_string());
    if let (Some(head), Err(_)) = (head, std::env::var("ESCHA_BUILD_COMMIT")) {
        assert_eq!(commit, head, "the commit the binary was built from");
    }
    let features = field("features");
    assert_eq!(features.contains("metal"), cfg!(feature = "metal"), "{long}");
    let target = field("target");
    assert!(target.contains(std::env::consts::ARCH) || cfg!(escha_cross), "{long}");
    assert!(target.contains(std::env::consts::OS), "{long}");
    assert!(field("profile").contains("opt-level"), "{long}");
}

/// Every file of a directory (outputs are flat), name → bytes.
fn files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn flags_go_anywhere_in_the_short_form() {
    let tmp = tempfile::tempdir().unwrap();
    let dense = fixture("dense");
    let reference = tmp.path().join("ref");
    let o = run(&[&"convert", &"-q", &dense, &reference]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let runs: [(&str, Vec<&dyn AsRef<std::ffi::OsStr>>); 4] = [
        ("before", vec![&"-q", &dense]),
        ("between", vec![&dense, &"-q"]),
        ("valued", vec![&"--format", &"bf16", &"-qj", &"1", &dense]),
        ("inline", vec![&"--mtp=auto", &"-j1", &dense, &"--quiet"]),
    ];
    for (name, args) in runs {
        let out = tmp.path().join(name);
        let mut args = args;
        args.push(&out);
        let o = run(&args);
        assert!(o.status.success(), "{name}: {}", text(&o.stderr));
        assert!(o.stderr.is_empty(), "{name}: -q applies: {}", text(&o.stderr));
        assert!(files(&out) == files(&reference), "{name}: not the output of `convert -q IN OUT`");
    }

    // A directory named like a subcommand: the subcommand, unless `--` or a path says otherwise.
    crate::common::copy_tree(&dense, &tmp.path().join("merge"));
    let in_tmp = |args: &[&str]| escha_convert().args(args).current_dir(tmp.path()).output().unwrap();
    let o = in_tmp(&["merge", "out-a"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("out-a: cannot read"), "the merge subcommand: {}", text(&o.stderr));
    assert!(!tmp.path().join("out-a").exists());
    for (out, args) in [("out-b", &["-q", "--", "merge", "out-b"][..]), ("out-c", &["-q", "./merge", "out-c"])] {
        let o = in_tmp(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        // The same output but for the model card, which names the input directory.
        let without_card = |dir: &Path| {
            let mut f = files(dir);
            f.remove("README.md");
            f
        };
        assert!(without_card(&tmp.path().join(out)) == without_card(&reference), "{args:?}");
    }
}

#[test]
fn value_names_are_case_insensitive() {
    let tmp = tempfile::tempdir().unwrap();
    let dense = fixture("dense");
    let out = tmp.path().join("out");
    for args in [
        &["--format", "GGUF", "--gguf-type", "Q4_K_M", "--mtp", "DROP", "--gguf-vocab", "None"][..],
        &["--format", "Mlx", "--bits", "AUTO", "--int8", "REQUANT", "--bias", "Keep"],
        &["--format", "F16", "--backend", "SCALAR"],
    ] {
        let o = escha_convert().arg(&dense).arg(&out).args(args).args(["--dry-run", "--json"]).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
    }
    let o = run(&[&"verify", &dense, &"--base", &fixture("dense-base"), &"--backend", &"Scalar", &"--sample", &"1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // Every value enum ignores case; none has two values that differ only by case.
    let cli = <Cli as clap::CommandFactory>::command();
    for sub in cli.get_subcommands() {
        for arg in sub.get_arguments().filter(|a| a.get_action().takes_values()) {
            let values: Vec<String> = arg.get_possible_values().iter().map(|v| v.get_name().to_lowercase()).collect();
            if values.iter().any(|v| v.contains(char::is_alphabetic)) {
                assert!(arg.is_ignore_case_set(), "{} --{}", sub.get_name(), arg.get_id());
            }
        }
    }
}

#[test]
fn a_verify_base_with_missing_tensors_recommends_nothing_convert_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    // The base model less its final norm.
    let base = tmp.path().join("base");
    std::fs::create_dir(&base).unwrap();
    std::fs::copy(fixture("dense-base/config.json"), base.join("config.json")).unwrap();
    let tensors: Vec<crate::synth::T> = crate::synth::read_safetensors(&fixture("dense-base/model.safetensors"))
        .into_iter()
        .filter(|(name, _)| name != "model.language_model.norm.weight")
        .map(|(name, (dtype, shape, data))| {
            let dtype: &'static str = Box::leak(dtype.into_boxed_str());
            crate::synth::T::new(&name, dtype, &shape, data)
        })
        .collect();
    crate::synth::write_safetensors(&base.join("model.safetensors"), &tensors);
    let out = tmp.path().join("out");
    let o = run(&[&fixture("dense"), &out, &"--quiet", &"--verify-base", &base]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("not in BASE, first model.language_model.norm.weight"), "{err}");
    assert!(!err.contains("--allow-missing accepts"), "convert has no --allow-missing: {err}");
    assert!(err.contains("escha-convert verify IN --base BASE --allow-missing"), "{err}");
    assert!(!out.exists());
    // `convert --allow-missing` is still refused: the message sends no one there.
    let o = run(&[&fixture("dense"), &out, &"--verify-base", &base, &"--allow-missing"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn an_empty_part_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p2");
    let o = run(&[&fixture("dense"), &out, &"--part", &"2/2", &"--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let warnings = report["warnings"].as_array().unwrap();
    let empty = warnings.iter().filter_map(|w| w["message"].as_str()).find(|w| w.contains("part 2/2 is empty"));
    let empty = empty.unwrap_or_else(|| panic!("{warnings:?}"));
    assert!(empty.contains("1 shard(s) for 2 parts") && empty.contains("at most 1 parts"), "{empty}");
    assert!(text(&o.stderr).contains("part 2/2 is empty"), "{}", text(&o.stderr));
    // Without --json: the warning, and no progress over nothing (0%, an infinite ETA).
    let o = run(&[&fixture("dense"), &tmp.path().join("p2-text"), &"--part", &"2/2"]);
    let err = text(&o.stderr);
    assert!(o.status.success() && err.contains("part 2/2 is empty"), "{err}");
    assert!(!err.contains("% written"), "{err}");
    assert!(err.contains("wrote 0 B in 0 of 1 shard (part 2/2 of an output of "), "{err}");
    // Part 1 of the same split holds the shard: no such warning.
    let o = run(&[&fixture("dense"), &tmp.path().join("p1"), &"--part", &"1/2", &"--json"]);
    assert!(!text(&o.stdout).contains("is empty"));
}

#[test]
fn merge_names_the_hidden_marker_a_plain_copy_leaves_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let merged = tmp.path().join("merged");
    std::fs::create_dir(&merged).unwrap();
    for i in 1..=2 {
        let part = tmp.path().join(format!("part{i}"));
        let o = run(&[
            &fixture("dense"),
            &part,
            &"-q",
            &"--checksums",
            &"--max-shard-size",
            &"100KB",
            &"--part",
            &format!("{i}/2"),
        ]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        // `cp part/* merged/`: the shell's * leaves out names that start with a dot.
        for (name, bytes) in files(&part).into_iter().filter(|(n, _)| !n.starts_with('.')) {
            std::fs::write(merged.join(name), bytes).unwrap();
        }
    }
    let o = run(&[&"merge", &merged]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("hidden marker file .escha-convert.json"), "{err}");
    assert!(err.contains("cp -r PART/.") && err.contains("cp -a"), "{err}");
    let o = run(&[&"merge", &merged.join("config.json")]);
    assert!(text(&o.stderr).contains("not a directory"), "{}", text(&o.stderr));
}

#[test]
fn the_verify_page_labels_the_mtp_head_as_mtp() {
    let tmp = tempfile::tempdir().unwrap();
    let page = tmp.path().join("report.html");
    let o =
        run(&[&"verify", &fixture("dense"), &"--base", &fixture("dense-base"), &"--sample", &"1", &"--html", &page]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("MTP L0 input_layernorm"), "the MTP layer's norm labelled as MTP");
    assert!(html.contains(">L0 input_layernorm<"), "layer 0's own norm keeps its label");
}

#[test]
fn a_file_at_out_is_called_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::write(&out, "").unwrap();
    for force in [&[][..], &["--force"]] {
        let o = escha_convert().arg(fixture("dense")).arg(&out).args(force).output().unwrap();
        assert_eq!(o.status.code(), Some(1));
        let err = text(&o.stderr);
        assert!(err.contains("is an empty file, not a directory"), "{force:?}: {err}");
        assert!(!err.contains("not empty"), "{err}");
    }
    std::fs::write(&out, "x").unwrap();
    let o = escha_convert().arg(fixture("dense")).arg(&out).output().unwrap();
    assert!(text(&o.stderr).contains("is a file, not a directory"), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(&out).unwrap(), b"x", "never touched");
}

#[test]
fn quiet_says_it_hides_warnings_too() {
    let help = text(&run(&[&"convert", &"--help"]).stdout);
    let quiet = help.split("\n\n").find(|p| p.contains("--quiet")).unwrap_or_default().to_string();
    assert!(quiet.contains("warnings"), "{quiet}");
}
