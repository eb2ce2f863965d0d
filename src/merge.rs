//! `escha-convert merge DIR`: the parts of a split job (`--part I/N --checksums`), copied into one
//! directory, checked and joined. Every part must be there once, all made from one input with one
//! set of options (their markers, which fingerprint both, agree), every file the marker lists must
//! be present with its planned size and the checksum its part recorded, and nothing else may be
//! there. Then `SHA256SUMS` is written, the file a one-machine run writes, and the parts' own sums
//! files are removed. Any disagreement fails naming the file and the parts. Merge reads only plain
//! file names in DIR, and only regular files there: a name in the marker or in a part's sums file
//! that is a path, `.` or `..` is an error naming it, before anything is looked at.

use crate::failure::{Classify, ErrorCode};
use crate::output::checksums::{parse_part_sums_file, parse_sums, sha256_file, sums_text, SUMS_FILE};
use crate::output::ours::is_plain_name;
use crate::output::{Marker, MARKER_FILE};
use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// What a merge found and wrote.
#[derive(Clone, Debug, Serialize)]
pub struct MergeReport {
    pub dir: String,
    pub parts: usize,
    /// Files checked and listed in `SHA256SUMS`.
    pub files: usize,
}

pub fn merge(dir: &Path) -> Result<MergeReport> {
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("{shown}: not a directory; pass the directory the parts were copied into"),
        Err(e) => return Err(e).with_context(|| format!("{shown}: cannot read")),
    }
    if std::fs::symlink_metadata(dir.join(MARKER_FILE)).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        bail!(
            "{shown}: the hidden marker file {MARKER_FILE} that every part holds is missing: a copy made with \
             `cp DIR/*` leaves hidden files behind; copy each part with `cp -r PART/. {shown}/` or `cp -a PART/. \
             {shown}/`, which keep it"
        );
    }
    // Every name merge joins to DIR is a plain file name in it: the marker's are checked as it is
    // read, the sums files' as they are parsed, before anything is looked at.
    let marker = Marker::read(dir)?
        .with_context(|| format!("{shown}: no readable {MARKER_FILE}: not an output of escha-convert"))?;
    if !marker.files.contains_key(SUMS_FILE) {
        bail!("{shown}: its parts were converted without --checksums, so nothing proves them; convert them with it");
    }
    // Where SHA256SUMS goes is checked before any file is hashed: a regular file or nothing, in a
    // directory that takes a new file.
    let target = crate::output::file::check_destination(&dir.join(SUMS_FILE), &[])?;
    let sums_files = part_sums_files(dir, &marker)?;
    let count = sums_files.len();
    let recorded = recorded_sums(dir, &sums_files, &marker)?;
    for (name, size) in marker.files.iter().filter(|(n, _)| n.as_str() != SUMS_FILE) {
        if !recorded.contains_key(name) {
            bail!("{shown}: {name} is in no part's checksums: a part is missing it");
        }
        let meta = match std::fs::symlink_metadata(dir.join(name)) {
            Ok(m) if m.is_file() => m,
            Ok(_) => bail!("{shown}: {name} is not a regular file"),
            Err(_) => bail!("{shown}: {name} is missing: copy in the part that wrote it ({})", recorded[name].1),
        };
        if let Some(size) = size.filter(|&s| s != meta.len()) {
            bail!("{shown}: {name} is {} bytes, {size} planned: an incomplete copy?", meta.len());
        }
    }
    let sums: Vec<(String, String)> = recorded
        .par_iter()
        .map(|(name, (hex, part))| {
            let actual = sha256_file(&dir.join(name))?;
            if &actual != hex {
                bail!(
                    "{shown}: {name}: its SHA-256 is not the one {part} recorded (damaged, or copied from another run)"
                );
            }
            Ok((name.clone(), actual))
        })
        .collect::<Result<_>>()?;
    crate::output::file::write_whole(&target, sums_text(&sums).as_bytes())?;
    for (file, _) in &sums_files {
        std::fs::remove_file(dir.join(file))
            .with_context(|| format!("{}: cannot remove", dir.join(file).display()))
            .class(ErrorCode::WriteFailed)?;
    }
    Ok(MergeReport { dir: shown.to_string(), parts: count, files: sums.len() })
}

/// The parts' sums files (name, text), checked to be parts 1 to N of one split; refuses anything
/// in `dir` that no part writes.
fn part_sums_files(dir: &Path, marker: &Marker) -> Result<Vec<(String, String)>> {
    let shown = dir.display();
    let mut parts: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("{shown}: cannot list"))? {
        let name = e.with_context(|| format!("{shown}: cannot list"))?.file_name().to_string_lossy().into_owned();
        match parse_part_sums_file(&name) {
            Some(part) => {
                parts.insert(part, name);
            }
            None if marker.lists(&name) => {}
            None => bail!("{shown}: holds {name:?}, which no part of this output writes"),
        }
    }
    let Some(&(_, count)) = parts.keys().next() else {
        bail!("{shown}: no {SUMS_FILE}.part-I-of-N files: nothing to merge");
    };
    if let Some((_, other)) = parts.keys().find(|(_, n)| *n != count) {
        bail!("{shown}: parts of two different splits (of {count} and of {other}); merge the parts of one run");
    }
    if let Some(missing) = (1..=count).find(|i| !parts.contains_key(&(*i, count))) {
        bail!(
            "{shown}: part {missing} of {count} is missing (no {}); copy it in and merge again",
            crate::output::checksums::part_sums_file(missing, count)
        );
    }
    parts
        .into_values()
        .map(|name| {
            // A regular file in DIR only: never a link followed out of it, never a FIFO waited on.
            let text = crate::checkpoint::read_text(&dir.join(&name))?;
            Ok((name, text))
        })
        .collect()
}

/// Every file's checksum as the parts recorded it: name → (hex, the part's sums file). Refuses a
/// file two parts recorded differently, and one the marker does not list.
fn recorded_sums(
    dir: &Path,
    parts: &[(String, String)],
    marker: &Marker,
) -> Result<BTreeMap<String, (String, String)>> {
    let shown = dir.display();
    let mut recorded: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (file, text) in parts {
        let sums =
            parse_sums(text).map_err(|line| anyhow::anyhow!("{shown}: {file}: line {line} is not a checksum line"))?;
        for (name, hex) in sums {
            if !is_plain_name(&name) {
                bail!("{shown}: {file} lists {name:?}, which is not a file name in {shown}; refusing to follow it");
            }
            if !marker.files.contains_key(&name) {
                bail!("{shown}: {file} lists {name}, which this output does not hold: the part comes from another run");
            }
            match recorded.get(&name) {
                Some((h, first)) if *h != hex => {
                    if name == MARKER_FILE {
                        bail!(
                            "{shown}: {first} and {file} come from different inputs or different options (their \
                             {MARKER_FILE} differ); convert every part from one input with one set of options"
                        );
                    }
                    bail!("{shown}: {name} differs between {first} and {file}: the parts come from different runs");
                }
                Some(_) => {}
                None => {
                    recorded.insert(name, (hex, file.clone()));
                }
            }
        }
    }
    Ok(recorded)
}
