//! What this tool writes into OUT: the only entries `--force` may replace, and the test for a
//! left-over staging directory.

use crate::checkpoint::COPIED_FILES;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// Files the tool writes at the top of OUT besides the shards.
const OWN_FILES: &[&str] = &["config.json", "model.safetensors.index.json", "README.md", "SHA256SUMS"];

/// Whether `name` (an entry of OUT, not a directory) is a file this tool writes.
fn own_file(name: &str) -> bool {
    OWN_FILES.contains(&name)
        || COPIED_FILES.contains(&name)
        || name.starts_with("SHA256SUMS.part-")
        || is_shard_name(name)
}

/// `model-00001-of-00003.safetensors`.
fn is_shard_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("model-").and_then(|r| r.strip_suffix(".safetensors")) else { return false };
    let Some((i, n)) = rest.split_once("-of-") else { return false };
    [i, n].iter().all(|s| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit()))
}

/// The first entry of directory `dir` this tool would not have written, if any (`mtp/` may hold
/// the same files).
pub fn first_foreign_entry(dir: &Path) -> Result<Option<String>> {
    foreign_in(dir, true)
}

fn foreign_in(dir: &Path, top: bool) -> Result<Option<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("{}: cannot list", dir.display()))? {
        let e = e.with_context(|| format!("{}: cannot list", dir.display()))?;
        names.push((e.file_name().to_string_lossy().into_owned(), e.file_type()?));
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, kind) in names {
        let ok = if kind.is_dir() {
            top && name == "mtp" && foreign_in(&dir.join(&name), false)?.is_none()
        } else {
            kind.is_file() && own_file(&name)
        };
        if !ok {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// Checks that OUT may be replaced by `--force`: a directory holding only what this tool writes.
pub fn check_replaceable(dest: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(dest)?;
    if !meta.is_dir() {
        bail!("{}: exists and is not a directory this tool wrote; not replacing it, even with --force", dest.display());
    }
    if let Some(name) = first_foreign_entry(dest)? {
        bail!(
            "{}: holds {name:?}, which this tool does not write; --force replaces only an earlier output of escha-convert",
            dest.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_names() {
        assert!(is_shard_name("model-00001-of-00012.safetensors"));
        assert!(!is_shard_name("model-1-of-2.safetensors"));
        assert!(!is_shard_name("model.safetensors"));
        assert!(own_file("tokenizer.json") && own_file("SHA256SUMS.part-2-of-3") && own_file("README.md"));
        assert!(!own_file("main.rs") && !own_file(".git"));
    }
}
