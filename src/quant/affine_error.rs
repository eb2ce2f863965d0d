//! The error MLX affine quantization adds to a weight, at every width it offers: estimated from
//! each group's range (a step `s` rounds each non-zero value with a mean squared error of
//! `s²/12`), or measured by quantizing and dequantizing exactly as the output will be.

use super::affine::{dequantize_rows, level, quantize_rows, round_to, scale_and_bias, AffineOut, AffineSpec, BITS};
use safetensors::Dtype;

/// Squared added error at each width of [`BITS`], and the squared norm of the weight, summed
/// over the rows seen (all-zero rows, pruned channels, are left out of both).
#[derive(Clone, Copy, Debug, Default)]
pub struct WidthErrors {
    pub sq: [f64; BITS.len()],
    pub norm_sq: f64,
}

impl WidthErrors {
    #[must_use]
    pub fn merge(mut self, o: WidthErrors) -> WidthErrors {
        for (a, b) in self.sq.iter_mut().zip(o.sq) {
            *a += b;
        }
        self.norm_sq += o.norm_sq;
        self
    }

    /// `‖deq(Q_b(W)) − W‖ / ‖W‖` at `bits`.
    pub fn relative(&self, bits: u32) -> f64 {
        let i = BITS.iter().position(|&b| b == bits).expect("a width MLX offers");
        if self.norm_sq > 0.0 {
            (self.sq[i] / self.norm_sq).sqrt()
        } else {
            0.0
        }
    }

    /// The smallest width whose added error is at most `budget` (the widest when none is).
    pub fn narrowest_within(&self, budget: f64) -> u32 {
        let options: Vec<(u32, f64)> = BITS.iter().map(|&b| (b, self.relative(b))).collect();
        super::budget::narrowest_within(&options, budget)
    }

    /// Adds the estimate for `values` (`rows × cols`, what gets quantized) at group size `gs`.
    pub fn add_estimate(&mut self, values: &[f32], cols: usize, gs: usize) {
        for row in values.chunks_exact(cols).filter(|r| r.iter().any(|&v| v != 0.0)) {
            self.norm_sq += row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
            for g in row.chunks_exact(gs) {
                let (lo, hi) = g.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                let range = f64::from(hi - lo);
                // Zeros (dead columns) sit on the grid: MLX aligns it so that zero is a code.
                let live = g.iter().filter(|&&v| v != 0.0).count() as f64;
                for (sq, bits) in self.sq.iter_mut().zip(BITS) {
                    let step = range / f64::from((1u32 << bits) - 1);
                    *sq += live * step * step / 12.0;
                }
            }
        }
    }

    /// Adds the estimates for `values` (`rows × cols`) at each group size of `group_sizes` (each a
    /// multiple of 32 that divides `cols`) into `errors`, one per group size: the ranges of the
    /// 32-value runs are found once and joined for the wider groups.
    pub fn add_estimates_at(errors: &mut [WidthErrors], values: &[f32], cols: usize, group_sizes: &[usize]) {
        let mut runs: Vec<(f32, f32, usize)> = Vec::with_capacity(cols / 32);
        for row in values.chunks_exact(cols).filter(|r| r.iter().any(|&v| v != 0.0)) {
            let norm_sq = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
            runs.clear();
            runs.extend(row.chunks_exact(32).map(|g| {
                let (lo, hi) = g.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                (lo, hi, g.iter().filter(|&&v| v != 0.0).count())
            }));
            for (e, &gs) in errors.iter_mut().zip(group_sizes) {
                e.norm_sq += norm_sq;
                for group in runs.chunks_exact(gs / 32) {
                    let (lo, hi, live) = group.iter().fold((f32::INFINITY, f32::NEG_INFINITY, 0), |(lo, hi, n), r| {
                        (lo.min(r.0), hi.max(r.1), n + r.2)
                    });
                    let range = f64::from(hi - lo);
                    for (sq, bits) in e.sq.iter_mut().zip(BITS) {
                        let step = range / f64::from((1u32 << bits) - 1);
                        *sq += live as f64 * step * step / 12.0;
                    }
                }
            }
        }
    }

    /// Adds the errors of `values` (`rows × cols`) at each group size of `group_sizes` (each
    /// dividing `cols`), measured on every `step`-th live row (the first included): each group
    /// quantized as `mx.quantize` does (its scale and bias stored in `scale_dtype`) and
    /// dequantized, each value's error and square weighed by its column's importance,
    /// `importance` giving row `r` of `values` its columns'.
    pub fn add_measured_at<'w>(
        errors: &mut [WidthErrors],
        values: &[f32],
        cols: usize,
        group_sizes: &[usize],
        scale_dtype: Dtype,
        step: usize,
        importance: &dyn Fn(usize) -> &'w [f32],
    ) {
        let live = values.chunks_exact(cols).enumerate().filter(|(_, r)| r.iter().any(|&v| v != 0.0));
        for (r, row) in live.step_by(step.max(1)) {
            let w = &importance(r)[..cols];
            let norm_sq = row.iter().zip(w).map(|(&v, &w)| f64::from(w) * f64::from(v) * f64::from(v)).sum::<f64>();
            for (e, &gs) in errors.iter_mut().zip(group_sizes) {
                e.norm_sq += norm_sq;
                for (g, w) in row.chunks_exact(gs).zip(w.chunks_exact(gs)) {
                    let (lo, hi) =
                        g.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                    for (sq, bits) in e.sq.iter_mut().zip(BITS) {
                        // The codes from the f32 scale and bias, the values from the stored ones.
                        let (scale, bias) = scale_and_bias(lo, hi, bits);
                        let (stored_scale, stored_bias) = (round_to(scale, scale_dtype), round_to(bias, scale_dtype));
                        let n_bins = ((1u32 << bits) - 1) as f32;
                        let group_sq: f32 = g
                            .iter()
                            .zip(w)
                            .map(|(&x, &w)| {
                                let back = stored_scale * level(x, scale, bias, n_bins) + stored_bias;
                                w * (back - x) * (back - x)
                            })
                            .sum();
                        *sq += f64::from(group_sq);
                    }
                }
            }
        }
    }

    /// Adds the exact errors for `values`: quantized as the output will be (scales stored in
    /// `scale_dtype`) and dequantized.
    pub fn add_exact(&mut self, values: &[f32], cols: usize, gs: usize, scale_dtype: Dtype) {
        let live: Vec<f32> =
            values.chunks_exact(cols).filter(|r| r.iter().any(|&v| v != 0.0)).flatten().copied().collect();
        if live.is_empty() {
            return;
        }
        self.norm_sq += live.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
        let (mut packed, mut scales, mut biases, mut back) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (sq, bits) in self.sq.iter_mut().zip(BITS) {
            let spec = AffineSpec { bits, group_size: gs };
            packed.clear();
            scales.clear();
            biases.clear();
            let out = &mut AffineOut { packed: &mut packed, scales: &mut scales, biases: &mut biases };
            quantize_rows(&live, cols, spec, scale_dtype, out);
            dequantize_rows(&packed, &scales, &biases, cols, spec, scale_dtype, &mut back);
            *sq += back.iter().zip(&live).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum::<f64>();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn the_estimate_tracks_the_exact_error_on_gaussian_weights() {
        let mut rng = SplitMix64(7);
        let mut gauss = || rng.gaussian() as f32 * 0.02;
        let (rows, cols) = (64, 512);
        let mut values: Vec<f32> = (0..rows * cols).map(|_| gauss()).collect();
        values[..cols].fill(0.0); // a pruned row counts for nothing
        super::super::affine::round_slice(&mut values, Dtype::BF16);
        let (mut est, mut exact) = (WidthErrors::default(), WidthErrors::default());
        est.add_estimate(&values, cols, 64);
        exact.add_exact(&values, cols, 64, Dtype::BF16);
        assert!((est.norm_sq - exact.norm_sq).abs() < 1e-9 * exact.norm_sq);
        for bits in BITS {
            let (e, x) = (est.relative(bits), exact.relative(bits));
            assert!((e / x - 1.0).abs() < 0.25, "bits {bits}: estimate {e} vs exact {x}");
        }
        // Gaussian groups of 64: about 0.45 / 0.19 / 0.090 at 2 / 3 / 4 bits.
        assert!((0.35..0.55).contains(&exact.relative(2)) && (0.07..0.11).contains(&exact.relative(4)));
        assert_eq!(exact.narrowest_within(0.5 * 0.25), 4);
        assert_eq!(exact.narrowest_within(0.5 * 0.125), 5);
    }

    #[test]
    fn the_measured_errors_are_those_of_the_bytes_written() {
        let mut rng = SplitMix64(9);
        let (rows, cols) = (5, 256);
        let mut values: Vec<f32> = (0..rows * cols).map(|_| rng.gaussian() as f32 * 0.02).collect();
        values[cols..2 * cols].fill(0.0);
        super::super::affine::round_slice(&mut values, Dtype::BF16);
        let ones = vec![1.0f32; cols];
        let mut at = [WidthErrors::default(); 2];
        WidthErrors::add_measured_at(&mut at, &values, cols, &[32, 128], Dtype::BF16, 1, &|_| ones.as_slice());
        for (e, gs) in at.iter().zip([32, 128]) {
            let mut exact = WidthErrors::default();
            exact.add_exact(&values, cols, gs, Dtype::BF16);
            assert!((e.norm_sq - exact.norm_sq).abs() < 1e-12 * exact.norm_sq);
            // Each group's error is summed in f32.
            for (a, b) in e.sq.iter().zip(exact.sq) {
                assert!((a - b).abs() < 1e-6 * b, "group size {gs}: {a} vs {b}");
            }
        }
        // Every 2nd live row: rows 0, 3 (row 1 is pruned, so not counted).
        let mut thinned = [WidthErrors::default()];
        WidthErrors::add_measured_at(&mut thinned, &values, cols, &[32], Dtype::BF16, 2, &|_| ones.as_slice());
        let picked: Vec<f32> = [0, 3].iter().flat_map(|&r| values[r * cols..(r + 1) * cols].to_vec()).collect();
        let mut those = [WidthErrors::default()];
        WidthErrors::add_measured_at(&mut those, &picked, cols, &[32], Dtype::BF16, 1, &|_| ones.as_slice());
        assert_eq!(thinned[0].sq.map(f64::to_bits), those[0].sq.map(f64::to_bits));
        assert_eq!(thinned[0].norm_sq.to_bits(), those[0].norm_sq.to_bits());
        // A column weighed double counts its error twice.
        let mut twice = ones.clone();
        twice[7] = 2.0;
        let mut heavier = [WidthErrors::default()];
        WidthErrors::add_measured_at(&mut heavier, &values, cols, &[32], Dtype::BF16, 1, &|_| twice.as_slice());
        let col: f64 = values.chunks_exact(cols).map(|r| f64::from(r[7]).powi(2)).sum();
        assert!((heavier[0].norm_sq - at[0].norm_sq - col).abs() < 1e-9 * at[0].norm_sq);
        assert!(heavier[0].sq.iter().zip(at[0].sq).all(|(h, a)| *h > a));
    }

    #[test]
    fn a_weight_on_one_column_moves_the_error_to_that_columns() {
        let mut rng = SplitMix64(5);
        let (rows, cols, gs) = (16, 128, 32);
        // Column 70's group (64..96) is ten times as wide as the others, but not column 70: its
        // values are small for the step its group rounds them with.
        let mut values: Vec<f32> = (0..rows * cols)
            .map(|i| rng.gaussian() as f32 * if (64..96).contains(&(i % cols)) && i % cols != 70 { 0.1 } else { 0.01 })
            .collect();
        super::super::affine::round_slice(&mut values, Dtype::BF16);
        let mut heavy = vec![1e-6f32; cols];
        heavy[70] = 1e6;
        let (mut plain, mut weighted) = (WidthErrors::default(), [WidthErrors::default()]);
        plain.add_exact(&values, cols, gs, Dtype::BF16);
        WidthErrors::add_measured_at(&mut weighted, &values, cols, &[gs], Dtype::BF16, 1, &|_| heavy.as_slice());
        // Column 70 alone, through the bytes: its values' error over their squares.
        let spec = AffineSpec { bits: 4, group_size: gs };
        let (mut packed, mut scales, mut biases, mut back) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        quantize_rows(
            &values,
            cols,
            spec,
            Dtype::BF16,
            &mut AffineOut { packed: &mut packed, scales: &mut scales, biases: &mut biases },
        );
        dequantize_rows(&packed, &scales, &biases, cols, spec, Dtype::BF16, &mut back);
        let column = |v: &[f32]| v.chunks_exact(cols).map(|r| f64::from(r[70])).collect::<Vec<_>>();
        let (x, y) = (column(&values), column(&back));
        let sq: f64 = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum();
        let alone = (sq / x.iter().map(|a| a * a).sum::<f64>()).sqrt();
        let (p, w) = (plain.relative(4), weighted[0].relative(4));
        assert!((w / alone - 1.0).abs() < 1e-3, "weighted {w} vs column 70's {alone}");
        assert!(p < 0.5 * alone, "the plain error {p} is another number");
    }

    #[test]
    fn the_estimates_at_several_group_sizes_equal_one_estimate_each() {
        let mut rng = SplitMix64(3);
        let (rows, cols) = (8, 384);
        let mut values: Vec<f32> = (0..rows * cols).map(|_| rng.gaussian() as f32).collect();
        values[cols..cols + 40].fill(0.0);
        let sizes = [32, 64, 128];
        let mut at = [WidthErrors::default(); 3];
        WidthErrors::add_estimates_at(&mut at, &values, cols, &sizes);
        for (e, gs) in at.iter().zip(sizes) {
            let mut one = WidthErrors::default();
            one.add_estimate(&values, cols, gs);
            assert!((e.norm_sq - one.norm_sq).abs() < 1e-9 * one.norm_sq);
            for (a, b) in e.sq.iter().zip(one.sq) {
                assert!((a - b).abs() < 1e-9 * b, "group size {gs}: {a} vs {b}");
            }
        }
    }
}
