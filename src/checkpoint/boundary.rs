//! IN's boundary. Everything read from a checkpoint (shards, index, config, side files, `mtp/`,
//! or the one file given as IN) must be a regular file inside it. A link is followed one step at a
//! time and every step must stay inside: elsewhere in IN, or, in a Hugging Face cache snapshot
//! (`…/snapshots/<rev>/`), directly inside the same repository's real `blobs/` directory (not a
//! link). Files are opened without following a final link and checked again once open.

use super::regular::kind;
use crate::paths::{parent_dir, physical, physical_destination};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// Links followed from one entry at most (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Where the files of one input checkpoint may live.
#[derive(Clone, Debug)]
pub struct Boundary {
    /// IN (or the directory of a single-file IN), canonical.
    root: PathBuf,
    /// The repository's `blobs/` when IN is a Hugging Face cache snapshot and `blobs/` is a real
    /// directory; canonical.
    blobs: Option<PathBuf>,
    /// Why a snapshot's `blobs/` is not trusted, for messages.
    blobs_refused: Option<String>,
}

impl Boundary {
    /// The boundary of the checkpoint directory `dir`.
    pub fn of_dir(dir: &Path) -> Result<Boundary> {
        let snapshot = super::hub::snapshot_by_path(dir)?;
        let root = dir.canonicalize().with_context(|| format!("{}: cannot resolve", dir.display()))?;
        if snapshot.as_ref().is_some_and(|s| *s != root) {
            bail!(
                "{}: changed while being read (it now resolves to {}); refusing to read it",
                dir.display(),
                root.display()
            );
        }
        let (mut blobs, mut blobs_refused) = (None, None);
        if let Some(repo) = hub_repository(&root) {
            let candidate = repo.join("blobs");
            match std::fs::symlink_metadata(&candidate) {
                Ok(m) if m.is_dir() => blobs = Some(candidate),
                Ok(m) if m.file_type().is_symlink() => {
                    blobs_refused =
                        Some(format!("the repository's {} is a link, which is never followed", candidate.display()));
                }
                _ => {}
            }
        }
        Ok(Boundary { root, blobs, blobs_refused })
    }

    /// The boundary of a single file given as IN: its own directory, with the same rules.
    pub fn of_file(file: &Path) -> Result<Boundary> {
        Boundary::of_dir(parent_dir(file))
    }

    /// The physical places IN occupies: its directory (and a snapshot's `blobs/`), which nothing
    /// this tool writes may overlap.
    pub fn extent(&self) -> Vec<PathBuf> {
        std::iter::once(self.root.clone()).chain(self.blobs.clone()).collect()
    }

    /// The regular file at `path` (an entry of IN), resolved: `None` when nothing is there.
    /// Refused, naming the link and its target: a link with a step out of the boundary, a dangling
    /// link, anything that is not a regular file (directory, FIFO, device, socket).
    pub fn file(&self, path: &Path) -> Result<Option<PathBuf>> {
        let Some(target) = self.resolve(path)? else { return Ok(None) };
        let meta = std::fs::symlink_metadata(&target).with_context(|| format!("{}: cannot read", path.display()))?;
        if !meta.is_file() {
            bail!("{}: {} is not a regular file; refusing to read it", path.display(), kind(&meta));
        }
        Ok(Some(target))
    }

    /// The directory at `path` (an entry of IN, such as `mtp/`), resolved: `None` when nothing is
    /// there.
    pub fn dir(&self, path: &Path) -> Result<Option<PathBuf>> {
        let Some(target) = self.resolve(path)? else { return Ok(None) };
        if !std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            bail!("{}: expected a directory, found something else; refusing to read it", path.display());
        }
        Ok(Some(target))
    }

    /// Where `path` physically is, following its links one step at a time, each step checked to
    /// stay inside the boundary.
    fn resolve(&self, path: &Path) -> Result<Option<PathBuf>> {
        let mut current = path.to_path_buf();
        for _ in 0..MAX_LINKS {
            let meta = match std::fs::symlink_metadata(&current) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && current == path => return Ok(None),
                Err(_) => bail!("{}: a link that does not resolve ({} is missing)", path.display(), current.display()),
            };
            let link = meta.file_type().is_symlink();
            let next = if link {
                let target =
                    std::fs::read_link(&current).with_context(|| format!("{}: cannot read", path.display()))?;
                parent_dir(&current).join(target)
            } else {
                current.clone()
            };
            let step = physical(&next)
                .with_context(|| format!("{}: a link that does not resolve ({})", path.display(), next.display()))?;
            self.check_inside(path, &step, link || current != path)?;
            if !link {
                return Ok(Some(step));
            }
            current = step;
        }
        bail!("{}: more than {MAX_LINKS} links in a row; refusing to read it", path.display())
    }

    /// Refuses `step` (where `path` leads) unless it lies inside IN or directly in the snapshot's
    /// blobs.
    fn check_inside(&self, path: &Path, step: &Path, linked: bool) -> Result<()> {
        let special = ["/proc", "/sys", "/dev"].iter().any(|p| step.starts_with(p));
        let in_blobs = self.blobs.as_deref().is_some_and(|b| step.parent() == Some(b));
        if !special && (step.starts_with(&self.root) || in_blobs) {
            return Ok(());
        }
        let what = if linked { "a link to" } else { "resolves to" };
        let why = self.blobs_refused.as_ref().map_or(String::new(), |r| format!(" ({r})"));
        bail!(
            "{}: {what} {}, outside the checkpoint {}{why}; refusing to read it",
            path.display(),
            step.display(),
            self.root.display()
        )
    }
}

/// Where the checkpoint at `path` physically is: its directory (and a Hub snapshot's `blobs/`), or
/// a single file both where it is named and where its links lead. Nothing this tool writes may
/// overlap it.
pub fn input_extent(path: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).with_context(|| format!("{}: cannot read", path.display()))?;
    if meta.is_dir() {
        return Ok(Boundary::of_dir(path)?.extent());
    }
    let resolved = path.canonicalize().with_context(|| format!("{}: cannot resolve", path.display()))?;
    Ok(vec![physical_destination(path)?, resolved])
}

/// The repository directory of a Hugging Face cache snapshot (`<repo>/snapshots/<rev>`).
fn hub_repository(root: &Path) -> Option<&Path> {
    root.parent().filter(|p| p.file_name().is_some_and(|n| n == "snapshots")).and_then(Path::parent)
}
