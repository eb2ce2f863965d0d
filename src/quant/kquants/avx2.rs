//! AVX2 kernel for `x86_64`, chosen at run time.
//!
//! The scale searches (`make_qkx2_quants` for the 32-value groups of `Q4_K` and `Q5_K`,
//! `make_qx_quants` for the 16-value groups of `Q6_K`) are sequential within a group but
//! independent between groups, so they run side by side: one group per f32 lane, the groups' values
//! transposed so that register `i` holds element `i` of eight groups. Each lane then does exactly
//! the reference's sequence for its group, sums front to back, products and sums as separate
//! instructions (no FMA), IEEE division (`vdivps`) and square root (`vsqrtps`), and the
//! reference's comparisons: `_mm256_min_ps(x, m)` is
//! `x < m ? x : m` and `_mm256_max_ps(x, m)` is `x > m ? x : m` operand for operand (NaN and the
//! sign of zero included), the other `if`s ordered compares feeding blends. Where the reference
//! skips work (`det > 0` false, an unimproved pass, a flat group) the lane computes it anyway and
//! the blend drops it.
//!
//! Rounding to quants is most of a pass's work, so each pass picks the cheapest way that gives the
//! reference's quants ([`Rounding`]): `vroundps` with only the clamps that can bite, or the
//! reference's bit arithmetic where the range of the pass's values is not known.
//!
//! `Q4_K` and `Q5_K` search four blocks at once (32 groups, four registers per quantity), each pass
//! split in three loops (quants, sums, error) so that few instructions wait on long chains; `Q6_K`'s
//! 16 groups are one block. The per-block rest (super-scales, 6- and 8-bit scales, re-quantization
//! against them, packing) is the shared code of [`super::finish_scale_min_block`] and
//! [`super::finish_q6_k_block`], compiled here for AVX2.

#[cfg(test)]
use super::count;
use super::{finish_q6_k_block, finish_scale_min_block, Fits, KQuant, Rounding, QK_K};
#[allow(clippy::wildcard_imports)] // the intrinsics
use std::arch::x86_64::*;

/// Encodes `values` (whole blocks) as `kind` into `out`, exactly `values.len() / QK_K` blocks.
#[target_feature(enable = "avx2")]
pub(super) fn quantize_blocks(kind: KQuant, values: &[f32], out: &mut [u8]) {
    let bytes = kind.block_bytes();
    assert_eq!(values.len() % QK_K, 0, "whole blocks");
    assert_eq!(values.len() / QK_K * bytes, out.len(), "room for exactly the blocks");
    let (nmax, rmin, nstep) = match kind {
        KQuant::Q4K => (15, -1.0, 20),
        KQuant::Q5K => (31, -0.5, 15),
        KQuant::Q6K => {
            for (x, o) in values.chunks_exact(QK_K).zip(out.chunks_exact_mut(bytes)) {
                finish_q6_k_block(x, &qx_search(x), o);
            }
            return;
        }
    };
    // Four blocks at a time, then what is left two and one at a time.
    let (mut x, mut o) = (values, out);
    while !x.is_empty() {
        let n = match x.len() / QK_K {
            4.. => search_and_finish::<4>(kind, x, o, nmax, rmin, nstep),
            2 | 3 => search_and_finish::<2>(kind, x, o, nmax, rmin, nstep),
            _ => search_and_finish::<1>(kind, x, o, nmax, rmin, nstep),
        };
        (x, o) = (&x[n * QK_K..], &mut o[n * bytes..]);
    }
}

/// Searches the first `G` blocks of `x` together and writes them to the start of `out`; returns
/// `G`.
#[inline]
#[target_feature(enable = "avx2")]
fn search_and_finish<const G: usize>(
    kind: KQuant,
    x: &[f32],
    out: &mut [u8],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> usize {
    let x = &x[..G * QK_K];
    let fits = qkx2_search::<G>(x, nmax, rmin, nstep);
    let bytes = kind.block_bytes();
    for (b, (xb, ob)) in x.chunks_exact(QK_K).zip(out[..G * bytes].chunks_exact_mut(bytes)).enumerate() {
        finish_scale_min_block(kind, xb, &fits, 8 * b, ob);
    }
    G
}

#[inline]
#[target_feature(enable = "avx2")]
fn load(x: &[f32; 8]) -> __m256 {
    // SAFETY: eight f32.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn store(v: __m256, to: &mut [f32; 8]) {
    // SAFETY: eight f32.
    unsafe { _mm256_storeu_ps(to.as_mut_ptr(), v) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn store_mask(v: __m256, to: &mut [u32; 8]) {
    // SAFETY: eight u32.
    unsafe { _mm256_storeu_si256(to.as_mut_ptr().cast(), _mm256_castps_si256(v)) }
}

/// Rows `r[j]` to columns: lane `j` of output `i` is lane `i` of `r[j]`.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// `x` as `8·G` consecutive groups ("units") of `N` values, transposed: lane `j` of `[i][g]` is
/// element `i` of unit `8g + j`.
#[allow(clippy::needless_range_loop)] // `g` is the register column of each row of `xt`
#[inline]
#[target_feature(enable = "avx2")]
fn transpose_units<const N: usize, const G: usize>(x: &[f32]) -> [[__m256; G]; N] {
    assert_eq!(x.len(), 8 * G * N);
    let mut xt = [[_mm256_setzero_ps(); G]; N];
    for g in 0..G {
        for c in 0..N / 8 {
            let mut rows = [_mm256_setzero_ps(); 8];
            for (j, row) in rows.iter_mut().enumerate() {
                let at = (8 * g + j) * N + 8 * c;
                *row = load(x[at..at + 8].try_into().unwrap());
            }
            for (r, v) in transpose8(rows).into_iter().enumerate() {
                xt[8 * c + r][g] = v;
            }
        }
    }
    xt
}

/// The cheapest [`Rounding`] for a pass whose values lie, lane by lane, between `a` and `b` (the
/// values of the group's least and greatest element), into quants `lo..=hi`. Lanes in `skip`
/// (whose results the search drops) do not count; `finite` says the groups hold no NaN or
/// infinity, without which no bound holds.
#[inline]
#[target_feature(enable = "avx2")]
fn rounding<const G: usize>(
    finite: bool,
    a: &[__m256; G],
    b: &[__m256; G],
    skip: &[__m256; G],
    lo: f32,
    hi: f32,
) -> Rounding {
    if !finite {
        return Rounding::Exact;
    }
    let (limit, sign) = (_mm256_set1_ps(4_194_304.0), _mm256_set1_ps(-0.0));
    let (below, above) = (_mm256_set1_ps(lo - 0.5), _mm256_set1_ps(hi + 0.5));
    let (mut wild, mut need_lo, mut need_hi) = (0, 0, 0);
    for g in 0..G {
        // Ordered compares: a NaN bound is out of range.
        let in_range = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_andnot_ps(sign, a[g]), limit),
            _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_andnot_ps(sign, b[g]), limit),
        );
        let (least, most) = (_mm256_min_ps(a[g], b[g]), _mm256_max_ps(a[g], b[g]));
        wild |=
            _mm256_movemask_ps(_mm256_andnot_ps(skip[g], _mm256_cmp_ps::<_CMP_EQ_OQ>(in_range, _mm256_setzero_ps())));
        need_lo |= _mm256_movemask_ps(_mm256_andnot_ps(skip[g], _mm256_cmp_ps::<_CMP_LT_OQ>(least, below)));
        need_hi |= _mm256_movemask_ps(_mm256_andnot_ps(skip[g], _mm256_cmp_ps::<_CMP_GE_OQ>(most, above)));
    }
    if wild != 0 {
        Rounding::Exact
    } else {
        Rounding::Round { lo: need_lo != 0, hi: need_hi != 0 }
    }
}

/// `nearest_int(v).clamp(lo, hi) as f32` lane by lane, with the reference's bit arithmetic.
#[inline]
#[target_feature(enable = "avx2")]
fn levels(v: __m256, lo: __m256i, hi: __m256i) -> __m256 {
    let bits = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12_582_912.0)));
    let q = _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007f_ffff)), _mm256_set1_epi32(0x0040_0000));
    _mm256_cvtepi32_ps(_mm256_min_epi32(_mm256_max_epi32(q, lo), hi))
}

/// `v` rounded to nearest-even and clamped to `[lo, hi]` on the sides asked for: `levels` for the
/// `v` that [`rounding`] allows.
#[inline]
#[target_feature(enable = "avx2")]
fn round_levels<const LO: bool, const HI: bool>(v: __m256, lo: __m256, hi: __m256) -> __m256 {
    let mut q = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
    if LO {
        q = _mm256_max_ps(q, lo);
    }
    if HI {
        q = _mm256_min_ps(q, hi);
    }
    q
}

/// `mask ? b : a`.
#[inline]
#[target_feature(enable = "avx2")]
fn select(a: __m256, b: __m256, mask: __m256) -> __m256 {
    _mm256_blendv_ps(a, b, mask)
}

/// Whether every value of `xt` is finite.
#[inline]
#[target_feature(enable = "avx2")]
fn all_finite<const N: usize, const G: usize>(xt: &[[__m256; G]; N]) -> bool {
    let (sign, inf) = (_mm256_set1_ps(-0.0), _mm256_set1_ps(f32::INFINITY));
    let mut finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for xi in xt {
        for v in xi {
            finite = _mm256_and_ps(finite, _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_andnot_ps(sign, *v), inf));
        }
    }
    _mm256_movemask_ps(finite) == 0xFF
}

/// The quants of one `make_qkx2_quants` pass, `nearest_int(iscale·(x − min))` in `0..=nmax`,
/// into `l`, rounded as `r` says.
#[inline]
#[target_feature(enable = "avx2")]
fn qkx2_levels<const G: usize>(
    r: Rounding,
    xt: &[[__m256; G]; 32],
    iscale: &[__m256; G],
    min: &[__m256; G],
    nmax: i32,
    l: &mut [[__m256; G]; 32],
) {
    #[cfg(test)]
    count(0, r);
    match r {
        Rounding::Exact => {
            let (lo, hi) = (_mm256_setzero_si256(), _mm256_set1_epi32(nmax));
            for (li, xi) in l.iter_mut().zip(xt) {
                for g in 0..G {
                    li[g] = levels(_mm256_mul_ps(iscale[g], _mm256_sub_ps(xi[g], min[g])), lo, hi);
                }
            }
        }
        Rounding::Round { lo: false, hi: false } => qkx2_round::<G, false, false>(xt, iscale, min, nmax, l),
        Rounding::Round { lo: true, hi: false } => qkx2_round::<G, true, false>(xt, iscale, min, nmax, l),
        Rounding::Round { lo: false, hi: true } => qkx2_round::<G, false, true>(xt, iscale, min, nmax, l),
        Rounding::Round { lo: true, hi: true } => qkx2_round::<G, true, true>(xt, iscale, min, nmax, l),
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn qkx2_round<const G: usize, const LO: bool, const HI: bool>(
    xt: &[[__m256; G]; 32],
    iscale: &[__m256; G],
    min: &[__m256; G],
    nmax: i32,
    l: &mut [[__m256; G]; 32],
) {
    let (lo, hi) = (_mm256_setzero_ps(), _mm256_set1_ps(nmax as f32));
    for (li, xi) in l.iter_mut().zip(xt) {
        for g in 0..G {
            li[g] = round_levels::<LO, HI>(_mm256_mul_ps(iscale[g], _mm256_sub_ps(xi[g], min[g])), lo, hi);
        }
    }
}

/// `Σ w·(scale·l + min − x)²` front to back: the error of a `make_qkx2_quants` fit.
#[inline]
#[target_feature(enable = "avx2")]
fn qkx2_error<const G: usize>(
    l: &[[__m256; G]; 32],
    w: &[[__m256; G]; 32],
    xt: &[[__m256; G]; 32],
    scale: &[__m256; G],
    min: &[__m256; G],
) -> [__m256; G] {
    let mut error = [_mm256_setzero_ps(); G];
    for ((li, wi), xi) in l.iter().zip(w).zip(xt) {
        for g in 0..G {
            let diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale[g], li[g]), min[g]), xi[g]);
            error[g] = _mm256_add_ps(error[g], _mm256_mul_ps(wi[g], _mm256_mul_ps(diff, diff)));
        }
    }
    error
}

/// `quantize_scale_min_block`'s weights and `make_qkx2_quants` for the `8·G` groups of 32 in `x`
/// (`G` blocks), one group per lane. See the reference for the algorithm; each line below is the
/// reference's, lane-wise.
#[target_feature(enable = "avx2")]
fn qkx2_search<const G: usize>(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> Fits {
    let xt = transpose_units::<32, G>(x);
    let finite = all_finite(&xt);
    let zero = _mm256_setzero_ps();
    let sign = _mm256_set1_ps(-0.0);
    let nmax_f = nmax as f32;

    // weights = sqrt(Σx²/32) + |x|, the sum front to back.
    let mut sum_x2 = [zero; G];
    for xi in &xt {
        for g in 0..G {
            sum_x2[g] = _mm256_add_ps(sum_x2[g], _mm256_mul_ps(xi[g], xi[g]));
        }
    }
    let av_x = sum_x2.map(|s| _mm256_sqrt_ps(_mm256_div_ps(s, _mm256_set1_ps(32.0))));
    let mut w = [[zero; G]; 32];
    for (wi, xi) in w.iter_mut().zip(&xt) {
        for g in 0..G {
            wi[g] = _mm256_add_ps(av_x[g], _mm256_andnot_ps(sign, xi[g]));
        }
    }

    let (mut min, mut max, mut sum_w, mut sum_x) = (xt[0], xt[0], w[0], [zero; G]);
    for g in 0..G {
        sum_x[g] = _mm256_mul_ps(w[0][g], xt[0][g]);
    }
    for i in 1..32 {
        for g in 0..G {
            min[g] = _mm256_min_ps(xt[i][g], min[g]);
            max[g] = _mm256_max_ps(xt[i][g], max[g]);
            sum_w[g] = _mm256_add_ps(sum_w[g], w[i][g]);
            sum_x[g] = _mm256_add_ps(sum_x[g], _mm256_mul_ps(w[i][g], xt[i][g]));
        }
    }
    // The least element, for the range of each pass's values.
    let least = min;
    // `if min > 0 { min = 0 }`: `0 < min ? 0 : min`.
    let mut flat = [zero; G];
    for g in 0..G {
        min[g] = _mm256_min_ps(zero, min[g]);
        flat[g] = _mm256_cmp_ps::<_CMP_EQ_OQ>(max[g], min[g]);
    }
    let data_min = min;
    // The rounding of a pass with these multipliers and offsets; flat groups' passes are dropped.
    let pass_rounding = |iscale: &[__m256; G], min: &[__m256; G]| {
        let (mut a, mut b) = ([zero; G], [zero; G]);
        for g in 0..G {
            a[g] = _mm256_mul_ps(iscale[g], _mm256_sub_ps(least[g], min[g]));
            b[g] = _mm256_mul_ps(iscale[g], _mm256_sub_ps(max[g], min[g]));
        }
        rounding(finite, &a, &b, &flat, 0.0, nmax_f)
    };

    let mut iscale = [zero; G];
    let mut scale = [zero; G];
    for g in 0..G {
        iscale[g] = _mm256_div_ps(_mm256_set1_ps(nmax_f), _mm256_sub_ps(max[g], min[g]));
        scale[g] = _mm256_div_ps(_mm256_set1_ps(1.0), iscale[g]);
    }
    let mut laux = [[zero; G]; 32];
    qkx2_levels(pass_rounding(&iscale, &min), &xt, &iscale, &min, nmax, &mut laux);
    let mut best_error = qkx2_error(&laux, &w, &xt, &scale, &min);
    let (mut best_iscale, mut best_lmin) = (iscale, min);

    for is in 0..=nstep {
        let num = _mm256_set1_ps(rmin + 0.1 * is as f32 + nmax_f);
        for g in 0..G {
            iscale[g] = _mm256_div_ps(num, _mm256_sub_ps(max[g], min[g]));
        }
        qkx2_levels(pass_rounding(&iscale, &min), &xt, &iscale, &min, nmax, &mut laux);
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([zero; G], [zero; G], [zero; G]);
        for ((li, wi), xi) in laux.iter().zip(&w).zip(&xt) {
            for g in 0..G {
                let wq = _mm256_mul_ps(wi[g], li[g]);
                sum_l[g] = _mm256_add_ps(sum_l[g], wq);
                sum_l2[g] = _mm256_add_ps(sum_l2[g], _mm256_mul_ps(wq, li[g]));
                sum_xl[g] = _mm256_add_ps(sum_xl[g], _mm256_mul_ps(wq, xi[g]));
            }
        }
        let (mut ok, mut this_scale, mut this_min) = ([zero; G], [zero; G], [zero; G]);
        for g in 0..G {
            let det = _mm256_sub_ps(_mm256_mul_ps(sum_w[g], sum_l2[g]), _mm256_mul_ps(sum_l[g], sum_l[g]));
            ok[g] = _mm256_cmp_ps::<_CMP_GT_OQ>(det, zero);
            let ts = _mm256_div_ps(
                _mm256_sub_ps(_mm256_mul_ps(sum_w[g], sum_xl[g]), _mm256_mul_ps(sum_x[g], sum_l[g])),
                det,
            );
            let tm = _mm256_div_ps(
                _mm256_sub_ps(_mm256_mul_ps(sum_l2[g], sum_x[g]), _mm256_mul_ps(sum_l[g], sum_xl[g])),
                det,
            );
            let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(tm, zero);
            this_min[g] = select(tm, zero, positive);
            this_scale[g] = select(ts, _mm256_div_ps(sum_xl[g], sum_l2[g]), positive);
        }
        let cur_error = qkx2_error(&laux, &w, &xt, &this_scale, &this_min);
        for g in 0..G {
            let better = _mm256_and_ps(ok[g], _mm256_cmp_ps::<_CMP_LT_OQ>(cur_error[g], best_error[g]));
            best_iscale[g] = select(best_iscale[g], iscale[g], better);
            best_lmin[g] = select(best_lmin[g], min[g], better);
            best_error[g] = select(best_error[g], cur_error[g], better);
            scale[g] = select(scale[g], this_scale[g], better);
            min[g] = select(min[g], this_min[g], better);
        }
    }

    // A flat group returns (0, −min) with all-zero quants.
    let mut fits = Fits::default();
    for g in 0..G {
        let u = 8 * g..8 * g + 8;
        store(_mm256_andnot_ps(flat[g], scale[g]), (&mut fits.scale[u.clone()]).try_into().unwrap());
        let neg_min = _mm256_xor_ps(select(min[g], data_min[g], flat[g]), sign);
        store(neg_min, (&mut fits.min[u.clone()]).try_into().unwrap());
        store(best_iscale[g], (&mut fits.iscale[u.clone()]).try_into().unwrap());
        store(best_lmin[g], (&mut fits.lmin[u.clone()]).try_into().unwrap());
        store_mask(flat[g], (&mut fits.zero[u]).try_into().unwrap());
    }
    fits
}

/// `Σ x²·x·q` and `Σ x²·q·q` front to back over a `make_qx_quants` pass's quants
/// `nearest_int(iscale·x)` in `−32..32`, rounded as `r` says; `w` is x², `wx` x²·x.
#[inline]
#[target_feature(enable = "avx2")]
fn qx_sums<const G: usize>(
    r: Rounding,
    xt: &[[__m256; G]; 16],
    w: &[[__m256; G]; 16],
    wx: &[[__m256; G]; 16],
    iscale: &[__m256; G],
) -> ([__m256; G], [__m256; G]) {
    #[cfg(test)]
    count(1, r);
    match r {
        Rounding::Exact => {
            let (lo, hi) = (_mm256_set1_epi32(-32), _mm256_set1_epi32(31));
            qx_sums_of(xt, w, wx, |xi, g| levels(_mm256_mul_ps(iscale[g], xi), lo, hi))
        }
        Rounding::Round { lo: false, hi: false } => qx_round::<G, false, false>(xt, w, wx, iscale),
        Rounding::Round { lo: true, hi: false } => qx_round::<G, true, false>(xt, w, wx, iscale),
        Rounding::Round { lo: false, hi: true } => qx_round::<G, false, true>(xt, w, wx, iscale),
        Rounding::Round { lo: true, hi: true } => qx_round::<G, true, true>(xt, w, wx, iscale),
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn qx_round<const G: usize, const LO: bool, const HI: bool>(
    xt: &[[__m256; G]; 16],
    w: &[[__m256; G]; 16],
    wx: &[[__m256; G]; 16],
    iscale: &[__m256; G],
) -> ([__m256; G], [__m256; G]) {
    let (lo, hi) = (_mm256_set1_ps(-32.0), _mm256_set1_ps(31.0));
    qx_sums_of(xt, w, wx, |xi, g| round_levels::<LO, HI>(_mm256_mul_ps(iscale[g], xi), lo, hi))
}

/// The sums of [`qx_sums`] for the quants `quant(x, g)` gives.
#[inline]
#[target_feature(enable = "avx2")]
fn qx_sums_of<const G: usize>(
    xt: &[[__m256; G]; 16],
    w: &[[__m256; G]; 16],
    wx: &[[__m256; G]; 16],
    quant: impl Fn(__m256, usize) -> __m256,
) -> ([__m256; G], [__m256; G]) {
    let (mut sumlx, mut suml2) = ([_mm256_setzero_ps(); G], [_mm256_setzero_ps(); G]);
    for ((wi, wxi), xi) in w.iter().zip(wx).zip(xt) {
        for g in 0..G {
            let q = quant(xi[g], g);
            sumlx[g] = _mm256_add_ps(sumlx[g], _mm256_mul_ps(wxi[g], q));
            suml2[g] = _mm256_add_ps(suml2[g], _mm256_mul_ps(_mm256_mul_ps(wi[g], q), q));
        }
    }
    (sumlx, suml2)
}

/// `make_qx_quants(32, …)` for the 16 groups of 16 of a `Q6_K` block, one group per lane (two
/// registers per quantity). Each line is the reference's, lane-wise.
#[target_feature(enable = "avx2")]
fn qx_search(x: &[f32]) -> Fits {
    const G: usize = 2;
    let xt = transpose_units::<16, G>(x);
    let finite = all_finite(&xt);
    let zero = _mm256_setzero_ps();
    let sign = _mm256_set1_ps(-0.0);
    let nmax_f = 32.0f32;

    // The value of largest magnitude, the first of equals; the least and greatest values.
    let (mut max, mut amax, mut least, mut most) = ([zero; G], [zero; G], xt[0], xt[0]);
    // The weights x² and the products x²·x of the sums.
    let (mut w, mut wx) = ([[zero; G]; 16], [[zero; G]; 16]);
    for ((wi, wxi), xi) in w.iter_mut().zip(&mut wx).zip(&xt) {
        for g in 0..G {
            let ax = _mm256_andnot_ps(sign, xi[g]);
            let larger = _mm256_cmp_ps::<_CMP_GT_OQ>(ax, amax[g]);
            amax[g] = select(amax[g], ax, larger);
            max[g] = select(max[g], xi[g], larger);
            least[g] = _mm256_min_ps(xi[g], least[g]);
            most[g] = _mm256_max_ps(xi[g], most[g]);
            wi[g] = _mm256_mul_ps(xi[g], xi[g]);
            wxi[g] = _mm256_mul_ps(wi[g], xi[g]);
        }
    }
    let tiny = amax.map(|a| _mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(1e-15)));
    // The rounding of a pass with these multipliers; groups below 1e-15 are dropped.
    let pass_rounding = |iscale: &[__m256; G]| {
        let (mut a, mut b) = ([zero; G], [zero; G]);
        for g in 0..G {
            a[g] = _mm256_mul_ps(iscale[g], least[g]);
            b[g] = _mm256_mul_ps(iscale[g], most[g]);
        }
        rounding(finite, &a, &b, &tiny, -32.0, 31.0)
    };

    let iscale = max.map(|m| _mm256_div_ps(_mm256_set1_ps(-nmax_f), m));
    let (sumlx, suml2) = qx_sums(pass_rounding(&iscale), &xt, &w, &wx, &iscale);
    let (mut scale, mut best) = ([zero; G], [zero; G]);
    for g in 0..G {
        // `suml2 == 0 ? 0 : sumlx / suml2`
        let s = _mm256_div_ps(sumlx[g], suml2[g]);
        scale[g] = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(suml2[g], zero), s);
        best[g] = _mm256_mul_ps(scale[g], sumlx[g]);
    }
    let mut best_iscale = iscale;
    for is in (-9..=9).filter(|&is| is != 0) {
        let num = _mm256_set1_ps(-(nmax_f + 0.1 * is as f32));
        let iscale = max.map(|m| _mm256_div_ps(num, m));
        let (sumlx, suml2) = qx_sums(pass_rounding(&iscale), &xt, &w, &wx, &iscale);
        for g in 0..G {
            let better = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GT_OQ>(suml2[g], zero),
                _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_mul_ps(sumlx[g], sumlx[g]), _mm256_mul_ps(best[g], suml2[g])),
            );
            let s = _mm256_div_ps(sumlx[g], suml2[g]);
            best_iscale[g] = select(best_iscale[g], iscale[g], better);
            scale[g] = select(scale[g], s, better);
            best[g] = select(best[g], _mm256_mul_ps(s, sumlx[g]), better);
        }
    }

    // A group below 1e-15 returns 0 with all-zero quants.
    let mut fits = Fits::default();
    for g in 0..G {
        let u = 8 * g..8 * g + 8;
        store(_mm256_andnot_ps(tiny[g], scale[g]), (&mut fits.scale[u.clone()]).try_into().unwrap());
        store(best_iscale[g], (&mut fits.iscale[u.clone()]).try_into().unwrap());
        store_mask(tiny[g], (&mut fits.zero[u]).try_into().unwrap());
    }
    fits
}
