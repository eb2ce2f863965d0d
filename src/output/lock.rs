//! An advisory lock on OUT, held for the whole run: a second run into the same OUT fails at once
//! instead of racing the first to the final rename.

use crate::signals;
use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// A hidden sibling of OUT named after it: `.NAME.TAG`, kept within the file-name limit for any
/// valid NAME (a long name is cut and a hash of the whole name keeps it unique).
pub fn sibling_name(name: &OsStr, tag: &str) -> String {
    const KEEP: usize = 150;
    let name = name.to_string_lossy();
    if name.len() + tag.len() + 2 <= 255 {
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

/// The lock file `.NAME.lock` beside OUT, locked with `flock`; removed when dropped.
pub struct OutputLock {
    path: PathBuf,
    _file: File,
}

impl OutputLock {
    pub fn acquire(dest: &Path, parent: &Path, name: &OsStr) -> Result<OutputLock> {
        use std::os::fd::AsRawFd;
        let path = parent.join(sibling_name(name, "lock"));
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .with_context(|| format!("{}: cannot create the output lock", path.display()))?;
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    bail!(
                        "{}: another escha-convert run is writing it (lock {}); wait for it to finish or choose another OUT",
                        dest.display(),
                        path.display()
                    );
                }
                return Err(e).with_context(|| format!("{}: cannot lock", path.display()));
            }
            // A run that just finished may have removed the file we opened: lock the one at `path`.
            if same_file(&file, &path) {
                signals::remove_on_signal(&path);
                return Ok(OutputLock { path, _file: file });
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
    }
}
