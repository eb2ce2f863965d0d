//! What a message says when OUT's place refuses a new entry: the cause, and what to do about it.

use std::path::Path;

/// `PATH: cannot create WHAT: CAUSE`; when the place itself refuses (no permission, a read-only
/// file system), followed by what to do, since no retry there can succeed.
pub fn cannot_create(path: &Path, what: &str, e: std::io::Error) -> anyhow::Error {
    let context = format!("{}: cannot create {what}", path.display());
    if place_refuses(&e) {
        return anyhow::anyhow!("{context}: {e}; the directory is not writable: choose a writable place for OUT");
    }
    anyhow::Error::new(e).context(context)
}

/// Whether `e` says the directory cannot take new entries at all, as opposed to a passing
/// failure or something in the way.
fn place_refuses(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied || e.raw_os_error() == Some(libc::EROFS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusing_place_names_the_fix() {
        let path = Path::new("/ro/.out.lock");
        for e in [std::io::Error::from_raw_os_error(libc::EACCES), std::io::Error::from_raw_os_error(libc::EROFS)] {
            let text = format!("{:#}", cannot_create(path, "the output lock", e));
            assert!(text.starts_with("/ro/.out.lock: cannot create the output lock: "), "{text}");
            assert!(text.ends_with("; the directory is not writable: choose a writable place for OUT"), "{text}");
        }
        let full = cannot_create(path, "the output lock", std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(!format!("{full:#}").contains("writable"), "{full:#}");
    }
}
