//! NEON kernel for aarch64 (NEON is part of the base architecture).
//!
//! The same scheme as the AVX2 kernel (see `avx2.rs`) with four lanes: the scale searches of the
//! groups run side by side, one group per f32 lane, each lane doing the reference's sequence of
//! operations for its group: sums front to back, products and sums as separate instructions (no
//! fused multiply-add), IEEE division (`fdiv`) and square root (`fsqrt`), and each pass rounds as
//! the AVX2 kernel's does ([`Rounding`]: `frintn` with the clamps that can bite, or the reference's
//! magic-number bit arithmetic). The reference's comparisons are compare-and-select
//! (`x < m ? x : m` and so on), not `fmin`/`fmax`, which differ from them on NaN and on the sign of
//! zero. Work the reference skips is computed and dropped by the selects.
//!
//! `Q4_K` and `Q5_K` search two blocks at once (16 groups in four registers per quantity), each pass
//! in three loops (quants, sums, error); `Q6_K` the 16 groups of one block. The per-block rest is
//! the shared code of [`super::finish_scale_min_block`] and [`super::finish_q6_k_block`].

#[cfg(test)]
use super::count;
use super::{finish_q6_k_block, finish_scale_min_block, Fits, KQuant, Rounding, QK_K};
#[allow(clippy::wildcard_imports)] // the intrinsics
use std::arch::aarch64::*;

/// Encodes `values` (whole blocks) as `kind` into `out`, exactly `values.len() / QK_K` blocks.
#[target_feature(enable = "neon")]
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
        let fits = qkx2_search::<4>(x, nmax, rmin, nstep);
        for (b, (xb, ob)) in x.chunks_exact(QK_K).zip(o.chunks_exact_mut(bytes)).enumerate() {
            finish_scale_min_block(kind, xb, &fits, 8 * b, ob);
        }
    }
    let (x, o) = (xs.remainder(), os.into_remainder());
    if !x.is_empty() {
        finish_scale_min_block(kind, x, &qkx2_search::<2>(x, nmax, rmin, nstep), 0, o);
    }
}

#[inline]
#[target_feature(enable = "neon")]
fn load(x: &[f32; 4]) -> float32x4_t {
    // SAFETY: four f32.
    unsafe { vld1q_f32(x.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn store(v: float32x4_t, to: &mut [f32; 4]) {
    // SAFETY: four f32.
    unsafe { vst1q_f32(to.as_mut_ptr(), v) }
}

#[inline]
#[target_feature(enable = "neon")]
fn store_mask(v: uint32x4_t, to: &mut [u32; 4]) {
    // SAFETY: four u32.
    unsafe { vst1q_u32(to.as_mut_ptr(), v) }
}

/// Rows `r[j]` to columns: lane `j` of output `i` is lane `i` of `r[j]`.
#[inline]
#[target_feature(enable = "neon")]
fn transpose4(r: [float32x4_t; 4]) -> [float32x4_t; 4] {
    let t0 = vreinterpretq_f64_f32(vtrn1q_f32(r[0], r[1]));
    let t1 = vreinterpretq_f64_f32(vtrn2q_f32(r[0], r[1]));
    let t2 = vreinterpretq_f64_f32(vtrn1q_f32(r[2], r[3]));
    let t3 = vreinterpretq_f64_f32(vtrn2q_f32(r[2], r[3]));
    [
        vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)),
        vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)),
        vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)),
        vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)),
    ]
}

/// `x` as `4·G` consecutive groups ("units") of `N` values, transposed: lane `j` of `[i][g]` is
/// element `i` of unit `4g + j`.
#[allow(clippy::needless_range_loop)] // `g` is the register column of each row of `xt`
#[inline]
#[target_feature(enable = "neon")]
fn transpose_units<const N: usize, const G: usize>(x: &[f32]) -> [[float32x4_t; G]; N] {
    assert_eq!(x.len(), 4 * G * N);
    let mut xt = [[vdupq_n_f32(0.0); G]; N];
    for g in 0..G {
        for c in 0..N / 4 {
            let mut rows = [vdupq_n_f32(0.0); 4];
            for (j, row) in rows.iter_mut().enumerate() {
                let at = (4 * g + j) * N + 4 * c;
                *row = load(x[at..at + 4].try_into().unwrap());
            }
            for (r, v) in transpose4(rows).into_iter().enumerate() {
                xt[4 * c + r][g] = v;
            }
        }
    }
    xt
}

/// `nearest_int(v).clamp(lo, hi) as f32` lane by lane, with the reference's bit arithmetic.
#[inline]
#[target_feature(enable = "neon")]
fn levels(v: float32x4_t, lo: int32x4_t, hi: int32x4_t) -> float32x4_t {
    let bits = vreinterpretq_s32_f32(vaddq_f32(v, vdupq_n_f32(12_582_912.0)));
    let q = vsubq_s32(vandq_s32(bits, vdupq_n_s32(0x007f_ffff)), vdupq_n_s32(0x0040_0000));
    vcvtq_f32_s32(vminq_s32(vmaxq_s32(q, lo), hi))
}

/// `mask ? b : a`.
#[inline]
#[target_feature(enable = "neon")]
fn select(a: float32x4_t, b: float32x4_t, mask: uint32x4_t) -> float32x4_t {
    vbslq_f32(mask, b, a)
}

/// `mask ? +0 : v`.
#[inline]
#[target_feature(enable = "neon")]
fn zero_where(mask: uint32x4_t, v: float32x4_t) -> float32x4_t {
    vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), mask))
}

/// The cheapest [`Rounding`] for a pass whose values lie, lane by lane, between `a` and `b` (the
/// values of the group's least and greatest element), into quants `lo..=hi`. Lanes in `skip`
/// (whose results the search drops) do not count; `finite` says the groups hold no NaN or
/// infinity, without which no bound holds.
#[inline]
#[target_feature(enable = "neon")]
fn rounding<const G: usize>(
    finite: bool,
    a: &[float32x4_t; G],
    b: &[float32x4_t; G],
    skip: &[uint32x4_t; G],
    lo: f32,
    hi: f32,
) -> Rounding {
    if !finite {
        return Rounding::Exact;
    }
    let limit = vdupq_n_f32(4_194_304.0);
    let (below, above) = (vdupq_n_f32(lo - 0.5), vdupq_n_f32(hi + 0.5));
    let (mut wild, mut need_lo, mut need_hi) = (vdupq_n_u32(0), vdupq_n_u32(0), vdupq_n_u32(0));
    for g in 0..G {
        // |a| < 2²² and |b| < 2²²; false for NaN.
        let in_range = vandq_u32(vcaltq_f32(a[g], limit), vcaltq_f32(b[g], limit));
        let (least, most) = (vminq_f32(a[g], b[g]), vmaxq_f32(a[g], b[g]));
        wild = vorrq_u32(wild, vbicq_u32(vmvnq_u32(in_range), skip[g]));
        need_lo = vorrq_u32(need_lo, vbicq_u32(vcltq_f32(least, below), skip[g]));
        need_hi = vorrq_u32(need_hi, vbicq_u32(vcgeq_f32(most, above), skip[g]));
    }
    if vmaxvq_u32(wild) != 0 {
        Rounding::Exact
    } else {
        Rounding::Round { lo: vmaxvq_u32(need_lo) != 0, hi: vmaxvq_u32(need_hi) != 0 }
    }
}

/// `v` rounded to nearest-even and clamped to `[lo, hi]` on the sides asked for: `levels` for the
/// `v` that [`rounding`] allows.
#[inline]
#[target_feature(enable = "neon")]
fn round_levels<const LO: bool, const HI: bool>(v: float32x4_t, lo: float32x4_t, hi: float32x4_t) -> float32x4_t {
    let mut q = vrndnq_f32(v);
    if LO {
        q = vmaxq_f32(q, lo);
    }
    if HI {
        q = vminq_f32(q, hi);
    }
    q
}

/// Whether every value of `xt` is finite.
#[inline]
#[target_feature(enable = "neon")]
fn all_finite<const N: usize, const G: usize>(xt: &[[float32x4_t; G]; N]) -> bool {
    let inf = vdupq_n_f32(f32::INFINITY);
    let mut finite = vdupq_n_u32(u32::MAX);
    for xi in xt {
        for v in xi {
            finite = vandq_u32(finite, vcaltq_f32(*v, inf));
        }
    }
    vminvq_u32(finite) == u32::MAX
}

/// The quants of one `make_qkx2_quants` pass, `nearest_int(iscale·(x − min))` in `0..=nmax`,
/// into `l`, rounded as `r` says.
#[inline]
#[target_feature(enable = "neon")]
fn qkx2_levels<const G: usize>(
    r: Rounding,
    xt: &[[float32x4_t; G]; 32],
    iscale: &[float32x4_t; G],
    min: &[float32x4_t; G],
    nmax: i32,
    l: &mut [[float32x4_t; G]; 32],
) {
    #[cfg(test)]
    count(0, r);
    match r {
        Rounding::Exact => {
            let (lo, hi) = (vdupq_n_s32(0), vdupq_n_s32(nmax));
            for (li, xi) in l.iter_mut().zip(xt) {
                for g in 0..G {
                    li[g] = levels(vmulq_f32(iscale[g], vsubq_f32(xi[g], min[g])), lo, hi);
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
#[target_feature(enable = "neon")]
fn qkx2_round<const G: usize, const LO: bool, const HI: bool>(
    xt: &[[float32x4_t; G]; 32],
    iscale: &[float32x4_t; G],
    min: &[float32x4_t; G],
    nmax: i32,
    l: &mut [[float32x4_t; G]; 32],
) {
    let (lo, hi) = (vdupq_n_f32(0.0), vdupq_n_f32(nmax as f32));
    for (li, xi) in l.iter_mut().zip(xt) {
        for g in 0..G {
            li[g] = round_levels::<LO, HI>(vmulq_f32(iscale[g], vsubq_f32(xi[g], min[g])), lo, hi);
        }
    }
}

/// `Σ w·(scale·l + min − x)²` front to back: the error of a `make_qkx2_quants` fit.
#[inline]
#[target_feature(enable = "neon")]
fn qkx2_error<const G: usize>(
    l: &[[float32x4_t; G]; 32],
    w: &[[float32x4_t; G]; 32],
    xt: &[[float32x4_t; G]; 32],
    scale: &[float32x4_t; G],
    min: &[float32x4_t; G],
) -> [float32x4_t; G] {
    let mut error = [vdupq_n_f32(0.0); G];
    for ((li, wi), xi) in l.iter().zip(w).zip(xt) {
        for g in 0..G {
            let diff = vsubq_f32(vaddq_f32(vmulq_f32(scale[g], li[g]), min[g]), xi[g]);
            error[g] = vaddq_f32(error[g], vmulq_f32(wi[g], vmulq_f32(diff, diff)));
        }
    }
    error
}

/// `quantize_scale_min_block`'s weights and `make_qkx2_quants` for the `4·G` groups of 32 in `x`
/// (`G / 2` blocks), one group per lane. Each line is the reference's, lane-wise.
#[target_feature(enable = "neon")]
fn qkx2_search<const G: usize>(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> Fits {
    let xt = transpose_units::<32, G>(x);
    let finite = all_finite(&xt);
    let zero = vdupq_n_f32(0.0);
    let no = vdupq_n_u32(0);
    let nmax_f = nmax as f32;

    // weights = sqrt(Σx²/32) + |x|, the sum front to back.
    let mut sum_x2 = [zero; G];
    for xi in &xt {
        for g in 0..G {
            sum_x2[g] = vaddq_f32(sum_x2[g], vmulq_f32(xi[g], xi[g]));
        }
    }
    let av_x = sum_x2.map(|s| vsqrtq_f32(vdivq_f32(s, vdupq_n_f32(32.0))));
    let mut w = [[zero; G]; 32];
    for (wi, xi) in w.iter_mut().zip(&xt) {
        for g in 0..G {
            wi[g] = vaddq_f32(av_x[g], vabsq_f32(xi[g]));
        }
    }

    let (mut min, mut max, mut sum_w, mut sum_x) = (xt[0], xt[0], w[0], [zero; G]);
    for g in 0..G {
        sum_x[g] = vmulq_f32(w[0][g], xt[0][g]);
    }
    for i in 1..32 {
        for g in 0..G {
            min[g] = select(min[g], xt[i][g], vcltq_f32(xt[i][g], min[g]));
            max[g] = select(max[g], xt[i][g], vcgtq_f32(xt[i][g], max[g]));
            sum_w[g] = vaddq_f32(sum_w[g], w[i][g]);
            sum_x[g] = vaddq_f32(sum_x[g], vmulq_f32(w[i][g], xt[i][g]));
        }
    }
    // The least element, for the range of each pass's values.
    let least = min;
    let mut flat = [no; G];
    for g in 0..G {
        min[g] = zero_where(vcgtq_f32(min[g], zero), min[g]);
        flat[g] = vceqq_f32(max[g], min[g]);
    }
    let data_min = min;
    // The rounding of a pass with these multipliers and offsets; flat groups' passes are dropped.
    let pass_rounding = |iscale: &[float32x4_t; G], min: &[float32x4_t; G]| {
        let (mut a, mut b) = ([zero; G], [zero; G]);
        for g in 0..G {
            a[g] = vmulq_f32(iscale[g], vsubq_f32(least[g], min[g]));
            b[g] = vmulq_f32(iscale[g], vsubq_f32(max[g], min[g]));
        }
        rounding(finite, &a, &b, &flat, 0.0, nmax_f)
    };

    let mut iscale = [zero; G];
    let mut scale = [zero; G];
    for g in 0..G {
        iscale[g] = vdivq_f32(vdupq_n_f32(nmax_f), vsubq_f32(max[g], min[g]));
        scale[g] = vdivq_f32(vdupq_n_f32(1.0), iscale[g]);
    }
    let mut laux = [[zero; G]; 32];
    qkx2_levels(pass_rounding(&iscale, &min), &xt, &iscale, &min, nmax, &mut laux);
    let mut best_error = qkx2_error(&laux, &w, &xt, &scale, &min);
    let (mut best_iscale, mut best_lmin) = (iscale, min);

    for is in 0..=nstep {
        let num = vdupq_n_f32(rmin + 0.1 * is as f32 + nmax_f);
        for g in 0..G {
            iscale[g] = vdivq_f32(num, vsubq_f32(max[g], min[g]));
        }
        qkx2_levels(pass_rounding(&iscale, &min), &xt, &iscale, &min, nmax, &mut laux);
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([zero; G], [zero; G], [zero; G]);
        for ((li, wi), xi) in laux.iter().zip(&w).zip(&xt) {
            for g in 0..G {
                let wq = vmulq_f32(wi[g], li[g]);
                sum_l[g] = vaddq_f32(sum_l[g], wq);
                sum_l2[g] = vaddq_f32(sum_l2[g], vmulq_f32(wq, li[g]));
                sum_xl[g] = vaddq_f32(sum_xl[g], vmulq_f32(wq, xi[g]));
            }
        }
        let (mut ok, mut this_scale, mut this_min) = ([no; G], [zero; G], [zero; G]);
        for g in 0..G {
            let det = vsubq_f32(vmulq_f32(sum_w[g], sum_l2[g]), vmulq_f32(sum_l[g], sum_l[g]));
            ok[g] = vcgtq_f32(det, zero);
            let ts = vdivq_f32(vsubq_f32(vmulq_f32(sum_w[g], sum_xl[g]), vmulq_f32(sum_x[g], sum_l[g])), det);
            let tm = vdivq_f32(vsubq_f32(vmulq_f32(sum_l2[g], sum_x[g]), vmulq_f32(sum_l[g], sum_xl[g])), det);
            let positive = vcgtq_f32(tm, zero);
            this_min[g] = zero_where(positive, tm);
            this_scale[g] = select(ts, vdivq_f32(sum_xl[g], sum_l2[g]), positive);
        }
        let cur_error = qkx2_error(&laux, &w, &xt, &this_scale, &this_min);
        for g in 0..G {
            let better = vandq_u32(ok[g], vcltq_f32(cur_error[g], best_error[g]));
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
        let u = 4 * g..4 * g + 4;
        store(zero_where(flat[g], scale[g]), (&mut fits.scale[u.clone()]).try_into().unwrap());
        store(vnegq_f32(select(min[g], data_min[g], flat[g])), (&mut fits.min[u.clone()]).try_into().unwrap());
        store(best_iscale[g], (&mut fits.iscale[u.clone()]).try_into().unwrap());
        store(best_lmin[g], (&mut fits.lmin[u.clone()]).try_into().unwrap());
        store_mask(flat[g], (&mut fits.zero[u]).try_into().unwrap());
    }
    fits
}

/// `Σ x²·x·q` and `Σ x²·q·q` front to back over a `make_qx_quants` pass's quants
/// `nearest_int(iscale·x)` in `−32..32`, rounded as `r` says; `w` is x², `wx` x²·x.
#[inline]
#[target_feature(enable = "neon")]
fn qx_sums<const G: usize>(
    r: Rounding,
    xt: &[[float32x4_t; G]; 16],
    w: &[[float32x4_t; G]; 16],
    wx: &[[float32x4_t; G]; 16],
    iscale: &[float32x4_t; G],
) -> ([float32x4_t; G], [float32x4_t; G]) {
    #[cfg(test)]
    count(1, r);
    match r {
        Rounding::Exact => {
            let (lo, hi) = (vdupq_n_s32(-32), vdupq_n_s32(31));
            qx_sums_of(xt, w, wx, |xi, g| levels(vmulq_f32(iscale[g], xi), lo, hi))
        }
        Rounding::Round { lo: false, hi: false } => qx_round::<G, false, false>(xt, w, wx, iscale),
        Rounding::Round { lo: true, hi: false } => qx_round::<G, true, false>(xt, w, wx, iscale),
        Rounding::Round { lo: false, hi: true } => qx_round::<G, false, true>(xt, w, wx, iscale),
        Rounding::Round { lo: true, hi: true } => qx_round::<G, true, true>(xt, w, wx, iscale),
    }
}

#[inline]
#[target_feature(enable = "neon")]
fn qx_round<const G: usize, const LO: bool, const HI: bool>(
    xt: &[[float32x4_t; G]; 16],
    w: &[[float32x4_t; G]; 16],
    wx: &[[float32x4_t; G]; 16],
    iscale: &[float32x4_t; G],
) -> ([float32x4_t; G], [float32x4_t; G]) {
    let (lo, hi) = (vdupq_n_f32(-32.0), vdupq_n_f32(31.0));
    qx_sums_of(xt, w, wx, |xi, g| round_levels::<LO, HI>(vmulq_f32(iscale[g], xi), lo, hi))
}

/// The sums of [`qx_sums`] for the quants `quant(x, g)` gives.
#[inline]
#[target_feature(enable = "neon")]
fn qx_sums_of<const G: usize>(
    xt: &[[float32x4_t; G]; 16],
    w: &[[float32x4_t; G]; 16],
    wx: &[[float32x4_t; G]; 16],
    quant: impl Fn(float32x4_t, usize) -> float32x4_t,
) -> ([float32x4_t; G], [float32x4_t; G]) {
    let (mut sumlx, mut suml2) = ([vdupq_n_f32(0.0); G], [vdupq_n_f32(0.0); G]);
    for ((wi, wxi), xi) in w.iter().zip(wx).zip(xt) {
        for g in 0..G {
            let q = quant(xi[g], g);
            sumlx[g] = vaddq_f32(sumlx[g], vmulq_f32(wxi[g], q));
            suml2[g] = vaddq_f32(suml2[g], vmulq_f32(vmulq_f32(wi[g], q), q));
        }
    }
    (sumlx, suml2)
}

/// `make_qx_quants(32, …)` for the 16 groups of 16 of a `Q6_K` block, one group per lane (four
/// registers per quantity). Each line is the reference's, lane-wise.
#[target_feature(enable = "neon")]
fn qx_search(x: &[f32]) -> Fits {
    const G: usize = 4;
    let xt = transpose_units::<16, G>(x);
    let finite = all_finite(&xt);
    let zero = vdupq_n_f32(0.0);
    let nmax_f = 32.0f32;

    // The value of largest magnitude, the first of equals; the least and greatest values.
    let (mut max, mut amax, mut least, mut most) = ([zero; G], [zero; G], xt[0], xt[0]);
    // The weights x² and the products x²·x of the sums.
    let (mut w, mut wx) = ([[zero; G]; 16], [[zero; G]; 16]);
    for ((wi, wxi), xi) in w.iter_mut().zip(&mut wx).zip(&xt) {
        for g in 0..G {
            let ax = vabsq_f32(xi[g]);
            let larger = vcgtq_f32(ax, amax[g]);
            amax[g] = select(amax[g], ax, larger);
            max[g] = select(max[g], xi[g], larger);
            least[g] = select(least[g], xi[g], vcltq_f32(xi[g], least[g]));
            most[g] = select(most[g], xi[g], vcgtq_f32(xi[g], most[g]));
            wi[g] = vmulq_f32(xi[g], xi[g]);
            wxi[g] = vmulq_f32(wi[g], xi[g]);
        }
    }
    let tiny = amax.map(|a| vcltq_f32(a, vdupq_n_f32(1e-15)));
    // The rounding of a pass with these multipliers; groups below 1e-15 are dropped.
    let pass_rounding = |iscale: &[float32x4_t; G]| {
        let (mut a, mut b) = ([zero; G], [zero; G]);
        for g in 0..G {
            a[g] = vmulq_f32(iscale[g], least[g]);
            b[g] = vmulq_f32(iscale[g], most[g]);
        }
        rounding(finite, &a, &b, &tiny, -32.0, 31.0)
    };

    let iscale = max.map(|m| vdivq_f32(vdupq_n_f32(-nmax_f), m));
    let (sumlx, suml2) = qx_sums(pass_rounding(&iscale), &xt, &w, &wx, &iscale);
    let (mut scale, mut best) = ([zero; G], [zero; G]);
    for g in 0..G {
        // `suml2 == 0 ? 0 : sumlx / suml2`
        scale[g] = zero_where(vceqq_f32(suml2[g], zero), vdivq_f32(sumlx[g], suml2[g]));
        best[g] = vmulq_f32(scale[g], sumlx[g]);
    }
    let mut best_iscale = iscale;
    for is in (-9..=9).filter(|&is| is != 0) {
        let num = vdupq_n_f32(-(nmax_f + 0.1 * is as f32));
        let iscale = max.map(|m| vdivq_f32(num, m));
        let (sumlx, suml2) = qx_sums(pass_rounding(&iscale), &xt, &w, &wx, &iscale);
        for g in 0..G {
            let better = vandq_u32(
                vcgtq_f32(suml2[g], zero),
                vcgtq_f32(vmulq_f32(sumlx[g], sumlx[g]), vmulq_f32(best[g], suml2[g])),
            );
            let s = vdivq_f32(sumlx[g], suml2[g]);
            best_iscale[g] = select(best_iscale[g], iscale[g], better);
            scale[g] = select(scale[g], s, better);
            best[g] = select(best[g], vmulq_f32(s, sumlx[g]), better);
        }
    }

    // A group below 1e-15 returns 0 with all-zero quants.
    let mut fits = Fits::default();
    for g in 0..G {
        let u = 4 * g..4 * g + 4;
        store(zero_where(tiny[g], scale[g]), (&mut fits.scale[u.clone()]).try_into().unwrap());
        store(best_iscale[g], (&mut fits.iscale[u.clone()]).try_into().unwrap());
        store_mask(tiny[g], (&mut fits.zero[u]).try_into().unwrap());
    }
    fits
}
