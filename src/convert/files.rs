//! The files around the shards: the index, config.json and the copied side files.

use crate::checkpoint::{open_regular, Checkpoint};
use crate::layout::{Layout, OutputTensor};
use crate::plan::Plan;
use anyhow::{Context, Result};
use std::path::Path;

/// Writes the index and config.json and copies the side files into `dir`; returns the paths
/// written, relative to the output (`subdir/name`).
pub fn write_side_files(
    ck: &Checkpoint,
    plan: &Plan,
    layout: &dyn Layout,
    dir: &Path,
    subdir: &str,
) -> Result<Vec<String>> {
    if let Some((name, text)) = &plan.index {
        std::fs::write(dir.join(name), text).with_context(|| format!("{}: cannot write", dir.join(name).display()))?;
    }
    let mut copied = Vec::new();
    for (name, src) in &ck.copied_files {
        let mut from = open_regular(src)?;
        let mut to = std::fs::File::create(dir.join(name))
            .with_context(|| format!("{}: cannot create", dir.join(name).display()))?;
        std::io::copy(&mut from, &mut to).with_context(|| format!("{}: cannot copy", src.display()))?;
        copied.push(Path::new(subdir).join(name).display().to_string());
    }
    if let Some(config) = &ck.config {
        let tensors: Vec<OutputTensor> = plan.tensors.iter().map(|p| p.tensor.clone()).collect();
        std::fs::write(dir.join("config.json"), layout.config(config, &tensors))?;
        copied.push(Path::new(subdir).join("config.json").display().to_string());
    }
    Ok(copied)
}
