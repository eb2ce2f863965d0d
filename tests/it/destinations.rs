//! What the tool writes, and where: OUT and `--html` are resolved to where they physically are and
//! never overlap an input or land on something that is not theirs; `--force` replaces only what a
//! marker proves this tool wrote; a live run on shared storage keeps its staging; an interrupted
//! swap leaves the old output; full disks and file-size limits end in a message naming the file.
//!
//! Some cases need root (mounts, namespaces); they are skipped with the reason printed, except
//! under `CI=true`, where a missing facility fails the test.

use crate::common::{copy_tree, escha_convert, fixture, snapshot, stderr};
use crate::synth::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    escha_convert().args(args.iter().map(AsRef::as_ref)).output().unwrap()
}

fn checkpoint(dir: &Path) -> PathBuf {
    write_checkpoint(dir, &small_checkpoint(41))
}

/// Whether this process may use root-only facilities (mounts, namespaces); says why not when it
/// cannot, and fails instead under `CI=true`.
fn root_or_skip(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{what} needs root, which CI has");
        eprintln!("skipped: {what} needs root");
    }
    root
}

#[test]
fn html_never_lands_on_a_device_an_input_or_an_unwritable_place() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    copy_tree(&fixture("dense"), &input);
    let before = snapshot(&input);
    for (target, says) in [
        (PathBuf::from("/dev/null"), "a device"),
        (input.join("config.json"), "lies in the input"),
        (fixture("dense-base").join("page.html"), "lies in the input"),
        (PathBuf::from("/proc/escha-report.html"), "cannot create a file there"),
    ] {
        let o = escha_convert()
            .arg("verify")
            .arg(&input)
            .arg("--base")
            .arg(fixture("dense-base"))
            .arg("--html")
            .arg(&target)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}: {}", target.display(), stderr(&o));
        assert!(stderr(&o).contains(says), "{}: {}", target.display(), stderr(&o));
        assert!(o.stdout.is_empty(), "refused before any check ran");
    }
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&std::fs::metadata("/dev/null").unwrap().file_type()));
    assert_eq!(snapshot(&input), before);
    assert!(!fixture("dense-base").join("page.html").exists());
}

#[test]
fn out_spelled_through_a_missing_directory_and_dot_dot_is_where_it_lands() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"));
    let before = snapshot(&input);
    let o = escha_convert().current_dir(tmp.path()).args(["in", "nope/../in/out", "--quiet"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("overlaps the input"), "{}", stderr(&o));
    assert!(!tmp.path().join("nope").exists() && !input.join("out").exists());
    // Not even with --force may IN itself be replaced, whatever it holds.
    let o = escha_convert().current_dir(tmp.path()).args(["in", "nope2/../in", "--force", "--quiet"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(snapshot(&input), before);
    // A base is an input too.
    let o = escha_convert()
        .current_dir(tmp.path())
        .arg("in")
        .arg(fixture("dense-base").join("x/../out"))
        .args(["--verify-base", fixture("dense-base").to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("overlaps the input"), "{}", stderr(&o));
}

#[test]
fn a_special_file_where_the_lock_goes_is_never_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"));
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "mine").unwrap();
    std::os::unix::fs::symlink(&secret, tmp.path().join(".out.lock")).unwrap();
    let o = run(&[&input, &tmp.path().join("out"), &"--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("in the way of the output lock"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "mine");
    assert!(std::fs::symlink_metadata(tmp.path().join(".out.lock")).unwrap().file_type().is_symlink());
}

#[test]
fn force_replaces_only_what_the_marker_proves_ours() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"));
    // A save_pretrained-style directory: every name one this tool could write.
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for name in [
        "config.json",
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "README.md",
    ] {
        std::fs::write(out.join(name), format!("the user's {name}")).unwrap();
    }
    let before = snapshot(&out);
    let o = run(&[&input, &out, &"--force", &"--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing shows that this tool wrote it"), "{}", stderr(&o));
    assert_eq!(snapshot(&out), before);
    // Its own earlier output is replaced; the same output with a file added is not.
    let ours = tmp.path().join("ours");
    assert!(run(&[&input, &ours, &"--quiet"]).status.success());
    assert!(run(&[&input, &ours, &"--force", &"--quiet", &"--format", &"f16"]).status.success());
    std::fs::write(ours.join("notes.txt"), "mine").unwrap();
    let o = run(&[&input, &ours, &"--force", &"--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("notes.txt"), "{}", stderr(&o));
    assert!(ours.join("notes.txt").is_file());
}

/// A checkpoint that takes a second or two to convert with `SLOW`.
fn slow_checkpoint(dir: &Path) -> PathBuf {
    crate::synth::slow_checkpoint(dir, 78)
}

const SLOW: &[&str] = &["--backend", "scalar", "-j", "1", "--format", "mlx", "--bits", "2", "--quiet"];

/// Waits until an entry whose name contains `part` appears in `dir`.
fn wait_for(dir: &Path, part: &str) {
    let t0 = Instant::now();
    while !std::fs::read_dir(dir).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().contains(part)) {
        assert!(t0.elapsed() < Duration::from_secs(60), "no {part} appeared in {}", dir.display());
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_staging_directory_whose_lock_is_held_is_left_alone() {
    use std::os::fd::AsRawFd;
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"));
    // Another host's run: a process id nobody here has, and its lock held.
    let live = tmp.path().join(".theirs.partial-999999");
    std::fs::create_dir(&live).unwrap();
    std::fs::write(live.join("model-00001-of-00002.safetensors"), "half written").unwrap();
    let lock = std::fs::File::create(tmp.path().join(".theirs.lock")).unwrap();
    // SAFETY: flock on a descriptor we own, as the other run holds it.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    let o = run(&[&input, &tmp.path().join("out"), &"--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(live.join("model-00001-of-00002.safetensors").is_file(), "a live run's staging survives");
}

#[test]
fn a_run_in_another_pid_namespace_does_not_remove_a_live_run_s_staging() {
    if !root_or_skip("unshare --pid") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let input = slow_checkpoint(&tmp.path().join("in"));
    let small = checkpoint(&tmp.path().join("small"));
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let first = escha_convert().arg(&input).arg(work.join("first")).args(SLOW).stderr(Stdio::piped()).spawn().unwrap();
    wait_for(&work, ".partial-");
    // The second run cannot see the first's process: only the lock tells it the staging is live.
    let mut second = Command::new("unshare");
    second.args(["--pid", "--fork", "--mount-proc"]);
    let program = escha_convert();
    second.arg(program.get_program()).args(program.get_args()).arg(&small).arg(work.join("second")).arg("--quiet");
    let o = second.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success(), "the first run finishes: {}", stderr(&o));
    assert!(work.join("first/model-00001-of-00001.safetensors").is_file());
}

#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the pause hook (ESCHA_CONVERT_PAUSE), which release builds leave out"
)]
fn an_interrupted_force_swap_leaves_the_old_output() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"));
    let out = tmp.path().join("out");
    assert!(run(&[&input, &out, &"--quiet"]).status.success());
    let before = snapshot(&out);
    let mut child = escha_convert()
        .arg(&input)
        .arg(&out)
        .args(["--force", "--quiet", "--format", "f16"])
        .env("ESCHA_CONVERT_PAUSE", "swap")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(tmp.path(), ".out.old-");
    // SAFETY: kill on our own child's process id.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert_eq!(snapshot(&out), before, "the old output is back, whole");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "only in/ and out/ remain: {left:?}");
}

/// Runs escha-convert with `args` under a file-size limit of `limit` bytes (`ulimit -f`).
fn with_file_size_limit(args: &[&dyn AsRef<std::ffi::OsStr>], limit: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = escha_convert();
    cmd.args(args.iter().map(AsRef::as_ref));
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

#[test]
fn a_file_size_limit_is_an_error_naming_the_file_not_a_signal() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"));
    // Shards fit the limit; the tokenizer copied beside them does not.
    std::fs::write(input.join("tokenizer.json"), vec![b' '; 8 << 20]).unwrap();
    let out = tmp.path().join("out");
    let o = with_file_size_limit(&[&input, &out, &"--quiet"], 4 << 20);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("tokenizer.json: cannot write") && err.contains("copying"), "{err}");
    assert!(err.contains("File too large"), "{err}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec!["in"], "no staging and no lock left");

    // verify's page: the checks ran, writing their record failed (exit 1), no temporary left.
    let pages = tmp.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    let page = pages.join("report.html");
    let base = fixture("dense-base");
    let o = with_file_size_limit(&[&"verify", &fixture("dense"), &"--base", &base, &"--html", &page], 16 << 10);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("report.html: cannot write") && err.contains("File too large"), "{err}");
    assert_eq!(std::fs::read_dir(&pages).unwrap().count(), 0, "no page, no temporary");
}

/// Unmounts a test's tmpfs when the test ends, however it ends.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Permission bits do not stop root, which CI runs as, so the place that refuses is a read-only
/// tmpfs (the unit tests of `output/writable.rs` hold the same message for `Permission denied`).
#[test]
fn an_unwritable_place_for_out_says_to_choose_another() {
    if !root_or_skip("a tmpfs mount") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ro = tmp.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"]).arg(&ro).status();
    if !mounted.is_ok_and(|s| s.success()) {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "mount -t tmpfs -o ro failed under CI");
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    }
    let _unmount = Unmount(ro.clone());
    for (out, what) in [(ro.join("out"), "the output lock"), (ro.join("new").join("out"), "OUT's parent directory")] {
        let o = run(&[&fixture("dense"), &out, &"--quiet"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(&format!("cannot create {what}: Read-only file system")), "the cause: {err}");
        assert!(err.contains("choose a writable place for OUT"), "the fix: {err}");
    }
    assert_eq!(std::fs::read_dir(&ro).unwrap().count(), 0);
}

#[test]
fn a_full_disk_names_the_file_it_could_not_write() {
    if !root_or_skip("a tmpfs mount") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let input = slow_checkpoint(&tmp.path().join("in"));
    let disk = tmp.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let size = 64 << 20;
    let mounted =
        Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}")]).arg("tmpfs").arg(&disk).status();
    if !mounted.is_ok_and(|s| s.success()) {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "mount -t tmpfs failed under CI");
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    }
    let _unmount = Unmount(disk.clone());
    let child = escha_convert().arg(&input).arg(disk.join("out")).args(SLOW).stderr(Stdio::piped()).spawn().unwrap();
    wait_for(&disk, ".partial-");
    // The shards are reserved up front; what comes after them finds the disk full.
    let _ = std::fs::write(disk.join("filler"), vec![0u8; size]);
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(": cannot write") && err.contains("No space left on device"), "{err}");
    assert!(err.contains(&disk.display().to_string()), "names the file: {err}");
    let left: Vec<_> = std::fs::read_dir(&disk).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec!["filler"], "no staging and no lock left");
}

#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the pause hook (ESCHA_CONVERT_PAUSE), which release builds leave out"
)]
fn a_refused_out_is_refused_before_any_weight_is_decoded() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = tmp.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("notes.txt"), "mine").unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, "mine").unwrap();
    // `probe` is where the first weight is decoded to choose widths or types (debug builds print
    // it there when ESCHA_CONVERT_PAUSE names it).
    let run = |out: &Path, extra: &[&str]| {
        let mut cmd = escha_convert();
        cmd.arg(fixture("dense")).arg(out).args(["--quiet"]).args(extra).env("ESCHA_CONVERT_PAUSE", "probe");
        let o = crate::common::output_within(&mut cmd, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        (o.status.code(), stderr(&o))
    };
    for format in [&["--format", "gguf", "--gguf-type", "auto"][..], &["--format", "mlx", "--bits", "auto"]] {
        for (out, force, says) in [
            (&taken, false, "already exists and is not empty"),
            (&taken, true, "notes.txt"),
            (&file, false, "not a directory"),
            (&file, true, "not a directory"),
        ] {
            let args = [format, if force { &["--force"][..] } else { &[] }].concat();
            let (code, err) = run(out, &args);
            assert_eq!(code, Some(1), "{args:?}: {err}");
            assert!(err.contains(says), "{args:?}: {err}");
            assert!(!err.contains("paused at probe"), "{args:?}: decoded before refusing OUT: {err}");
        }
        assert_eq!(std::fs::read_to_string(taken.join("notes.txt")).unwrap(), "mine");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
        // The same run into a free OUT does decode there: the observable is real.
        let free = tmp.path().join(format!("free-{}", format[1]));
        let (code, err) = run(&free, format);
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("paused at probe"), "{format:?}: {err}");
    }
}

/// The files of directory `dir` by name (one level: an output has no subdirectory).
fn named_files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap_or_default()))
        .collect()
}

/// In a private mount namespace (nothing leaks to the host): a tmpfs mounted at `disk` is OUT of
/// a conversion, then of `--force` over it, then of a plain run (refused: not empty); a read-only
/// tmpfs at `ro` is OUT of a fourth. Each step's exit status and stderr, and OUT's copy after it,
/// are left in `tmp`. `$R` is the emulator a cross-built test starts the binary with (empty
/// natively).
const MOUNT_STEPS: &str = r#"set -u
mount -t tmpfs tmpfs "$T/disk" && mount -t tmpfs -o ro tmpfs "$T/ro" || exit 77
step() { n=$1; shift; "$@" 2>"$T/$n.err" >"$T/$n.out"; echo $? >"$T/$n.rc"; }
step 1 $R "$B" "$IN" "$T/disk" -q
cp -a "$T/disk" "$T/after-1"
step 2 $R "$B" "$IN" "$T/disk" -q --force --format mlx
cp -a "$T/disk" "$T/after-2"
step 3 $R "$B" "$IN" "$T/disk" -q --format mlx
step 4 $R "$B" "$IN" "$T/ro" --json
step 5 $R "$B" "$IN" "$T/ro" --dry-run --json
ls -A "$T" >"$T/beside"
"#;

#[test]
fn an_empty_mount_point_is_a_place_to_write_and_a_read_only_one_is_refused_first() {
    if !root_or_skip("mounting a tmpfs in a mount namespace") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let input = fixture("dense");
    for d in ["disk", "ro"] {
        std::fs::create_dir(t.join(d)).unwrap();
    }
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", MOUNT_STEPS])
        .env("T", t)
        .env("B", env!("CARGO_BIN_EXE_escha-convert"))
        .env(
            "R",
            if cfg!(escha_cross) { std::env::var("ESCHA_TEST_RUNNER").unwrap_or_default() } else { String::new() },
        )
        .env("IN", &input)
        .output();
    if !o.as_ref().is_ok_and(|o| o.status.code() == Some(0)) {
        let why = o.map_or_else(|e| e.to_string(), |o| stderr(&o));
        assert!(std::env::var("CI").as_deref() != Ok("true"), "cannot mount a tmpfs in a namespace under CI: {why}");
        eprintln!("skipped: cannot mount a tmpfs in a mount namespace: {why}");
        return;
    }
    let step = |n: u32| {
        let read = |ext: &str| std::fs::read_to_string(t.join(format!("{n}.{ext}"))).unwrap();
        (read("rc").trim().parse::<i32>().unwrap(), read("err"), read("out"))
    };
    // The same outputs as into a plain directory, and nothing of the run's own left in OUT.
    let (bf16, mlx) = (t.join("bf16"), t.join("mlx"));
    assert!(run(&[&input, &bf16, &"-q"]).status.success());
    assert!(run(&[&input, &mlx, &"-q", &"--format", &"mlx"]).status.success());
    let (rc, err, _) = step(1);
    assert_eq!(rc, 0, "convert into the mount point: {err}");
    assert!(named_files(&t.join("after-1")) == named_files(&bf16), "convert: not the output a plain OUT gets");
    let (rc, err, _) = step(2);
    assert_eq!(rc, 0, "--force over the earlier output on the mount point: {err}");
    assert!(named_files(&t.join("after-2")) == named_files(&mlx), "--force: not the output a plain OUT gets");
    let (rc, err, _) = step(3);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("already exists and is not empty; pass --force"), "{err}");
    // Read-only: refused with the true reason, before any work, with nothing staged beside it.
    let (rc, err, out) = step(4);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("a read-only file system is mounted there"), "{err}");
    assert!(!err.contains("during the run") && !err.contains("decod"), "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["error"]["code"], "output_refused", "{doc}");
    let (rc, err, out) = step(5);
    assert_eq!(rc, 0, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(plan["would_refuse"].as_str().is_some_and(|w| w.contains("read-only file system")), "{plan}");
    let beside = std::fs::read_to_string(t.join("beside")).unwrap();
    assert!(!beside.contains(".disk.") && !beside.contains(".ro."), "staged beside OUT: {beside}");
}
