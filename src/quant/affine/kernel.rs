//! The vector kernel, written once over [`Lanes`] and compiled for each CPU by one
//! `#[target_feature]` entry ([`quantize_groups_avx2`], [`quantize_groups_neon`]).
//!
//! A group's maximum and minimum run in as many vectors as it takes to hold the reference's eight
//! lanes, lane `i` over elements `i, i + 8, …`, with the reference's comparisons operand for
//! operand (`Vector::max` and `min` are C's `x > m ? x : m` and `x < m ? x : m`, which keep NaN
//! out). The scales and biases of eight groups are then computed together, one group per lane,
//! with the reference's operations.
//!
//! Codes are a vector at a time: `(x − bias) / scale` (IEEE division, as the scalar `/`), then
//! rounded to nearest even and clamped to `0..=n_bins` with NaN giving 0, as the reference's
//! `rint` and clamp make them. Runs of [`PACKED_CODES`] codes fill whole bytes at any width, so
//! they are packed one after another, each by the CPU's byte shuffles ([`Lanes::pack_codes`]).

use super::PACK_SLACK;
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;
#[cfg(target_arch = "aarch64")]
use crate::simd::Neon;
use crate::simd::{Lanes, Vector, PACKED_CODES};

/// [`quantize_groups`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) fn quantize_groups_avx2(
    lanes: Avx2,
    values: &[f32],
    group_size: usize,
    bits: u32,
    packed: &mut [u8],
    scales: &mut [f32],
    biases: &mut [f32],
) {
    quantize_groups(lanes, values, group_size, bits, packed, scales, biases);
}

/// [`quantize_groups`] compiled for NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
pub(super) fn quantize_groups_neon(
    lanes: Neon,
    values: &[f32],
    group_size: usize,
    bits: u32,
    packed: &mut [u8],
    scales: &mut [f32],
    biases: &mut [f32],
) {
    quantize_groups(lanes, values, group_size, bits, packed, scales, biases);
}

/// Quantizes consecutive groups of `group_size` values: group `i`'s scale and bias go to
/// `scales[i]` and `biases[i]`, its `group_size·bits/8` packed bytes follow group `i − 1`'s in
/// `packed`, which has [`PACK_SLACK`] bytes to spare at the end.
#[inline(always)]
fn quantize_groups<L: Lanes>(
    lanes: L,
    values: &[f32],
    group_size: usize,
    bits: u32,
    packed: &mut [u8],
    scales: &mut [f32],
    biases: &mut [f32],
) {
    assert!(
        group_size > 0 && group_size.is_multiple_of(PACKED_CODES),
        "group size {group_size} is not a multiple of {PACKED_CODES}"
    );
    let groups = values.len() / group_size;
    assert_eq!(groups * group_size, values.len(), "values are not whole groups");
    assert!(scales.len() >= groups && biases.len() >= groups, "room for every scale and bias");
    assert!(packed.len() >= values.len() * bits as usize / 8 + PACK_SLACK, "room for the packed codes");
    match bits {
        2 => run::<L, 2>(lanes, values, group_size, packed, scales, biases),
        3 => run::<L, 3>(lanes, values, group_size, packed, scales, biases),
        4 => run::<L, 4>(lanes, values, group_size, packed, scales, biases),
        5 => run::<L, 5>(lanes, values, group_size, packed, scales, biases),
        6 => run::<L, 6>(lanes, values, group_size, packed, scales, biases),
        8 => run::<L, 8>(lanes, values, group_size, packed, scales, biases),
        _ => panic!("MLX affine quantization has no {bits}-bit mode"),
    }
}

/// The reference's lanes of maximum and minimum; also the groups whose scales and biases are
/// computed together.
const BATCH: usize = 8;

#[inline(always)]
fn run<L: Lanes, const BITS: u32>(
    lanes: L,
    values: &[f32],
    group_size: usize,
    packed: &mut [u8],
    scales: &mut [f32],
    biases: &mut [f32],
) {
    let n_bins = ((1u32 << BITS) - 1) as f32;
    let group_bytes = group_size * BITS as usize / 8;
    let mut packed = packed;
    let batches = values.chunks(BATCH * group_size).zip(scales.chunks_mut(BATCH).zip(biases.chunks_mut(BATCH)));
    for (batch, (scales, biases)) in batches {
        // Unused lanes of a short last batch quantize a zero group, and are dropped.
        let (mut his, mut los) = ([0f32; BATCH], [0f32; BATCH]);
        for ((g, hi), lo) in batch.chunks_exact(group_size).zip(&mut his).zip(&mut los) {
            (*hi, *lo) = max_min(lanes, g);
        }
        let (mut s, mut o) = ([0f32; BATCH], [0f32; BATCH]);
        for k in (0..BATCH).step_by(L::LANES) {
            let (scale, bias) = scale_bias(lanes, lanes.load(&his[k..]), lanes.load(&los[k..]), n_bins);
            scale.store(&mut s[k..]);
            bias.store(&mut o[k..]);
        }
        for (((g, scale), bias), (&s, &o)) in
            batch.chunks_exact(group_size).zip(scales).zip(biases).zip(s.iter().zip(&o))
        {
            codes::<L, BITS>(lanes, g, s, o, packed);
            packed = &mut packed[group_bytes..];
            (*scale, *bias) = (s, o);
        }
    }
}

/// The maximum and minimum of a group (a multiple of [`PACKED_CODES`] values), NaNs ignored as in
/// the reference: its eight lanes (see the module comment), then a tree over them, which can only
/// differ from the reference's in-order fold in the sign of a zero result, on which the scale and
/// bias do not depend.
#[inline(always)]
fn max_min<L: Lanes>(lanes: L, g: &[f32]) -> (f32, f32) {
    // Enough vectors for the reference's eight lanes at four lanes a vector, the fewest there are.
    let (mut hi, mut lo) = ([lanes.splat(f32::NEG_INFINITY); BATCH / 4], [lanes.splat(f32::INFINITY); BATCH / 4]);
    let n = BATCH / L::LANES;
    // A run of codes at a time (groups are whole runs), so that its steps of eight unroll.
    for run in g.chunks_exact(PACKED_CODES) {
        for x in run.chunks_exact(BATCH) {
            for (k, (hi, lo)) in hi[..n].iter_mut().zip(&mut lo[..n]).enumerate() {
                let x = lanes.load(&x[k * L::LANES..]);
                *hi = x.max(*hi);
                *lo = x.min(*lo);
            }
        }
    }
    // No lane holds a NaN, so the order of these max/min does not matter.
    let hi = hi[1..n].iter().fold(hi[0], |m, &v| m.max_num(v));
    let lo = lo[1..n].iter().fold(lo[0], |m, &v| m.min_num(v));
    (hi.max_lane_num(), lo.min_lane_num())
}

/// The scale and bias of [`super::quantize_group`] for a vector of groups, the same IEEE
/// operations lane by lane: the `max` with eps is `v > eps ? v : eps` (NaN gives eps, as
/// `f32::max`), and `q0 != 0` is the negation of an ordered equality (true for NaN, as in Rust).
#[inline(always)]
fn scale_bias<L: Lanes>(lanes: L, hi: L::F32, lo: L::F32, n_bins: f32) -> (L::F32, L::F32) {
    let use_min = lo.abs().gt(hi.abs());
    let s = ((hi - lo) / lanes.splat(n_bins)).max(lanes.splat(1e-7));
    let s = (-s).replaced_where(use_min, s);
    let edge = hi.replaced_where(use_min, lo);
    let q0 = (edge / s).round_ties_even();
    let q0_zero = q0.eq(lanes.splat(0.0));
    ((edge / q0).replaced_where(q0_zero, s), edge.zero_where(q0_zero))
}

/// Writes the packed codes of one group (a multiple of [`PACKED_CODES`] values) to the start of
/// `out`, and up to [`PACK_SLACK`] bytes beyond them.
#[inline(always)]
fn codes<L: Lanes, const BITS: u32>(lanes: L, g: &[f32], scale: f32, bias: f32, out: &mut [u8]) {
    let (scale, bias) = (lanes.splat(scale), lanes.splat(bias));
    let n = PACKED_CODES / L::LANES;
    // Enough vectors for a run at four lanes a vector, the fewest there are.
    let mut q = [bias; PACKED_CODES / 4];
    for (c, x) in g.chunks_exact(PACKED_CODES).enumerate() {
        for (k, q) in q[..n].iter_mut().enumerate() {
            *q = (lanes.load(&x[k * L::LANES..]) - bias) / scale;
        }
        let codes = lanes.round_to_codes(&q[..n], (1 << BITS) - 1);
        // Each run's slack is overwritten by the next run, or lies in the group's slack.
        lanes.pack_codes::<BITS>(codes, &mut out[c * PACKED_CODES * BITS as usize / 8..]);
    }
}
