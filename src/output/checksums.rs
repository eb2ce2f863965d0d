//! `SHA256SUMS`: one line per output file, `<hex>  <name>`, sorted by name, the format
//! `sha256sum -c` reads. SHA-256 comes from the `sha2` crate, which uses the CPU's SHA
//! instructions where there are some (SHA-NI on `x86_64`, the `ARMv8` crypto extension on aarch64).

use anyhow::{Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// The sums file of a whole run.
pub const SUMS_FILE: &str = "SHA256SUMS";

/// The sums file of part `index` of `count` (merged into [`SUMS_FILE`] after the parts are copied
/// together).
pub fn part_sums_file(index: usize, count: usize) -> String {
    format!("{SUMS_FILE}.part-{index}-of-{count}")
}

/// The SHA-256 of a file, as lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).with_context(|| format!("{}: cannot read back", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).with_context(|| format!("{}: cannot read back", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes.iter().flat_map(|b| [DIGITS[usize::from(b >> 4)] as char, DIGITS[usize::from(b & 15)] as char]).collect()
}

/// Hashes `files` (names in `dir`, in parallel) and writes them as `sums_file` in `dir`; returns
/// (name, hex) sorted by name.
pub fn write_sums(dir: &Path, files: &[String], sums_file: &str) -> Result<Vec<(String, String)>> {
    let mut sums: Vec<(String, String)> =
        files.par_iter().map(|f| Ok((f.clone(), sha256_file(&dir.join(f))?))).collect::<Result<_>>()?;
    sums.sort();
    let text: String = sums.iter().flat_map(|(f, h)| [h.as_str(), "  ", f.as_str(), "\n"]).collect();
    std::fs::write(dir.join(sums_file), text)
        .with_context(|| format!("{}: cannot write", dir.join(sums_file).display()))?;
    Ok(sums)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("abc"), "abc").unwrap();
        let sums = write_sums(dir.path(), &["abc".into()], SUMS_FILE).unwrap();
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sums, [("abc".to_string(), want.to_string())]);
        assert_eq!(std::fs::read_to_string(dir.path().join(SUMS_FILE)).unwrap(), format!("{want}  abc\n"));
    }
}
