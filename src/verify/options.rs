//! What verify is asked to do, and the thresholds its verdicts use.

use crate::checkpoint::HubSource;
use std::path::PathBuf;

/// `--max-ratio` when not given: a misplaced decode lands near √2·2^K, far above it.
pub const DEFAULT_MAX_RATIO: f64 = 2.0;
/// Minimum element-wise correlation for K ≤ 2 when `--min-corr` is not given.
pub const MIN_CORR_LOW_K: f64 = 0.8;
/// Minimum element-wise correlation for K ≥ 3 when `--min-corr` is not given.
pub const MIN_CORR_HIGH_K: f64 = 0.9;
/// Minimum correlation of an int8 pair with its base weight.
pub const INT8_MIN_CORR: f64 = 0.9;
/// A norm matches a candidate when the mean absolute difference is below this (bf16 rounding of
/// values near 1 is 2^-8).
pub const NORM_MATCH: f64 = 0.02;

#[derive(Clone, Debug)]
pub struct VerifyOptions {
    /// IN and BASE: directories or files (a Hub id's cache snapshot once located).
    pub input: PathBuf,
    pub base: PathBuf,
    /// The Hub ids IN and BASE were given as, and the commits they resolved to.
    pub input_hub: Option<HubSource>,
    pub base_hub: Option<HubSource>,
    pub only: Vec<String>,
    /// Check this many evenly spread 128×128 blocks per tensor instead of whole tensors.
    pub sample: Option<usize>,
    pub max_ratio: f64,
    /// Minimum correlation; `None`: 0.8 for K ≤ 2, 0.9 above.
    pub min_corr: Option<f64>,
    pub threads: Option<usize>,
    /// Pass even when tensors of IN are missing from BASE (never when no coded tensor was checked).
    pub allow_missing: bool,
}

impl VerifyOptions {
    /// `escha-convert verify IN --base BASE` with no other flag: every block of every tensor, the
    /// default thresholds, one thread per core.
    pub fn new(input: PathBuf, base: PathBuf) -> VerifyOptions {
        VerifyOptions {
            input,
            base,
            input_hub: None,
            base_hub: None,
            only: Vec::new(),
            sample: None,
            max_ratio: DEFAULT_MAX_RATIO,
            min_corr: None,
            threads: None,
            allow_missing: false,
        }
    }

    /// The correlation a K-bit linear must reach.
    pub fn min_corr(&self, k: u32) -> f64 {
        min_corr_for(self.min_corr, k)
    }
}

/// `given`, or the default floor for K.
pub fn min_corr_for(given: Option<f64>, k: u32) -> f64 {
    given.unwrap_or(if k <= 2 { MIN_CORR_LOW_K } else { MIN_CORR_HIGH_K })
}

/// A usable `--max-ratio`: finite and at least 1 (no honest decode beats the bound).
pub fn check_max_ratio(r: f64) -> Result<f64, String> {
    if r.is_finite() && r >= 1.0 {
        Ok(r)
    } else {
        Err(format!("--max-ratio must be a finite number of at least 1.0, not {r}"))
    }
}

/// A usable `--min-corr`: a correlation in [-1, 1].
pub fn check_min_corr(c: f64) -> Result<f64, String> {
    if (-1.0..=1.0).contains(&c) {
        Ok(c)
    } else {
        Err(format!("--min-corr must be a correlation between -1 and 1, not {c}"))
    }
}
