//! The K-quants with an importance matrix: ggml's `quantize_row_q{2,3,4,5,6}_K_impl` block by
//! block, operation for operation, scalar. Each value's error is weighted by its column's
//! importance (times `√(σ² + x²)` for all but `Q6_K`, which takes the importance alone), and the
//! group scales are themselves fitted by weighted least squares (`make_qp_quants`,
//! `make_qx_quants` with weights) instead of from the largest scale.

use super::low::{q2_k_from_scales, q3_k_from_scales};
use super::reference::{
    fit_affine, q6_k_from_scales, requantize_scale_min, write_q4_k, write_q5_k, ErrorNorm, GridSearch,
};
use super::{nearest_int, to_f16_bits, QK_K};
use crate::block_type::BlockType;

/// The grids `make_qkx3_quants` tries in every weighted K-quant and legacy `_1` type.
const QKX3: GridSearch = GridSearch { rmin: -0.9, rdelta: 0.05, nstep: 36 };

/// ggml's `make_qkx3_quants` for `N` values with weights `w`, squared error: `x ≈ scale·L − min`,
/// `L` in `0..=nmax`. Writes `l`, returns `(scale, min)` with `min ≥ 0` (the offset subtracted).
pub(crate) fn fit_affine_weighted<const N: usize>(nmax: i32, x: &[f32], w: &[f32; N], l: &mut [u8]) -> (f32, f32) {
    // make_qkx3 differs from make_qkx2 only in `max <= min` for `max == min`, the same test for
    // the values it meets (no NaN).
    fit_affine(nmax, x, w, l, QKX3, ErrorNorm::Squared)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and importance weights `w`, over `x.len()` values: a
/// symmetric grid `x ≈ scale·(L − nmax)`, L in `0..2·nmax`, the scale the best of 19 stretches by
/// weighted least squares. Writes `l`, returns the scale.
pub(crate) fn make_qx_quants_weighted(nmax: i32, x: &[f32], l: &mut [u8], w: &[f32]) -> f32 {
    let n = x.len();
    let (max, amax) = crate::quant::largest_magnitude(x);
    if amax < 1e-15 {
        l[..n].fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = -nmax_f / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (q + nmax) as u8;
        let qf = q as f32;
        sumlx += w[i] * x[i] * qf;
        suml2 += w[i] * qf * qf;
    }
    // C tests `suml2 ? … : 0`: NaN counts as non-zero.
    let mut scale = if suml2 == 0.0 { 0.0 } else { sumlx / suml2 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax_f + 0.1 * is as f32) / max;
        (sumlx, suml2) = (0.0, 0.0);
        for i in 0..n {
            let qf = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1) as f32;
            sumlx += w[i] * x[i] * qf;
            suml2 += w[i] * qf * qf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                l[i] = (nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_qp_quants`: non-negative `x` (group scales or mins) as `scale·L`, L in `0..=nmax`,
/// weighted by `w`: the best of 9 stretches of the grid, then value by value improvements (at most 5
/// sweeps). `L` is C's `uint8_t`: a negative quant (from a negative `x`) wraps, as there.
fn make_qp_quants(nmax: i32, x: &[f32], l: &mut [u8], w: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < 1e-15 {
        l[..n].fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / max;
    for i in 0..n {
        l[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += w[i] * diff * diff;
    }
    for is in (-4..=4).filter(|&is| is != 0) {
        let iscale_is = (0.1 * is as f32 + nmax_f) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let q = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * q as f32;
            mse += w[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).min(nmax);
        l[i] = q as u8;
        sumlx += w[i] * x[i] * q as f32;
        suml2 += w[i] * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..n {
            let li = l[i] as f32;
            let mut slx = sumlx - w[i] * x[i] * li;
            let mut sl2 = suml2 - w[i] * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != i32::from(l[i]) {
                    let nf = new_l as f32;
                    slx += w[i] * x[i] * nf;
                    sl2 += w[i] * nf * nf;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Sum of squares of a super-block, front to back.
fn sum_squares(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |s, &v| s + v * v)
}

/// `qw·√(σ² + x²)` value by value, and their sum front to back.
fn scaled_weights<const N: usize>(x: &[f32], qw: &[f32], sigma2: f32) -> ([f32; N], f32) {
    let mut w = [0.0f32; N];
    let mut sum = 0.0f32;
    for i in 0..N {
        w[i] = qw[i] * (sigma2 + x[i] * x[i]).sqrt();
        sum += w[i];
    }
    (w, sum)
}

/// Writes super-block `x` encoded as `kind` with importance `qw` (one value per element) into
/// `out` (exactly one block's bytes, zero).
///
/// # Panics
///
/// If `kind` is not a K-quant.
pub(super) fn quantize_block(kind: BlockType, x: &[f32; QK_K], qw: &[f32; QK_K], out: &mut [u8]) {
    match kind {
        BlockType::Q2_K => out.copy_from_slice(&q2_k(x, qw)),
        BlockType::Q3_K => out.copy_from_slice(&q3_k(x, qw)),
        BlockType::Q4_K | BlockType::Q5_K => scale_min(kind, x, qw, out),
        BlockType::Q6_K => out.copy_from_slice(&q6_k(x, qw)),
        other => panic!("{} is not a K-quant", other.name()),
    }
}

fn q2_k(x: &[f32; QK_K], qw: &[f32; QK_K]) -> [u8; BlockType::Q2_K.bytes()] {
    let sigma2 = sum_squares(x) / QK_K as f32;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
    for j in 0..16 {
        let range = 16 * j..16 * j + 16;
        let (w, sum) = scaled_weights::<16>(&x[range.clone()], &qw[range.clone()], sigma2);
        sw[j] = sum;
        (scales[j], mins[j]) = fit_affine_weighted(3, &x[range.clone()], &w, &mut l[range]);
    }
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    let dm = make_qp_quants(15, &scales, &mut ls, &sw);
    let mm = make_qp_quants(15, &mins, &mut lm, &sw);
    let (d, dmin) = (to_f16_bits(dm), to_f16_bits(mm));
    let packed: [u8; 16] = std::array::from_fn(|j| ls[j] | (lm[j] << 4));
    q2_k_from_scales(x, d, dmin, &packed, &mut l)
}

fn q3_k(x: &[f32; QK_K], qw: &[f32; QK_K]) -> [u8; BlockType::Q3_K.bytes()] {
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let mut l = [0u8; QK_K];
    let (mut scales, mut sw) = ([0.0f32; 16], [0.0f32; 16]);
    for j in 0..16 {
        let range = 16 * j..16 * j + 16;
        let (w, sum) = scaled_weights::<16>(&x[range.clone()], &qw[range.clone()], sigma2);
        sw[j] = sum;
        scales[j] = make_qx_quants_weighted(4, &x[range.clone()], &mut l[range], &w);
    }
    let mut ls = [0u8; 16];
    let d_block = make_qx_quants_weighted(32, &scales, &mut ls, &sw);
    let mut packed = [0u8; 12];
    for (j, &q) in ls.iter().enumerate() {
        if j < 8 {
            packed[j] = q & 0xF;
        } else {
            packed[j - 8] |= (q & 0xF) << 4;
        }
        packed[8 + j % 4] |= (q >> 4) << (2 * (j / 4));
    }
    q3_k_from_scales(x, to_f16_bits(d_block), &packed, &mut l)
}

/// `Q4_K` and `Q5_K`: 8 groups of 32, their scales and mins fitted to 6 bits by `make_qp_quants`.
fn scale_min(kind: BlockType, x: &[f32; QK_K], qw: &[f32; QK_K], out: &mut [u8]) {
    let nmax = if kind == BlockType::Q4_K { 15 } else { 31 };
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
    for j in 0..8 {
        let range = 32 * j..32 * j + 32;
        let (w, sum) = scaled_weights::<32>(&x[range.clone()], &qw[range.clone()], sigma2);
        sw[j] = sum;
        (scales[j], mins[j]) = fit_affine_weighted(nmax, &x[range.clone()], &w, &mut l[range]);
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let (mut s, mut m) = (ls[j], lm[j]);
        // Only Q5_K clamps; Q4_K packs a wrapped quant's bits as they are.
        if kind == BlockType::Q5_K {
            (s, m) = (s.min(63), m.min(63));
        }
        if j < 4 {
            packed[j] = s;
            packed[j + 4] = m;
        } else {
            packed[j + 4] = (s & 0xF) | ((m & 0xF) << 4);
            packed[j - 4] |= (s >> 4) << 6;
            packed[j] |= (m >> 4) << 6;
        }
    }
    let (d, dmin) = (to_f16_bits(d_block), to_f16_bits(m_block));
    requantize_scale_min(x, d, dmin, &packed, nmax, &mut l);
    if kind == BlockType::Q4_K {
        write_q4_k(d, dmin, &packed, &l, out.try_into().unwrap());
    } else {
        write_q5_k(d, dmin, &packed, &l, out.try_into().unwrap());
    }
}

fn q6_k(x: &[f32; QK_K], qw: &[f32; QK_K]) -> [u8; BlockType::Q6_K.bytes()] {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    for (ib, scale) in scales.iter_mut().enumerate() {
        let range = 16 * ib..16 * ib + 16;
        *scale = make_qx_quants_weighted(32, &x[range.clone()], &mut l[range.clone()], &qw[range]);
    }
    q6_k_from_scales(x, &scales, &mut l)
}
