//! What this tool wrote, proven rather than guessed from names: every output carries a marker,
//! `.escha-convert.json`, written into the staging directory before anything else. It records the
//! tool, a fingerprint of the input and of the options that shaped the output, and every file the
//! complete output holds (the shards with their planned sizes). `--force` replaces, and the
//! stale-staging cleanup removes, only a directory whose every entry its marker lists; `merge`
//! checks the parts of a split job against it. Every name a marker lists is a plain file name in
//! its directory (no separator, not `.` or `..`, not empty, no NUL): a marker listing any other
//! name proves nothing, so nothing that follows a marker's names ever leaves the directory.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The marker's file name in OUT.
pub const MARKER_FILE: &str = ".escha-convert.json";
/// The tool name the marker and the model card's tags carry.
pub const TOOL: &str = "escha-convert";
/// The largest marker read (one of a very large model lists a few thousand files).
const MAX_MARKER: u64 = 64 << 20;

/// Whether `name` names an entry directly inside a directory, and nothing else: not empty, not
/// `.` or `..`, no separator (so not absolute), no NUL. The only names a marker or a sums file
/// may give, so that what is joined to a directory stays in it.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

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

/// A marker that lists a name which is not a plain file name: it proves nothing, and nothing may
/// follow its names.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: lists {name:?}, which is not a file name in its directory (a path, `.`, `..` or empty); not a marker \
     this tool wrote",
    marker.display()
)]
pub struct BadMarker {
    /// The marker file.
    pub marker: PathBuf,
    /// The name it lists.
    pub name: String,
}

impl Marker {
    pub fn new(input: String, options: String, files: BTreeMap<String, Option<u64>>) -> Marker {
        Marker { tool: TOOL.into(), version: env!("CARGO_PKG_VERSION").into(), input, options, files }
    }

    pub fn to_text(&self) -> String {
        crate::json::to_text(&serde_json::to_value(self).expect("a marker serialises"), 2)
    }

    /// The marker of directory `dir`: `None` when it has none this tool wrote (absent, not a
    /// regular file, too large, not parsing, another tool's). A marker that lists a name which is
    /// not a plain file name in `dir` ([`is_plain_name`]) is an error naming it: nothing that
    /// follows a marker's names may leave `dir`.
    pub fn read(dir: &Path) -> Result<Option<Marker>, BadMarker> {
        use std::io::Read;
        let path = dir.join(MARKER_FILE);
        // Never a link, never a FIFO: only a regular file in `dir` is read.
        let Ok(file) = crate::checkpoint::open_regular(&path) else { return Ok(None) };
        if !file.metadata().is_ok_and(|m| m.len() <= MAX_MARKER) {
            return Ok(None);
        }
        let mut bytes = Vec::new();
        if file.take(MAX_MARKER).read_to_end(&mut bytes).is_err() {
            return Ok(None);
        }
        let Some(marker) = serde_json::from_slice::<Marker>(&bytes).ok().filter(|m| m.tool == TOOL) else {
            return Ok(None);
        };
        match marker.files.keys().find(|n| !is_plain_name(n)) {
            Some(name) => Err(BadMarker { marker: path, name: name.clone() }),
            None => Ok(Some(marker)),
        }
    }

    /// Whether `name` (a file at the top of an output) is one the marker accounts for: a listed
    /// file, or a part's checksum file of a run that writes checksums.
    pub fn lists(&self, name: &str) -> bool {
        self.files.contains_key(name)
            || (self.files.contains_key(super::checksums::SUMS_FILE)
                && super::checksums::parse_part_sums_file(name).is_some())
    }
}

/// An entry of a directory that this tool did not write, or a marker that proves nothing.
#[derive(Debug, PartialEq, Eq)]
pub struct Foreign {
    pub name: String,
    pub why: Why,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Why {
    /// The directory has no marker at all.
    Unmarked,
    /// The marker does not list the entry (or the entry is a directory, link or special file).
    Unlisted,
    /// The marker lists `name`, which is not a plain file name: no marker this tool wrote.
    BadMarker,
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self.why {
            Why::Unmarked => {
                write!(f, "holds {:?} and no {MARKER_FILE}, so nothing shows that this tool wrote it", self.name)
            }
            Why::Unlisted => write!(f, "holds {:?}, which this tool did not write", self.name),
            Why::BadMarker => write!(
                f,
                "has a {MARKER_FILE} listing {:?}, which is not a file name in it, so nothing shows that this tool \
                 wrote it",
                self.name
            ),
        }
    }
}

/// The first entry of directory `dir` this tool did not write, if any, judged by the marker in it:
/// an entry it does not list, any directory, link or special file. Without a marker every entry
/// is foreign (an empty directory holds nothing foreign); a marker listing a name that is not a
/// plain file name proves nothing, and is named itself.
pub fn first_foreign_entry(dir: &Path) -> Result<Option<Foreign>> {
    first_foreign_entry_but(dir, |_| false)
}

/// [`first_foreign_entry`], the entries named so that `skip` holds left out (a run's working
/// entries inside an OUT that is a mount point).
pub fn first_foreign_entry_but(dir: &Path, skip: impl Fn(&str) -> bool) -> Result<Option<Foreign>> {
    let marker = match Marker::read(dir) {
        Ok(marker) => marker,
        Err(BadMarker { name, .. }) => return Ok(Some(Foreign { name, why: Why::BadMarker })),
    };
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("{}: cannot list", dir.display()))? {
        let e = e.with_context(|| format!("{}: cannot list", dir.display()))?;
        let regular = e.file_type().is_ok_and(|t| t.is_file());
        let name = e.file_name().to_string_lossy().into_owned();
        if !skip(&name) {
            names.push((name, regular));
        }
    }
    names.sort();
    let ours = |(name, regular): &(String, bool)| *regular && marker.as_ref().is_some_and(|m| m.lists(name));
    let why = if marker.is_none() { Why::Unmarked } else { Why::Unlisted };
    Ok(names.into_iter().find(|e| !ours(e)).map(|(name, _)| Foreign { name, why }))
}

/// Checks that OUT (at `dest`, spelled `shown`) may be replaced by `--force`: a directory whose
/// marker lists everything in it.
pub fn check_replaceable(dest: &Path, shown: &Path) -> Result<()> {
    check_replaceable_but(dest, shown, |_| false)
}

/// [`check_replaceable`], the entries named so that `skip` holds left out.
pub fn check_replaceable_but(dest: &Path, shown: &Path, skip: impl Fn(&str) -> bool) -> Result<()> {
    let meta = std::fs::symlink_metadata(dest).with_context(|| format!("{}: cannot read", shown.display()))?;
    if !meta.is_dir() {
        bail!(
            "{}: exists and is not a directory this tool wrote; not replacing it, even with --force",
            shown.display()
        );
    }
    if let Some(foreign) = first_foreign_entry_but(dest, skip)? {
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
        assert_eq!(first_foreign_entry(dir.path()).unwrap().unwrap().why, Why::Unmarked);
        let files = [("config.json", None), (MARKER_FILE, None), ("SHA256SUMS", None)];
        let marker = Marker::new("i".into(), "o".into(), files.iter().map(|(n, s)| ((*n).into(), *s)).collect());
        std::fs::write(dir.path().join(MARKER_FILE), marker.to_text()).unwrap();
        assert_eq!(first_foreign_entry(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join("SHA256SUMS.part-2-of-3"), "").unwrap();
        assert_eq!(first_foreign_entry(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join("model-00001-of-00001.safetensors"), "").unwrap();
        let foreign = first_foreign_entry(dir.path()).unwrap().unwrap();
        assert_eq!((foreign.name.as_str(), foreign.why), ("model-00001-of-00001.safetensors", Why::Unlisted));
        assert_eq!(Marker::read(dir.path()).unwrap(), Some(marker));
    }

    #[test]
    fn a_marker_naming_anything_but_a_file_in_its_directory_proves_nothing() {
        for bad in ["/etc/passwd", "../outside", "sub/dir", ".", "..", "", "a\0b"] {
            assert!(!is_plain_name(bad), "{bad:?}");
            let dir = tempfile::tempdir().unwrap();
            let files = [(MARKER_FILE, None), ("config.json", None), (bad, Some(3))];
            let marker = Marker::new("i".into(), "o".into(), files.iter().map(|(n, s)| ((*n).into(), *s)).collect());
            std::fs::write(dir.path().join(MARKER_FILE), marker.to_text()).unwrap();
            let e = Marker::read(dir.path()).unwrap_err();
            assert_eq!(e.name, bad);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
            let foreign = first_foreign_entry(dir.path()).unwrap().unwrap();
            assert_eq!((foreign.name.as_str(), foreign.why), (bad, Why::BadMarker));
        }
        for good in ["config.json", ".escha-convert.json", "...", "a b", "SHA256SUMS.part-1-of-2"] {
            assert!(is_plain_name(good), "{good:?}");
        }
    }
}
