//! Opening a resolved input file: a regular file or nothing, checked on the open file, and text
//! files read within a bound. The boundary (`boundary.rs`) decides which paths may be opened; the
//! Hub cache (`hub.rs`) opens its refs the same way.

use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::path::Path;

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
pub fn kind(meta: &std::fs::Metadata) -> &'static str {
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
        if t.is_symlink() {
            return "a link";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "it"
    }
}
