//! AVX2 kernel for `x86_64`, chosen at run time.
//!
//! The scale searches (`make_qkx2_quants` for the 32-value groups of `Q4_K` and `Q5_K`,
//! `make_qx_quants` for the 16-value groups of `Q6_K`) are sequential within a group but
//! independent between groups, so they run side by side: one group per f32 lane, the groups' values
//! transposed so that register `i` holds element `i` of eight groups. Each lane then does exactly
//! the reference's sequence for its group, sums front to back, products and sums as separate
//! instructions (no FMA), IEEE division (`vdivps`) and square root (`vsqrtps`), rounding by the
//! same magic-number bit arithmetic, and the reference's comparisons: `_mm256_min_ps(x, m)` is
//! `x < m ? x : m` and `_mm256_max_ps(x, m)` is `x > m ? x : m` operand for operand (NaN and the
//! sign of zero included), the other `if`s ordered compares feeding blends. Where the reference
//! skips work (`det > 0` false, an unimproved pass, a flat group) the lane computes it anyway and
//! the blend drops it.
//!
//! `Q4_K` and `Q5_K` search two blocks at once (16 groups, two registers per quantity) for
//! instruction-level parallelism; `Q6_K`'s 16 groups are one block. The per-block rest (super-scales,
//! 6- and 8-bit scales, re-quantization against them, packing) is the shared code of
//! [`super::finish_scale_min_block`] and [`super::finish_q6_k_block`], compiled here for AVX2.

use super::{finish_q6_k_block, finish_scale_min_block, Fits, KQuant, QK_K};
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
    let mut xs = values.chunks_exact(2 * QK_K);
    let mut os = out.chunks_exact_mut(2 * bytes);
    for (x, o) in (&mut xs).zip(&mut os) {
        let fits = qkx2_search::<2>(x, nmax, rmin, nstep);
        for (b, (xb, ob)) in x.chunks_exact(QK_K).zip(o.chunks_exact_mut(bytes)).enumerate() {
            finish_scale_min_block(kind, xb, &fits, 8 * b, ob);
        }
    }
    let (x, o) = (xs.remainder(), os.into_remainder());
    if !x.is_empty() {
        finish_scale_min_block(kind, x, &qkx2_search::<1>(x, nmax, rmin, nstep), 0, o);
    }
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

/// `nearest_int(v).clamp(lo, hi) as f32` lane by lane, with the reference's bit arithmetic.
#[inline]
#[target_feature(enable = "avx2")]
fn levels(v: __m256, lo: __m256i, hi: __m256i) -> __m256 {
    let bits = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12_582_912.0)));
    let q = _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007f_ffff)), _mm256_set1_epi32(0x0040_0000));
    _mm256_cvtepi32_ps(_mm256_min_epi32(_mm256_max_epi32(q, lo), hi))
}

/// `mask ? b : a`.
#[inline]
#[target_feature(enable = "avx2")]
fn select(a: __m256, b: __m256, mask: __m256) -> __m256 {
    _mm256_blendv_ps(a, b, mask)
}

/// `quantize_scale_min_block`'s weights and `make_qkx2_quants` for the `8·G` groups of 32 in `x`
/// (`G` blocks), one group per lane. See the reference for the algorithm; each line below is the
/// reference's, lane-wise.
#[target_feature(enable = "avx2")]
fn qkx2_search<const G: usize>(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> Fits {
    let xt = transpose_units::<32, G>(x);
    let zero = _mm256_setzero_ps();
    let sign = _mm256_set1_ps(-0.0);
    let (lo, hi) = (_mm256_setzero_si256(), _mm256_set1_epi32(nmax));
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

    let (mut min, mut max, sum_w, mut sum_x) = (xt[0], xt[0], w[0], [zero; G]);
    let mut sum_w = sum_w;
    for g in 0..G {
        sum_x[g] = _mm256_mul_ps(w[0][g], xt[0][g]);
    }
    for (wi, xi) in w.iter().zip(&xt).skip(1) {
        for g in 0..G {
            min[g] = _mm256_min_ps(xi[g], min[g]);
            max[g] = _mm256_max_ps(xi[g], max[g]);
            sum_w[g] = _mm256_add_ps(sum_w[g], wi[g]);
            sum_x[g] = _mm256_add_ps(sum_x[g], _mm256_mul_ps(wi[g], xi[g]));
        }
    }
    // `if min > 0 { min = 0 }`: `0 < min ? 0 : min`.
    let mut flat = [zero; G];
    for g in 0..G {
        min[g] = _mm256_min_ps(zero, min[g]);
        flat[g] = _mm256_cmp_ps::<_CMP_EQ_OQ>(max[g], min[g]);
    }
    let data_min = min;

    let mut iscale = [zero; G];
    let mut scale = [zero; G];
    for g in 0..G {
        iscale[g] = _mm256_div_ps(_mm256_set1_ps(nmax_f), _mm256_sub_ps(max[g], min[g]));
        scale[g] = _mm256_div_ps(_mm256_set1_ps(1.0), iscale[g]);
    }
    let mut best_error = [zero; G];
    for (wi, xi) in w.iter().zip(&xt) {
        for g in 0..G {
            let q = levels(_mm256_mul_ps(iscale[g], _mm256_sub_ps(xi[g], min[g])), lo, hi);
            let diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale[g], q), min[g]), xi[g]);
            best_error[g] = _mm256_add_ps(best_error[g], _mm256_mul_ps(wi[g], _mm256_mul_ps(diff, diff)));
        }
    }
    let (mut best_iscale, mut best_lmin) = (iscale, min);

    let mut laux = [[zero; G]; 32];
    for is in 0..=nstep {
        let num = _mm256_set1_ps(rmin + 0.1 * is as f32 + nmax_f);
        for g in 0..G {
            iscale[g] = _mm256_div_ps(num, _mm256_sub_ps(max[g], min[g]));
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([zero; G], [zero; G], [zero; G]);
        for ((li, wi), xi) in laux.iter_mut().zip(&w).zip(&xt) {
            for g in 0..G {
                let q = levels(_mm256_mul_ps(iscale[g], _mm256_sub_ps(xi[g], min[g])), lo, hi);
                li[g] = q;
                let wq = _mm256_mul_ps(wi[g], q);
                sum_l[g] = _mm256_add_ps(sum_l[g], wq);
                sum_l2[g] = _mm256_add_ps(sum_l2[g], _mm256_mul_ps(wq, q));
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
        let mut cur_error = [zero; G];
        for ((li, wi), xi) in laux.iter().zip(&w).zip(&xt) {
            for g in 0..G {
                let diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(this_scale[g], li[g]), this_min[g]), xi[g]);
                cur_error[g] = _mm256_add_ps(cur_error[g], _mm256_mul_ps(wi[g], _mm256_mul_ps(diff, diff)));
            }
        }
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

/// `make_qx_quants(32, …)` for the 16 groups of 16 of a `Q6_K` block, one group per lane (two
/// registers per quantity). Each line is the reference's, lane-wise.
#[target_feature(enable = "avx2")]
fn qx_search(x: &[f32]) -> Fits {
    const G: usize = 2;
    let xt = transpose_units::<16, G>(x);
    let zero = _mm256_setzero_ps();
    let sign = _mm256_set1_ps(-0.0);
    let nmax_f = 32.0f32;
    let (lo, hi) = (_mm256_set1_epi32(-32), _mm256_set1_epi32(31));

    // The value of largest magnitude, the first of equals.
    let (mut max, mut amax) = ([zero; G], [zero; G]);
    // The weights x² and the products x²·x of the sums.
    let (mut w, mut wx) = ([[zero; G]; 16], [[zero; G]; 16]);
    for ((wi, wxi), xi) in w.iter_mut().zip(&mut wx).zip(&xt) {
        for g in 0..G {
            let ax = _mm256_andnot_ps(sign, xi[g]);
            let larger = _mm256_cmp_ps::<_CMP_GT_OQ>(ax, amax[g]);
            amax[g] = select(amax[g], ax, larger);
            max[g] = select(max[g], xi[g], larger);
            wi[g] = _mm256_mul_ps(xi[g], xi[g]);
            wxi[g] = _mm256_mul_ps(wi[g], xi[g]);
        }
    }
    let tiny = amax.map(|a| _mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(1e-15)));

    let sums = |iscale: &[__m256; G]| {
        let (mut sumlx, mut suml2) = ([zero; G], [zero; G]);
        for ((wi, wxi), xi) in w.iter().zip(&wx).zip(&xt) {
            for g in 0..G {
                let q = levels(_mm256_mul_ps(iscale[g], xi[g]), lo, hi);
                sumlx[g] = _mm256_add_ps(sumlx[g], _mm256_mul_ps(wxi[g], q));
                suml2[g] = _mm256_add_ps(suml2[g], _mm256_mul_ps(_mm256_mul_ps(wi[g], q), q));
            }
        }
        (sumlx, suml2)
    };

    let iscale = max.map(|m| _mm256_div_ps(_mm256_set1_ps(-nmax_f), m));
    let (sumlx, suml2) = sums(&iscale);
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
        let (sumlx, suml2) = sums(&iscale);
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
