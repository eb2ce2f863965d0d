//! The staging directory: output is written to a hidden sibling of OUT and renamed into place at
//! the end, so an interrupted or failed run never leaves something that looks finished.
//!
//! Rules: OUT is resolved to where it physically is (links followed, `..` applied) before anything
//! is created, and refused when it overlaps an input; OUT is checked and locked ([`Claim`]) before
//! any weight is decoded, so a refused OUT costs no work; OUT is replaced only when it is empty, or
//! when `--force` is given and its marker shows that this tool wrote everything in it; a second
//! run into the same OUT fails at once (an advisory lock); OUT is checked again at the final
//! rename, so something that appeared during the run is never deleted without `--force`, and the
//! swap of an old output for the new one is never cut in half by a signal; a staging directory
//! left by a killed run is removed by a later run only when its lock is free and its marker shows
//! it is ours. OUT that is a mount point is worked on from inside (`inplace.rs`): a staging
//! directory beside it would be on another file system, and the mount point cannot be renamed.

use super::inplace::{self, is_working_entry, INSIDE};
use super::lock::{sibling_name, OutputLock};
use super::ours::{check_replaceable, check_replaceable_but, first_foreign_entry, MARKER_FILE};
use super::writable::cannot_create;
use crate::failure::{Classify, ErrorCode};
use crate::paths::{overlaps, physical_destination};
use crate::signals;
use crate::warning::{Warning, WarningCode};
use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The tag of a staging directory: `.NAME.partial-PID`.
const PARTIAL: &str = "partial-";

pub struct Staging {
    tmp: PathBuf,
    /// OUT where it physically is, and as the user spelled it (for messages).
    dest: PathBuf,
    shown: PathBuf,
    force: bool,
    /// OUT is a mount point: the staging directory is inside it ([`inplace`]).
    inside: bool,
    _lock: OutputLock,
    committed: bool,
}

/// Where OUT is and what it must not touch.
pub struct Destination<'a> {
    /// OUT as the user gave it.
    pub path: &'a Path,
    /// The physical places of the inputs (IN, BASE), which OUT must not overlap.
    pub inputs: &'a [PathBuf],
    pub force: bool,
}

/// OUT checked and locked for this run, before any work: the staging directory comes later.
pub struct Claim {
    dest: PathBuf,
    shown: PathBuf,
    force: bool,
    inside: bool,
    lock: OutputLock,
}

impl Claim {
    /// Checks that OUT may be written and locks it (creating OUT's parent if needed). Taken before
    /// any weight is decoded, so that a refused OUT or a second run into it fails at once.
    pub fn take(out: &Destination) -> Result<Claim> {
        let dest = resolve(out)?;
        let (parent, name) = split(&dest, out.path)?;
        let inside = inplace::is_mount_point(&dest);
        let lock = if inside {
            // Everything this run creates stays on OUT's own file system.
            check_destination(&dest, out, inside)?;
            OutputLock::acquire(out.path, &dest, OsStr::new(INSIDE))?
        } else {
            std::fs::create_dir_all(parent).map_err(|e| cannot_create(parent, "OUT's parent directory", e))?;
            OutputLock::acquire(out.path, parent, name)?
        };
        check_destination(&dest, out, inside)?;
        Ok(Claim { dest, shown: out.path.to_path_buf(), force: out.force, inside, lock })
    }
}

impl Staging {
    /// Creates the staging directory beside the claimed OUT, holding `marker` (the text of
    /// [`MARKER_FILE`]), after checking OUT again. Stale staging directories it removes or keeps
    /// are reported in `notes`.
    pub fn prepare(claim: Claim, marker: &str, notes: &mut Vec<Warning>) -> Result<Staging> {
        let Claim { dest, shown, force, inside, lock } = claim;
        let (parent, name) = if inside { (dest.as_path(), OsStr::new(INSIDE)) } else { split(&dest, &shown)? };
        // Something may have appeared at OUT since the claim; the final rename checks once more.
        let out = Destination { path: &shown, inputs: &[], force };
        check_destination(&dest, &out, inside)?;
        let own = sibling_name(name, "");
        remove_stale_staging(parent, &own, notes);
        let tmp = parent.join(sibling_name(name, &format!("{PARTIAL}{}", std::process::id())));
        signals::remove_on_signal(&tmp);
        // create_dir fails on anything already there: a staging directory is always new.
        std::fs::create_dir(&tmp).map_err(|e| cannot_create(&tmp, "the staging directory", e))?;
        let staging = Staging { tmp, dest, shown, force, inside, _lock: lock, committed: false };
        let marker_path = staging.tmp.join(MARKER_FILE);
        std::fs::write(&marker_path, marker)
            .with_context(|| format!("{}: cannot write", marker_path.display()))
            .class(ErrorCode::WriteFailed)?;
        Ok(staging)
    }

    /// The checks of [`Claim::take`] that need no lock and create nothing: what a dry run
    /// reports.
    pub fn check(out: &Destination) -> Result<()> {
        let dest = resolve(out)?;
        check_destination(&dest, out, inplace::is_mount_point(&dest))
    }

    /// Where files are written until [`Staging::commit`].
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Moves the finished staging directory to OUT, checking OUT again first.
    pub fn commit(mut self) -> Result<()> {
        if self.inside {
            self.commit_inside()?;
            self.committed = true;
            signals::forget(&self.tmp);
            return Ok(());
        }
        let (dest, shown) = (&self.dest, &self.shown);
        let appeared = || {
            format!(
                "{}: something was written there during the run; not replacing it (run again{})",
                shown.display(),
                if self.force { "" } else { ", with --force if it is an earlier output" }
            )
        };
        // A signal that arrived before the rename ends the run (the staging is removed); one after
        // it finds the run succeeded.
        let move_in =
            || signals::put_in_place(|| std::fs::rename(&self.tmp, dest).map_err(|_| anyhow::anyhow!(appeared())));
        match std::fs::symlink_metadata(dest) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // rename(2) never replaces a non-empty directory: a race loses with an error.
                move_in()?;
            }
            Ok(m) if m.is_dir() && std::fs::read_dir(dest)?.next().is_none() => move_in()?,
            Ok(_) if !self.force => bail!(appeared()),
            Ok(_) => {
                check_replaceable(dest, shown)?;
                self.swap()?;
            }
            Err(e) => return Err(e).with_context(|| format!("{}: cannot read", shown.display())),
        }
        self.committed = true;
        signals::forget(&self.tmp);
        Ok(())
    }

    /// Replaces the old output at OUT with the staging directory: the old one is moved aside, the
    /// new one moved in, then the old one removed. A signal arriving during the two renames waits
    /// for them, and they are then undone, so an interrupted run leaves the old output in place.
    /// Once the new output is in place the run has succeeded: the old one is removed whatever
    /// signal comes.
    fn swap(&self) -> Result<()> {
        let parent = self.tmp.parent().expect("staging has a parent");
        let old = parent
            .join(sibling_name(self.dest.file_name().unwrap_or_default(), &format!("old-{}", std::process::id())));
        if std::fs::symlink_metadata(&old).is_ok() {
            bail!("{}: in the way of replacing {}; remove it first", old.display(), self.shown.display());
        }
        let swapped = signals::uninterrupted(|| -> Result<bool> {
            if signals::interrupted() {
                return Ok(false);
            }
            std::fs::rename(&self.dest, &old)
                .with_context(|| format!("{}: cannot move the old output aside", self.shown.display()))?;
            signals::pause_point("swap");
            if let Err(e) = std::fs::rename(&self.tmp, &self.dest) {
                let _ = std::fs::rename(&old, &self.dest);
                return Err(e).with_context(|| format!("{}: cannot move output into place", self.shown.display()));
            }
            if signals::interrupted() {
                // Put the old output back; the signal's handler then removes the staging directory.
                std::fs::rename(&self.dest, &self.tmp).and_then(|()| std::fs::rename(&old, &self.dest)).with_context(
                    || format!("{}: interrupted, and cannot put the old output back", self.shown.display()),
                )?;
                return Ok(false);
            }
            signals::remove_leftover_on_signal(&old);
            signals::output_in_place();
            Ok(true)
        })?;
        if !swapped {
            signals::await_interruption();
        }
        signals::pause_point("in_place");
        std::fs::remove_dir_all(&old)
            .with_context(|| {
                format!(
                    "{}: cannot remove the old output (the new one is in place at {})",
                    old.display(),
                    self.shown.display()
                )
            })
            .class(ErrorCode::WriteFailed)?;
        signals::forget(&old);
        Ok(())
    }
}

impl Staging {
    /// Puts the output in place inside OUT, a mount point: an old output's entries (with
    /// `--force`) are set aside in `.escha-convert.old-PID`, then the staging directory's entries
    /// are renamed into OUT, the marker first (so that whatever is there is listed) and
    /// config.json last (what a client opens first). A signal during the moves waits for them and
    /// then has them undone, so an interrupted run leaves OUT as it was.
    fn commit_inside(&self) -> Result<()> {
        let (dest, shown) = (&self.dest, &self.shown);
        let old_entries = inplace::output_entries(dest)?;
        if !old_entries.is_empty() {
            if !self.force {
                bail!(
                    "{}: something was written there during the run; not replacing it (run again, with --force if it \
                     is an earlier output)",
                    shown.display()
                );
            }
            check_replaceable_but(dest, shown, is_working_entry)?;
        }
        let old = dest.join(sibling_name(OsStr::new(INSIDE), &format!("old-{}", std::process::id())));
        let order = |name: &OsStr| match name.to_str() {
            Some(MARKER_FILE) => 0,
            Some("config.json") => 2,
            _ => 1,
        };
        let placed = signals::uninterrupted(|| -> Result<bool> {
            if signals::interrupted() {
                return Ok(false);
            }
            let mut set_aside = Vec::new();
            if !old_entries.is_empty() {
                std::fs::create_dir(&old).map_err(|e| cannot_create(&old, "a place for the old output", e))?;
                signals::remove_leftover_on_signal(&old);
                set_aside = move_but_working(dest, &old)?;
            }
            let moved = match inplace::move_entries(&self.tmp, dest, order) {
                Ok(moved) => moved,
                Err(e) => {
                    inplace::move_back(&set_aside, dest, &old);
                    return Err(e).with_context(|| format!("{}: cannot move the output into place", shown.display()));
                }
            };
            if signals::interrupted() {
                inplace::move_back(&moved, &self.tmp, dest);
                inplace::move_back(&set_aside, dest, &old);
                return Ok(false);
            }
            signals::output_in_place();
            Ok(true)
        })?;
        if !placed {
            signals::await_interruption();
        }
        signals::pause_point("in_place");
        let _ = std::fs::remove_dir(&self.tmp);
        if std::fs::symlink_metadata(&old).is_ok() {
            std::fs::remove_dir_all(&old)
                .with_context(|| {
                    format!(
                        "{}: cannot remove the old output (the new one is in place at {})",
                        old.display(),
                        shown.display()
                    )
                })
                .class(ErrorCode::WriteFailed)?;
            signals::forget(&old);
        }
        Ok(())
    }
}

/// Moves every entry of OUT but the working entries into `old`; on a failure, moves them back.
fn move_but_working(dest: &Path, old: &Path) -> Result<Vec<PathBuf>> {
    let mut moved = Vec::new();
    for path in inplace::output_entries(dest)? {
        let name = PathBuf::from(path.file_name().unwrap_or_default());
        if let Err(e) = std::fs::rename(&path, old.join(&name)) {
            inplace::move_back(&moved, dest, old);
            return Err(e).with_context(|| format!("{}: cannot move the old output aside", path.display()));
        }
        moved.push(name);
    }
    Ok(moved)
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
            signals::forget(&self.tmp);
        }
    }
}

/// Where OUT physically is, refused when it overlaps an input: checked before anything is created,
/// so nothing is ever made inside IN, whatever links or `..` OUT is spelled with.
fn resolve(out: &Destination) -> Result<PathBuf> {
    let dest = physical_destination(out.path)?;
    if let Some(input) = out.inputs.iter().find(|i| overlaps(&dest, i)) {
        bail!("{}: output overlaps the input {}; choose another place", out.path.display(), input.display());
    }
    Ok(dest)
}

/// OUT's directory and name.
fn split<'a>(dest: &'a Path, shown: &Path) -> Result<(&'a Path, &'a OsStr)> {
    match (dest.parent(), dest.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name)),
        _ => bail!("{}: not a usable output path", shown.display()),
    }
}

/// Refuses an OUT that exists and may not be replaced. Inside an OUT that is a mount point
/// (`inside`), a run's working entries are not part of it, and a read-only one is refused.
fn check_destination(dest: &Path, out: &Destination, inside: bool) -> Result<()> {
    let meta = match std::fs::symlink_metadata(dest) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot look at the output path", out.path.display())),
    };
    if !meta.is_dir() {
        // Empty or not, a file is not an output directory, and --force never replaces one.
        let what = match meta.len() {
            _ if !meta.is_file() => crate::checkpoint::file_kind(&meta),
            0 => "an empty file",
            _ => "a file",
        };
        bail!(
            "{}: is {what}, not a directory; OUT is the directory the output goes into: remove it or choose another \
             path",
            out.path.display()
        );
    }
    if inside {
        inplace::check_writable(dest, out.path)?;
        if inplace::output_entries(dest)?.is_empty() {
            return Ok(());
        }
    } else if std::fs::read_dir(dest).with_context(|| format!("{}: cannot list", out.path.display()))?.next().is_none()
    {
        return Ok(());
    }
    if !out.force {
        bail!("{}: already exists and is not empty; pass --force to replace it", out.path.display());
    }
    if inside {
        return check_replaceable_but(dest, out.path, is_working_entry);
    }
    check_replaceable(dest, out.path)
}

/// Removes staging directories (`.NAME.partial-*`) that no live run owns: their lock
/// (`.NAME.lock`) is free, or is this run's own (`own`: `.NAME.` of this OUT). A process id says
/// nothing on shared storage, where the writer may be another container or host; the lock does.
/// One whose marker does not account for everything in it is kept and named.
fn remove_stale_staging(parent: &Path, own: &str, notes: &mut Vec<Warning>) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((prefix, _)) = name.rsplit_once(PARTIAL).filter(|(p, _)| p.starts_with('.') && p.ends_with('.'))
        else {
            continue;
        };
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        // Held for the removal: no run can start writing there meanwhile.
        let _lock = if prefix == own {
            None
        } else {
            match OutputLock::try_lock(&parent.join(format!("{prefix}lock"))) {
                Ok(Some(lock)) => Some(lock),
                _ => continue, // a live run's (or a lock we may not touch)
            }
        };
        let path = e.path();
        match first_foreign_entry(&path) {
            Ok(None) if std::fs::remove_dir_all(&path).is_ok() => notes.push(Warning::new(
                WarningCode::StaleStagingRemoved,
                format!(
                    "removed {}, a staging directory left by an earlier run (no run holds its lock)",
                    path.display()
                ),
            )),
            Ok(Some(foreign)) => notes.push(Warning::new(
                WarningCode::StaleStagingKept,
                format!(
                "kept {}, named like a staging directory of an earlier run: it {foreign}; remove it yourself if it is \
                 not needed",
                path.display()
            ),
            )),
            _ => {}
        }
    }
}
