//! What verify found: one row per checked tensor, with its figures and failures, and the report
//! that holds them, ordered one way for every kind of row.

use super::base::BaseLayout;
use super::options::min_corr_for;
use crate::checkpoint::HubSource;
use serde::Serialize;

/// Figures for one coded linear, or one expert of a stack.
#[derive(Clone, Debug, Serialize)]
pub struct CodedFigures {
    pub corr: Option<f64>,
    pub cosine: Option<f64>,
    pub rel_err: Option<f64>,
    pub shannon_bound: f64,
    pub ratio: Option<f64>,
    pub compared: u64,
    pub live_channels: usize,
    pub pruned_channels: usize,
    pub tiles_checked: u64,
    pub overlap_violations: u64,
    pub corr_rout_row_norm: Option<f64>,
    pub corr_rin_col_norm: Option<f64>,
    pub inner_std: Option<f64>,
    pub codebook_rms: f32,
}

#[derive(Clone, Debug, Serialize)]
pub struct CodedRow {
    pub tensor: String,
    pub base_tensor: Vec<String>,
    pub k: u32,
    pub experts: Option<usize>,
    #[serde(flatten)]
    pub figures: CodedFigures,
    /// The experts of a stack that were checked (all of them, or those a sample reached).
    pub per_expert: Vec<ExpertRow>,
    /// Every failure of the tensor; an expert's are prefixed `expert E: `.
    pub failures: Vec<String>,
}

/// One expert of a stack: its index in the stack, its figures and its own failures.
#[derive(Clone, Debug, Serialize)]
pub struct ExpertRow {
    pub expert: usize,
    #[serde(flatten)]
    pub figures: CodedFigures,
    pub failures: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Int8Row {
    pub tensor: String,
    pub corr: Option<f64>,
    pub rel_err: Option<f64>,
    pub failures: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct NormRow {
    pub tensor: String,
    pub kind: &'static str,
    pub escha_mean: f64,
    pub base_mean: f64,
    pub diff: f64,
    pub diff_plus_one: f64,
    pub verdict: &'static str,
    pub failures: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    /// IN and BASE as read: the paths given, or the cache snapshots Hub ids resolved to.
    pub input: String,
    pub base: String,
    /// The Hub ids IN and BASE were given as, with the commits read (`null` for local paths).
    pub input_hub: Option<HubSource>,
    pub base_hub: Option<HubSource>,
    pub base_layout: BaseLayout,
    pub base_fp8: bool,
    pub decoder: &'static str,
    pub sampled_blocks: Option<usize>,
    pub max_ratio: f64,
    /// `--min-corr`, when given (else the defaults by K).
    pub min_corr: Option<f64>,
    pub coded: Vec<CodedRow>,
    pub int8: Vec<Int8Row>,
    pub norms: Vec<NormRow>,
    pub missing_in_base: Vec<String>,
    /// Failures of the run as a whole (tensors missing from BASE, nothing coded checked, BASE
    /// looking like another model).
    pub problems: Vec<String>,
    pub checked: usize,
    pub failed: usize,
    pub passed: bool,
    /// Notes on how the run went (a capped `-j`).
    pub warnings: Vec<crate::warning::Warning>,
}

impl VerifyReport {
    /// The correlation a K-bit linear had to reach.
    pub fn min_corr_for(&self, k: u32) -> f64 {
        min_corr_for(self.min_corr, k)
    }

    /// The first reason the run failed: a problem of the run, else the first failing tensor of
    /// any kind with its failures.
    pub fn first_failure(&self) -> Option<String> {
        let rows = self.coded.iter().map(|r| (&r.tensor, r.failures()));
        let rows = rows.chain(self.int8.iter().map(|r| (&r.tensor, r.failures())));
        let mut rows = rows.chain(self.norms.iter().map(|r| (&r.tensor, r.failures())));
        self.problems.first().cloned().or_else(|| {
            let (tensor, failures) = rows.find(|(_, f)| !f.is_empty())?;
            Some(format!("{tensor}: {}", failures.join("; ")))
        })
    }
}

/// A checked tensor.
pub trait Finding {
    fn failures(&self) -> &[String];

    /// How bad it looks among passing rows of its kind (higher first).
    fn severity(&self) -> f64 {
        0.0
    }
}

impl Finding for CodedRow {
    fn failures(&self) -> &[String] {
        &self.failures
    }

    /// The worst ratio first.
    fn severity(&self) -> f64 {
        self.figures.ratio.unwrap_or(f64::INFINITY)
    }
}

impl Finding for Int8Row {
    fn failures(&self) -> &[String] {
        &self.failures
    }
}

impl Finding for NormRow {
    fn failures(&self) -> &[String] {
        &self.failures
    }
}

/// Failing rows first, then by severity; otherwise in model order (a stable sort).
pub fn order<T: Finding>(rows: &mut [T]) {
    rows.sort_by(|a, b| {
        a.failures().is_empty().cmp(&b.failures().is_empty()).then(b.severity().total_cmp(&a.severity()))
    });
}

/// How many rows failed.
pub fn failed<T: Finding>(rows: &[T]) -> usize {
    rows.iter().filter(|r| !r.failures().is_empty()).count()
}
