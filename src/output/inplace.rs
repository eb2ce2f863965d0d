//! OUT that is a mount point (an external disk, a fresh volume): it cannot be renamed, nor
//! replaced by a rename, and a staging directory beside it would be on another file system. The
//! run then works inside OUT: the lock is `OUT/.escha-convert.lock`, the staging directory
//! `OUT/.escha-convert.partial-PID`, and at the end its entries are renamed into OUT (an old
//! output's entries first set aside in `OUT/.escha-convert.old-PID`), all within OUT's own file
//! system, with signals held off, so an interrupted run leaves OUT as it was.

use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The name the working entries inside OUT are named after: `.escha-convert.TAG`.
pub const INSIDE: &str = "escha-convert";

/// Whether `dest`, an existing directory, is a mount point: on another device than its parent,
/// or named as a mount point in `/proc/self/mountinfo` (a bind mount of the same device).
pub fn is_mount_point(dest: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(dest) else { return false };
    if !meta.is_dir() {
        return false;
    }
    let parent = crate::paths::parent_dir(dest);
    if std::fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev()) {
        return true;
    }
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    table.lines().filter_map(|l| l.split(' ').nth(4)).any(|p| Path::new(&unescape(p)) == dest)
}

/// A mount point as `/proc/self/mountinfo` writes it: space, tab, newline and `\` as octal escapes.
fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the file system at `dir` is mounted read-only.
pub fn read_only(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    // SAFETY: statvfs fills the struct we own from a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(path.as_ptr(), &raw mut st) } == 0) && (st.f_flag & libc::ST_RDONLY != 0)
}

/// Whether `name`, an entry of OUT, is one of a run's working entries there (a lock, a staging
/// directory, an old output set aside), which are not part of any output.
pub fn is_working_entry(name: &str) -> bool {
    let Some(tag) = name.strip_prefix(&format!(".{INSIDE}.")) else { return false };
    tag == "lock" || tag.starts_with("partial-") || tag.starts_with("old-")
}

/// The entries of `dir` that are not working entries, sorted.
pub fn output_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("{}: cannot list", dir.display()))? {
        let e = e.with_context(|| format!("{}: cannot list", dir.display()))?;
        if !is_working_entry(&e.file_name().to_string_lossy()) {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Moves every entry of `from` into `to` (a directory on the same file system), in `order`'s
/// order; on a failure the ones moved are moved back and the error returned.
pub fn move_entries(from: &Path, to: &Path, order: impl Fn(&OsStr) -> u8) -> Result<Vec<PathBuf>> {
    let mut names: Vec<_> = std::fs::read_dir(from)
        .with_context(|| format!("{}: cannot list", from.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("{}: cannot list", from.display()))?;
    names.sort_by(|a, b| (order(a), a).cmp(&(order(b), b)));
    let mut moved = Vec::new();
    for name in names {
        if let Err(e) = std::fs::rename(from.join(&name), to.join(&name)) {
            move_back(&moved, from, to);
            return Err(e)
                .with_context(|| format!("{}: cannot move it into {}", from.join(&name).display(), to.display()));
        }
        moved.push(PathBuf::from(name));
    }
    Ok(moved)
}

/// Moves the entries `names` of `to` back into `from`, the last first.
pub fn move_back(names: &[PathBuf], from: &Path, to: &Path) {
    for name in names.iter().rev() {
        let _ = std::fs::rename(to.join(name), from.join(name));
    }
}

/// Refuses a mount point at OUT whose file system is read-only, before any work.
pub fn check_writable(dest: &Path, shown: &Path) -> Result<()> {
    if read_only(dest) {
        bail!(
            "{}: a read-only file system is mounted there; mount it writable, or choose a writable place for OUT",
            shown.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_entries_are_told_from_output() {
        for name in [".escha-convert.lock", ".escha-convert.partial-12", ".escha-convert.old-7"] {
            assert!(is_working_entry(name), "{name}");
        }
        for name in [".escha-convert.json", "config.json", ".escha-convert.lockx", ".out.lock"] {
            assert!(!is_working_entry(name), "{name}");
        }
        assert_eq!(unescape(r"/mnt/a\040b\134c"), r"/mnt/a b\c");
    }

    #[test]
    fn the_root_and_a_plain_directory() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(tmp.path()));
        assert!(!is_mount_point(&tmp.path().join("absent")));
    }
}
