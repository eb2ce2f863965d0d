//! The files around the shards: the index, config.json and the copied side files.

use super::job::Job;
use crate::checkpoint::open_regular;
use anyhow::{Context, Result};
use std::path::Path;

/// Writes the index and config.json and copies the side files into `dir`; returns the names
/// written.
pub fn write_side_files(job: &Job, dir: &Path) -> Result<Vec<String>> {
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).with_context(|| format!("{}: cannot write", dir.join(name).display()))
    };
    if let Some((name, text)) = &job.plan.index {
        write(name, text)?;
    }
    let mut written = Vec::new();
    for (name, src) in &job.ck.copied_files {
        let mut from = open_regular(src)?;
        let target = dir.join(name);
        let mut to = std::fs::File::create(&target).with_context(|| format!("{}: cannot create", target.display()))?;
        std::io::copy(&mut from, &mut to).with_context(|| format!("{}: cannot copy", src.display()))?;
        written.push(name.clone());
    }
    if let Some(config) = &job.config {
        write("config.json", config)?;
        written.push("config.json".into());
    }
    Ok(written)
}
