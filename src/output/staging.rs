//! The staging directory: output is written to a hidden sibling of OUT and renamed into place at
//! the end, so an interrupted or failed run never leaves something that looks finished.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Staging directories of this process, removed by the signal handler.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// On SIGINT/SIGTERM/SIGHUP: remove every staging directory, then exit with 130.
pub fn install_signal_cleanup() {
    let _ = ctrlc::set_handler(|| {
        if let Ok(dirs) = LIVE.lock() {
            for d in dirs.iter() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        eprintln!("escha-convert: interrupted; partial output removed");
        std::process::exit(130);
    });
}

pub struct Staging {
    tmp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl Staging {
    /// Checks that `dest` may be written (refusing a non-empty one without `force`, and any
    /// overlap with `input`), then creates the staging directory beside it.
    pub fn prepare(dest: &Path, input: &Path, force: bool) -> Result<Staging> {
        let input_abs = std::fs::canonicalize(input).with_context(|| format!("{}: cannot resolve", input.display()))?;
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let Some(name) = dest.file_name() else {
            bail!("{}: not a usable output path", dest.display());
        };
        std::fs::create_dir_all(&parent).with_context(|| format!("{}: cannot create", parent.display()))?;
        let dest_abs = std::fs::canonicalize(&parent)?.join(name);
        if dest_abs == input_abs || input_abs.starts_with(&dest_abs) || dest_abs.starts_with(&input_abs) {
            bail!("{}: output overlaps the input {}; choose another place", dest.display(), input.display());
        }
        if let Ok(meta) = std::fs::symlink_metadata(dest) {
            let empty_dir = meta.is_dir() && std::fs::read_dir(dest)?.next().is_none();
            if !empty_dir && !force {
                bail!("{}: already exists and is not empty; pass --force to replace it", dest.display());
            }
        }
        let tmp = parent.join(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).with_context(|| format!("{}: cannot clear stale staging", tmp.display()))?;
        }
        std::fs::create_dir(&tmp).with_context(|| format!("{}: cannot create", tmp.display()))?;
        LIVE.lock().unwrap().push(tmp.clone());
        Ok(Staging { tmp, dest: dest.to_path_buf(), committed: false })
    }

    /// Where files are written until [`Staging::commit`].
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Replaces `dest` (if any) with the finished staging directory.
    pub fn commit(mut self) -> Result<()> {
        if let Ok(meta) = std::fs::symlink_metadata(&self.dest) {
            if meta.is_dir() { std::fs::remove_dir_all(&self.dest) } else { std::fs::remove_file(&self.dest) }
                .with_context(|| format!("{}: cannot replace", self.dest.display()))?;
        }
        std::fs::rename(&self.tmp, &self.dest)
            .with_context(|| format!("{}: cannot move output into place", self.dest.display()))?;
        self.committed = true;
        self.forget();
        Ok(())
    }

    fn forget(&self) {
        LIVE.lock().unwrap().retain(|d| d != &self.tmp);
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
            self.forget();
        }
    }
}
