//! What this tool wrote, proven rather than guessed from names: every output carries a marker,
//! `.escha-convert.json`, written into the staging directory before anything else. It records the
//! tool, a fingerprint of the input and of the options that shaped the output, and every file the
//! complete output holds (the shards with their planned sizes). `--force` replaces, and the
//! stale-staging cleanup removes, only a directory whose every entry its marker lists; `merge`
//! checks the parts of a split job against it.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The marker's file name in OUT.
pub const MARKER_FILE: &str = ".escha-convert.json";
/// The tool name the marker and the model card's tags carry.
pub const TOOL: &str = "escha-convert";

/// Where an output comes from, and what it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub tool: String,
    pub version: String,
    /// SHA-256 (hex) of the input's shard headers, sizes and sampled bytes, and its config.
    pub input: String,
    /// SHA-256 (hex) of the options that shape the output bytes.
    pub options: String,
    /// Every file of the complete output (all parts), the marker included: name and, for a
    /// shard, its size.
    pub files: BTreeMap<String, Option<u64>>,
}

impl Marker {
    pub fn new(input: String, options: String, files: BTreeMap<String, Option<u64>>) -> Marker {
        Marker { tool: TOOL.into(), version: env!("CARGO_PKG_VERSION").into(), input, options, files }
    }

    pub fn to_text(&self) -> String {
        crate::json::to_text(&serde_json::to_value(self).expect("a marker serialises"), 2)
    }

    /// The marker of directory `dir`, if it has one that parses.
    pub fn read(dir: &Path) -> Option<Marker> {
        let path = dir.join(MARKER_FILE);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if !meta.is_file() || meta.len() > 64 << 20 {
            return None;
        }
        serde_json::from_slice::<Marker>(&std::fs::read(path).ok()?).ok().filter(|m| m.tool == TOOL)
    }

    /// Whether `name` (a file at the top of an output) is one the marker accounts for: a listed
    /// file, or a part's checksum file of a run that writes checksums.
    pub fn lists(&self, name: &str) -> bool {
        self.files.contains_key(name)
            || (self.files.contains_key(super::checksums::SUMS_FILE)
                && super::checksums::parse_part_sums_file(name).is_some())
    }
}

/// An entry of a directory that this tool did not write.
#[derive(Debug, PartialEq, Eq)]
pub struct Foreign {
    pub name: String,
    /// The directory has no marker at all.
    pub unmarked: bool,
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        if self.unmarked {
            write!(f, "holds {:?} and no {MARKER_FILE}, so nothing shows that this tool wrote it", self.name)
        } else {
            write!(f, "holds {:?}, which this tool did not write", self.name)
        }
    }
}

/// The first entry of directory `dir` this tool did not write, if any, judged by the marker in it:
/// an entry it does not list, any directory, link or special file. Without a marker every entry
/// is foreign (an empty directory holds nothing foreign).
pub fn first_foreign_entry(dir: &Path) -> Result<Option<Foreign>> {
    let marker = Marker::read(dir);
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("{}: cannot list", dir.display()))? {
        let e = e.with_context(|| format!("{}: cannot list", dir.display()))?;
        let regular = e.file_type().is_ok_and(|t| t.is_file());
        names.push((e.file_name().to_string_lossy().into_owned(), regular));
    }
    names.sort();
    let ours = |(name, regular): &(String, bool)| *regular && marker.as_ref().is_some_and(|m| m.lists(name));
    Ok(names.into_iter().find(|e| !ours(e)).map(|(name, _)| Foreign { name, unmarked: marker.is_none() }))
}

/// Checks that OUT (at `dest`, spelled `shown`) may be replaced by `--force`: a directory whose
/// marker lists everything in it.
pub fn check_replaceable(dest: &Path, shown: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(dest).with_context(|| format!("{}: cannot read", shown.display()))?;
    if !meta.is_dir() {
        bail!(
            "{}: exists and is not a directory this tool wrote; not replacing it, even with --force",
            shown.display()
        );
    }
    if let Some(foreign) = first_foreign_entry(dest)? {
        bail!(
            "{}: {foreign}; --force replaces only an earlier output of escha-convert (one written by a version \
             without the marker must be removed by hand)",
            shown.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_marked_directory_is_ours() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(first_foreign_entry(dir.path()).unwrap(), None, "an empty directory holds nothing foreign");
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        assert!(first_foreign_entry(dir.path()).unwrap().unwrap().unmarked);
        let files = [("config.json", None), (MARKER_FILE, None), ("SHA256SUMS", None)];
        let marker = Marker::new("i".into(), "o".into(), files.iter().map(|(n, s)| ((*n).into(), *s)).collect());
        std::fs::write(dir.path().join(MARKER_FILE), marker.to_text()).unwrap();
        assert_eq!(first_foreign_entry(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join("SHA256SUMS.part-2-of-3"), "").unwrap();
        assert_eq!(first_foreign_entry(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join("model-00001-of-00001.safetensors"), "").unwrap();
        let foreign = first_foreign_entry(dir.path()).unwrap().unwrap();
        assert_eq!((foreign.name.as_str(), foreign.unmarked), ("model-00001-of-00001.safetensors", false));
        assert_eq!(Marker::read(dir.path()), Some(marker));
    }
}
