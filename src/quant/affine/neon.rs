//! NEON kernel for aarch64 (NEON is part of the base architecture).
//!
//! A group's maximum and minimum run in two 4-lane registers each, lanes `0..4` and `4..8`
//! matching the reference's eight lanes, with the reference's comparisons as compare-and-select
//! (`m < x ? x : m`, `x < m ? x : m`; not `fmax`/`fmin`, which would let NaN in). The scales
//! and biases of eight groups are then computed together, with the reference's operations.
//!
//! Codes are four at a time: `(x − bias) / scale` with `fdiv` (IEEE division, as the scalar
//! `/`), then `fcvtnu`, which rounds to nearest even and saturates to u32 (negatives and NaN give
//! 0, as the reference's clamp does), and a `min` with `n_bins`.
//!
//! Packing, 32 codes at a time: narrowing gives 16 byte codes per register; three shift-ors
//! (`u16`, `u32`, `u64`) leave 8 consecutive codes in the low `8b` bits (`b` bytes) of each u64,
//! and a table lookup closes the gaps. 32 codes always fill `4b` whole bytes, so groups pack
//! independently.

use super::PACK_SLACK;
#[allow(clippy::wildcard_imports)] // the intrinsics
use std::arch::aarch64::*;

/// Quantizes consecutive groups of `group_size` values: group `i`'s scale and bias go to
/// `scales[i]` and `biases[i]`, its `group_size·bits/8` packed bytes follow group `i − 1`'s in
/// `packed`, which has [`PACK_SLACK`] bytes to spare at the end.
pub(super) fn quantize_groups(
    values: &[f32],
    group_size: usize,
    bits: u32,
    packed: &mut [u8],
    scales: &mut [f32],
    biases: &mut [f32],
) {
    assert!(group_size > 0 && group_size.is_multiple_of(32), "group size {group_size} is not a multiple of 32");
    let groups = values.len() / group_size;
    assert_eq!(groups * group_size, values.len(), "values are not whole groups");
    assert!(scales.len() >= groups && biases.len() >= groups, "room for every scale and bias");
    assert!(packed.len() >= values.len() * bits as usize / 8 + PACK_SLACK, "room for the packed codes");
    match bits {
        2 => run::<2>(values, group_size, packed, scales, biases),
        3 => run::<3>(values, group_size, packed, scales, biases),
        4 => run::<4>(values, group_size, packed, scales, biases),
        5 => run::<5>(values, group_size, packed, scales, biases),
        6 => run::<6>(values, group_size, packed, scales, biases),
        8 => run::<8>(values, group_size, packed, scales, biases),
        _ => panic!("MLX affine quantization has no {bits}-bit mode"),
    }
}

/// Table lookups that keep the low `b` bytes of each u64: bytes `0..b` then `8..8 + b`, zeros
/// (index 255) after. Indexed by `b`.
static COMPACT: [[u8; 16]; 9] = {
    let mut t = [[255u8; 16]; 9];
    let mut b = 0;
    while b <= 8 {
        let mut j = 0;
        while j < b {
            t[b][j] = j as u8;
            t[b][b + j] = (8 + j) as u8;
            j += 1;
        }
        b += 1;
    }
    t
};

/// Groups per batch: their scales and biases are computed together, in the lanes of two registers.
const BATCH: usize = 8;

fn run<const BITS: u32>(values: &[f32], group_size: usize, packed: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    let n_bins = ((1u32 << BITS) - 1) as f32;
    let group_bytes = group_size * BITS as usize / 8;
    let out = packed.as_mut_ptr();
    for (b, batch) in values.chunks(BATCH * group_size).enumerate() {
        // Unused lanes of a short last batch quantize a zero group, and are dropped.
        let (mut his, mut los) = ([0f32; BATCH], [0f32; BATCH]);
        for (j, g) in batch.chunks_exact(group_size).enumerate() {
            (his[j], los[j]) = max_min(g);
        }
        let (mut s, mut o) = ([0f32; BATCH], [0f32; BATCH]);
        for k in [0, 4] {
            // SAFETY: NEON is baseline on aarch64; four f32 at k of eight.
            unsafe {
                let (hi, lo) = (vld1q_f32(his.as_ptr().add(k)), vld1q_f32(los.as_ptr().add(k)));
                let (scale, bias) = scale_bias(hi, lo, n_bins);
                vst1q_f32(s.as_mut_ptr().add(k), scale);
                vst1q_f32(o.as_mut_ptr().add(k), bias);
            }
        }
        for (j, g) in batch.chunks_exact(group_size).enumerate() {
            let i = b * BATCH + j;
            // SAFETY: group `i`'s bytes plus the slack lie inside `packed` (sizes checked by the
            // caller).
            unsafe { codes::<BITS>(g, s[j], o[j], out.add(i * group_bytes)) };
            scales[i] = s[j];
            biases[i] = o[j];
        }
    }
}

/// The maximum and minimum of a group (a multiple of 8 values), NaNs ignored as in the reference:
/// lanes `0..4` and `4..8` over elements `i, i + 8, …` (see the module comment), then `fmaxv` and
/// `fminv` over the lanes, which can only differ from the reference's in-order fold in the sign
/// of a zero result.
#[inline]
fn max_min(g: &[f32]) -> (f32, f32) {
    // SAFETY: NEON is baseline on aarch64; every load reads eight f32 of `g`.
    unsafe {
        let (mut hi0, mut hi1) = (vdupq_n_f32(f32::NEG_INFINITY), vdupq_n_f32(f32::NEG_INFINITY));
        let (mut lo0, mut lo1) = (vdupq_n_f32(f32::INFINITY), vdupq_n_f32(f32::INFINITY));
        for x in g.chunks_exact(8) {
            let (x0, x1) = (vld1q_f32(x.as_ptr()), vld1q_f32(x.as_ptr().add(4)));
            hi0 = vbslq_f32(vcltq_f32(hi0, x0), x0, hi0);
            hi1 = vbslq_f32(vcltq_f32(hi1, x1), x1, hi1);
            lo0 = vbslq_f32(vcltq_f32(x0, lo0), x0, lo0);
            lo1 = vbslq_f32(vcltq_f32(x1, lo1), x1, lo1);
        }
        // No lane holds a NaN, so the order of these max/min does not matter.
        (vmaxvq_f32(vmaxq_f32(hi0, hi1)), vminvq_f32(vminq_f32(lo0, lo1)))
    }
}

/// The scale and bias of [`super::quantize_group`] for four groups at once, the same IEEE operations lane by lane: the
/// `max` with eps a compare-and-select (NaN gives eps, as `f32::max`), the sign flip `fneg`,
/// `q0 != 0` the negation of an equality (true for NaN, as in Rust).
///
/// # Safety
///
/// NEON (baseline on aarch64).
#[inline]
unsafe fn scale_bias(hi: float32x4_t, lo: float32x4_t, n_bins: f32) -> (float32x4_t, float32x4_t) {
    // SAFETY: register operations only.
    unsafe {
        let use_min = vcgtq_f32(vabsq_f32(lo), vabsq_f32(hi));
        let s = vdivq_f32(vsubq_f32(hi, lo), vdupq_n_f32(n_bins));
        let eps = vdupq_n_f32(1e-7);
        let s = vbslq_f32(vcgtq_f32(s, eps), s, eps);
        let s = vbslq_f32(use_min, s, vnegq_f32(s));
        let edge = vbslq_f32(use_min, lo, hi);
        let q0 = vrndnq_f32(vdivq_f32(edge, s));
        let realign = vmvnq_u32(vceqq_f32(q0, vdupq_n_f32(0.0)));
        let scale = vbslq_f32(realign, vdivq_f32(edge, q0), s);
        let bias = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(edge), realign));
        (scale, bias)
    }
}

/// Writes the packed codes of one group (a multiple of 32 values) to `out`, and up to
/// [`PACK_SLACK`] bytes beyond them.
///
/// # Safety
///
/// `out` is valid for `g.len()·BITS/8 + PACK_SLACK` bytes.
#[inline]
unsafe fn codes<const BITS: u32>(g: &[f32], scale: f32, bias: f32, out: *mut u8) {
    // SAFETY (the whole body): NEON is baseline on aarch64; loads read chunks of `g`, stores stay
    // inside `out`'s documented range.
    unsafe {
        let (vb, vs, vn) = (vdupq_n_f32(bias), vdupq_n_f32(scale), vdupq_n_u32((1u32 << BITS) - 1));
        let code4 = |x: &[f32]| vminq_u32(vcvtnq_u32_f32(vdivq_f32(vsubq_f32(vld1q_f32(x.as_ptr()), vb), vs)), vn);
        // Eight codes as u16 (the low halves of two u32 registers, in order), then sixteen as u8.
        let halves =
            |x: &[f32]| vuzp1q_u16(vreinterpretq_u16_u32(code4(&x[..4])), vreinterpretq_u16_u32(code4(&x[4..8])));
        let bytes =
            |x: &[f32]| vuzp1q_u8(vreinterpretq_u8_u16(halves(&x[..8])), vreinterpretq_u8_u16(halves(&x[8..16])));
        let ctrl = vld1q_u8(COMPACT[BITS as usize].as_ptr());
        let b = BITS as i16;
        let (sh16, sh32, sh64) = (vdupq_n_s16(b), vdupq_n_s32(2 * b as i32), vdupq_n_s64(4 * b as i64));
        let pack16 = |v: uint8x16_t| {
            let x = vreinterpretq_u16_u8(v);
            let x = vorrq_u16(vandq_u16(x, vdupq_n_u16(0xFF)), vshlq_u16(vshrq_n_u16::<8>(x), sh16));
            let x = vreinterpretq_u32_u16(x);
            let x = vorrq_u32(vandq_u32(x, vdupq_n_u32(0xFFFF)), vshlq_u32(vshrq_n_u32::<16>(x), sh32));
            let x = vreinterpretq_u64_u32(x);
            let x = vorrq_u64(vandq_u64(x, vdupq_n_u64(0xFFFF_FFFF)), vshlq_u64(vshrq_n_u64::<32>(x), sh64));
            // The 2·BITS bytes of 16 codes, first.
            vqtbl1q_u8(vreinterpretq_u8_u64(x), ctrl)
        };
        for (c, x) in g.chunks_exact(32).enumerate() {
            let o = out.add(c * 4 * BITS as usize);
            let (b0, b1) = (bytes(&x[..16]), bytes(&x[16..]));
            if BITS == 8 {
                vst1q_u8(o, b0);
                vst1q_u8(o.add(16), b1);
            } else {
                // The second store overwrites the first one's zeros past 2·BITS bytes; the writes
                // end at 2·BITS + 16 ≤ 4·BITS + PACK_SLACK bytes.
                vst1q_u8(o, pack16(b0));
                vst1q_u8(o.add(2 * BITS as usize), pack16(b1));
            }
        }
    }
}
