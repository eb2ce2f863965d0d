//! The conversion engine: checkpoint → catalogue → layout → plan → parallel work units →
//! finished directory. It knows output formats only through [`Layout`] and containers only
//! through [`Container`].
//!
//! A work unit is a run of output rows of one tensor: one 128-row block of a coded linear (or of
//! one expert), or a bounded run of rows of anything else. Each unit reads its rows from the
//! memory maps, adjusts and encodes them and writes the bytes at their planned offset, so memory
//! is bounded by threads × one unit, and the bytes do not depend on the thread count or schedule.

mod execute;
mod files;
mod job;
mod options;
mod progress;
mod report;
mod rows;
mod units;

pub use options::ConvertOptions;
pub use report::{render_plan, render_summary, ConvertReport, ShardReport, TensorReport};

use crate::checkpoint::Checkpoint;
use crate::codec::TileDecoder;
use crate::container::{Container, Safetensors};
use crate::layout::Layout;
use crate::output::Staging;
use crate::transform::hadamard::HADAMARD_SIZE;
use anyhow::{Context, Result};
use job::Job;
use std::collections::BTreeMap;
use std::time::Instant;

pub fn convert(opts: &ConvertOptions, decoder: &dyn TileDecoder) -> Result<ConvertReport> {
    let started = Instant::now();
    let mut warnings = Vec::new();
    let pool = crate::pool::pool(opts.threads, &mut warnings)?;
    let layout = opts.format.layout();
    let container = Safetensors;
    let job = Job::new(Checkpoint::open(&opts.input)?, opts, layout.as_ref(), &container, &mut warnings)?;

    let mut report = plan_report(opts, layout.as_ref(), &job, decoder, pool.current_num_threads());
    if opts.dry_run {
        report.would_refuse = Staging::check(&opts.output, &opts.input, opts.force).err().map(|e| format!("{e:#}"));
        report.warnings = warnings;
        return Ok(report);
    }

    let staging = Staging::prepare(&opts.output, &opts.input, opts.force, &mut warnings)?;
    let progress = progress::Progress::new(opts.progress, report.bytes_written);
    let dir = staging.path();
    let reader = rows::Reader { ck: &job.ck, cat: &job.cat, decoder };
    pool.install(|| execute::write_shards(&job.plan, &reader, dir, &progress))
        .with_context(|| format!("{}: cannot write the output", opts.output.display()))?;
    for (i, shard) in job.plan.shards.iter().enumerate() {
        let tensors: Vec<_> = job.plan.shard_tensors(i).map(|p| &p.tensor).collect();
        container.check_written(&dir.join(&shard.file_name), &tensors)?;
    }
    report.copied_files = files::write_side_files(&job, dir)?;
    progress.finish();
    job.ck.check_unchanged()?;
    staging.commit()?;

    report.seconds = started.elapsed().as_secs_f64();
    report.gb_per_s = report.bytes_written as f64 / 1e9 / report.seconds;
    report.weights_per_s = report.weights as f64 / report.seconds;
    report.warnings = warnings;
    Ok(report)
}

/// The report of a planned conversion: every tensor and shard, sizes and the memory estimate.
fn plan_report(
    opts: &ConvertOptions,
    layout: &dyn Layout,
    job: &Job,
    decoder: &dyn TileDecoder,
    threads: usize,
) -> ConvertReport {
    let plan = &job.plan;
    let mut report = ConvertReport {
        input: opts.input.display().to_string(),
        output: opts.output.display().to_string(),
        format: layout.name(),
        dry_run: opts.dry_run,
        decoder: decoder.name(),
        threads,
        counts: BTreeMap::new(),
        shards: Vec::new(),
        bytes_written: plan.shards.iter().map(|s| s.len).sum(),
        weights: 0,
        seconds: 0.0,
        gb_per_s: 0.0,
        weights_per_s: 0.0,
        peak_memory_estimate: 0,
        copied_files: Vec::new(),
        would_refuse: None,
        warnings: Vec::new(),
        tensors: Vec::new(),
    };
    for p in &plan.tensors {
        *report.counts.entry(p.tensor.kind.name()).or_default() += 1;
        report.weights += p.tensor.weights();
        report.tensors.push(TensorReport {
            name: p.tensor.name.clone(),
            kind: p.tensor.kind.name(),
            dtype: format!("{:?}", p.tensor.dtype),
            shape: p.tensor.shape.clone(),
            bytes: p.tensor.byte_len() as u64,
            file: plan.shards[p.shard].file_name.clone(),
        });
    }
    for s in &plan.shards {
        report.shards.push(ShardReport { file: s.file_name.clone(), tensors: s.tensors.len(), bytes: s.len });
    }
    let widest = job.cat.coded.iter().map(|m| m.in_padded).max().unwrap_or(0);
    report.peak_memory_estimate = threads as u64 * unit_memory(widest) as u64;
    report
}

/// Bytes of scratch one work unit needs at input width `ic`.
fn unit_memory(ic: usize) -> usize {
    HADAMARD_SIZE * ic * (4 + 4) + units::ELEMENTS_PER_UNIT * (4 + 4)
}
