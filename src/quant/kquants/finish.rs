//! What a kernel does per block once its lane-wise search has fitted the groups: the super-scales,
//! the 6- and 8-bit group scales, the quants against the scales as stored, and the packing, with
//! the reference's own scalar operations.

use super::low::{q2_k_header, q3_k_header, q3_k_scale, write_q2_k, write_q3_k};
use super::reference::{q6_k_header, scale_min_header, write_q4_k, write_q5_k, write_q6_k};
use super::{nearest_int, scale_min_k4, Q6_K_BLOCK_BYTES, QK_K};
use crate::block_type::BlockType;
use half::f16;

/// What a kernel's scale search found for each group ("unit") of the blocks it works on, lane by
/// lane: at most 32 units (four `Q4_K`/`Q5_K` blocks, two `Q2_K`/`Q3_K` blocks, or one `Q6_K`
/// block).
///
/// `scale` and `min` are what the reference's `make_qkx2_quants` / `make_qx_quants` return.
/// A unit's quants are kept as the grid they came from instead: `iscale` and `lmin` (the
/// multiplier and the offset that the winning pass rounded `iscale·(x − lmin)` or `iscale·x`
/// with), and `zero` (non-zero when the reference returns all-zero quants). The quants are only
/// needed for a group whose stored scale comes out zero, and are then recomputed from the grid,
/// with the reference's operations.
#[derive(Clone, Copy, Default)]
pub(super) struct Fits {
    pub(super) scale: [f32; 32],
    pub(super) min: [f32; 32],
    pub(super) iscale: [f32; 32],
    pub(super) lmin: [f32; 32],
    pub(super) zero: [u32; 32],
}

/// The final quants (`−4..4`) of `make_q3_quants`' sweeps, which no grid reproduces: element `i`
/// of unit `u` at `[i][u]`, as the lanes hold them.
pub(super) type Levels = [[f32; 32]; 16];

/// The quants of one `make_qkx2_quants` pass: `nearest_int(iscale·(x − min))` in `0..=nmax`.
fn qkx2_levels(nmax: i32, x: &[f32], iscale: f32, min: f32, l: &mut [u8]) {
    for (q, &v) in l.iter_mut().zip(x) {
        *q = nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    }
}

/// The quants of one `make_qx_quants` pass: `nearest_int(iscale·x)` in `−nmax..nmax`, plus `nmax`.
fn qx_levels(nmax: i32, x: &[f32], iscale: f32, l: &mut [u8]) {
    for (q, &v) in l.iter_mut().zip(x) {
        *q = (nearest_int(iscale * v).clamp(-nmax, nmax - 1) + nmax) as u8;
    }
}

/// The rest of [`quantize_scale_min_block`] and the packing, for a kernel that has done the
/// groups' searches: the fits of the block's groups are units `first..first + 8` of `fits`.
/// Inlined into each kernel, so that its element loops are compiled for that kernel's CPU.
#[inline(always)]
pub(super) fn finish_scale_min_block(kind: BlockType, x: &[f32], fits: &Fits, first: usize, out: &mut [u8]) {
    let x: &[f32; QK_K] = x.try_into().unwrap();
    let nmax = if kind == BlockType::Q4_K { 15 } else { 31 };
    let scales: &[f32; 8] = fits.scale[first..first + 8].try_into().unwrap();
    let mins: &[f32; 8] = fits.min[first..first + 8].try_into().unwrap();
    let (d, dmin, packed) = scale_min_header(scales, mins);
    let d_f = f16::from_bits(d).to_f32();
    let dmin_f = f16::from_bits(dmin).to_f32();
    let mut l = [0u8; QK_K];
    for (j, (xs, ls)) in x.chunks_exact(32).zip(l.chunks_exact_mut(32)).enumerate() {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d_f * sc as f32;
        if dj == 0.0 {
            let u = first + j;
            if fits.zero[u] == 0 {
                qkx2_levels(nmax, xs, fits.iscale[u], fits.lmin[u], ls);
            }
            continue;
        }
        let dm = dmin_f * m as f32;
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = nearest_int((v + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    if kind == BlockType::Q4_K {
        write_q4_k(d, dmin, &packed, &l, out.try_into().unwrap());
    } else {
        out[16..48].fill(0);
        write_q5_k(d, dmin, &packed, &l, out.try_into().unwrap());
    }
}

/// The rest of [`quantize_q6_k_block`], for a kernel that has done the 16 groups' searches.
#[inline(always)]
pub(super) fn finish_q6_k_block(x: &[f32], fits: &Fits, out: &mut [u8]) {
    let x: &[f32; QK_K] = x.try_into().unwrap();
    let out: &mut [u8; Q6_K_BLOCK_BYTES] = out.try_into().unwrap();
    let Some((d, sc)) = q6_k_header(fits.scale[..16].try_into().unwrap()) else {
        out.fill(0);
        return;
    };
    let d_f = f16::from_bits(d).to_f32();
    let mut l = [0u8; QK_K];
    for (j, (xs, ls)) in x.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
        let dj = d_f * sc[j] as f32;
        if dj == 0.0 {
            if fits.zero[j] == 0 {
                qx_levels(32, xs, fits.iscale[j], ls);
            }
            continue;
        }
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = (nearest_int(v / dj).clamp(-32, 31) + 32) as u8;
        }
    }
    write_q6_k(d, &sc, &l, out);
}

/// The rest of [`quantize_q2_k_block`] and the packing, for a kernel that has done the 16
/// groups' searches: units `first..first + 16` of `fits`.
#[inline(always)]
pub(super) fn finish_q2_k_block(x: &[f32], fits: &Fits, first: usize, out: &mut [u8]) {
    let x: &[f32; QK_K] = x.try_into().unwrap();
    let scales: &[f32; 16] = fits.scale[first..first + 16].try_into().unwrap();
    let mins: &[f32; 16] = fits.min[first..first + 16].try_into().unwrap();
    let (d, dmin, packed) = q2_k_header(scales, mins);
    let (d_f, dmin_f) = (f16::from_bits(d).to_f32(), f16::from_bits(dmin).to_f32());
    let mut l = [0u8; QK_K];
    for (j, (xs, ls)) in x.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
        let sc = packed[j];
        let dj = d_f * (sc & 0xF) as f32;
        if dj == 0.0 {
            let u = first + j;
            if fits.zero[u] == 0 {
                qkx2_levels(3, xs, fits.iscale[u], fits.lmin[u], ls);
            }
            continue;
        }
        let dm = dmin_f * (sc >> 4) as f32;
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = nearest_int((v + dm) / dj).clamp(0, 3) as u8;
        }
    }
    out.copy_from_slice(&write_q2_k(d, dmin, &packed, &l));
}

/// The rest of [`quantize_q3_k_block`] and the packing, for a kernel that has done the 16
/// groups' searches: units `first..first + 16` of `fits` and `levels`.
#[inline(always)]
pub(super) fn finish_q3_k_block(x: &[f32], fits: &Fits, levels: &Levels, first: usize, out: &mut [u8]) {
    let x: &[f32; QK_K] = x.try_into().unwrap();
    let (d, packed) = q3_k_header(fits.scale[first..first + 16].try_into().unwrap());
    let d_f = f16::from_bits(d).to_f32();
    let mut l = [0u8; QK_K];
    for (j, (xs, ls)) in x.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
        let dj = d_f * q3_k_scale(j, &packed) as f32;
        if dj == 0.0 {
            // The fit's own quants, plus 4; a group below 1e-15 keeps zeros.
            let u = first + j;
            if fits.zero[u] == 0 {
                for (q, level) in ls.iter_mut().zip(levels) {
                    *q = (level[u] as i32 + 4) as u8;
                }
            }
            continue;
        }
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = (nearest_int(v / dj).clamp(-4, 3) + 4) as u8;
        }
    }
    out.copy_from_slice(&write_q3_k(d, &packed, &mut l));
}
