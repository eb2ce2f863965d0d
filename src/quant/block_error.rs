//! The error a GGUF storage type adds to a weight, for each of several candidates: estimated from
//! each block's range (a step `s` rounds a value with a mean squared error of `s²/12`; the block
//! scales' own f16 rounding, 2^-11 relative, is left out), or measured by encoding and decoding
//! exactly as the output will be. A row whose scales f16 would round coarsely (subnormal) is always
//! measured, so the error reported is that of the bytes written; a row with a value beyond what
//! blocks hold (`blocks::VALUE_MAX`) cannot be stored in any block type (infinite error). Element
//! types (bf16, f16) are always measured: rounding one value costs no more than estimating it.

use super::affine::round_to;
use super::blocks::{dequantize, first_unholdable, quantize};
use crate::block_type::BlockType;
use crate::storage::Storage;
use half::f16;

/// Squared added error of each candidate, and the squared norm of the weight, summed over the
/// rows seen (all-zero rows, pruned channels, are left out of both).
#[derive(Clone, Debug)]
pub struct StorageErrors {
    pub candidates: Vec<Storage>,
    pub sq: Vec<f64>,
    /// The squared norm of the rows each candidate's error was taken over: every row seen, unless
    /// its measuring was thinned ([`StorageErrors::add_estimate_thinned`]).
    pub norms: Vec<f64>,
    pub norm_sq: f64,
}

impl StorageErrors {
    /// No rows seen yet, for `candidates` (narrowest first).
    pub fn new(candidates: &[Storage]) -> StorageErrors {
        let n = candidates.len();
        StorageErrors { candidates: candidates.to_vec(), sq: vec![0.0; n], norms: vec![0.0; n], norm_sq: 0.0 }
    }

    #[must_use]
    pub fn merge(mut self, o: StorageErrors) -> StorageErrors {
        for (a, b) in self.sq.iter_mut().zip(o.sq) {
            *a += b;
        }
        for (a, b) in self.norms.iter_mut().zip(o.norms) {
            *a += b;
        }
        self.norm_sq += o.norm_sq;
        self
    }

    /// `‖deq(Q(W)) − W‖ / ‖W‖` for each candidate, in their order.
    pub fn relative(&self) -> Vec<(Storage, f64)> {
        let rel = |sq: f64, norm: f64| if norm > 0.0 { (sq / norm).sqrt() } else { 0.0 };
        self.candidates.iter().zip(self.sq.iter().zip(&self.norms)).map(|(&c, (&sq, &n))| (c, rel(sq, n))).collect()
    }

    /// Adds the estimate for `values` (`rows × cols`).
    pub fn add_estimate(&mut self, values: &[f32], cols: usize) {
        self.add_estimate_thinned(values, cols, 1);
    }

    /// As [`StorageErrors::add_estimate`], but a block type with no range estimate (the IQ4 types,
    /// each row an encode) is measured on every `step`-th live row only (the first included), its
    /// error taken over those rows' norm.
    pub fn add_estimate_thinned(&mut self, values: &[f32], cols: usize, step: usize) {
        self.add_weighted(values, cols, step, None);
    }

    /// As [`StorageErrors::add_estimate_thinned`], each value's error and square weighed by its
    /// column's importance where `importance` gives row `r` of `values` its columns' (`--imatrix`:
    /// the error ggml's weighted encoders minimize). With an importance every block type is
    /// measured with those encoders (they fit their scales to it, which a range does not see) on
    /// every `step`-th row, and on a large unit on evenly spread rows holding about
    /// [`WEIGHTED_MEASURED_VALUES`] values ([`GRID_MEASURED_VALUES`] for a grid type).
    pub fn add_weighted<'w>(
        &mut self,
        values: &[f32],
        cols: usize,
        step: usize,
        importance: Option<&dyn Fn(usize) -> &'w [f32]>,
    ) {
        let ranged = |b: BlockType| importance.is_none() && has_range_estimate(b);
        let every = |b: BlockType| {
            if importance.is_none() {
                return step.max(1);
            }
            let target = if on_grid(b) { GRID_MEASURED_VALUES } else { WEIGHTED_MEASURED_VALUES };
            step.max(values.len().div_ceil(target)).max(1)
        };
        self.add(values, cols, importance, |c, row, w, i| match c {
            Storage::Block(b) if !ranged(b) && i % every(b) != 0 => None,
            Storage::Block(b) if !ranged(b) => Some(measured(c, row, w)),
            Storage::Block(b) => Some(estimate(b, row).unwrap_or_else(|| measured(c, row, w))),
            Storage::Element(_) => Some(measured(c, row, w)),
        });
    }

    /// Adds the exact errors for `values` (`rows × cols`): encoded and decoded.
    pub fn add_exact(&mut self, values: &[f32], cols: usize) {
        self.add(values, cols, None, |c, row, w, _| Some(measured(c, row, w)));
    }

    /// Adds `error(candidate, row, weights, i)` for each live row (the `i`-th), where it gives
    /// one; a row with a value no block holds costs every block type an infinite error (it cannot
    /// be stored in one at all).
    fn add<'w>(
        &mut self,
        values: &[f32],
        cols: usize,
        importance: Option<&dyn Fn(usize) -> &'w [f32]>,
        error: impl Fn(Storage, &[f32], Option<&[f32]>, usize) -> Option<f64>,
    ) {
        let live = values.chunks_exact(cols).enumerate().filter(|(_, r)| r.iter().any(|&v| v != 0.0));
        for (i, (r, row)) in live.enumerate() {
            let w = importance.map(|of| of(r));
            let norm = norm_sq(row, w);
            self.norm_sq += norm;
            let holdable = first_unholdable(row).is_none();
            for ((sq, n), &c) in self.sq.iter_mut().zip(&mut self.norms).zip(&self.candidates) {
                let e = match c {
                    Storage::Block(_) if !holdable => Some(f64::INFINITY),
                    _ => error(c, row, w, i),
                };
                if let Some(e) = e {
                    *sq += e;
                    *n += norm;
                }
            }
        }
    }
}

/// Values of a large unit of rows measured per block type with an importance matrix (about 25 ms
/// of weighted K-quant encoding).
pub const WEIGHTED_MEASURED_VALUES: usize = 1 << 16;

/// The same for a grid type (IQ2, IQ3): their lattice search costs several times a K-quant's.
pub const GRID_MEASURED_VALUES: usize = WEIGHTED_MEASURED_VALUES / 4;

/// Whether `block`'s error can be estimated from its groups' ranges: not the IQ types, whose
/// levels are not evenly spaced (IQ4) or lie on grids (IQ2, IQ3).
fn has_range_estimate(block: BlockType) -> bool {
    !block.name().starts_with("iq")
}

/// Whether `block`'s values lie on a lattice of grid points (IQ2, IQ3), each group's searched.
fn on_grid(block: BlockType) -> bool {
    use BlockType as T;
    matches!(block, T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S)
}

/// `Σ w_j · x_j²` (each weight 1 without an importance).
fn norm_sq(row: &[f32], w: Option<&[f32]>) -> f64 {
    match w {
        None => row.iter().map(|&v| f64::from(v) * f64::from(v)).sum(),
        Some(w) => row.iter().zip(w).map(|(&v, &w)| f64::from(w) * f64::from(v) * f64::from(v)).sum(),
    }
}

/// The squared error of `row` stored as `storage`, encoded (with the importance, as the output
/// will be) and decoded, each value's weighed by its importance.
fn measured(storage: Storage, row: &[f32], w: Option<&[f32]>) -> f64 {
    let mut back = Vec::with_capacity(row.len());
    match storage {
        Storage::Block(b) => {
            let mut bytes = Vec::new();
            quantize(b, row, w, &mut bytes);
            dequantize(b, &bytes, &mut back);
        }
        Storage::Element(dtype) => back.extend(row.iter().map(|&v| round_to(v, dtype))),
    }
    let sq = back.iter().zip(row).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2));
    match w {
        None => sq.sum(),
        Some(w) => sq.zip(w).map(|(e, &w)| f64::from(w) * e).sum(),
    }
}

/// The smallest step whose stored scales f16 holds to its full precision: below it the smallest
/// stored scale (the step over the sub-block scales' levels, for the K-quants) is subnormal.
fn smallest_exact_step(block: BlockType) -> f64 {
    let sub_levels = match block {
        BlockType::Q2_K => 15.0,
        BlockType::Q3_K => 32.0,
        BlockType::Q4_K | BlockType::Q5_K => 63.0,
        BlockType::Q6_K => 127.0,
        _ => 1.0,
    };
    // A margin of 2 covers the quantizers' own choice of scale within a group's range.
    2.0 * f64::from(f16::MIN_POSITIVE.to_f32()) * sub_levels
}

/// The estimated squared error of `row` stored as `block`: per group of values sharing a step,
/// `n · s²/12` with the step of its format (symmetric ones from the largest magnitude, those
/// with a minimum from the range down to at most zero); `None` where a non-zero step is too small
/// for f16 scales to hold exactly, so the row must be measured, and for the IQ4 types, whose
/// levels are not evenly spaced.
fn estimate(block: BlockType, row: &[f32]) -> Option<f64> {
    let smallest = smallest_exact_step(block);
    let (group, levels, with_min) = match block {
        BlockType::IQ4_NL
        | BlockType::IQ4_XS
        | BlockType::IQ2_XXS
        | BlockType::IQ2_XS
        | BlockType::IQ2_S
        | BlockType::IQ3_XXS
        | BlockType::IQ3_S => return None,
        // The 16-value groups: Q2_K's 4 levels from a minimum, Q3_K's 8 symmetric ones.
        BlockType::Q2_K => (16, 3.0, true),
        BlockType::Q3_K => (16, 8.0, false),
        BlockType::Q4_0 => (32, 16.0, false),
        BlockType::Q5_0 => (32, 32.0, false),
        BlockType::Q8_0 => (32, 254.0, false),
        // The K-quants' 32-value sub-blocks round like the 32-value blocks with a minimum.
        BlockType::Q4_1 | BlockType::Q4_K => (32, 15.0, true),
        BlockType::Q5_1 | BlockType::Q5_K => (32, 31.0, true),
        BlockType::Q6_K => (16, 64.0, false),
    };
    let mut sq = 0.0;
    for g in row.chunks(group) {
        let span = if with_min {
            let (lo, hi) = g.iter().fold((0.0f32, f32::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            f64::from(hi.max(0.0) - lo)
        } else {
            2.0 * g.iter().fold(0.0f64, |m, &v| m.max(f64::from(v.abs())))
        };
        let step = span / levels;
        if step != 0.0 && step < smallest {
            return None;
        }
        sq += g.len() as f64 * step * step / 12.0;
    }
    Some(sq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use safetensors::Dtype;

    #[test]
    fn the_estimate_tracks_the_exact_error_on_gaussian_weights() {
        let mut rng = SplitMix64(11);
        let mut gauss = || rng.gaussian() as f32 * 0.02;
        let (rows, cols) = (32, 1024);
        let mut values: Vec<f32> = (0..rows * cols).map(|_| gauss()).collect();
        values[..cols].fill(0.0); // a pruned row counts for nothing
        let candidates: Vec<Storage> = [
            BlockType::Q2_K,
            BlockType::Q3_K,
            BlockType::IQ4_XS,
            BlockType::Q4_K,
            BlockType::Q5_K,
            BlockType::Q6_K,
            BlockType::Q8_0,
        ]
        .into_iter()
        .map(Storage::Block)
        .chain([Storage::Element(Dtype::BF16)])
        .collect();
        let (mut est, mut exact) = (StorageErrors::new(&candidates), StorageErrors::new(&candidates));
        est.add_estimate(&values, cols);
        exact.add_exact(&values, cols);
        assert!((est.norm_sq - exact.norm_sq).abs() < 1e-9 * exact.norm_sq);
        let (e, x) = (est.relative(), exact.relative());
        for ((c, e), (_, x)) in e.iter().zip(&x) {
            assert!((e / x - 1.0).abs() < 0.3, "{}: estimate {e} vs exact {x}", c.name());
        }
        // Each wider type is more exact than the one before.
        assert!(x.windows(2).all(|w| w[1].1 < w[0].1), "{x:?}");
    }

    #[test]
    fn thinned_measuring_of_the_iq4_types_stays_close_and_leaves_the_others_alone() {
        let mut rng = SplitMix64(5);
        let (rows, cols) = (256, 512);
        // Rows of different scales: the thinned ratio is taken over the measured rows' own norm.
        let values: Vec<f32> =
            (0..rows * cols).map(|i| rng.gaussian() as f32 * 0.01 * (1 + (i / cols) % 7) as f32).collect();
        let candidates: Vec<Storage> = [BlockType::Q3_K, BlockType::IQ4_XS, BlockType::IQ4_NL, BlockType::Q4_K]
            .into_iter()
            .map(Storage::Block)
            .collect();
        let (mut every, mut thinned) = (StorageErrors::new(&candidates), StorageErrors::new(&candidates));
        every.add_estimate(&values, cols);
        thinned.add_estimate_thinned(&values, cols, 16);
        for ((c, e), (_, t)) in every.relative().iter().zip(&thinned.relative()) {
            match c {
                Storage::Block(BlockType::IQ4_XS | BlockType::IQ4_NL) => {
                    assert!((t / e - 1.0).abs() < 0.05, "{}: thinned {t} vs every row {e}", c.name());
                }
                _ => assert_eq!(t, e, "{}: estimated from every row either way", c.name()),
            }
        }
    }

    #[test]
    fn with_an_importance_a_large_unit_is_measured_on_fewer_rows_the_grid_types_on_fewest() {
        // 128 rows of 5120 (a 27B linear's unit): every 10th row for the K-quants, every 40th for
        // the grid types; each row's norm differs, so the norms say which rows were measured.
        let (rows, cols) = (128, 5120);
        let mut rng = SplitMix64(11);
        let values: Vec<f32> = (0..rows * cols).map(|i| rng.gaussian() as f32 * (1 + i / cols) as f32).collect();
        let w = vec![1.0f32; cols];
        let of = |_: usize| w.as_slice();
        let candidates = [Storage::Block(BlockType::Q4_K), Storage::Block(BlockType::IQ2_XXS)];
        let mut e = StorageErrors::new(&candidates);
        e.add_weighted(&values, cols, 4, Some(&of));
        let norm_of =
            |step: usize| (0..rows).step_by(step).map(|r| norm_sq(&values[r * cols..][..cols], None)).sum::<f64>();
        assert_eq!(e.norms[0], norm_of(10));
        assert_eq!(e.norms[1], norm_of(40));
        // A small unit keeps the step it is given for both: every 4th row, or every row (a small
        // tensor's, `Probe::weighted_row_step`).
        let small = &values[..64 * 256];
        for step in [4, 1] {
            let mut e = StorageErrors::new(&candidates);
            e.add_weighted(small, 256, step, Some(&|_| &w[..256]));
            let kept = (0..64).step_by(step).map(|r| norm_sq(&small[r * 256..][..256], None)).sum::<f64>();
            assert_eq!((e.norms[0], e.norms[1]), (kept, kept));
        }
    }

    #[test]
    fn tiny_and_huge_weights_are_measured_with_their_f16_scales() {
        let candidates: Vec<Storage> = [
            BlockType::Q2_K,
            BlockType::Q3_K,
            BlockType::IQ4_NL,
            BlockType::IQ4_XS,
            BlockType::Q4_K,
            BlockType::Q5_K,
            BlockType::Q6_K,
            BlockType::Q8_0,
        ]
        .into_iter()
        .map(Storage::Block)
        .collect();
        let mut rng = SplitMix64(5);
        let gauss: Vec<f32> = (0..8 * 1024).map(|_| rng.gaussian() as f32).collect();
        for scale in [2e-5f32, 1e-6, 1e-9, 5e6, 1e9] {
            let values: Vec<f32> = gauss.iter().map(|v| v * scale).collect();
            let (mut est, mut exact) = (StorageErrors::new(&candidates), StorageErrors::new(&candidates));
            est.add_estimate(&values, 1024);
            exact.add_exact(&values, 1024);
            for ((c, e), (_, x)) in est.relative().iter().zip(&exact.relative()) {
                // What auto reports is what the bytes hold: never below the measured error.
                assert!(e >= x || (e / x - 1.0).abs() < 0.3, "{} at scale {scale}: estimate {e}, bytes {x}", c.name());
            }
        }
        // Weights of 1e-9 are zeros in every type (their scales underflow f16): the whole norm is lost.
        let values: Vec<f32> = gauss.iter().map(|v| v * 1e-9).collect();
        let mut est = StorageErrors::new(&candidates);
        est.add_estimate(&values, 1024);
        assert!(est.relative().iter().all(|&(_, e)| (e - 1.0).abs() < 1e-6), "{:?}", est.relative());
        // Weights of 1e9 are beyond what any block type holds.
        let values: Vec<f32> = gauss.iter().map(|v| v * 1e9).collect();
        let mut est = StorageErrors::new(&candidates);
        est.add_estimate(&values, 1024);
        assert!(est.relative().iter().all(|&(_, e)| e == f64::INFINITY), "{:?}", est.relative());
    }
}
