//! One output file written whole (the verify page, a merged `SHA256SUMS`): checked before any
//! work, written to a temporary sibling and renamed into place, so it is never half-written and
//! never lands on something that is not a regular file.

use crate::checkpoint::file_kind;
use crate::failure::{Classify, ErrorCode};
use crate::paths::{overlaps, parent_dir, physical_destination};
use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Checks that `path` may receive a file: where it physically is lies outside `inputs` (the
/// physical places of IN and BASE), it is a regular file or absent (never a link, device, FIFO or
/// directory), and its directory takes a new file. Returns the physical path to write. A refusal
/// is the output's (`output_refused`).
pub fn check_destination(path: &Path, inputs: &[PathBuf]) -> Result<PathBuf> {
    checked_destination(path, inputs).class(ErrorCode::OutputRefused)
}

fn checked_destination(path: &Path, inputs: &[PathBuf]) -> Result<PathBuf> {
    let target = physical_destination(path)?;
    if target.file_name().is_none() {
        bail!("{}: not a file name", path.display());
    }
    if let Some(input) = inputs.iter().find(|i| overlaps(&target, i)) {
        bail!("{}: lies in the input {}; choose another place", path.display(), input.display());
    }
    match std::fs::symlink_metadata(&target) {
        Ok(m) if !m.is_file() => {
            bail!("{}: {} is there; only a regular file is ever replaced", path.display(), file_kind(&m))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("{}: cannot look at it", path.display())),
    }
    // A probe now rather than a failure after the work: the directory must take a new file.
    let probe = temporary(&target);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .with_context(|| format!("{}: cannot create a file there", parent_dir(&target).display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(target)
}

/// Writes `bytes` to `target` (checked by [`check_destination`]): a temporary sibling, flushed,
/// then renamed over it; refused if something other than a regular file appeared there meanwhile.
pub fn write_whole(target: &Path, bytes: &[u8]) -> Result<()> {
    if let Ok(m) = std::fs::symlink_metadata(target) {
        if !m.is_file() {
            return Err(anyhow!("{}: {} appeared there; not replacing it", target.display(), file_kind(&m)))
                .class(ErrorCode::OutputRefused);
        }
    }
    let tmp = temporary(target);
    crate::signals::remove_on_signal(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| crate::signals::put_in_place(|| std::fs::rename(&tmp, target)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    crate::signals::forget(&tmp);
    written.with_context(|| format!("{}: cannot write", target.display())).class(ErrorCode::WriteFailed)
}

/// The hidden sibling a file is written to before it is renamed into place.
fn temporary(target: &Path) -> PathBuf {
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    parent_dir(target).join(format!(".{name}.{}.tmp", std::process::id()))
}
