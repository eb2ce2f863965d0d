//! IN's boundary. Everything read from a checkpoint directory (shards, index, config, side files,
//! `mtp/`) must resolve to a regular file inside it: a link may point elsewhere inside IN, or, in a
//! Hugging Face cache snapshot (`…/snapshots/<rev>/`), into the same repository's `blobs/`, and
//! nowhere else. Files are opened without following a final link and checked again once open.

use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// Where the files of one input checkpoint may live.
#[derive(Clone, Debug)]
pub struct Boundary {
    /// IN, canonical.
    root: PathBuf,
    /// The repository's `blobs/` when IN is a Hugging Face cache snapshot, canonical.
    blobs: Option<PathBuf>,
}

impl Boundary {
    /// The boundary of the checkpoint directory `dir`.
    pub fn of_dir(dir: &Path) -> Result<Boundary> {
        let root = dir.canonicalize().with_context(|| format!("{}: cannot resolve", dir.display()))?;
        let snapshots = root.parent().filter(|p| p.file_name().is_some_and(|n| n == "snapshots"));
        let blobs =
            snapshots.and_then(|s| s.parent()).map(|repo| repo.join("blobs")).and_then(|b| b.canonicalize().ok());
        Ok(Boundary { root, blobs })
    }

    /// The regular file at `path` (an entry of IN), resolved: `None` when nothing is there.
    /// Refused, naming the link and its target: a link out of the boundary, a dangling link,
    /// anything that is not a regular file (directory, FIFO, device, socket).
    pub fn file(&self, path: &Path) -> Result<Option<PathBuf>> {
        let Some(target) = self.resolve(path)? else { return Ok(None) };
        let meta = std::fs::metadata(&target).with_context(|| format!("{}: cannot read", path.display()))?;
        if !meta.is_file() {
            bail!("{}: {} is not a regular file; refusing to read it", path.display(), kind(&meta));
        }
        Ok(Some(target))
    }

    /// The directory at `path` (an entry of IN, such as `mtp/`), resolved: `None` when nothing is
    /// there.
    pub fn dir(&self, path: &Path) -> Result<Option<PathBuf>> {
        let Some(target) = self.resolve(path)? else { return Ok(None) };
        if !target.is_dir() {
            bail!("{}: expected a directory, found something else; refusing to read it", path.display());
        }
        Ok(Some(target))
    }

    /// The canonical target of `path`, checked to lie inside the boundary.
    fn resolve(&self, path: &Path) -> Result<Option<PathBuf>> {
        let link = match std::fs::symlink_metadata(path) {
            Ok(m) => m.file_type().is_symlink(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("{}: cannot read", path.display())),
        };
        let target =
            path.canonicalize().with_context(|| format!("{}: a link that does not resolve", path.display()))?;
        let inside = target.starts_with(&self.root) || self.blobs.as_ref().is_some_and(|b| target.starts_with(b));
        let special = ["/proc", "/sys", "/dev"].iter().any(|p| target.starts_with(p));
        if !inside || special {
            let what = if link { "a link to" } else { "resolves to" };
            bail!(
                "{}: {what} {}, outside the checkpoint {}; refusing to read it",
                path.display(),
                target.display(),
                self.root.display()
            );
        }
        Ok(Some(target))
    }
}

/// Opens a resolved input file for reading, refusing anything but a regular file (checked on the
/// open file, so a swap after `Boundary::file` is caught too).
pub fn open_regular(path: &Path) -> Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Never follow a final link, and never block opening a FIFO.
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let file = options.open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let meta = file.metadata().with_context(|| format!("{}: cannot read", path.display()))?;
    if !meta.is_file() {
        bail!("{}: {} is not a regular file; refusing to read it", path.display(), kind(&meta));
    }
    Ok(file)
}

/// The largest JSON or text file read from IN (an index of a very large model is a few MB).
const MAX_TEXT: u64 = 256 << 20;

/// Reads a whole resolved input file as text.
pub fn read_text(path: &Path) -> Result<String> {
    use std::io::Read;
    let file = open_regular(path)?;
    let len = file.metadata().map_or(0, |m| m.len());
    if len > MAX_TEXT {
        bail!("{}: {len} bytes is too large for a metadata file", path.display());
    }
    let mut text = String::new();
    file.take(MAX_TEXT).read_to_string(&mut text).with_context(|| format!("{}: cannot read", path.display()))?;
    Ok(text)
}

/// What kind of file `meta` describes, for messages.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "it"
    }
}
