//! `SHA256SUMS`: one line per output file, `<hex>  <name>`, sorted by name, the format
//! `sha256sum -c` reads. SHA-256 comes from the `sha2` crate, which uses the CPU's SHA
//! instructions where there are some (SHA-NI on `x86_64`, the `ARMv8` crypto extension on aarch64).

use crate::text::hex;
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

/// `(I, N)` of a part's sums file name `SHA256SUMS.part-I-of-N`.
pub fn parse_part_sums_file(name: &str) -> Option<(usize, usize)> {
    let (i, n) = name.strip_prefix(SUMS_FILE)?.strip_prefix(".part-")?.split_once("-of-")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(i) || !digits(n) {
        return None;
    }
    let (i, n) = (i.parse().ok()?, n.parse().ok()?);
    (1..=n).contains(&i).then_some((i, n))
}

/// The SHA-256 of `bytes`, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The SHA-256 of a regular file (never a link followed, never a FIFO waited on), as lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file =
        crate::checkpoint::open_regular(path).with_context(|| format!("{}: cannot read back", path.display()))?;
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

/// Hashes `files` (names in `dir`, in parallel) and writes them as `sums_file` in `dir`; returns
/// (name, hex) sorted by name.
pub fn write_sums(dir: &Path, files: &[String], sums_file: &str) -> Result<Vec<(String, String)>> {
    let mut sums: Vec<(String, String)> =
        files.par_iter().map(|f| Ok((f.clone(), sha256_file(&dir.join(f))?))).collect::<Result<_>>()?;
    sums.sort();
    std::fs::write(dir.join(sums_file), sums_text(&sums))
        .with_context(|| format!("{}: cannot write", dir.join(sums_file).display()))?;
    Ok(sums)
}

/// The text of a sums file: `<hex>  <name>` per (name, hex), in the order given.
pub fn sums_text(sums: &[(String, String)]) -> String {
    sums.iter().flat_map(|(f, h)| [h.as_str(), "  ", f.as_str(), "\n"]).collect()
}

/// The (name, hex) pairs of a sums file's text, or the number of the first line that is not one.
pub fn parse_sums(text: &str) -> Result<Vec<(String, String)>, usize> {
    text.lines()
        .enumerate()
        .map(|(i, line)| match line.split_once("  ") {
            Some((h, name)) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) && !name.is_empty() => {
                Ok((name.to_string(), h.to_ascii_lowercase()))
            }
            _ => Err(i + 1),
        })
        .collect()
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
        assert_eq!(sha256_hex(b"abc"), want);
    }

    #[test]
    fn part_sums_names() {
        assert_eq!(parse_part_sums_file(&part_sums_file(2, 3)), Some((2, 3)));
        for bad in ["SHA256SUMS", "SHA256SUMS.part-0-of-3", "SHA256SUMS.part-4-of-3", "SHA256SUMS.part--of-3"] {
            assert_eq!(parse_part_sums_file(bad), None, "{bad}");
        }
    }
}
