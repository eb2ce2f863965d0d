//! The staging directory: output is written to a hidden sibling of OUT and renamed into place at
//! the end, so an interrupted or failed run never leaves something that looks finished.
//!
//! Rules: nothing is created inside IN; OUT is replaced only when it is empty, or holds nothing
//! but what this tool writes and `--force` is given; a second run into the same OUT fails at once
//! (an advisory lock); OUT is checked again at the final rename, so something that appeared during
//! the run is never deleted without `--force`; a staging directory left by a run that was killed
//! is removed by the next run into the same parent.

use super::lock::{sibling_name, OutputLock};
use super::ours::{check_replaceable, first_foreign_entry};
use crate::signals;
use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The tag of a staging directory: `.NAME.partial-PID`.
const PARTIAL: &str = "partial-";

pub struct Staging {
    tmp: PathBuf,
    dest: PathBuf,
    force: bool,
    _lock: OutputLock,
    committed: bool,
}

impl Staging {
    /// Checks that `dest` may be written and locks it, then creates the staging directory beside
    /// it. Stale staging directories it removes are reported in `notes`.
    pub fn prepare(dest: &Path, input: &Path, force: bool, notes: &mut Vec<String>) -> Result<Staging> {
        let Some(name) = dest.file_name() else {
            bail!("{}: not a usable output path", dest.display());
        };
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        check_outside(dest, input)?;
        std::fs::create_dir_all(&parent).with_context(|| format!("{}: cannot create", parent.display()))?;
        let lock = OutputLock::acquire(dest, &parent, name)?;
        check_destination(dest, force)?;
        remove_stale_staging(&parent, notes);
        let tmp = parent.join(sibling_name(name, &format!("{PARTIAL}{}", std::process::id())));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).with_context(|| format!("{}: cannot clear stale staging", tmp.display()))?;
        }
        signals::remove_on_signal(&tmp);
        std::fs::create_dir(&tmp).with_context(|| format!("{}: cannot create", tmp.display()))?;
        Ok(Staging { tmp, dest: dest.to_path_buf(), force, _lock: lock, committed: false })
    }

    /// The checks of [`Staging::prepare`] that need no lock and create nothing: what a dry run
    /// reports.
    pub fn check(dest: &Path, input: &Path, force: bool) -> Result<()> {
        check_outside(dest, input)?;
        check_destination(dest, force)
    }

    /// Where files are written until [`Staging::commit`].
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Moves the finished staging directory to OUT, checking OUT again first.
    pub fn commit(mut self) -> Result<()> {
        let dest = &self.dest;
        let appeared = || {
            format!(
                "{}: something was written there during the run; not replacing it (run again{})",
                dest.display(),
                if self.force { "" } else { ", with --force if it is an earlier output" }
            )
        };
        match std::fs::symlink_metadata(dest) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // rename(2) never replaces a non-empty directory: a race loses with an error.
                std::fs::rename(&self.tmp, dest).map_err(|_| anyhow::anyhow!(appeared()))?;
            }
            Ok(m) if m.is_dir() && std::fs::read_dir(dest)?.next().is_none() => {
                std::fs::rename(&self.tmp, dest).map_err(|_| anyhow::anyhow!(appeared()))?;
            }
            Ok(_) if !self.force => bail!(appeared()),
            Ok(_) => {
                check_replaceable(dest)?;
                let parent = self.tmp.parent().expect("staging has a parent");
                let old = parent
                    .join(sibling_name(dest.file_name().unwrap_or_default(), &format!("old-{}", std::process::id())));
                signals::remove_on_signal(&old);
                std::fs::rename(dest, &old)
                    .with_context(|| format!("{}: cannot move the old output aside", dest.display()))?;
                if let Err(e) = std::fs::rename(&self.tmp, dest) {
                    let _ = std::fs::rename(&old, dest);
                    signals::forget(&old);
                    return Err(e).with_context(|| format!("{}: cannot move output into place", dest.display()));
                }
                std::fs::remove_dir_all(&old)
                    .with_context(|| format!("{}: cannot remove the old output", old.display()))?;
                signals::forget(&old);
            }
            Err(e) => return Err(e).with_context(|| format!("{}: cannot read", dest.display())),
        }
        self.committed = true;
        signals::forget(&self.tmp);
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
            signals::forget(&self.tmp);
        }
    }
}

/// Refuses an OUT that is IN, lies inside it or contains it, before anything is created.
fn check_outside(dest: &Path, input: &Path) -> Result<()> {
    let input_abs = input.canonicalize().with_context(|| format!("{}: cannot resolve", input.display()))?;
    let dest_abs = resolve_to_be(dest)?;
    if dest_abs == input_abs || input_abs.starts_with(&dest_abs) || dest_abs.starts_with(&input_abs) {
        bail!("{}: output overlaps the input {}; choose another place", dest.display(), input.display());
    }
    Ok(())
}

/// The absolute path `path` names, resolving links in the part that exists.
fn resolve_to_be(path: &Path) -> Result<PathBuf> {
    let abs = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir()?.join(path) };
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(base) = existing.canonicalize() {
            return Ok(rest.iter().rev().fold(base, |p, c: &&OsStr| p.join(c)));
        }
        let (Some(parent), Some(last)) = (existing.parent(), existing.file_name()) else {
            return Ok(abs);
        };
        rest.push(last);
        existing = parent;
    }
}

/// Refuses an OUT that exists and may not be replaced.
fn check_destination(dest: &Path, force: bool) -> Result<()> {
    let meta = match std::fs::symlink_metadata(dest) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot look at the output path", dest.display())),
    };
    if meta.is_dir()
        && std::fs::read_dir(dest).with_context(|| format!("{}: cannot list", dest.display()))?.next().is_none()
    {
        return Ok(());
    }
    if !force {
        bail!("{}: already exists and is not empty; pass --force to replace it", dest.display());
    }
    check_replaceable(dest)
}

/// Removes staging directories of runs whose process no longer exists (killed with -9, or by
/// the OOM killer), when they hold nothing but what this tool writes; one holding anything else
/// is kept and named, for its owner to look at.
fn remove_stale_staging(parent: &Path, notes: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.rsplit_once(PARTIAL).and_then(|(_, p)| p.parse::<u32>().ok()) else { continue };
        if !name.starts_with('.') || pid == std::process::id() || process_exists(pid) {
            continue;
        }
        let path = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match first_foreign_entry(&path) {
            Ok(None) if std::fs::remove_dir_all(&path).is_ok() => notes.push(format!(
                "removed {}, a staging directory left by an earlier run (process {pid} no longer exists)",
                path.display()
            )),
            Ok(Some(foreign)) => notes.push(format!(
                "kept {}, named like a staging directory of an earlier run (process {pid} no longer exists): \
                 it holds {foreign:?}, which this tool does not write; remove it yourself if it is not needed",
                path.display()
            )),
            _ => {}
        }
    }
}

fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) }
}
