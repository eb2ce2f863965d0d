//! Output shard files: created at full size up front (a full disk fails here, with a message,
//! not halfway), headers written first, tensor bytes written at their planned offsets. Every
//! failure here is the output's (`write_failed`), whatever the engine around it was doing.

use crate::failure::{Classify, ErrorCode};
use crate::plan::Plan;
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub struct ShardFiles {
    /// The files of the shards this run writes (`None`: another part's).
    files: Vec<Option<(PathBuf, File)>>,
}

impl ShardFiles {
    /// Creates the shards `owned` marks.
    pub fn create(dir: &Path, plan: &Plan, owned: &[bool]) -> Result<Self> {
        Self::create_files(dir, plan, owned).class(ErrorCode::WriteFailed)
    }

    fn create_files(dir: &Path, plan: &Plan, owned: &[bool]) -> Result<Self> {
        let mut files = Vec::new();
        for (shard, &own) in plan.shards.iter().zip(owned) {
            if !own {
                files.push(None);
                continue;
            }
            let path = dir.join(&shard.file_name);
            let file = File::create(&path).with_context(|| format!("{}: cannot create", path.display()))?;
            preallocate(&file, shard.len)
                .with_context(|| format!("{}: cannot reserve {} bytes", path.display(), shard.len))?;
            file.write_all_at(&shard.header, 0).with_context(|| format!("{}: cannot write header", path.display()))?;
            files.push(Some((path, file)));
        }
        Ok(Self { files })
    }

    pub fn write_at(&self, shard: usize, offset: u64, bytes: &[u8]) -> Result<()> {
        let Some((path, file)) = &self.files[shard] else { bail!("shard {shard} is not written by this run") };
        file.write_all_at(bytes, offset)
            .with_context(|| format!("{}: write failed", path.display()))
            .class(ErrorCode::WriteFailed)
    }

    /// Flushes every file to disk.
    pub fn finish(self) -> Result<()> {
        for (path, file) in self.files.into_iter().flatten() {
            file.sync_all()
                .with_context(|| format!("{}: cannot flush", path.display()))
                .class(ErrorCode::WriteFailed)?;
        }
        Ok(())
    }
}

#[cfg(target_os = "linux")]
fn preallocate(file: &File, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a file descriptor we own.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    match rc {
        0 => Ok(()),
        // The system's own error, so that the message says "No space left on device" as a full
        // disk met later does.
        libc::ENOSPC => Err(std::io::Error::from_raw_os_error(rc)).context("not enough disk space"),
        // Filesystems without fallocate: fall back to a sparse file.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(file.set_len(len)?),
        e => Err(std::io::Error::from_raw_os_error(e).into()),
    }
}

#[cfg(not(target_os = "linux"))]
fn preallocate(file: &File, len: u64) -> Result<()> {
    Ok(file.set_len(len)?)
}
