//! `escha-convert verify IN --base BASE`.

use super::exit::{fail, print_json, print_out, warn, FAILURE, USAGE};
use super::values::BackendArg;
use crate::backend::Backend;
use crate::checkpoint::{input_extent, locate};
use crate::failure::ErrorCode;
use crate::output::file::check_destination;
use crate::verify::{check_max_ratio, check_min_corr, render, verify, write_html, VerifyOptions, DEFAULT_MAX_RATIO};
use anyhow::Context;
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The Escha-W2 checkpoint: a directory, a .safetensors file, or a Hub id `org/name[@REVISION]`
    /// read from the local Hugging Face cache (nothing is downloaded).
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// The unquantized base model: HF layout (bf16/f16/f32 or fp8 e4m3 with `weight_scale_inv`) or
    /// MLX layout bf16; a directory, a .safetensors file or a Hub id `org/name[@REVISION]` in the
    /// local cache.
    #[arg(long, value_name = "BASE")]
    pub base: PathBuf,
    /// Check only tensors whose output name matches GLOB; repeatable.
    #[arg(long, value_name = "GLOB")]
    pub only: Vec<String>,
    /// Check N evenly spread 128×128 blocks per tensor (across its experts too) instead of whole
    /// tensors.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub sample: Option<u64>,
    /// Fail when the ratio of the relative error to the Shannon bound exceeds R.
    #[arg(long, value_name = "R", default_value_t = DEFAULT_MAX_RATIO, value_parser = number(check_max_ratio))]
    pub max_ratio: f64,
    /// Fail when the element-wise correlation is below C (default 0.8 for K≤2, 0.9 for K≥3).
    #[arg(long, value_name = "C", value_parser = number(check_min_corr))]
    pub min_corr: Option<f64>,
    /// Pass even when tensors of IN are missing from BASE (at least one coded tensor must still be
    /// checked).
    #[arg(long)]
    pub allow_missing: bool,
    /// Worker threads (default: one per core).
    #[arg(short = 'j', long)]
    pub threads: Option<usize>,
    /// Print one JSON document with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Who decodes the trellis tiles.
    #[arg(long, value_enum, ignore_case = true, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Also write the report as one self-contained HTML page (charts, sortable tables) to FILE,
    /// whether the checks pass or not.
    #[arg(long, value_name = "FILE", value_parser = html_destination)]
    pub html: Option<PathBuf>,
}

/// `--html FILE`: a file name (where it may go is checked against IN and BASE before the run).
fn html_destination(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if p.file_name().is_none() {
        return Err(format!("{s}: not a file name"));
    }
    Ok(p)
}

/// Where `--html` writes, checked before any check runs: outside IN and BASE, a regular file or
/// nothing, in a directory that takes a new file.
fn html_target(opts: &VerifyOptions, path: &Path) -> anyhow::Result<PathBuf> {
    let mut inputs = input_extent(&opts.input)?;
    inputs.extend(input_extent(&opts.base)?);
    check_destination(path, &inputs).context("--html")
}

/// A value parser for a number that `check` accepts.
fn number(check: fn(f64) -> Result<f64, String>) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |s| s.trim().parse::<f64>().map_err(|_| format!("{s:?} is not a number")).and_then(check)
}

impl TryFrom<&VerifyArgs> for VerifyOptions {
    type Error = anyhow::Error;

    /// The options, IN and BASE located (a Hub id found in the cache, or an error saying how to
    /// download it).
    fn try_from(a: &VerifyArgs) -> anyhow::Result<Self> {
        let input = locate(&a.input)?;
        let base = locate(&a.base).context("--base")?;
        Ok(VerifyOptions {
            input_hub: input.hub,
            base_hub: base.hub,
            only: a.only.clone(),
            sample: a.sample.map(|n| n as usize),
            max_ratio: a.max_ratio,
            min_corr: a.min_corr,
            threads: a.threads,
            allow_missing: a.allow_missing,
            ..VerifyOptions::new(input.path, base.path)
        })
    }
}

pub fn run(a: &VerifyArgs) -> ExitCode {
    // A file-size limit or an interrupt while the page is written: an error, no temporary left.
    crate::signals::install();
    // Exit 1 is reserved for failed checks: a run that could not check anything is 2 (an IN or
    // BASE that is not there, a Hub id the cache does not hold, included).
    let opts = match VerifyOptions::try_from(a) {
        Ok(o) => o,
        Err(e) => return fail(&e, ErrorCode::InputRefused, USAGE),
    };
    let html = match a.html.as_deref().map(|p| html_target(&opts, p)).transpose() {
        Ok(t) => t,
        Err(e) => return fail(&e, ErrorCode::OutputRefused, USAGE),
    };
    let backend = match Backend::new(a.backend.into()) {
        Ok(b) => b,
        Err(e) => return fail(&e.into(), ErrorCode::BackendUnavailable, USAGE),
    };
    let report = match verify(&opts, backend.decoder()) {
        Ok(r) => r,
        Err(e) => return fail(&e, ErrorCode::InputRefused, USAGE),
    };
    report.warnings.iter().for_each(|w| warn(&w.message));
    // Under --json the page is written first, so that a failure to write it prints the failure
    // document instead of the report: stdout holds one document either way.
    let write_page = || html.as_ref().map_or(Ok(()), |path| write_html(&report, path));
    let printed = if a.json {
        if let Err(e) = write_page() {
            return fail(&e, ErrorCode::WriteFailed, FAILURE);
        }
        print_json(&report)
    } else {
        let printed = print_out(&render(&report));
        if let Err(e) = write_page() {
            // The checks ran; what failed is writing their record (a full disk, a vanished folder).
            return fail(&e, ErrorCode::WriteFailed, FAILURE);
        }
        printed
    };
    if !report.passed {
        return ExitCode::from(FAILURE);
    }
    printed
}
