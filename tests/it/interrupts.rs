//! Ctrl-C, SIGTERM and SIGHUP at every point of a run that writes: before anything is written the
//! run ends (130) saying nothing was written; while it writes, the partial output is removed and
//! the line says so; once the output is in place the run has succeeded, and a signal neither ends
//! it nor adds a second document to stdout: it finishes its report and exits 0.
//!
//! The points are reached with the pause hook of debug builds (`ESCHA_CONVERT_PAUSE`: `probe`,
//! before the staging directory exists; `in_place`, just after the output was renamed into place)
//! or, for a report blocked on its reader, with a pipe nobody reads until the signal was sent.

use crate::common::{copy_tree, escha_convert, fixture, stderr};
use crate::synth::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn kill(child: &Child, signal: libc::c_int) {
    // SAFETY: kill on our own child's process id.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
}

/// Waits until `path` exists.
fn wait_for(path: &Path) {
    let t0 = Instant::now();
    while std::fs::symlink_metadata(path).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(120), "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Starts `cmd` with stdout and stderr piped (read by nobody yet).
fn start(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

/// The one JSON document on stdout (`serde_json` refuses anything after it).
fn one_document(stdout: &[u8]) -> Value {
    serde_json::from_slice(stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", String::from_utf8_lossy(stdout)))
}

/// A checkpoint whose `--json` report is far larger than a pipe holds (one entry per tensor).
fn checkpoint_with_a_long_report(dir: &Path) -> PathBuf {
    // The small checkpoint's model grown to 300 layers: over 4,000 tensors.
    let model = Model { layer_types: vec!["linear_attention"; 300], ..Model::small() };
    write_model(dir, &small_checkpoint(5), &model)
}

/// Waits until the child writing into `stdout` has filled the pipe (its report is longer than a
/// pipe holds), so that it now waits for a reader.
fn wait_until_blocked_on(stdout: &std::process::ChildStdout) {
    use std::os::fd::AsRawFd;
    let t0 = Instant::now();
    loop {
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD on a pipe we own writes one int.
        assert_eq!(unsafe { libc::ioctl(stdout.as_raw_fd(), libc::FIONREAD, &raw mut unread) }, 0);
        if unread >= 4096 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "the report never filled the pipe");
        std::thread::sleep(Duration::from_millis(2));
    }
    // A full pipe holds at least a page; give the writer time to fill the rest and wait.
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn a_signal_while_a_report_of_no_output_waits_for_its_reader_ends_in_that_one_report() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint_with_a_long_report(&tmp.path().join("in"));
    let mut child = start(escha_convert().arg(&input).arg(tmp.path().join("out")).args(["--json", "--dry-run"]));
    wait_until_blocked_on(child.stdout.as_ref().unwrap());
    kill(&child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    let mut stdout = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let doc = one_document(&stdout);
    assert_eq!(doc["dry_run"], true, "{err}");
    assert!(doc["tensors"].as_array().map_or(0, Vec::len) > 4000, "the whole report");
    assert!(!err.contains("removed") && !err.contains("nothing was written"), "{err}");
    assert!(err.contains("report was printed; finishing it"), "says what happened: {err}");
    assert_eq!(names(tmp.path()), ["in"], "nothing written");
}

#[test]
fn a_signal_while_the_report_waits_for_its_reader_leaves_a_successful_run() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint_with_a_long_report(&tmp.path().join("in"));
    let out = tmp.path().join("out");
    let mut child = start(escha_convert().arg(&input).arg(&out).args(["--json", "--quiet"]));
    wait_for(&out);
    wait_until_blocked_on(child.stdout.as_ref().unwrap());
    kill(&child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    let mut stdout = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let doc = one_document(&stdout);
    assert!(doc.get("error").is_none(), "{err}");
    let reported = doc["tensors"].as_array().map_or(0, Vec::len);
    assert!(!err.contains("removed"), "claims a removal that did not happen: {err}");
    assert!(err.contains("after the output was complete"), "says what happened: {err}");
    assert_eq!(names(tmp.path()), ["in", "out"], "no staging and no lock left");
    let written = read_safetensors(&out.join("model-00001-of-00001.safetensors"));
    assert!(written.len() > 4000, "OUT complete");
    assert_eq!(reported, written.len(), "the whole report");
}

#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the pause hook (ESCHA_CONVERT_PAUSE), which release builds leave out"
)]
fn a_signal_once_the_output_is_in_place_ends_in_success_for_every_command_that_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let dense = fixture("dense");
    let (parts, pristine) = (tmp.path().join("parts"), tmp.path().join("pristine"));
    let o =
        escha_convert().arg(&dense).arg(&pristine).args(["--checksums", "--part", "1/1", "--quiet"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (out, old, page) = (tmp.path().join("out"), tmp.path().join("old"), tmp.path().join("page.html"));
    let o = escha_convert().arg(&dense).arg(&old).arg("--quiet").output().unwrap();
    assert!(o.status.success());
    let base = fixture("dense-base");
    let cases: [(&str, Vec<&dyn AsRef<std::ffi::OsStr>>, PathBuf); 4] = [
        ("convert", vec![&dense, &out], out.join("config.json")),
        ("convert --force", vec![&dense, &old, &"--force", &"--format", &"f16"], old.join("config.json")),
        ("verify --html", vec![&"verify", &dense, &"--base", &base, &"--html", &page], page.clone()),
        ("merge", vec![&"merge", &parts], parts.join("SHA256SUMS")),
    ];
    for (what, args, appears) in cases {
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            let _ = std::fs::remove_dir_all(&out);
            let _ = std::fs::remove_dir_all(&parts);
            copy_tree(&pristine, &parts);
            let mut cmd = escha_convert();
            cmd.args(args.iter().map(AsRef::as_ref)).arg("--json").env("ESCHA_CONVERT_PAUSE", "in_place");
            let mut child = start(&mut cmd);
            let mut stderr = BufReader::new(child.stderr.take().unwrap());
            let mut said = String::new();
            while !said.contains("paused at in_place") {
                assert!(stderr.read_line(&mut said).unwrap() > 0, "{what}: never paused: {said}");
            }
            assert!(std::fs::symlink_metadata(&appears).is_ok(), "{what}: nothing in place");
            kill(&child, signal);
            stderr.read_to_string(&mut said).unwrap();
            let o = child.wait_with_output().unwrap();
            assert_eq!(o.status.code(), Some(0), "{what} {signal}: {said}");
            let doc = one_document(&o.stdout);
            assert!(doc.get("error").is_none(), "{what}: {doc}");
            assert!(!said.contains("removed"), "{what}: {said}");
            assert!(std::fs::symlink_metadata(&appears).is_ok(), "{what}: the output stays");
            let left: Vec<String> = names(tmp.path()).into_iter().filter(|n| n.starts_with('.')).collect();
            assert!(left.is_empty(), "{what}: {left:?} left behind");
        }
    }
}

#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the pause hook (ESCHA_CONVERT_PAUSE), which release builds leave out"
)]
fn a_signal_before_anything_is_written_says_nothing_was_written() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    // `probe` comes after OUT is claimed (its lock taken) and before the staging directory exists.
    let mut cmd = escha_convert();
    cmd.arg(fixture("dense")).arg(&out).args(["--json", "--format", "mlx", "--bits", "auto"]);
    let mut child = start(cmd.env("ESCHA_CONVERT_PAUSE", "probe"));
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("paused at probe") {
        assert!(stderr.read_line(&mut said).unwrap() > 0, "never paused: {said}");
    }
    kill(&child, libc::SIGTERM);
    stderr.read_to_string(&mut said).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{said}");
    let doc = one_document(&o.stdout);
    let line = "interrupted; nothing was written";
    assert_eq!(doc["error"], serde_json::json!({"code": "interrupted", "message": line, "exit_status": 130}));
    assert!(said.ends_with(&format!("escha-convert: {line}\n")), "{said}");
    assert!(names(tmp.path()).is_empty(), "no OUT, no lock: {:?}", names(tmp.path()));
}

#[test]
fn a_signal_while_writing_removes_the_partial_output_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let input = crate::edges::slow_checkpoint(&tmp.path().join("in"));
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let child = crate::edges::start_slow_with(&input, &work.join("out"), &["--json"]);
    kill(&child, libc::SIGTERM);
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    let line = "interrupted; partial output removed";
    let doc = one_document(&o.stdout);
    assert_eq!(doc["error"], serde_json::json!({"code": "interrupted", "message": line, "exit_status": 130}));
    assert!(err.ends_with(&format!("escha-convert: {line}\n")), "{err}");
    assert!(names(&work).is_empty(), "no OUT, no staging, no lock: {:?}", names(&work));
}
