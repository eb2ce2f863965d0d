//! The files around the shards: the marker, the index, config.json, the copied side files and the
//! model card.

use super::job::Job;
use super::options::ConvertOptions;
use super::report::VerifySummary;
use crate::card::{self, Card};
use crate::checkpoint::{open_regular, Leaf};
use crate::failure::{Classify, ErrorCode};
use crate::layout::mtp::is_mtp;
use crate::layout::{tensors_only_note, Layout};
use crate::output::checksums::{sha256_hex, SUMS_FILE};
use crate::output::{Marker, MARKER_FILE};
use crate::text::shell_word;
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// Writes `text` as file `name` of `dir`, naming the file when it fails (a full disk, say).
pub fn write(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("{}: cannot write", path.display()))
}

/// Writes the index and config.json and copies the side files into `dir`; returns the names
/// written.
pub fn write_side_files(job: &Job, dir: &Path) -> Result<Vec<String>> {
    if let Some((name, text)) = &job.plan.index {
        write(dir, name, text)?;
    }
    let mut written = Vec::new();
    for (name, src) in &job.side_files {
        // A side file of IN that cannot be read refuses the input, not the output.
        let mut from = open_regular(src).class(ErrorCode::InputRefused)?;
        let target = dir.join(name);
        let mut to = std::fs::File::create(&target).with_context(|| format!("{}: cannot create", target.display()))?;
        std::io::copy(&mut from, &mut to)
            .with_context(|| format!("{}: cannot write (copying {})", target.display(), src.display()))?;
        written.push(name.clone());
    }
    if let Some(config) = &job.config {
        write(dir, "config.json", config)?;
        written.push("config.json".into());
    }
    for (name, text) in &job.extra_files {
        write(dir, name, text)?;
        written.push(name.clone());
    }
    Ok(written)
}

/// The marker of the output `job` writes in `layout`: the input's fingerprint, the options' and
/// every file of the complete output (every part's shards included).
pub fn marker(job: &Job, layout: &dyn Layout, opts: &ConvertOptions) -> Marker {
    let mut files: BTreeMap<String, Option<u64>> =
        job.plan.shards.iter().map(|s| (s.file_name.clone(), Some(s.len))).collect();
    let side = job.side_files.iter().map(|(name, _)| name.as_str());
    let index = job.plan.index.iter().map(|(name, _)| name.as_str());
    let config = job.config.iter().map(|_| "config.json").chain(job.extra_files.iter().map(|(n, _)| n.as_str()));
    let card = opts.card.then_some(CARD_FILE);
    let sums = opts.checksums.then_some(SUMS_FILE);
    for name in side.chain(index).chain(config).chain(card).chain(sums).chain([MARKER_FILE]) {
        files.insert(name.to_string(), None);
    }
    let options = format!("{} {}", layout.name(), job.recorded_flags(opts));
    Marker::new(job.ck.fingerprint(), sha256_hex(options.as_bytes()), files)
}

/// The model card's file name in OUT.
pub const CARD_FILE: &str = "README.md";

/// The model card of `job`.
pub fn card(job: &Job, layout: &dyn Layout, opts: &ConvertOptions, verify: Option<&VerifySummary>) -> Card {
    let (source, revision) = card::source(&opts.input, opts.hub.as_ref());
    // OUT is named by role: the parts of a split job write to differently named directories. A Hub
    // source is named with its commit, so the command reads the same snapshot again.
    let arg = card::source_arg(&opts.input, opts.hub.as_ref());
    let command = format!("escha-convert {} OUT {}", shell_word(&arg), job.recorded_flags(opts));
    let mut notes = Vec::new();
    if job.ck.single_file {
        notes.push(("tensors only", tensors_only_note(layout)));
    }
    if let Some(bias) = bias_note(job, layout.applies_bias()) {
        notes.push(("coded-linear biases", bias.to_string()));
    }
    if !job.cat.int8.is_empty() {
        notes.push((
            "int8 layers",
            format!("{} pairs, dequantized exactly (w8·scale) before any rounding", job.cat.int8.len()),
        ));
    }
    if let Some(change) = job.fold_change {
        let line = if change == 0.0 {
            "folded into the f16 channel scales exactly (every s_in and s_out is 1)".to_string()
        } else {
            format!(
                "folded into the f16 channel scales, one rounding per channel: largest relative change {change:.3e}"
            )
        };
        notes.push(("channel scales (s_in, s_out)", line));
    }
    if let Some(budget) = &job.budget {
        notes.push(("size budget", budget.words()));
    }
    if let Some(note) = layout.rope_scaling_note().filter(|_| scales_rope(job.ck.config.as_ref())) {
        notes.push(("rotary scaling", note.to_string()));
    }
    if let Some(imatrix) = &job.imatrix {
        notes.push(("importance matrix", imatrix.words()));
    }
    let mtp =
        if job.ck.tensors.keys().any(|n| is_mtp(n)) { layout.mtp_note(job.mtp_written) } else { "none in the source" };
    notes.push(("MTP head", mtp.to_string()));
    Card {
        source,
        revision,
        base_model: card::base_model(&job.ck),
        license: card::license(&job.ck),
        command,
        format: layout.card(job.mtp_written),
        notes,
        verified: verify.map(|v| v.line_quoting(|base| card::md_code(base, true))),
    }
}

/// Whether config.json asks for a rotary scaling (a rope type other than the default).
fn scales_rope(config: Option<&Value>) -> bool {
    let Some(config) = config else { return false };
    let text = config.get("text_config").filter(|t| t.is_object()).unwrap_or(config);
    ["rope_parameters", "rope_scaling"]
        .iter()
        .filter_map(|k| text.get(k))
        .any(|r| r.get("rope_type").or_else(|| r.get("type")).and_then(Value::as_str).is_some_and(|t| t != "default"))
}

/// The card's line on the biases of coded linears, when the input has any: kept or dropped, and
/// what the source's runtime does with them (Escha's reference runtime never applies them;
/// exllamav3 adds an EXL3 linear's).
fn bias_note(job: &Job, applied: bool) -> Option<&'static str> {
    let with_bias: Vec<_> = job.cat.coded.iter().filter(|m| m.tensor(Leaf::Bias).is_some()).collect();
    let escha = with_bias.iter().any(|m| !m.source_applies_bias());
    let exl3 = with_bias.iter().any(|m| m.source_applies_bias());
    let kept =
        |source_applies: bool| with_bias.iter().any(|m| m.source_applies_bias() == source_applies && job.bias.keeps(m));
    Some(match (escha, exl3) {
        (false, false) => return None,
        (true, false) if kept(false) && applied => {
            "kept as `<module>.bias`, which the runtime adds after the matmul (the reference runtime never applies them)"
        }
        (true, false) if kept(false) => "kept as `<module>.bias` (stock Qwen3.5 models have no slot for them)",
        (true, false) => "dropped: the reference runtime never applies them",
        (false, true) if kept(true) && applied => {
            "kept as `<module>.bias`, which exllamav3 adds after the matmul, as the source's runtime did"
        }
        (false, true) if kept(true) => {
            "kept as `<module>.bias` (the source's runtime, exllamav3, adds them; stock Qwen3.5 models have no slot for them)"
        }
        (false, true) => "dropped on request, though the source's runtime (exllamav3) adds them after the matmul",
        (true, true) => "as `--bias` says for each source: Escha's reference runtime never applies a bias, exllamav3 adds an EXL3 linear's",
    })
}
