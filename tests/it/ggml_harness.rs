//! ggml's own quantizers as the tests' reference: `tests/c/ggml_quants_ref.c`, compiled with the
//! llama.cpp sources named by `ESCHA_LLAMA_CPP` (the `vendor/llama.cpp` of the llama-cpp-python
//! sdist), run as one process a test that answers framed requests (see the C file's header).
//! Used by `kquants_ref.rs`, `iq_ref.rs` and `weighted_ref.rs`.

use crate::common::stderr;
use escha_convert::block_type::BlockType;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

/// Added to the type: decode the blocks given instead of encoding values.
pub(crate) const DECODE: u32 = 256;
/// Added to the type: the values are followed by a row length and its importance weights, and
/// encoded as llama-quantize encodes with an importance matrix.
pub(crate) const WEIGHTED: u32 = 512;
/// Added to the type: the answer starts with the encoding's nanoseconds.
pub(crate) const TIMED: u32 = 1024;

/// The llama.cpp source directory, or `None` (after saying so) when it is not configured outside CI.
pub(crate) fn llama_cpp_dir() -> Option<PathBuf> {
    match std::env::var_os("ESCHA_LLAMA_CPP") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "ESCHA_LLAMA_CPP is not set: it names the vendor/llama.cpp directory of the llama-cpp-python \
                 sdist, and scripts/test.sh sets it"
            );
            println!("skipped: ESCHA_LLAMA_CPP not set");
            None
        }
    }
}

/// The compiled C harness, one process serving every request of a test (forking from the
/// multi-threaded test binary under qemu-user can hang, so a test forks once), in a temporary
/// directory that lives as long as this.
pub(crate) struct Harness {
    _dir: tempfile::TempDir,
    server: Mutex<Server>,
}

struct Server {
    child: Child,
    requests: ChildStdin,
    responses: ChildStdout,
}

impl Harness {
    pub(crate) fn build(llama: &Path) -> Harness {
        let ggml = llama.join("ggml");
        let quants = ggml.join("src").join("ggml-quants.c");
        assert!(quants.is_file(), "ESCHA_LLAMA_CPP={}: no {}", llama.display(), quants.display());
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/ggml_quants_ref.c");
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("ggml_quants_ref");
        // -ffp-contract=off: the reference is the C code as written, no fused multiply-adds.
        // -DNDEBUG: as ggml's release builds (see the harness).
        let out = Command::new("cc")
            .args(["-O2", "-ffp-contract=off", "-std=c11", "-DNDEBUG"])
            .arg(format!("-I{}", ggml.join("include").display()))
            .arg(format!("-I{}", ggml.join("src").display()))
            .arg(&source)
            .arg(&quants)
            .arg("-lm")
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("running cc");
        assert!(out.status.success(), "building the ggml harness failed:\n{}", stderr(&out));
        let mut child =
            Command::new(&exe).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let requests = child.stdin.take().unwrap();
        let responses = child.stdout.take().unwrap();
        Harness { _dir: dir, server: Mutex::new(Server { child, requests, responses }) }
    }

    /// The harness's answer to one request. It reads a whole request before it answers, so
    /// writing all of it and then reading cannot block on a full pipe.
    pub(crate) fn run(&self, mode: u32, n_values: usize, payload: &[u8]) -> Vec<u8> {
        let mut server = self.server.lock().unwrap();
        let mut request = Vec::with_capacity(8 + payload.len());
        request.extend_from_slice(&mode.to_le_bytes());
        request.extend_from_slice(&u32::try_from(n_values).unwrap().to_le_bytes());
        request.extend_from_slice(payload);
        let answered = server.requests.write_all(&request).and_then(|()| server.requests.flush()).and_then(|()| {
            let mut length = [0u8; 8];
            server.responses.read_exact(&mut length)?;
            let mut out = vec![0u8; usize::try_from(u64::from_le_bytes(length)).unwrap()];
            server.responses.read_exact(&mut out)?;
            Ok(out)
        });
        answered.unwrap_or_else(|e| {
            let mut why = String::new();
            let _ = server.child.kill();
            let _ = server.child.stderr.take().map(|mut err| err.read_to_string(&mut why));
            panic!("ggml harness (mode {mode}) failed ({e}): {why}")
        })
    }

    pub(crate) fn quantize(&self, kind: BlockType, values: &[f32]) -> Vec<u8> {
        let payload: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let out = self.run(kind.ggml_type(), values.len(), &payload);
        assert_eq!(out.len(), values.len() / kind.elements() * kind.bytes());
        out
    }

    pub(crate) fn dequantize(&self, kind: BlockType, blocks: &[u8]) -> Vec<f32> {
        let n = blocks.len() / kind.bytes() * kind.elements();
        let out = self.run(kind.ggml_type() + DECODE, n, blocks);
        assert_eq!(out.len(), n * 4);
        out.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let server = self.server.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = server.child.kill();
        let _ = server.child.wait();
    }
}
