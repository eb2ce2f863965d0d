//! An advisory lock on OUT, held for the whole run: a second run into the same OUT fails at once
//! instead of racing the first to the final rename.

use super::writable::cannot_create;
use crate::checkpoint::file_kind as kind;
use crate::signals;
use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// A hidden sibling of OUT named after it: `.NAME.TAG`, kept within the file-name limit for any
/// valid NAME (a long name is cut and a hash of the whole name keeps it unique). The `.NAME.` part
/// is the same for every tag of at most [`MAX_TAG`] bytes, so a staging directory names its lock.
pub fn sibling_name(name: &OsStr, tag: &str) -> String {
    const KEEP: usize = 150;
    debug_assert!(tag.len() <= MAX_TAG, "{tag}");
    let name = name.to_string_lossy();
    if name.len() + MAX_TAG + 2 <= 255 {
        return format!(".{name}.{tag}");
    }
    let mut cut = KEEP;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    // FNV-1a: stable across builds, so two runs agree on the name.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!(".{}~{hash:016x}.{tag}", &name[..cut])
}

/// The longest tag of a sibling (`partial-` and a process id).
const MAX_TAG: usize = 24;

/// The lock file `.NAME.lock` beside OUT, locked with `flock`; removed when dropped.
pub struct OutputLock {
    path: PathBuf,
    _file: File,
}

impl OutputLock {
    /// Locks OUT (`dest`, named `name` in `parent`) for this run; fails at once when another run
    /// holds it.
    pub fn acquire(dest: &Path, parent: &Path, name: &OsStr) -> Result<OutputLock> {
        let path = parent.join(sibling_name(name, "lock"));
        OutputLock::try_lock(&path)?.with_context(|| {
            format!(
                "{}: another escha-convert run is writing it (lock {}); wait for it to finish or choose another OUT",
                dest.display(),
                path.display()
            )
        })
    }

    /// The lock file at `path`, locked; `None` when another process holds it. Only a regular file
    /// (or nothing) may be at `path`: a link, FIFO or device there is refused, never opened.
    pub fn try_lock(path: &Path) -> Result<Option<OutputLock>> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)
                .map_err(|e| match std::fs::symlink_metadata(path) {
                    Ok(m) if !m.is_file() => {
                        anyhow::anyhow!(
                            "{}: {} is in the way of the output lock; not touching it",
                            path.display(),
                            kind(&m)
                        )
                    }
                    _ => cannot_create(path, "the output lock", e),
                })?;
            let meta = file.metadata().with_context(|| format!("{}: cannot read", path.display()))?;
            if !meta.is_file() {
                bail!("{}: {} is in the way of the output lock; not touching it", path.display(), kind(&meta));
            }
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    return Ok(None);
                }
                return Err(e).with_context(|| format!("{}: cannot lock", path.display()));
            }
            // A run that just finished may have removed the file we opened: lock the one at `path`.
            if same_file(&file, path) {
                signals::remove_leftover_on_signal(path);
                return Ok(Some(OutputLock { path: path.to_path_buf(), _file: file }));
            }
        }
    }
}

fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        // Removed while still locked, so a waiting run re-opens a fresh file.
        let _ = std::fs::remove_file(&self.path);
        signals::forget(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sibling_names_fit_any_valid_name() {
        assert_eq!(sibling_name(OsStr::new("out"), "lock"), ".out.lock");
        let long = "é".repeat(127); // 254 bytes
        let s = sibling_name(OsStr::new(&long), "partial-4194304");
        assert!(s.len() <= 255, "{}", s.len());
        assert_ne!(s, sibling_name(OsStr::new(&format!("{long}x")), "partial-4194304"));
        // Every tag shares the prefix, at every length.
        for n in 200..=255 {
            let name = "o".repeat(n);
            let lock = sibling_name(OsStr::new(&name), "lock");
            assert_eq!(
                lock.strip_suffix("lock"),
                sibling_name(OsStr::new(&name), "partial-4294967295").strip_suffix("partial-4294967295")
            );
            assert!(lock.len() <= 255);
        }
    }
}
