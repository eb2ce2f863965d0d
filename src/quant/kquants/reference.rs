//! The scalar reference: ggml's `quantize_row_q{4,5,6}_K_ref` block by block, operation for
//! operation, and the header and packing steps the lane-wise kernels share with it.

use super::{nearest_int, scale_min_k4, to_f16_bits, Q4_K_BLOCK_BYTES, Q5_K_BLOCK_BYTES, Q6_K_BLOCK_BYTES, QK_K};
use half::f16;

/// How a `make_qkx2_quants` fit measures a value's error: squared (`Q4_K`, `Q5_K`) or absolute
/// (`Q2_K`'s `use_mad`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorNorm {
    Squared,
    Absolute,
}

/// The stretched grids a `make_qkx2_quants` fit tries: `nmax + rmin + rdelta·is` levels over the
/// group's range for `is` in `0..=nstep`.
#[derive(Clone, Copy)]
pub(super) struct GridSearch {
    pub(super) rmin: f32,
    pub(super) rdelta: f32,
    pub(super) nstep: i32,
}

/// ggml's `make_qkx2_quants` for 32 values, squared error: fits `x ≈ scale·L − min` with `L` in
/// 0..=nmax by trying `nstep + 1` stretched grids and keeping the weighted least-squares fit of the
/// best one. Writes `l`, returns `(scale, min)` with `min ≥ 0` (the offset subtracted).
pub(super) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32; 32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    fit_affine(nmax, x, weights, l, GridSearch { rmin, rdelta, nstep }, ErrorNorm::Squared)
}

/// `make_qkx2_quants` for `N` values (`nstep ≥ 1`), the error measured by `norm`.
pub(super) fn fit_affine<const N: usize>(
    nmax: i32,
    x: &[f32],
    weights: &[f32; N],
    l: &mut [u8],
    search: GridSearch,
    norm: ErrorNorm,
) -> (f32, f32) {
    let x = &x[..N];
    let measure = |diff: f32| if norm == ErrorNorm::Absolute { diff.abs() } else { diff * diff };
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..N {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    // The grid always holds zero: the offset is never positive.
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..N].fill(0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..N {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += weights[i] * measure(diff);
    }
    let mut laux = [0u8; N];
    for is in 0..=search.nstep {
        iscale = (search.rmin + search.rdelta * is as f32 + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..N {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let qf = q as f32;
            sum_l += w * qf;
            sum_l2 += w * qf * qf;
            sum_xl += w * qf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            // A positive offset is not representable: refit the scale alone through zero.
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..N {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * measure(diff);
            }
            if cur_error < best_error {
                l[..N].copy_from_slice(&laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The part `Q4_K` and `Q5_K` share: per 32 values a scale and min (`make_qkx2_quants`, weights
/// `rms + |x|`), both quantized to 6 bits against f16 super-scales, then the quants recomputed
/// against the scales as stored. Returns `(d, dmin, scales field, quants in 0..=nmax)`.
fn quantize_scale_min_block(x: &[f32; QK_K], nmax: i32, rmin: f32, nstep: i32) -> (u16, u16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut weights = [0.0f32; 32];
    for j in 0..8 {
        let sub = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in sub {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(sub) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(nmax, sub, &weights, &mut l[32 * j..], rmin, 0.1, nstep);
        scales[j] = scale;
        mins[j] = min;
    }
    let (d, dmin, packed) = scale_min_header(&scales, &mins);

    requantize_scale_min(x, d, dmin, &packed, nmax, &mut l);
    (d, dmin, packed, l)
}

/// Quantizes `x` again against the `Q4_K`/`Q5_K` scales and mins as stored (what a decoder will
/// see); a group whose scale came out zero keeps the quants of its own fit.
pub(super) fn requantize_scale_min(
    x: &[f32; QK_K],
    d: u16,
    dmin: u16,
    packed: &[u8; 12],
    nmax: i32,
    l: &mut [u8; QK_K],
) {
    let (d_f, dmin_f) = (f16::from_bits(d).to_f32(), f16::from_bits(dmin).to_f32());
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, packed);
        let dj = d_f * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin_f * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
}

/// The super-scales `d`, `dmin` (f16 bits) and the 12-byte field of 6-bit group scales and mins
/// for the groups' fitted scales and mins, as `quantize_row_q{4,5}_K_ref` computes them.
pub(super) fn scale_min_header(scales: &[f32; 8], mins: &[f32; 8]) -> (u16, u16, [u8; 12]) {
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for (&scale, &min) in scales.iter().zip(mins) {
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // C stores the rounded int in a uint8_t before clamping: out-of-range values wrap first.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = to_f16_bits(max_scale / 63.0);
    let dmin = to_f16_bits(max_min / 63.0);
    (d, dmin, packed)
}

/// One `Q4_K` super-block: 8 groups of 32 values, `x ≈ d·sc·q − dmin·m`, q in 0..16.
pub(super) fn quantize_q4_k_block(x: &[f32; QK_K]) -> [u8; Q4_K_BLOCK_BYTES] {
    let (d, dmin, scales, l) = quantize_scale_min_block(x, 15, -1.0, 20);
    let mut out = [0u8; Q4_K_BLOCK_BYTES];
    write_q4_k(d, dmin, &scales, &l, &mut out);
    out
}

/// Writes a `Q4_K` block from its header and quants (0..16).
#[inline(always)]
pub(super) fn write_q4_k(d: u16, dmin: u16, scales: &[u8; 12], l: &[u8; QK_K], out: &mut [u8; Q4_K_BLOCK_BYTES]) {
    out[0..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    out[4..16].copy_from_slice(scales);
    // Each 64 values share 32 bytes: the first 32 in the low nibbles, the next 32 in the high.
    let qs = &mut out[16..];
    for (chunk, ls) in qs.chunks_exact_mut(32).zip(l.chunks_exact(64)) {
        for k in 0..32 {
            chunk[k] = ls[k] | (ls[k + 32] << 4);
        }
    }
}

/// One `Q5_K` super-block: as `Q4_K` with q in 0..32; the fifth bit of value `64·p + k` (k < 32) is
/// bit `2p` of byte `k` of `qh`, that of value `64·p + 32 + k` bit `2p + 1`.
pub(super) fn quantize_q5_k_block(x: &[f32; QK_K]) -> [u8; Q5_K_BLOCK_BYTES] {
    let (d, dmin, scales, l) = quantize_scale_min_block(x, 31, -0.5, 15);
    let mut out = [0u8; Q5_K_BLOCK_BYTES];
    write_q5_k(d, dmin, &scales, &l, &mut out);
    out
}

/// Writes a `Q5_K` block from its header and quants (0..32) into `out`, which is zero.
#[inline(always)]
pub(super) fn write_q5_k(d: u16, dmin: u16, scales: &[u8; 12], l: &[u8; QK_K], out: &mut [u8; Q5_K_BLOCK_BYTES]) {
    out[0..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    out[4..16].copy_from_slice(scales);
    let (qh, qs) = out[16..].split_at_mut(32);
    for (p, (chunk, ls)) in qs.chunks_exact_mut(32).zip(l.chunks_exact(64)).enumerate() {
        for k in 0..32 {
            let (lo, hi) = (ls[k], ls[k + 32]);
            qh[k] |= ((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1));
            chunk[k] = (lo & 0xF) | ((hi & 0xF) << 4);
        }
    }
}

/// ggml's `make_qx_quants` for 16 values with `rmse_type` 1 (weights x²) and no importance: a
/// symmetric grid `x ≈ scale·(L − nmax)`, L in 0..2·nmax, the scale chosen among 19 stretches of
/// the grid by weighted least squares. Writes `l`, returns the scale (its sign that of the
/// largest-magnitude value's negation, so the extreme value lands on L = 0).
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let (max, amax) = crate::quant::largest_magnitude(&x[..16]);
    if amax < 1e-15 {
        l[..16].fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = -nmax_f / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..16 {
        let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (q + nmax) as u8;
        let w = x[i] * x[i];
        let qf = q as f32;
        sumlx += w * x[i] * qf;
        suml2 += w * qf * qf;
    }
    // C tests `suml2 ? … : 0`: NaN counts as non-zero.
    let mut scale = if suml2 == 0.0 { 0.0 } else { sumlx / suml2 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax_f + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in &x[..16] {
            let qf = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v;
            sumlx += w * v * qf;
            suml2 += w * qf * qf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..16 {
                l[i] = (nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// One `Q6_K` super-block: 16 groups of 16 values, `x ≈ d·sc·(q − 32)` with an int8 `sc` per group
/// and q in 0..64 split into a low nibble and a high bit pair.
pub(super) fn quantize_q6_k_block(x: &[f32; QK_K]) -> [u8; Q6_K_BLOCK_BYTES] {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    for ib in 0..16 {
        scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..]);
    }
    q6_k_from_scales(x, &scales, &mut l)
}

/// A `Q6_K` block from its 16 groups' fitted scales: the scales stored, then every value
/// quantized again against the scale as stored (a group whose scale is zero keeps its fit's `l`).
pub(super) fn q6_k_from_scales(x: &[f32; QK_K], scales: &[f32; 16], l: &mut [u8; QK_K]) -> [u8; Q6_K_BLOCK_BYTES] {
    let mut out = [0u8; Q6_K_BLOCK_BYTES];
    let Some((d, sc)) = q6_k_header(scales) else {
        // ggml zeroes the whole block (d = +0 included).
        return out;
    };
    let d_f = f16::from_bits(d).to_f32();
    for (j, &s) in sc.iter().enumerate() {
        let dj = d_f * s as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / dj).clamp(-32, 31) + 32) as u8;
        }
    }
    write_q6_k(d, &sc, l, &mut out);
    out
}

/// The super-scale `d` (f16 bits) and the int8 group scales for the groups' fitted scales, as
/// `quantize_row_q6_K_ref` computes them; `None` when every scale is below 1e-15 in magnitude
/// (ggml then writes a zero block).
pub(super) fn q6_k_header(scales: &[f32; 16]) -> Option<(u16, [i8; 16])> {
    let (max_scale, max_abs_scale) = crate::quant::largest_magnitude(scales);
    if max_abs_scale < 1e-15 {
        return None;
    }
    // The largest-magnitude group scale maps to −128; the others round into −128..=127 (C clamps
    // above only, then stores in an int8_t).
    let iscale = -128.0 / max_scale;
    let d = to_f16_bits(1.0 / iscale);
    let mut sc = [0i8; 16];
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    Some((d, sc))
}

/// Writes a `Q6_K` block from its super-scale, group scales and quants (0..64).
#[inline(always)]
pub(super) fn write_q6_k(d: u16, sc: &[i8; 16], l: &[u8; QK_K], out: &mut [u8; Q6_K_BLOCK_BYTES]) {
    // Per 128 values: 64 bytes of nibbles (values k and k + 64 share byte k, k + 32 and k + 96 share
    // byte 32 + k) and 32 bytes of high bit pairs (k, k + 32, k + 64, k + 96 from the bottom up).
    let (ql, rest) = out.split_at_mut(128);
    let (qh, tail) = rest.split_at_mut(64);
    for ((ql, qh), ls) in ql.chunks_exact_mut(64).zip(qh.chunks_exact_mut(32)).zip(l.chunks_exact(128)) {
        for k in 0..32 {
            let (q1, q2, q3, q4) = (ls[k], ls[k + 32], ls[k + 64], ls[k + 96]);
            ql[k] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            ql[k + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            qh[k] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    for (b, &s) in tail[..16].iter_mut().zip(sc) {
        *b = s as u8;
    }
    tail[16..18].copy_from_slice(&d.to_le_bytes());
}
