//! The `--json` contract on failure: exactly one document on stdout, `{"schema_version": 1,
//! "error": {"code", "message", "exit_status"}}`, whose message is stderr's error line and whose
//! status is the run's. (Every document is validated against `docs/escha-convert.schema.json` by
//! `tests/python/test_json_schema.py`.)
//!
//! Every class of `docs/escha-convert.schema.json` is provoked here where it can be: `usage`,
//! `input_refused`, `output_refused`, `input_changed`, `write_failed` (a full disk, a file-size
//! limit), `verify_failed`, `backend_unavailable`; `interrupted` is provoked in `interrupts.rs`.
//! `failed` is the class of what no input, output or flag can cause (a thread pool the system
//! refuses to start, a report that does not serialise): no test can provoke it without breaking the
//! machine the test runs on, so none does.

use crate::common::{copy_tree, escha_convert, fixture, stderr};
use crate::synth::{read_safetensors, write_safetensors, T};
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

/// Runs `cmd` under a file-size limit of `limit` bytes (`ulimit -f`).
fn with_file_size_limit(cmd: &mut std::process::Command, limit: u64) -> Output {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit in the child before exec; no allocation or lock is involved.
    unsafe {
        cmd.pre_exec(move || {
            let l = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &raw const l) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    cmd.output().unwrap()
}

/// Unmounts a test's tmpfs when the test ends, however it ends.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_or_a_file_size_limit_at_preallocation_is_write_failed() {
    let tmp = tempfile::tempdir().unwrap();
    // Shards of about 100 MB: reserved before any weight is decoded.
    let input = crate::edges::slow_checkpoint(&tmp.path().join("in"));
    let shard = "model-00001-of-00001.safetensors";

    let out = tmp.path().join("limited");
    let o = with_file_size_limit(escha_convert().arg(&input).arg(&out).args(["--json", "--quiet"]), 1 << 20);
    failed_mid_run(&o, "write_failed");
    assert!(stderr(&o).contains(shard) && stderr(&o).contains("File too large"), "{}", stderr(&o));

    // A 1 MiB tmpfs (root only; anywhere else the reason is printed and this case skipped).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "a tmpfs mount needs root, which CI has");
        eprintln!("skipped: the full-disk case needs root to mount a tmpfs");
        return;
    }
    let disk = tmp.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let mounted =
        std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&disk).status();
    if !mounted.is_ok_and(|s| s.success()) {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "mount -t tmpfs failed under CI");
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    }
    let _unmount = Unmount(disk.clone());
    let o = run(&[&input, &disk.join("out"), &"--json", &"--quiet"]);
    failed_mid_run(&o, "write_failed");
    let err = stderr(&o);
    assert!(err.contains(shard) && err.contains("No space left on device"), "{err}");
    assert_eq!(std::fs::read_dir(&disk).unwrap().count(), 0, "no staging and no lock left");
    // A disk already full: whichever step meets it first (OUT's directory, its lock, the marker).
    let _ = std::fs::write(disk.join("filler"), vec![0u8; 2 << 20]);
    let o = run(&[&fixture("dense"), &disk.join("deeper/out"), &"--json", &"--quiet"]);
    failed_mid_run(&o, "write_failed");
}

#[test]
fn a_proof_that_fails_is_verify_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    copy_tree(&fixture("dense-base"), &base);
    // Every matrix of the base negated: the decode disagrees with it.
    let file = base.join("model.safetensors");
    let tensors: Vec<T> = read_safetensors(&file)
        .into_iter()
        .map(|(name, (dtype, shape, mut data))| {
            if shape.len() == 2 && (dtype == "BF16" || dtype == "F16") {
                data.iter_mut().skip(1).step_by(2).for_each(|b| *b ^= 0x80);
            }
            let dtype: &'static str = Box::leak(dtype.into_boxed_str());
            T::new(&name, dtype, &shape, data)
        })
        .collect();
    write_safetensors(&file, &tensors);
    let out = tmp.path().join("out");
    failed_mid_run(&run(&[&fixture("dense"), &out, &"--json", &"--verify-base", &base]), "verify_failed");
    assert!(!out.exists());
}

#[test]
fn a_backend_this_machine_lacks_is_backend_unavailable() {
    if cfg!(all(target_os = "macos", feature = "metal")) {
        eprintln!("skipped: this build has Metal");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dense = fixture("dense");
    for (args, status) in [
        (&[&dense as &dyn AsRef<std::ffi::OsStr>, &tmp.path().join("out"), &"--backend", &"metal", &"--json"][..], 1),
        (&[&"verify", &dense, &"--base", &fixture("dense-base"), &"--backend", &"metal", &"--json"], 2),
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(status), "{}", stderr(&o));
        let doc = error_document(&o);
        assert_eq!(doc["error"]["code"], "backend_unavailable", "{doc}");
    }
    assert!(!tmp.path().join("out").exists());
}

#[test]
fn merge_s_own_output_is_refused_as_output_and_its_input_as_input() {
    let tmp = tempfile::tempdir().unwrap();
    let parts = tmp.path().join("parts");
    let o = escha_convert()
        .arg(fixture("dense"))
        .arg(&parts)
        .args(["--checksums", "--part", "1/1", "--quiet"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // Where SHA256SUMS goes, a directory: merge's output cannot be written there.
    std::fs::create_dir(parts.join("SHA256SUMS")).unwrap();
    let o = run(&[&"merge", &parts, &"--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(error_document(&o)["error"]["code"], "output_refused");
}
