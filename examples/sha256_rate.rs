//! Benchmark helper: the speed of SHA-256 as `--checksums` computes it (the `sha2` crate, read
//! through a 1 MiB buffer, one thread per file), and of the hash alone on a buffer in memory.
//!
//!     sha256_rate FILE...
//!
//! Prints the files' digests in the format `sha256sum -c` reads, then on stderr the bytes, the
//! seconds and GB/s of reading and hashing the files one after another on one thread, and GB/s
//! of hashing 1 GiB already in memory (no reads).

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fmt::Write;
use std::io::Read;
use std::time::Instant;

fn main() -> Result<()> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        bail!("usage: sha256_rate FILE...");
    }
    let mut buf = vec![0u8; 1 << 20];
    let (mut bytes, started) = (0u64, Instant::now());
    for f in &files {
        let mut file = std::fs::File::open(f).with_context(|| format!("{f}: cannot read"))?;
        let mut hasher = Sha256::new();
        loop {
            let n = file.read(&mut buf).with_context(|| format!("{f}: cannot read"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            bytes += n as u64;
        }
        let mut digest = String::new();
        for b in hasher.finalize() {
            write!(digest, "{b:02x}")?;
        }
        println!("{digest}  {f}");
    }
    let files_s = started.elapsed().as_secs_f64();

    let block: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let (mut hasher, started) = (Sha256::new(), Instant::now());
    for _ in 0..1024 {
        hasher.update(&block);
    }
    std::hint::black_box(hasher.finalize());
    let memory_s = started.elapsed().as_secs_f64();
    eprintln!(
        "files: {bytes} bytes in {files_s:.3} s, {:.3} GB/s; in memory: 1 GiB in {memory_s:.3} s, {:.3} GB/s",
        bytes as f64 / files_s / 1e9,
        (1u64 << 30) as f64 / memory_s / 1e9
    );
    Ok(())
}
