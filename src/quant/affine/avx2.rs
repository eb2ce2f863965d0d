//! AVX2 kernel for `x86_64`, chosen at run time.
//!
//! A group's maximum and minimum run in one 8-lane register each, lane `i` over elements
//! `i, i + 8, …` exactly as the reference's eight lanes: `_mm256_max_ps(x, m)` is `x > m ? x : m`
//! and `_mm256_min_ps(x, m)` is `x < m ? x : m`, the reference's comparisons operand for operand
//! (NaN and the sign of zero included). The lanes are then folded in the same order, and the
//! scale and bias come from the same scalar code.
//!
//! Codes are eight at a time: `(x − bias) / scale` with `vdivps` (IEEE division, as the scalar
//! `/`), clamped above to `n_bins` and only then rounded to nearest even (clamping to an integer
//! bound and rounding commute; below 2^22 the reference's `rint` is exact), then clamped below by
//! the unsigned saturation of the packs: negative codes and NaN (as `i32::MIN`) become 0, as the
//! reference's `max(0.0)` makes them.
//!
//! Packing, 32 codes at a time: two saturating packs make 32 bytes (exact, codes ≤ 255); a
//! multiply-add of byte pairs (`c0 + c1·2^b`), one of u16 pairs (`p0 + p1·2^2b`) and a 64-bit
//! shift-or leave 8 consecutive codes in the low `8b` bits (`b` bytes) of each u64, and a byte
//! shuffle closes the gaps. 32 codes always fill `4b` whole bytes, so groups pack independently.

use super::PACK_SLACK;
#[allow(clippy::wildcard_imports)] // the intrinsics
use std::arch::x86_64::*;

/// Quantizes consecutive groups of `group_size` values: group `i`'s scale and bias go to
/// `scales[i]` and `biases[i]`, its `group_size·bits/8` packed bytes follow group `i − 1`'s in
/// `packed`, which has [`PACK_SLACK`] bytes to spare at the end.
///
/// # Safety
///
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_groups(
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
    // SAFETY (each arm): AVX2 is available (this function's contract) and the sizes were checked.
    unsafe {
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
}

/// Byte shuffles (per 128-bit lane) that keep the low `b` bytes of each u64: lane bytes
/// `0..b` then `8..8 + b`, zeros after. Indexed by `b`.
static COMPACT: [[i8; 32]; 9] = {
    let mut t = [[-128i8; 32]; 9];
    let mut b = 0;
    while b <= 8 {
        let mut j = 0;
        while j < b {
            let (lo, hi) = (j as i8, (8 + j) as i8);
            t[b][j] = lo;
            t[b][b + j] = hi;
            t[b][16 + j] = lo;
            t[b][16 + b + j] = hi;
            j += 1;
        }
        b += 1;
    }
    t
};

/// Groups per batch: their scales and biases are computed together, in the lanes of one register.
const BATCH: usize = 8;

/// # Safety
///
/// AVX2; the sizes [`quantize_groups`] checks.
#[target_feature(enable = "avx2")]
unsafe fn run<const BITS: u32>(
    values: &[f32],
    group_size: usize,
    packed: &mut [u8],
    scales: &mut [f32],
    biases: &mut [f32],
) {
    let n_bins = ((1u32 << BITS) - 1) as f32;
    let group_bytes = group_size * BITS as usize / 8;
    let out = packed.as_mut_ptr();
    for (b, batch) in values.chunks(BATCH * group_size).enumerate() {
        // Unused lanes of a short last batch quantize a zero group, and are dropped.
        let (mut his, mut los) = ([0f32; BATCH], [0f32; BATCH]);
        for (j, g) in batch.chunks_exact(group_size).enumerate() {
            // SAFETY: AVX2.
            (his[j], los[j]) = unsafe { max_min(g) };
        }
        let (mut s, mut o) = ([0f32; BATCH], [0f32; BATCH]);
        // SAFETY: AVX2; each array holds eight f32.
        unsafe {
            let (hi, lo) = (_mm256_loadu_ps(his.as_ptr()), _mm256_loadu_ps(los.as_ptr()));
            let (scale, bias) = scale_bias(hi, lo, n_bins);
            _mm256_storeu_ps(s.as_mut_ptr(), scale);
            _mm256_storeu_ps(o.as_mut_ptr(), bias);
        }
        for (j, g) in batch.chunks_exact(group_size).enumerate() {
            let i = b * BATCH + j;
            // SAFETY: group `i`'s bytes plus the slack lie inside `packed`.
            unsafe { codes::<BITS>(g, s[j], o[j], out.add(i * group_bytes)) };
            scales[i] = s[j];
            biases[i] = o[j];
        }
    }
}

/// The maximum and minimum of a group (a multiple of 8 values), NaNs ignored as in the reference:
/// lane `i` over elements `i, i + 8, …` (see the module comment), then a tree over the lanes,
/// which can only differ from the reference's in-order fold in the sign of a zero result.
///
/// # Safety
///
/// AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn max_min(g: &[f32]) -> (f32, f32) {
    let (mut hi, mut lo) = (_mm256_set1_ps(f32::NEG_INFINITY), _mm256_set1_ps(f32::INFINITY));
    for x in g.chunks_exact(8) {
        // SAFETY: eight f32.
        let x = unsafe { _mm256_loadu_ps(x.as_ptr()) };
        hi = _mm256_max_ps(x, hi);
        lo = _mm256_min_ps(x, lo);
    }
    // No lane holds a NaN, so the order of these max/min does not matter.
    let hi = _mm_max_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps::<1>(hi));
    let lo = _mm_min_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps::<1>(lo));
    let hi = _mm_max_ps(hi, _mm_movehl_ps(hi, hi));
    let lo = _mm_min_ps(lo, _mm_movehl_ps(lo, lo));
    let hi = _mm_max_ss(hi, _mm_movehdup_ps(hi));
    let lo = _mm_min_ss(lo, _mm_movehdup_ps(lo));
    (_mm_cvtss_f32(hi), _mm_cvtss_f32(lo))
}

/// The scale and bias of [`super::quantize_group`] for eight groups at once, the same IEEE operations lane by lane:
/// `max_ps(v, eps)` is `v > eps ? v : eps` (NaN gives eps, as `f32::max`), the sign flip an XOR,
/// `q0 != 0` an unordered not-equal (true for NaN, as in Rust).
///
/// # Safety
///
/// AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_bias(hi: __m256, lo: __m256, n_bins: f32) -> (__m256, __m256) {
    let sign = _mm256_set1_ps(-0.0);
    let use_min = _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_andnot_ps(sign, lo), _mm256_andnot_ps(sign, hi));
    let s = _mm256_max_ps(_mm256_div_ps(_mm256_sub_ps(hi, lo), _mm256_set1_ps(n_bins)), _mm256_set1_ps(1e-7));
    let s = _mm256_blendv_ps(_mm256_xor_ps(s, sign), s, use_min);
    let edge = _mm256_blendv_ps(hi, lo, use_min);
    let q0 = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_div_ps(edge, s));
    let realign = _mm256_cmp_ps::<_CMP_NEQ_UQ>(q0, _mm256_setzero_ps());
    let scale = _mm256_blendv_ps(s, _mm256_div_ps(edge, q0), realign);
    let bias = _mm256_and_ps(edge, realign);
    (scale, bias)
}

/// Writes the packed codes of one group (a multiple of 32 values) to `out`, and up to
/// [`PACK_SLACK`] bytes beyond them.
///
/// # Safety
///
/// AVX2; `out` is valid for `g.len()·BITS/8 + PACK_SLACK` bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn codes<const BITS: u32>(g: &[f32], scale: f32, bias: f32, out: *mut u8) {
    let n_bins = ((1u32 << BITS) - 1) as f32;
    let (vb, vs, vn) = (_mm256_set1_ps(bias), _mm256_set1_ps(scale), _mm256_set1_ps(n_bins));
    let code8 = |x: &[f32]| {
        // SAFETY: `x` holds eight f32 (a chunk of 32, split).
        let x = unsafe { _mm256_loadu_ps(x.as_ptr()) };
        let v = _mm256_div_ps(_mm256_sub_ps(x, vb), vs);
        // `n_bins < v ? n_bins : v`: NaN stays NaN. Then round to nearest even (the default
        // MXCSR mode, which Rust code runs under); NaN converts to i32::MIN, and the unsigned
        // saturation of the packs sends it and every negative code to 0.
        _mm256_cvtps_epi32(_mm256_min_ps(vn, v))
    };
    for (c, x) in g.chunks_exact(32).enumerate() {
        // Bytes in 128-bit-lane order: dwords hold codes [0..4, 8..12, 16..20, 24..28 | 4..8, …].
        let bytes = _mm256_packus_epi16(
            _mm256_packus_epi32(code8(&x[..8]), code8(&x[8..16])),
            _mm256_packus_epi32(code8(&x[16..24]), code8(&x[24..])),
        );
        // SAFETY: this chunk's 4·BITS bytes start at 4·BITS·c, and at most 16 − 2·BITS bytes
        // beyond them are written (then overwritten by the next chunk, or slack).
        unsafe { pack32::<BITS>(bytes, out.add(c * 4 * BITS as usize)) };
    }
}

/// Writes 32 byte codes (in the lane order [`group`] leaves them) as a `BITS`-wide bit stream.
///
/// # Safety
///
/// AVX2; `out` is valid for `4·BITS` bytes plus `16 − 2·BITS` when `BITS < 8`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pack32<const BITS: u32>(bytes: __m256i, out: *mut u8) {
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    if BITS == 8 {
        // SAFETY: 32 bytes.
        unsafe { _mm256_storeu_si256(out.cast(), _mm256_permutevar8x32_epi32(bytes, order)) };
        return;
    }
    // c0 + c1·2^b in each u16, then p0 + p1·2^2b in each u32 (no saturation: < 2^24).
    let pairs = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16((1 | 1 << (8 + BITS)) as i16));
    let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(1 | 1 << (16 + 2 * BITS)));
    let quads = _mm256_permutevar8x32_epi32(quads, order);
    let hi = _mm256_sll_epi64(_mm256_srli_epi64::<32>(quads), _mm_cvtsi32_si128(4 * BITS as i32));
    let octs = _mm256_or_si256(_mm256_and_si256(quads, _mm256_set1_epi64x(0xFFFF_FFFF)), hi);
    // SAFETY: a 32-byte table.
    let ctrl = unsafe { _mm256_loadu_si256(COMPACT[BITS as usize].as_ptr().cast()) };
    let packed = _mm256_shuffle_epi8(octs, ctrl);
    let b = 2 * BITS as usize;
    // SAFETY: the writes end at 2·BITS + 16 ≤ 4·BITS + (16 − 2·BITS) bytes.
    unsafe {
        _mm_storeu_si128(out.cast(), _mm256_castsi256_si128(packed));
        _mm_storeu_si128(out.add(b).cast(), _mm256_extracti128_si256::<1>(packed));
    }
}
