//! The conversion engine: checkpoint → catalogue → layout → plan → parallel work units →
//! finished directory. It knows output formats only through [`Layout`] and containers only
//! through the `container::Container` trait.
//!
//! A work unit is a run of output rows of one tensor: one 128-row block of a coded linear (or of
//! one expert), or a bounded run of rows of anything else. Each unit reads its rows from the
//! memory maps, adjusts and encodes them and writes the bytes at their planned offset, so memory
//! is bounded by threads × one unit, and the bytes do not depend on the thread count or schedule.

mod execute;
mod files;
mod fit;
mod importance;
mod job;
mod memory;
mod options;
mod probe;
mod progress;
mod report;
mod rows;
mod units;

pub use crate::plan::PartSpec;
pub use fit::BudgetReport;
pub use memory::{FitMemory, MemoryBudget};
pub use options::{ConvertOptions, VerifyRequest};
pub use report::{render_plan, render_summary, ConvertReport, ShardReport, TensorReport, VerifySummary, WrittenFile};

use crate::checkpoint::Checkpoint;
use crate::codec::TileDecoder;
use crate::failure::{classified, Classify, ErrorCode};
use crate::layout::{Encoding, Layout, WidthChoice};
use crate::output::{checksums, Claim, Destination, Staging, MARKER_FILE};
use crate::plan::Plan;
use crate::transform::hadamard::HADAMARD_SIZE;
use crate::verify::{verify, VerifyOptions};
use crate::warning::{Warning, WarningCode};
use anyhow::{anyhow, Context, Result};
use job::Job;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

pub fn convert(opts: &ConvertOptions, decoder: &dyn TileDecoder) -> Result<ConvertReport> {
    let started = Instant::now();
    let mut warnings = Vec::new();
    let pool = crate::pool::pool(opts.threads, &mut warnings)?;
    let layout = opts.format.layout();
    let ck = Checkpoint::open(&opts.input).class(ErrorCode::InputRefused)?;
    // OUT is checked (and, for a real run, locked) once the input is, before any weight is
    // decoded: a refused OUT costs no `--bits auto` or `--gguf-type auto` pass.
    let (mut claim, mut would_refuse) = (None, None::<String>);
    let job = pool
        .install(|| {
            Job::new(ck, opts, layout.as_ref(), (decoder, None), &mut warnings, |ck| {
                let inputs = protected_inputs(ck, opts).class(ErrorCode::InputRefused)?;
                let out = Destination { path: &opts.output, inputs: &inputs, force: opts.force };
                if opts.dry_run {
                    would_refuse = Staging::check(&out).err().map(|e| format!("{e:#}"));
                } else {
                    claim = Some(Claim::take(&out).class(ErrorCode::OutputRefused)?);
                }
                Ok(())
            })
        })
        .class(ErrorCode::InputRefused)?;
    let owned = job.plan.owned_shards(opts.part);
    if let Some(part) = opts.part.filter(|_| !owned.contains(&true)) {
        let (index, count, shards) = (part.index, part.count, job.plan.shards.len());
        warnings.push(Warning::new(
            WarningCode::EmptyPart,
            format!(
                "part {index}/{count} is empty: the output has {shards} shard(s) for {count} parts, so this part \
                 writes no tensor, only the files beside the shards; split into at most {shards} parts, or lower \
                 --max-shard-size"
            ),
        ));
    }

    let mut report = plan_report(opts, layout.as_ref(), &job, &owned, decoder, pool.current_num_threads());
    if opts.dry_run {
        report.would_refuse = would_refuse;
        report.warnings = warnings;
        return Ok(report);
    }

    let marker = files::marker(&job, layout.as_ref(), opts);
    let claim = claim.expect("Job::new claims OUT before it returns");
    let staging = Staging::prepare(claim, &marker.to_text(), &mut warnings).class(ErrorCode::OutputRefused)?;
    let progress = progress::Progress::new(opts.progress, report.bytes_written);
    let dir = staging.path();
    let reader = rows::Reader { ck: &job.ck, cat: &job.cat, decoder };
    pool.install(|| execute::write_shards(&job.plan, &reader, dir, &owned, &progress))
        .map_err(|e| {
            let code = write_class(&e);
            classified(e, code)
        })
        .with_context(|| format!("{}: cannot write the output", opts.output.display()))?;
    progress.finish();
    let mut written = vec![MARKER_FILE.to_string()];
    for (i, shard) in job.plan.shards.iter().enumerate().filter(|(i, _)| owned[*i]) {
        let tensors: Vec<_> = job.plan.shard_tensors(i).map(|p| p.tensor.info()).collect();
        job.container
            .check_written(&dir.join(&shard.file_name), &tensors, job.plan.shard_at(i))
            .class(ErrorCode::WriteFailed)?;
        written.push(shard.file_name.clone());
    }
    report.copied_files = files::write_side_files(&job, dir).class(ErrorCode::WriteFailed)?;
    written.extend(job.plan.index.iter().map(|(name, _)| name.clone()));
    written.extend(report.copied_files.iter().cloned());
    if let Some(request) = &opts.verify {
        let summary = prove(opts, request, decoder)?;
        report.verify = Some(summary);
    }
    if opts.card {
        let card = files::card(&job, layout.as_ref(), opts, report.verify.as_ref());
        files::write(dir, files::CARD_FILE, &card.render()).class(ErrorCode::WriteFailed)?;
        written.push(files::CARD_FILE.into());
    }
    report.files = match opts.part.filter(|_| opts.checksums) {
        Some(p) => {
            with_sums(dir, &written, &checksums::part_sums_file(p.index, p.count)).class(ErrorCode::WriteFailed)?
        }
        None if opts.checksums => with_sums(dir, &written, checksums::SUMS_FILE).class(ErrorCode::WriteFailed)?,
        None => written.into_iter().map(|file| WrittenFile { file, sha256: None }).collect(),
    };
    job.ck.check_unchanged().class(ErrorCode::InputChanged)?;
    // OUT gained something during the run, or the swap failed.
    staging.commit().class(ErrorCode::OutputRefused)?;

    report.seconds = started.elapsed().as_secs_f64();
    report.gb_per_s = report.bytes_written as f64 / 1e9 / report.seconds;
    report.weights_per_s = report.weights as f64 / report.seconds;
    report.warnings = warnings;
    Ok(report)
}

/// Where the inputs physically are (IN, and BASE for `--verify-base`): OUT must not overlap them.
fn protected_inputs(ck: &Checkpoint, opts: &ConvertOptions) -> Result<Vec<std::path::PathBuf>> {
    let mut inputs = ck.extent.clone();
    if let Some(request) = &opts.verify {
        inputs.extend(crate::checkpoint::input_extent(&request.base)?);
    }
    Ok(inputs)
}

/// Runs verify for `--verify-base`; a failed check is an error, so nothing is moved into place.
fn prove(opts: &ConvertOptions, request: &VerifyRequest, decoder: &dyn TileDecoder) -> Result<VerifySummary> {
    let verify_opts = VerifyOptions {
        input_hub: opts.hub.clone(),
        base_hub: request.hub.clone(),
        only: opts.only.clone(),
        sample: request.sample,
        threads: opts.threads,
        ..VerifyOptions::new(opts.input.clone(), request.base.clone())
    };
    let r = verify(&verify_opts, decoder)
        .context("--verify-base: cannot check the decode")
        .class(ErrorCode::InputRefused)?;
    let summary = VerifySummary {
        base: crate::card::source(&request.base, request.hub.as_ref()).0,
        hub: request.hub.clone(),
        passed: r.passed,
        checked: r.checked,
        failed: r.failed,
        coded: r.coded.len(),
        int8: r.int8.len(),
        norms: r.norms.len(),
        sampled_blocks: request.sample,
    };
    if !r.passed {
        // verify's own words would recommend its --allow-missing, which convert does not take.
        let why = match r.missing_in_base.first() {
            Some(first) => format!(
                "{} tensors of IN are not in BASE, first {first}: --verify-base needs the complete base model \
                 (`escha-convert verify IN --base BASE --allow-missing` checks the rest of a partial one)",
                r.missing_in_base.len()
            ),
            None => r.first_failure().unwrap_or_default(),
        };
        return Err(anyhow!("--verify-base: {}; {why}; nothing was written", summary.line()))
            .class(ErrorCode::VerifyFailed);
    }
    Ok(summary)
}

/// The class of a failure while the shards were written that was not classified where it arose
/// (the shard files classify their own failures as `write_failed`): an I/O error is the output's;
/// anything else arose from what was read (a value the format cannot hold).
fn write_class(e: &anyhow::Error) -> ErrorCode {
    if e.chain().any(<dyn std::error::Error>::is::<std::io::Error>) {
        ErrorCode::WriteFailed
    } else {
        ErrorCode::InputRefused
    }
}

/// Writes the sums of `files` as `sums_file`, which is written too.
fn with_sums(dir: &Path, files: &[String], sums_file: &str) -> Result<Vec<WrittenFile>> {
    let mut out: Vec<WrittenFile> = checksums::write_sums(dir, files, sums_file)?
        .into_iter()
        .map(|(file, hash)| WrittenFile { file, sha256: Some(hash) })
        .collect();
    out.push(WrittenFile { file: sums_file.into(), sha256: None });
    Ok(out)
}

/// The report of a planned conversion: every tensor and shard, sizes and the memory estimate.
fn plan_report(
    opts: &ConvertOptions,
    layout: &dyn Layout,
    job: &Job,
    owned: &[bool],
    decoder: &dyn TileDecoder,
    threads: usize,
) -> ConvertReport {
    let plan = &job.plan;
    let mut report = ConvertReport {
        input: opts.input.display().to_string(),
        hub: opts.hub.clone(),
        output: opts.output.display().to_string(),
        format: layout.name(),
        dry_run: opts.dry_run,
        decoder: decoder.name(),
        threads,
        counts: BTreeMap::new(),
        shards: Vec::new(),
        bytes_written: plan.shards.iter().zip(owned).filter(|(_, &own)| own).map(|(s, _)| s.len).sum(),
        weights: 0,
        seconds: 0.0,
        gb_per_s: 0.0,
        weights_per_s: 0.0,
        peak_memory_estimate: 0,
        copied_files: Vec::new(),
        would_refuse: None,
        part: opts.part.map(|p| format!("{}/{}", p.index, p.count)),
        files: Vec::new(),
        verify: None,
        width_choices: Vec::new(),
        affine_bits_per_weight: None,
        scale_fold_change: job.fold_change,
        budget: job.budget.clone(),
        imatrix: job.imatrix.clone(),
        warnings: Vec::new(),
        tensors: Vec::new(),
    };
    for p in &plan.tensors {
        *report.counts.entry(p.tensor.kind.name()).or_default() += 1;
        report.weights += p.tensor.weights();
        report.tensors.push(TensorReport {
            name: p.tensor.name.clone(),
            kind: p.tensor.kind.name(),
            dtype: p.tensor.storage.name(),
            shape: p.tensor.shape.clone(),
            bytes: p.tensor.byte_len() as u64,
            file: plan.shards[p.shard].file_name.clone(),
        });
    }
    for s in &plan.shards {
        report.shards.push(ShardReport { file: s.file_name.clone(), tensors: s.tensors.len(), bytes: s.len });
    }
    report.width_choices.clone_from(&job.widths);
    report.affine_bits_per_weight = affine_bits_per_weight(plan);
    let widest = job.cat.coded.iter().map(|m| m.in_padded).max().unwrap_or(0);
    report.peak_memory_estimate = threads as u64 * unit_memory(widest) as u64;
    report
}

/// Bits per weight of the affine-quantized tensors, scales and biases included.
fn affine_bits_per_weight(plan: &Plan) -> Option<f64> {
    let (mut bytes, mut weights) = (0u64, 0u64);
    for p in &plan.tensors {
        if let Some(Encoding::Affine { .. } | Encoding::Int8Affine { .. }) =
            p.tensor.recipe.as_ref().map(|r| &r.encoding)
        {
            weights += p.tensor.weights();
            bytes += p.tensor.byte_len() as u64;
            bytes += p.params.iter().flatten().map(|&t| plan.tensors[t].tensor.byte_len() as u64).sum::<u64>();
        }
    }
    (weights > 0).then(|| 8.0 * bytes as f64 / weights as f64)
}

/// The tensor bytes a conversion with `opts` would write, planned without writing; a format
/// that looks at the weights looks at `sample` blocks per tensor.
pub fn planned_tensor_bytes(
    opts: &ConvertOptions,
    decoder: &dyn TileDecoder,
    sample: Option<usize>,
) -> Result<(u64, Vec<WidthChoice>)> {
    let layout = opts.format.layout();
    let ck = Checkpoint::open(&opts.input)?;
    let job = Job::new(ck, opts, layout.as_ref(), (decoder, sample), &mut Vec::new(), |_| Ok(()))?;
    Ok((job.plan.tensors.iter().map(|p| p.tensor.byte_len() as u64).sum(), job.widths))
}

/// Bytes of scratch one work unit needs at input width `ic`.
fn unit_memory(ic: usize) -> usize {
    HADAMARD_SIZE * ic * (4 + 4) + units::ELEMENTS_PER_UNIT * (4 + 4)
}
