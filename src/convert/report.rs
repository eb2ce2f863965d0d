//! What a conversion (or a dry run) did: the report, printed as text or as one JSON document.

use crate::checkpoint::HubSource;
use crate::layout::WidthChoice;
use crate::text::{count, escape_controls, human_bytes, shape};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One planned output tensor, for `--dry-run` and `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct TensorReport {
    pub name: String,
    pub kind: &'static str,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: u64,
    pub file: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ShardReport {
    pub file: String,
    pub tensors: usize,
    pub bytes: u64,
}

/// One file written into OUT.
#[derive(Clone, Debug, Serialize)]
pub struct WrittenFile {
    pub file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// What `--verify-base` proved.
#[derive(Clone, Debug, Serialize)]
pub struct VerifySummary {
    /// The base model's directory (or file) name, or its Hub repository.
    pub base: String,
    /// The Hub id BASE was given as, and the commit it resolved to.
    pub hub: Option<HubSource>,
    pub passed: bool,
    pub checked: usize,
    pub failed: usize,
    pub coded: usize,
    pub int8: usize,
    pub norms: usize,
    /// Blocks checked per tensor; `None`: every block.
    pub sampled_blocks: Option<usize>,
}

impl VerifySummary {
    /// One line for the summary.
    pub fn line(&self) -> String {
        self.line_quoting(|base| format!("`{base}`"))
    }

    /// The line with the base's name written by `quote` (the model card escapes it as Markdown).
    pub fn line_quoting(&self, quote: impl Fn(&str) -> String) -> String {
        let blocks =
            self.sampled_blocks.map_or("every block".into(), |n| format!("{n} sampled 128×128 blocks per tensor"));
        format!(
            "{} against {}: {} checked ({} coded, {} int8, {} norms), {} failed; {blocks}",
            if self.passed { "PASS" } else { "FAIL" },
            quote(&self.base),
            self.checked,
            self.coded,
            self.int8,
            self.norms,
            self.failed
        )
    }
}

/// What a conversion (or a dry run) did; printed as text, or as one JSON document with `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct ConvertReport {
    /// IN as read: the path given, or the cache snapshot a Hub id resolved to.
    pub input: String,
    /// The Hub id IN was given as: `id`, the `revision` asked for (`null`: the default branch) and
    /// the `commit` read; `null` for a local path.
    pub hub: Option<HubSource>,
    pub output: String,
    pub format: &'static str,
    pub dry_run: bool,
    pub decoder: &'static str,
    pub threads: usize,
    pub counts: BTreeMap<&'static str, usize>,
    pub shards: Vec<ShardReport>,
    pub bytes_written: u64,
    pub weights: u64,
    pub seconds: f64,
    pub gb_per_s: f64,
    pub weights_per_s: f64,
    pub peak_memory_estimate: u64,
    /// Files copied or written beside the shards (config, tokenizer, chat template, …).
    pub copied_files: Vec<String>,
    /// `--dry-run`: why the real run would refuse OUT, if it would.
    pub would_refuse: Option<String>,
    /// `--part I/N`: which part this run wrote.
    pub part: Option<String>,
    /// Every file this run wrote into OUT, with its SHA-256 under `--checksums`.
    pub files: Vec<WrittenFile>,
    /// The summary of `--verify-base`, when it ran.
    pub verify: Option<VerifySummary>,
    /// `--bits auto`: every coded linear's width, with its budget and added error.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub width_choices: Vec<WidthChoice>,
    /// Bits per weight of the affine-quantized tensors, scales and biases included.
    pub affine_bits_per_weight: Option<f64>,
    /// `--format exl3`: the largest relative change folding `s_in`/`s_out` into the f16 channel scales
    /// makes (0: exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_fold_change: Option<f64>,
    /// `--max-size`: the size asked for, the bytes of the model files, and the largest and mean
    /// added-error ratios of the coded linears.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<super::fit::BudgetReport>,
    /// `--imatrix`: the file (name, sha256), the texts it was computed on, and what it weighs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imatrix: Option<super::importance::ImatrixReport>,
    pub warnings: Vec<crate::warning::Warning>,
    pub tensors: Vec<TensorReport>,
}

/// `--dry-run`: every output tensor, the shards, and the memory estimate.
pub fn render_plan(r: &ConvertReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "plan: {} → {} ({})", r.input, r.output, r.format);
    for t in &r.tensors {
        let _ = writeln!(
            s,
            "  {:<72} {:<5} {:<18} {:>10}  {}  [{}]",
            escape_controls(&t.name),
            t.dtype,
            shape(&t.shape),
            human_bytes(t.bytes),
            t.file,
            t.kind
        );
    }
    for sh in &r.shards {
        let _ = writeln!(s, "shard {}: {}, {}", sh.file, count(sh.tensors, "tensor"), human_bytes(sh.bytes));
    }
    let _ = writeln!(
        s,
        "total {} in {}; peak memory estimate {} ({})",
        human_bytes(r.bytes_written),
        count(r.shards.len(), "shard"),
        human_bytes(r.peak_memory_estimate),
        count(r.threads, "thread")
    );
    if let Some(b) = &r.budget {
        render_budget(&mut s, b, &r.width_choices);
    }
    if let Some(why) = &r.would_refuse {
        let _ = writeln!(s, "the real run would refuse: {}", escape_controls(why));
    }
    s
}

/// `--max-size`: every chosen tensor's encoding, bytes and predicted ratio, then the totals.
fn render_budget(s: &mut String, b: &super::fit::BudgetReport, choices: &[WidthChoice]) {
    let _ = writeln!(
        s,
        "size budget: per quantized tensor, its encoding, bytes and estimated added error over 2^-K (K=8: a table)"
    );
    for c in choices {
        let group = c.group_size.map_or(String::new(), |g| format!(", group {g}"));
        let _ = writeln!(
            s,
            "  {:<64} K={} → {}{group:<10} {:>10}  ratio {:.3}",
            escape_controls(&c.tensor),
            c.k,
            c.chosen,
            human_bytes(c.bytes.unwrap_or(0)),
            c.ratio.unwrap_or(0.0)
        );
    }
    let _ = writeln!(
        s,
        "model files {} ({} bytes) of --max-size {} ({} bytes); estimated largest ratio of a coded linear {:.3}, mean {:.3} (by weight); largest of a table {:.3}",
        human_bytes(b.bytes),
        b.bytes,
        human_bytes(b.max_size),
        b.max_size,
        b.max_added_error_ratio,
        b.mean_added_error_ratio,
        b.max_table_ratio
    );
    if !b.fixed_recipes_beaten.is_empty() {
        let _ = writeln!(
            s,
            "estimated lower on both than each fixed recipe that fits: {}",
            b.fixed_recipes_beaten.join(", ")
        );
    }
    if !b.fixed_recipes_off_menu.is_empty() {
        let _ = writeln!(
            s,
            "not weighed against (a tensor's type is not on the menu): {}",
            b.fixed_recipes_off_menu.join(", ")
        );
    }
    if let Some(m) = &b.memory {
        let _ = writeln!(s, "--fit-memory: {}", m.words().replace('`', ""));
    }
}

/// `--max-size`'s choices per encoding: how many tensors took it, and their bytes.
fn render_encodings(s: &mut String, choices: &[WidthChoice]) {
    let mut by: Vec<(String, usize, u64)> = Vec::new();
    for c in choices {
        let name = match c.group_size {
            Some(g) => format!("{}, group {g}", c.chosen),
            None => c.chosen.to_string(),
        };
        match by.iter_mut().find(|(n, ..)| *n == name) {
            Some((_, n, bytes)) => {
                *n += 1;
                *bytes += c.bytes.unwrap_or(0);
            }
            None => by.push((name, 1, c.bytes.unwrap_or(0))),
        }
    }
    by.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    let _ = writeln!(s, "chosen for --max-size, per encoding (-v, --dry-run or --json: every tensor):");
    for (name, n, bytes) in by {
        let _ = writeln!(s, "  {name:<24} {:>14} {:>10}", count(n, "tensor"), human_bytes(bytes));
    }
}

/// The closing summary of a finished conversion. `--max-size`'s choices are summed up per
/// encoding unless `per_tensor` (`-v`) asks for each tensor's (`--dry-run` and `--json` list them
/// all).
pub fn render_summary(r: &ConvertReport, per_tensor: bool) -> String {
    let counts = r.counts.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ");
    let tensors = format!("{}: {counts}", count(r.tensors.len(), "tensor"));
    // A part writes its share of the shards; the tensor counts are those of the whole output.
    let what = match &r.part {
        Some(part) => {
            let mine = r.shards.iter().filter(|s| r.files.iter().any(|f| f.file == s.file)).count();
            format!("in {mine} of {} (part {part} of an output of {tensors})", count(r.shards.len(), "shard"))
        }
        None => format!("({tensors}) in {}", count(r.shards.len(), "shard")),
    };
    let mut s = format!(
        "wrote {} {what} to {} in {:.2} s ({:.2} GB/s, {:.3e} weights/s, decoder {}, {})\n",
        human_bytes(r.bytes_written),
        r.output,
        r.seconds,
        r.gb_per_s,
        r.weights_per_s,
        r.decoder,
        count(r.threads, "thread")
    );
    if !r.copied_files.is_empty() {
        let _ = writeln!(s, "beside the shards: {}", r.copied_files.join(", "));
    }
    if r.budget.is_some() && !r.width_choices.is_empty() && !per_tensor {
        render_encodings(&mut s, &r.width_choices);
    } else if !r.width_choices.is_empty() {
        let against = if r.budget.is_some() {
            "the largest ratio times 2^-K (K=8: a table), for --max-size"
        } else {
            "the budget R·2^-K"
        };
        let _ = writeln!(s, "chosen from the weights: added error ‖deq(Q(W)) − W‖/‖W‖ against {against}");
        for c in &r.width_choices {
            let actual = c.actual.map_or(String::new(), |a| format!(", measured {a:.4}"));
            let _ = writeln!(
                s,
                "  {:<64} K={} → {} ({:.2} bits/weight)  predicted {:.4}{actual}  budget {:.4}",
                escape_controls(&c.tensor),
                c.k,
                c.chosen,
                c.bits_per_weight,
                c.predicted,
                c.budget
            );
        }
    }
    if let Some(b) = &r.budget {
        let _ = writeln!(s, "size budget: {}", b.words().replace('`', ""));
    }
    if let Some(bpw) = r.affine_bits_per_weight {
        let _ = writeln!(s, "quantized tensors: {bpw:.3} bits per weight, scales and biases included");
    }
    match r.scale_fold_change {
        Some(0.0) => {
            let _ = writeln!(s, "channel scales: s_in and s_out folded into suh/svh exactly");
        }
        Some(change) => {
            let _ = writeln!(
                s,
                "channel scales: s_in and s_out folded into f16 suh/svh, one rounding per channel; largest relative change {change:.3e}"
            );
        }
        None => {}
    }
    s
}
