//! Helpers shared by the integration tests.
#![allow(dead_code)]

use escha_convert::rng::SplitMix64;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `escha-convert` binary as a command.
///
/// A cross-compiled test (cfg `escha_cross`, set by build.rs when the target is not the host)
/// cannot start a target binary itself: the words of `ESCHA_TEST_RUNNER` (the emulator, e.g.
/// `qemu-aarch64 -L /usr/aarch64-linux-gnu`, set in .cargo/config.toml) then come first.
pub fn escha_convert() -> Command {
    let exe = env!("CARGO_BIN_EXE_escha-convert");
    let runner = if cfg!(escha_cross) { std::env::var("ESCHA_TEST_RUNNER").unwrap_or_default() } else { String::new() };
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(words).arg(exe);
            c
        }
        None => Command::new(exe),
    }
}

/// The exit code of a finished run; a run killed by a signal (which the tool never dies of) fails
/// the test naming the signal, with what the run printed on stderr.
pub fn exit_code(o: &Output) -> i32 {
    o.status.code().unwrap_or_else(|| panic!("{}; stderr:\n{}", o.status, stderr(o)))
}

/// What a finished run printed on stderr, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Path of a file under `fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(rel)
}

/// Copies a directory tree (files and directories).
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            copy_tree(&p, &to.join(p.file_name().unwrap()));
        } else {
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// Stored int16 words as the little-endian bytes a checkpoint holds.
pub fn words_to_bytes(words: &[u16]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The crate's deterministic generator, with what tests draw from it.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut g = SplitMix64(self.0);
        let v = g.next_u64();
        self.0 = g.0;
        v
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn gaussian(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1], so the logarithm stays finite
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Every file under `dir` with its bytes, for before/after comparisons.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(snapshot(&p));
        } else {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out.sort();
    out
}

/// Limits the address space of `cmd`'s process to `bytes` (`setrlimit(RLIMIT_AS)` in the child
/// before exec). Not under an emulator (a cross-compiled run), which reserves a guest address
/// space larger than any such limit.
pub fn limit_address_space(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    if cfg!(escha_cross) {
        return;
    }
    // SAFETY: setrlimit in the child before exec; no allocation or lock is involved.
    unsafe {
        cmd.pre_exec(move || {
            let l = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            if libc::setrlimit(libc::RLIMIT_AS, &raw const l) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Runs `cmd` to its end and returns its output, stdout and stderr drained meanwhile (so that a
/// full pipe cannot stall it); kills it when it runs past `deadline` (five times that under an
/// emulator) and says so, with what it printed on stderr.
pub fn output_within(cmd: &mut Command, deadline: std::time::Duration) -> Result<std::process::Output, String> {
    use std::io::Read;
    use std::process::Stdio;
    let deadline = if cfg!(escha_cross) { deadline * 5 } else { deadline };
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let t0 = std::time::Instant::now();
    let mut child = cmd.spawn().unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            b
        })
    };
    let (stdout, stderr) =
        (drain(Box::new(child.stdout.take().unwrap())), drain(Box::new(child.stderr.take().unwrap())));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
            return Err(format!("still running after {deadline:?}: {err}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    Ok(std::process::Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() })
}

/// Converts `input` into `out` with `args`; the `--json` report (success required).
pub fn convert_json(input: &std::path::Path, out: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let o = escha_convert().arg(input).arg(out).args(args).args(["--json", "--quiet"]).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}
