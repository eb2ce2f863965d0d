//! What a conversion (or a dry run) did: the report, printed as text or as one JSON document.

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

/// What a conversion (or a dry run) did; printed as text, or as one JSON document with `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct ConvertReport {
    pub input: String,
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
    pub copied_files: Vec<String>,
    pub warnings: Vec<String>,
    pub tensors: Vec<TensorReport>,
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1_000_000_000 => format!("{:.2} GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.2} MB", b as f64 / 1e6),
        b if b >= 1_000 => format!("{:.1} kB", b as f64 / 1e3),
        b => format!("{b} B"),
    }
}

/// `--dry-run`: every output tensor, the shards, and the memory estimate.
pub fn render_plan(r: &ConvertReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "plan: {} → {} ({})", r.input, r.output, r.format);
    for t in &r.tensors {
        let shape = t.shape.iter().map(std::string::ToString::to_string).collect::<Vec<_>>().join("×");
        let _ = writeln!(
            s,
            "  {:<72} {:<5} {:<18} {:>10}  {}  [{}]",
            t.name,
            t.dtype,
            shape,
            human_bytes(t.bytes),
            t.file,
            t.kind
        );
    }
    for sh in &r.shards {
        let _ = writeln!(s, "shard {}: {} tensors, {}", sh.file, sh.tensors, human_bytes(sh.bytes));
    }
    let _ = writeln!(
        s,
        "total {} in {} shards; peak memory estimate {} ({} threads)",
        human_bytes(r.bytes_written),
        r.shards.len(),
        human_bytes(r.peak_memory_estimate),
        r.threads
    );
    s
}

/// The closing summary of a finished conversion.
pub fn render_summary(r: &ConvertReport) -> String {
    let counts = r.counts.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ");
    format!(
        "wrote {} ({} tensors: {counts}) in {} shards to {} in {:.2} s ({:.2} GB/s, {:.3e} weights/s, decoder {}, {} threads)\n",
        human_bytes(r.bytes_written),
        r.tensors.len(),
        r.shards.len(),
        r.output,
        r.seconds,
        r.gb_per_s,
        r.weights_per_s,
        r.decoder,
        r.threads
    )
}
