//! What a path really names on disk: its directory resolved through links, the part of a
//! destination that does not exist yet applied by name, and whether two places overlap. Every path
//! this tool reads from or writes to is compared in this physical form.

use anyhow::{Context, Result};
use std::path::{Component, Path, PathBuf};

/// The directory holding `path` (`.` for a bare name).
pub fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Where `path` is on disk without following its last component: its directory resolved, then
/// its own name (a path ending in `..` or `/` names a directory and is resolved whole).
pub fn physical(path: &Path) -> std::io::Result<PathBuf> {
    match path.file_name() {
        Some(name) => Ok(parent_dir(path).canonicalize()?.join(name)),
        None => path.canonicalize(),
    }
}

/// The absolute path `path` will name once its missing directories are created: the part that
/// exists resolved (links followed), the rest applied by name (`..` steps back, as it will once
/// the directories it passes through exist). What a write to `path` would really touch.
pub fn physical_destination(path: &Path) -> Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().context("cannot read the current directory")?.join(path)
    };
    let parts: Vec<Component> = abs.components().collect();
    for known in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..known].iter().collect();
        let Ok(mut resolved) = prefix.canonicalize() else { continue };
        for part in &parts[known..] {
            match part {
                Component::ParentDir => {
                    resolved.pop();
                }
                Component::Normal(name) => resolved.push(name),
                _ => {}
            }
        }
        return Ok(resolved);
    }
    Ok(abs)
}

/// Whether two physical paths overlap: one is the other or lies inside it.
pub fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_resolve_dot_dot_through_missing_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        std::fs::create_dir(base.join("in")).unwrap();
        let spelled = base.join("nope").join("..").join("in").join("out");
        assert_eq!(physical_destination(&spelled).unwrap(), base.join("in").join("out"));
        std::os::unix::fs::symlink(base.join("in"), base.join("link")).unwrap();
        assert_eq!(physical_destination(&base.join("link/x/../y")).unwrap(), base.join("in/y"));
        assert!(overlaps(&base.join("in/out"), &base.join("in")) && !overlaps(&base.join("in2"), &base.join("in")));
    }
}
