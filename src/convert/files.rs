//! The files around the shards: the index, config.json and the copied side files.

use super::job::Job;
use super::options::ConvertOptions;
use super::report::VerifySummary;
use crate::card::{self, Card};
use crate::checkpoint::{open_regular, Leaf};
use crate::layout::mtp::is_mtp;
use crate::layout::Layout;
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

/// The model card's file name in OUT.
pub const CARD_FILE: &str = "README.md";

/// The model card of `job`.
pub fn card(
    job: &Job,
    layout: &dyn Layout,
    opts: &ConvertOptions,
    command: &str,
    verify: Option<&VerifySummary>,
) -> Card {
    let (source, revision) = card::source_name(&opts.input);
    let mut notes = Vec::new();
    if job.cat.coded.iter().any(|m| m.tensor(Leaf::Bias).is_some()) {
        let bias = if opts.keep_bias {
            "kept as `<module>.bias` (stock Qwen3.5 models have no slot for them)"
        } else {
            "dropped: the reference runtime never applies them"
        };
        notes.push(("coded-linear biases", bias.to_string()));
    }
    if !job.cat.int8.is_empty() {
        notes.push((
            "int8 layers",
            format!("{} pairs, dequantized exactly (w8·scale) before any rounding", job.cat.int8.len()),
        ));
    }
    let mtp = match (job.ck.tensors.keys().any(|n| is_mtp(n)), job.mtp_written) {
        (false, _) => "none in the source",
        (true, true) => "kept: `mtp.*` tensors in the main shards",
        (true, false) => {
            "not written (incomplete, dropped on request, or the format has none); mtp_num_hidden_layers is 0"
        }
    };
    notes.push(("MTP head", mtp.to_string()));
    Card {
        source,
        revision,
        base_model: card::base_model(&job.ck),
        license: card::license(&job.ck),
        command: command.to_string(),
        format: layout.card(job.mtp_written),
        notes,
        verified: verify.map(VerifySummary::line),
    }
}
