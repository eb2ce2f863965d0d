//! The 2- and 3-bit K-quants `Q2_K` and `Q3_K`: ggml's `quantize_row_q{2,3}_K_ref` block by block,
//! operation for operation (the scalar reference the kernels of `search.rs` are held to), and
//! ggml's dequantization of them. Both split a super-block into 16 groups of 16 values.

use super::reference::{fit_affine, ErrorNorm, GridSearch};
use super::{f16_at, nearest_int, to_f16_bits, QK_K};
use crate::block_type::BlockType;
use half::f16;

/// Bytes of one `Q2_K` super-block: 16 bytes of group scales (low nibble) and mins (high nibble),
/// 64 bytes of 2-bit quants, f16 `d`, f16 `dmin`.
pub const Q2_K_BLOCK_BYTES: usize = BlockType::Q2_K.bytes();
/// Bytes of one `Q3_K` super-block: 32 bytes of high bits, 64 bytes of low bit pairs, 12 bytes of
/// 6-bit group scales, f16 `d`.
pub const Q3_K_BLOCK_BYTES: usize = BlockType::Q3_K.bytes();

/// The levels of the 4-bit group scales and mins of `Q2_K`.
const Q2_SCALE_LEVELS: f32 = 15.0;

/// Packs 256 2-bit quants as ggml does: per 128 values, byte `k` of 32 holds values `k`, `k + 32`,
/// `k + 64`, `k + 96` from its low bits up.
fn pack_bit_pairs(l: &[u8; QK_K], qs: &mut [u8]) {
    for (chunk, ls) in qs.chunks_exact_mut(32).zip(l.chunks_exact(128)) {
        for k in 0..32 {
            chunk[k] = ls[k] | (ls[k + 32] << 2) | (ls[k + 64] << 4) | (ls[k + 96] << 6);
        }
    }
}

/// One `Q2_K` super-block: per 16 values `x ≈ d·sc·q − dmin·m`, q in 0..4, with 4-bit `sc` and `m`
/// fitted by `make_qkx2_quants` (weights `|x|`, absolute error).
pub(super) fn quantize_q2_k_block(x: &[f32; QK_K]) -> [u8; Q2_K_BLOCK_BYTES] {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    let mins_and_scales = {
        let mut mins = [0.0f32; 16];
        let mut weights = [0.0f32; 16];
        let search = GridSearch { rmin: -0.5, rdelta: 0.1, nstep: 15 };
        for j in 0..16 {
            let sub = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(sub) {
                *w = v.abs();
            }
            (scales[j], mins[j]) = fit_affine(3, sub, &weights, &mut l[16 * j..], search, ErrorNorm::Absolute);
        }
        mins
    };
    let mins = mins_and_scales;
    let (d, dmin, packed) = q2_k_header(&scales, &mins);

    q2_k_from_scales(x, d, dmin, &packed, &mut l)
}

/// A `Q2_K` block from its stored super-scales and packed group scales and mins: every value
/// quantized again against them (a group whose scale is zero keeps its fit's `l`).
pub(super) fn q2_k_from_scales(
    x: &[f32; QK_K],
    d: u16,
    dmin: u16,
    packed: &[u8; 16],
    l: &mut [u8; QK_K],
) -> [u8; Q2_K_BLOCK_BYTES] {
    let (d_f, dmin_f) = (f16::from_bits(d).to_f32(), f16::from_bits(dmin).to_f32());
    for (j, &sc) in packed.iter().enumerate() {
        let dj = d_f * (sc & 0xF) as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin_f * (sc >> 4) as f32;
        for i in 16 * j..16 * j + 16 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, 3) as u8;
        }
    }
    write_q2_k(d, dmin, packed, l)
}

/// The super-scales `d`, `dmin` (f16 bits) and the 16 bytes of 4-bit group scales (low nibble)
/// and mins (high nibble) for the groups' fitted scales and mins, as `quantize_row_q2_K_ref`
/// computes them.
pub(super) fn q2_k_header(scales: &[f32; 16], mins: &[f32; 16]) -> (u16, u16, [u8; 16]) {
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }

    let mut packed = [0u8; 16];
    let mut d = 0u16;
    if max_scale > 0.0 {
        let iscale = Q2_SCALE_LEVELS / max_scale;
        for (p, &s) in packed.iter_mut().zip(scales) {
            // C stores the int in a uint8_t: its low byte.
            *p = nearest_int(iscale * s) as u8;
        }
        d = to_f16_bits(max_scale / Q2_SCALE_LEVELS);
    }
    let mut dmin = 0u16;
    if max_min > 0.0 {
        let iscale = Q2_SCALE_LEVELS / max_min;
        for (p, &m) in packed.iter_mut().zip(mins) {
            *p |= nearest_int(iscale * m).wrapping_shl(4) as u8;
        }
        dmin = to_f16_bits(max_min / Q2_SCALE_LEVELS);
    }
    (d, dmin, packed)
}

/// A `Q2_K` block from its header and its quants (0..4).
pub(super) fn write_q2_k(d: u16, dmin: u16, packed: &[u8; 16], l: &[u8; QK_K]) -> [u8; Q2_K_BLOCK_BYTES] {
    let mut out = [0u8; Q2_K_BLOCK_BYTES];
    out[..16].copy_from_slice(packed);
    pack_bit_pairs(l, &mut out[16..80]);
    out[80..82].copy_from_slice(&d.to_le_bytes());
    out[82..84].copy_from_slice(&dmin.to_le_bytes());
    out
}

/// ggml's `make_q3_quants` for 16 values with `do_rmse`: a symmetric grid `x ≈ scale·L`, L in
/// `−nmax..nmax`, started from the largest magnitude landing on `−nmax` and improved value by value
/// (at most 5 sweeps) while the weighted (x²) least-squares fit gets better. Writes `L + nmax` to
/// `l`, returns the scale.
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let x = &x[..16];
    let (max, amax) = crate::quant::largest_magnitude(x);
    if amax < 1e-15 {
        l[..16].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut q = [0i32; 16];
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..16 {
        q[i] = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        let w = x[i] * x[i];
        let qf = q[i] as f32;
        sumlx += w * x[i] * qf;
        suml2 += w * qf * qf;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..16 {
            let w = x[i] * x[i];
            let qf = q[i] as f32;
            let mut slx = sumlx - w * x[i] * qf;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * qf * qf;
                let new_q = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_q != q[i] {
                    let nf = new_q as f32;
                    slx += w * x[i] * nf;
                    sl2 += w * nf * nf;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        q[i] = new_q;
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
    for (l, &q) in l.iter_mut().zip(&q) {
        *l = (q + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The 6-bit scale of group `j` (0..16) of a `Q3_K` scales field, less 32: its low nibble is in byte
/// `j` (low) or `j − 8` (high) of the first 8 bytes, its top bit pair in byte `8 + j % 4` at bit
/// `2·(j / 4)`.
pub(super) fn q3_k_scale(j: usize, scales: &[u8]) -> i8 {
    let low = if j < 8 { scales[j] & 0xF } else { scales[j - 8] >> 4 };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// One `Q3_K` super-block: per 16 values `x ≈ d·sc·(q − 4)`, q in 0..8 (two low bits in `qs`, the
/// third in `hmask`), `sc` a 6-bit signed scale.
pub(super) fn quantize_q3_k_block(x: &[f32; QK_K]) -> [u8; Q3_K_BLOCK_BYTES] {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..]);
    }
    let (d, packed) = q3_k_header(&scales);
    q3_k_from_scales(x, d, &packed, &mut l)
}

/// A `Q3_K` block whose header is fixed: every group's quants found again against its stored
/// scale `d·sc` (a group whose stored scale is 0 keeps the quants it has), as ggml closes both
/// the reference and the weighted encoder.
pub(super) fn q3_k_from_scales(
    x: &[f32; QK_K],
    d: u16,
    packed: &[u8; 12],
    l: &mut [u8; QK_K],
) -> [u8; Q3_K_BLOCK_BYTES] {
    let d_f = f16::from_bits(d).to_f32();
    for j in 0..16 {
        let dj = d_f * q3_k_scale(j, packed) as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / dj).clamp(-4, 3) + 4) as u8;
        }
    }
    write_q3_k(d, packed, l)
}

/// The super-scale `d` (f16 bits) and the 12 bytes of 6-bit group scales for the groups' fitted
/// scales, as `quantize_row_q3_K_ref` computes them.
pub(super) fn q3_k_header(scales: &[f32; 16]) -> (u16, [u8; 12]) {
    let (max_scale, _) = crate::quant::largest_magnitude(scales);
    let mut packed = [0u8; 12];
    let mut d = 0u16;
    // C tests `if (max_scale)`: a NaN counts as non-zero.
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // C keeps the rounded int in an int8_t (its low byte) before clamping.
            let q = (nearest_int(iscale * s) as i8).clamp(-32, 31) as i32 + 32;
            let low = (q & 0xF) as u8;
            if j < 8 {
                packed[j] = low;
            } else {
                packed[j - 8] |= low << 4;
            }
            packed[8 + j % 4] |= ((q >> 4) as u8) << (2 * (j / 4));
        }
        d = to_f16_bits(1.0 / iscale);
    }
    (d, packed)
}

/// A `Q3_K` block from its header and its quants (0..8, the third bit taken out of `l`).
pub(super) fn write_q3_k(d: u16, packed: &[u8; 12], l: &mut [u8; QK_K]) -> [u8; Q3_K_BLOCK_BYTES] {
    let mut out = [0u8; Q3_K_BLOCK_BYTES];
    let (hmask, rest) = out.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (scales, d_bytes) = rest.split_at_mut(12);
    scales.copy_from_slice(packed);
    // The third bit of value `32·b + k` is bit `b` of `hmask[k]` (without a branch: it is as
    // often set as not).
    for (b, ls) in l.chunks_exact_mut(32).enumerate() {
        for (h, q) in hmask.iter_mut().zip(ls) {
            *h |= ((*q >> 2) & 1) << b;
            *q &= 3;
        }
    }
    pack_bit_pairs(l, qs);
    d_bytes.copy_from_slice(&d.to_le_bytes());
    out
}

/// Appends the 256 values of a `Q2_K` block, as `dequantize_row_q2_K` computes them.
pub(super) fn dequantize_q2_k_block(block: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(block, 80);
    let min = f16_at(block, 82);
    let scales = &block[..16];
    for (h, q) in block[16..80].chunks_exact(32).enumerate() {
        for shift in 0..4 {
            for half in 0..2 {
                let sc = scales[8 * h + 2 * shift + half];
                let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                let q = &q[16 * half..16 * half + 16];
                out.extend(q.iter().map(|&b| dl * ((b >> (2 * shift)) & 3) as f32 - ml));
            }
        }
    }
}

/// Appends the 256 values of a `Q3_K` block, as `dequantize_row_q3_K` computes them.
pub(super) fn dequantize_q3_k_block(block: &[u8], out: &mut Vec<f32>) {
    let hmask = &block[..32];
    let scales = &block[96..108];
    let d = f16_at(block, 108);
    for (h, q) in block[32..96].chunks_exact(32).enumerate() {
        for shift in 0..4 {
            let bit = 1u8 << (4 * h + shift);
            for half in 0..2 {
                let dl = d * q3_k_scale(8 * h + 2 * shift + half, scales) as f32;
                let range = 16 * half..16 * half + 16;
                out.extend(q[range.clone()].iter().zip(&hmask[range]).map(|(&b, &m)| {
                    let low = ((b >> (2 * shift)) & 3) as i32;
                    dl * (low - if m & bit != 0 { 0 } else { 4 }) as f32
                }));
            }
        }
    }
}
