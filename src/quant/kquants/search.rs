//! The scale searches of the SIMD kernels, written once over [`Lanes`] and compiled for each CPU
//! by one `#[target_feature]` entry ([`quantize_blocks_avx2`], [`quantize_blocks_neon`]).
//!
//! The searches (`make_qkx2_quants` for the 32-value groups of `Q4_K` and `Q5_K` and the 16-value
//! groups of `Q2_K`, `make_q3_quants` for those of `Q3_K`, `make_qx_quants` for those of `Q6_K`)
//! are sequential within a group but independent between
//! groups, so they run side by side: one group per f32 lane, the groups' values transposed so that
//! vector `i` holds element `i` of as many groups as there are lanes. Each lane then does exactly
//! the reference's sequence for its group: sums front to back, products and sums as separate
//! operations (no fused multiply-add), IEEE division and square root, and the reference's
//! comparisons (`Vector::min` and `max` are C's `x < m ? x : m` and `x > m ? x : m`, the other
//! `if`s ordered compares feeding selects). Where the reference skips work (`det > 0` false, an
//! unimproved pass, a flat group) the lane computes it anyway and the select drops it.
//!
//! Rounding to quants is most of a pass's work, so each pass picks the cheapest way that gives the
//! reference's quants (`rounding.rs`).
//!
//! `Q4_K` and `Q5_K` search four vectors of groups at once (four blocks on AVX2, two on NEON), each
//! pass in three loops (quants, sums, error) so that few instructions wait on long chains; `Q2_K`
//! and `Q3_K` four vectors of 16-value groups (two blocks on AVX2, one on NEON); `Q6_K`'s 16
//! groups are one block. The per-block rest is `finish.rs`.

use super::finish::{finish_q2_k_block, finish_q3_k_block, finish_q6_k_block, finish_scale_min_block, Fits, Levels};
#[cfg(test)]
use super::rounding::count;
use super::rounding::{quant, rounding, QuantRange, Rounding};
use super::QK_K;
use crate::block_type::BlockType;
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;
#[cfg(target_arch = "aarch64")]
use crate::simd::Neon;
use crate::simd::{Lanes, Mask, Vector};

/// [`quantize_blocks`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) fn quantize_blocks_avx2(lanes: Avx2, kind: BlockType, values: &[f32], out: &mut [u8]) {
    quantize_blocks(lanes, kind, values, out);
}

/// [`quantize_blocks`] compiled for NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
pub(super) fn quantize_blocks_neon(lanes: Neon, kind: BlockType, values: &[f32], out: &mut [u8]) {
    quantize_blocks(lanes, kind, values, out);
}

/// Encodes `values` (whole blocks) as `kind` into `out`, exactly `values.len() / QK_K` blocks.
#[inline(always)]
fn quantize_blocks<L: Lanes>(lanes: L, kind: BlockType, values: &[f32], out: &mut [u8]) {
    let bytes = kind.bytes();
    assert_eq!(values.len() % QK_K, 0, "whole blocks");
    assert_eq!(values.len() / QK_K * bytes, out.len(), "room for exactly the blocks");
    if kind == BlockType::Q6_K {
        for (x, o) in values.chunks_exact(QK_K).zip(out.chunks_exact_mut(bytes)) {
            // The 16 groups: two vectors of eight lanes or four of four.
            let fits = if L::LANES == 8 { qx_search::<L, 2>(lanes, x) } else { qx_search::<L, 4>(lanes, x) };
            finish_q6_k_block(x, &fits, o);
        }
        return;
    }
    // Q2_K and Q3_K: four vectors of 16-value groups at a time (two blocks on AVX2, one on NEON),
    // then a last block alone. Q4_K and Q5_K: four vectors of 32-value groups at a time, then what
    // is left two and one at a time. (Loops, not a closure: a closure would not be compiled for
    // the caller's CPU features.)
    let (nmax, rmin, nstep) = if kind == BlockType::Q4_K { (15, -1.0, 20) } else { (31, -0.5, 15) };
    let (mut x, mut o) = (values, out);
    while !x.is_empty() {
        let (groups16, groups32) = (x.len() / 16, x.len() / 32);
        let n = match kind {
            BlockType::Q2_K if groups16 >= 4 * L::LANES => q2_k_search_and_finish::<L, 4>(lanes, x, o),
            BlockType::Q2_K => q2_k_search_and_finish::<L, 2>(lanes, x, o),
            BlockType::Q3_K if groups16 >= 4 * L::LANES => q3_k_search_and_finish::<L, 4>(lanes, x, o),
            BlockType::Q3_K => q3_k_search_and_finish::<L, 2>(lanes, x, o),
            BlockType::Q4_K | BlockType::Q5_K if groups32 >= 4 * L::LANES => {
                search_and_finish::<L, 4>(lanes, kind, x, o, nmax, rmin, nstep)
            }
            BlockType::Q4_K | BlockType::Q5_K if groups32 >= 2 * L::LANES => {
                search_and_finish::<L, 2>(lanes, kind, x, o, nmax, rmin, nstep)
            }
            BlockType::Q4_K | BlockType::Q5_K => search_and_finish::<L, 1>(lanes, kind, x, o, nmax, rmin, nstep),
            other => unreachable!("{} is not a K-quant", other.name()),
        };
        assert!(n > 0, "every step encodes a block");
        (x, o) = (&x[n * QK_K..], &mut o[n * bytes..]);
    }
}

/// Searches the first `G·LANES / 8` blocks of `x` together and writes them to the start of `out`;
/// returns how many.
#[inline(always)]
fn search_and_finish<L: Lanes, const G: usize>(
    lanes: L,
    kind: BlockType,
    x: &[f32],
    out: &mut [u8],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> usize {
    let blocks = G * L::LANES / 8;
    let x = &x[..blocks * QK_K];
    let fits = qkx2_search::<L, 32, G, false>(lanes, x, nmax, rmin, nstep);
    let bytes = kind.bytes();
    for (b, (xb, ob)) in x.chunks_exact(QK_K).zip(out[..blocks * bytes].chunks_exact_mut(bytes)).enumerate() {
        finish_scale_min_block(kind, xb, &fits, 8 * b, ob);
    }
    blocks
}

/// `Q2_K`: searches the first `G·LANES / 16` blocks of `x` together (`make_qkx2_quants(16, 3, …,
/// rmin −0.5, nstep 15)`, weights |x|, absolute error) and writes them to the start of `out`;
/// returns how many.
#[inline(always)]
fn q2_k_search_and_finish<L: Lanes, const G: usize>(lanes: L, x: &[f32], out: &mut [u8]) -> usize {
    let blocks = G * L::LANES / 16;
    let x = &x[..blocks * QK_K];
    let fits = qkx2_search::<L, 16, G, true>(lanes, x, 3, -0.5, 15);
    let bytes = BlockType::Q2_K.bytes();
    for (b, (xb, ob)) in x.chunks_exact(QK_K).zip(out[..blocks * bytes].chunks_exact_mut(bytes)).enumerate() {
        finish_q2_k_block(xb, &fits, 16 * b, ob);
    }
    blocks
}

/// `Q3_K`: searches the first `G·LANES / 16` blocks of `x` together (`make_q3_quants(16, 4, …,
/// do_rmse)`) and writes them to the start of `out`; returns how many.
#[inline(always)]
fn q3_k_search_and_finish<L: Lanes, const G: usize>(lanes: L, x: &[f32], out: &mut [u8]) -> usize {
    let blocks = G * L::LANES / 16;
    let x = &x[..blocks * QK_K];
    let (fits, levels) = q3_search::<L, G>(lanes, x);
    let bytes = BlockType::Q3_K.bytes();
    for (b, (xb, ob)) in x.chunks_exact(QK_K).zip(out[..blocks * bytes].chunks_exact_mut(bytes)).enumerate() {
        finish_q3_k_block(xb, &fits, &levels, 16 * b, ob);
    }
    blocks
}

/// `x` as `LANES·G` consecutive groups ("units") of `N` values, transposed: lane `j` of `[i][g]`
/// is element `i` of unit `LANES·g + j`.
#[inline(always)]
fn transpose_units<L: Lanes, const N: usize, const G: usize>(lanes: L, x: &[f32]) -> [[L::F32; G]; N] {
    assert_eq!(x.len(), L::LANES * G * N);
    let zero = lanes.splat(0.0);
    let mut xt = [[zero; G]; N];
    let mut columns = [zero; 8];
    for g in 0..G {
        for c in 0..N / L::LANES {
            lanes.load_columns(&x[L::LANES * (g * N + c)..], N, &mut columns);
            for (r, &v) in columns[..L::LANES].iter().enumerate() {
                xt[L::LANES * c + r][g] = v;
            }
        }
    }
    xt
}

/// Whether every value of `xt` is finite.
#[inline(always)]
fn all_finite<L: Lanes, const N: usize, const G: usize>(lanes: L, xt: &[[L::F32; G]; N]) -> bool {
    let inf = lanes.splat(f32::INFINITY);
    let mut finite = xt[0][0].abs_lt(inf);
    for xi in xt {
        for v in xi {
            finite = finite & v.abs_lt(inf);
        }
    }
    finite.all()
}

/// The quants of one `make_qkx2_quants` pass, `nearest_int(iscale·(x − min))` in `0..=nmax`,
/// into `l`, rounded as `r` says.
#[inline(always)]
fn qkx2_levels<L: Lanes, const N: usize, const G: usize>(
    lanes: L,
    r: Rounding,
    xt: &[[L::F32; G]; N],
    iscale: &[L::F32; G],
    min: &[L::F32; G],
    nmax: i32,
    l: &mut [[L::F32; G]; N],
) {
    #[cfg(test)]
    count(if N == 16 { 2 } else { 0 }, r);
    let range = QuantRange::new(lanes, 0, nmax);
    match r {
        Rounding::Exact => qkx2_levels_as::<L, N, G, true, false, false>(xt, iscale, min, range, l),
        Rounding::Round { lo: false, hi: false } => {
            qkx2_levels_as::<L, N, G, false, false, false>(xt, iscale, min, range, l);
        }
        Rounding::Round { lo: true, hi: false } => {
            qkx2_levels_as::<L, N, G, false, true, false>(xt, iscale, min, range, l);
        }
        Rounding::Round { lo: false, hi: true } => {
            qkx2_levels_as::<L, N, G, false, false, true>(xt, iscale, min, range, l);
        }
        Rounding::Round { lo: true, hi: true } => {
            qkx2_levels_as::<L, N, G, false, true, true>(xt, iscale, min, range, l);
        }
    }
}

#[inline(always)]
fn qkx2_levels_as<L: Lanes, const N: usize, const G: usize, const EXACT: bool, const LO: bool, const HI: bool>(
    xt: &[[L::F32; G]; N],
    iscale: &[L::F32; G],
    min: &[L::F32; G],
    range: QuantRange<L::F32>,
    l: &mut [[L::F32; G]; N],
) {
    for (li, xi) in l.iter_mut().zip(xt) {
        for g in 0..G {
            li[g] = quant::<_, EXACT, LO, HI>(iscale[g] * (xi[g] - min[g]), range);
        }
    }
}

/// `Σ w·(scale·l + min − x)²` front to back, or `Σ w·|scale·l + min − x|` when `MAD` (ggml's
/// `use_mad`): the error of a `make_qkx2_quants` fit.
#[inline(always)]
fn qkx2_error<L: Lanes, const N: usize, const G: usize, const MAD: bool>(
    lanes: L,
    l: &[[L::F32; G]; N],
    w: &[[L::F32; G]; N],
    xt: &[[L::F32; G]; N],
    scale: &[L::F32; G],
    min: &[L::F32; G],
) -> [L::F32; G] {
    let mut error = [lanes.splat(0.0); G];
    for ((li, wi), xi) in l.iter().zip(w).zip(xt) {
        for g in 0..G {
            let diff = scale[g] * li[g] + min[g] - xi[g];
            error[g] = error[g] + wi[g] * if MAD { diff.abs() } else { diff * diff };
        }
    }
    error
}

/// `make_qkx2_quants` for the `LANES·G` groups of `N` in `x`, one group per lane, with its
/// callers' weights: `quantize_scale_min_block`'s `sqrt(Σx²/N) + |x|` and squared error (`Q4_K`,
/// `Q5_K`), or when `MAD` `Q2_K`'s `|x|` and absolute error. See the reference for the algorithm;
/// each line below is the reference's, lane-wise.
#[allow(clippy::needless_range_loop)] // `g` indexes several arrays of vectors at once
#[inline(always)]
fn qkx2_search<L: Lanes, const N: usize, const G: usize, const MAD: bool>(
    lanes: L,
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> Fits {
    let xt = transpose_units::<L, N, G>(lanes, x);
    let finite = all_finite(lanes, &xt);
    let zero = lanes.splat(0.0);
    let nmax_f = nmax as f32;

    // weights = sqrt(Σx²/N) + |x|, the sum front to back; or |x|.
    let mut w = [[zero; G]; N];
    if MAD {
        for (wi, xi) in w.iter_mut().zip(&xt) {
            for g in 0..G {
                wi[g] = xi[g].abs();
            }
        }
    } else {
        let mut sum_x2 = [zero; G];
        for xi in &xt {
            for g in 0..G {
                sum_x2[g] = sum_x2[g] + xi[g] * xi[g];
            }
        }
        let mut av_x = [zero; G];
        for g in 0..G {
            av_x[g] = (sum_x2[g] / lanes.splat(N as f32)).sqrt();
        }
        for (wi, xi) in w.iter_mut().zip(&xt) {
            for g in 0..G {
                wi[g] = av_x[g] + xi[g].abs();
            }
        }
    }

    let (mut min, mut max, mut sum_w, mut sum_x) = (xt[0], xt[0], w[0], [zero; G]);
    for g in 0..G {
        sum_x[g] = w[0][g] * xt[0][g];
    }
    for i in 1..N {
        for g in 0..G {
            min[g] = xt[i][g].min(min[g]);
            max[g] = xt[i][g].max(max[g]);
            sum_w[g] = sum_w[g] + w[i][g];
            sum_x[g] = sum_x[g] + w[i][g] * xt[i][g];
        }
    }
    // The least element, for the range of each pass's values.
    let least = min;
    // `if min > 0 { min = 0 }`: `0 < min ? 0 : min`.
    let mut flat = [zero.eq(zero); G];
    for g in 0..G {
        min[g] = zero.min(min[g]);
        flat[g] = max[g].eq(min[g]);
    }
    let data_min = min;

    let mut iscale = [zero; G];
    let mut scale = [zero; G];
    for g in 0..G {
        iscale[g] = lanes.splat(nmax_f) / (max[g] - min[g]);
        scale[g] = lanes.splat(1.0) / iscale[g];
    }
    let mut laux = [[zero; G]; N];
    let r = qkx2_rounding(lanes, finite, &least, &max, &flat, &iscale, &min, nmax_f);
    qkx2_levels(lanes, r, &xt, &iscale, &min, nmax, &mut laux);
    let mut best_error = qkx2_error::<L, N, G, MAD>(lanes, &laux, &w, &xt, &scale, &min);
    let (mut best_iscale, mut best_lmin) = (iscale, min);

    for is in 0..=nstep {
        let num = lanes.splat(rmin + 0.1 * is as f32 + nmax_f);
        for g in 0..G {
            iscale[g] = num / (max[g] - min[g]);
        }
        let r = qkx2_rounding(lanes, finite, &least, &max, &flat, &iscale, &min, nmax_f);
        qkx2_levels(lanes, r, &xt, &iscale, &min, nmax, &mut laux);
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([zero; G], [zero; G], [zero; G]);
        for ((li, wi), xi) in laux.iter().zip(&w).zip(&xt) {
            for g in 0..G {
                let wq = wi[g] * li[g];
                sum_l[g] = sum_l[g] + wq;
                sum_l2[g] = sum_l2[g] + wq * li[g];
                sum_xl[g] = sum_xl[g] + wq * xi[g];
            }
        }
        let (mut ok, mut this_scale, mut this_min) = ([zero.eq(zero); G], [zero; G], [zero; G]);
        for g in 0..G {
            let det = sum_w[g] * sum_l2[g] - sum_l[g] * sum_l[g];
            ok[g] = det.gt(zero);
            let ts = (sum_w[g] * sum_xl[g] - sum_x[g] * sum_l[g]) / det;
            let tm = (sum_l2[g] * sum_x[g] - sum_l[g] * sum_xl[g]) / det;
            let positive = tm.gt(zero);
            this_min[g] = tm.zero_where(positive);
            this_scale[g] = ts.replaced_where(positive, sum_xl[g] / sum_l2[g]);
        }
        let cur_error = qkx2_error::<L, N, G, MAD>(lanes, &laux, &w, &xt, &this_scale, &this_min);
        for g in 0..G {
            let better = ok[g] & cur_error[g].lt(best_error[g]);
            best_iscale[g] = best_iscale[g].replaced_where(better, iscale[g]);
            best_lmin[g] = best_lmin[g].replaced_where(better, min[g]);
            best_error[g] = best_error[g].replaced_where(better, cur_error[g]);
            scale[g] = scale[g].replaced_where(better, this_scale[g]);
            min[g] = min[g].replaced_where(better, this_min[g]);
        }
    }

    // A flat group returns (0, −min) with all-zero quants.
    let mut fits = Fits::default();
    for g in 0..G {
        let u = L::LANES * g..L::LANES * (g + 1);
        scale[g].zero_where(flat[g]).store(&mut fits.scale[u.clone()]);
        (-min[g].replaced_where(flat[g], data_min[g])).store(&mut fits.min[u.clone()]);
        best_iscale[g].store(&mut fits.iscale[u.clone()]);
        best_lmin[g].store(&mut fits.lmin[u.clone()]);
        flat[g].store(&mut fits.zero[u]);
    }
    fits
}

/// The rounding of a `make_qkx2_quants` pass with multipliers `iscale` and offsets `min`, from the
/// groups' least and greatest values; flat groups' passes are dropped.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn qkx2_rounding<L: Lanes, const G: usize>(
    lanes: L,
    finite: bool,
    least: &[L::F32; G],
    most: &[L::F32; G],
    flat: &[<L::F32 as Vector>::Mask; G],
    iscale: &[L::F32; G],
    min: &[L::F32; G],
    nmax: f32,
) -> Rounding {
    let zero = lanes.splat(0.0);
    let (mut a, mut b) = ([zero; G], [zero; G]);
    for g in 0..G {
        a[g] = iscale[g] * (least[g] - min[g]);
        b[g] = iscale[g] * (most[g] - min[g]);
    }
    rounding(lanes, finite, &a, &b, flat, 0.0, nmax)
}

/// `Σ x²·x·q` and `Σ x²·q·q` front to back over a `make_qx_quants` pass's quants
/// `nearest_int(iscale·x)` in `−32..32`, rounded as `r` says; `w` is x², `wx` x²·x.
#[inline(always)]
fn qx_sums<L: Lanes, const G: usize>(
    lanes: L,
    r: Rounding,
    xt: &[[L::F32; G]; 16],
    w: &[[L::F32; G]; 16],
    wx: &[[L::F32; G]; 16],
    iscale: &[L::F32; G],
) -> ([L::F32; G], [L::F32; G]) {
    #[cfg(test)]
    count(1, r);
    let range = QuantRange::new(lanes, -32, 31);
    match r {
        Rounding::Exact => qx_sums_as::<L, G, true, false, false>(lanes, xt, w, wx, iscale, range),
        Rounding::Round { lo: false, hi: false } => {
            qx_sums_as::<L, G, false, false, false>(lanes, xt, w, wx, iscale, range)
        }
        Rounding::Round { lo: true, hi: false } => {
            qx_sums_as::<L, G, false, true, false>(lanes, xt, w, wx, iscale, range)
        }
        Rounding::Round { lo: false, hi: true } => {
            qx_sums_as::<L, G, false, false, true>(lanes, xt, w, wx, iscale, range)
        }
        Rounding::Round { lo: true, hi: true } => {
            qx_sums_as::<L, G, false, true, true>(lanes, xt, w, wx, iscale, range)
        }
    }
}

#[inline(always)]
fn qx_sums_as<L: Lanes, const G: usize, const EXACT: bool, const LO: bool, const HI: bool>(
    lanes: L,
    xt: &[[L::F32; G]; 16],
    w: &[[L::F32; G]; 16],
    wx: &[[L::F32; G]; 16],
    iscale: &[L::F32; G],
    range: QuantRange<L::F32>,
) -> ([L::F32; G], [L::F32; G]) {
    let (mut sumlx, mut suml2) = ([lanes.splat(0.0); G], [lanes.splat(0.0); G]);
    for ((wi, wxi), xi) in w.iter().zip(wx).zip(xt) {
        for g in 0..G {
            let q = quant::<_, EXACT, LO, HI>(iscale[g] * xi[g], range);
            sumlx[g] = sumlx[g] + wxi[g] * q;
            suml2[g] = suml2[g] + wi[g] * q * q;
        }
    }
    (sumlx, suml2)
}

/// `make_qx_quants(32, …)` for the 16 groups of 16 of a `Q6_K` block, one group per lane (`G`
/// vectors per quantity). Each line is the reference's, lane-wise.
#[allow(clippy::needless_range_loop)] // `g` indexes several arrays of vectors at once
#[inline(always)]
fn qx_search<L: Lanes, const G: usize>(lanes: L, x: &[f32]) -> Fits {
    let xt = transpose_units::<L, 16, G>(lanes, x);
    let finite = all_finite(lanes, &xt);
    let zero = lanes.splat(0.0);
    let nmax_f = 32.0f32;

    // The value of largest magnitude, the first of equals; the least and greatest values.
    let (mut max, mut amax, mut least, mut most) = ([zero; G], [zero; G], xt[0], xt[0]);
    // The weights x² and the products x²·x of the sums.
    let (mut w, mut wx) = ([[zero; G]; 16], [[zero; G]; 16]);
    for ((wi, wxi), xi) in w.iter_mut().zip(&mut wx).zip(&xt) {
        for g in 0..G {
            let ax = xi[g].abs();
            let larger = ax.gt(amax[g]);
            amax[g] = amax[g].replaced_where(larger, ax);
            max[g] = max[g].replaced_where(larger, xi[g]);
            least[g] = xi[g].min(least[g]);
            most[g] = xi[g].max(most[g]);
            wi[g] = xi[g] * xi[g];
            wxi[g] = wi[g] * xi[g];
        }
    }
    let mut tiny = [zero.eq(zero); G];
    for g in 0..G {
        tiny[g] = amax[g].lt(lanes.splat(1e-15));
    }

    let mut iscale = [zero; G];
    for g in 0..G {
        iscale[g] = lanes.splat(-nmax_f) / max[g];
    }
    let r = qx_rounding(lanes, finite, &least, &most, &tiny, &iscale);
    let (sumlx, suml2) = qx_sums(lanes, r, &xt, &w, &wx, &iscale);
    let (mut scale, mut best) = ([zero; G], [zero; G]);
    for g in 0..G {
        // `suml2 == 0 ? 0 : sumlx / suml2`
        scale[g] = (sumlx[g] / suml2[g]).zero_where(suml2[g].eq(zero));
        best[g] = scale[g] * sumlx[g];
    }
    let mut best_iscale = iscale;
    for is in (-9..=9).filter(|&is| is != 0) {
        let num = lanes.splat(-(nmax_f + 0.1 * is as f32));
        for g in 0..G {
            iscale[g] = num / max[g];
        }
        let r = qx_rounding(lanes, finite, &least, &most, &tiny, &iscale);
        let (sumlx, suml2) = qx_sums(lanes, r, &xt, &w, &wx, &iscale);
        for g in 0..G {
            let better = suml2[g].gt(zero) & (sumlx[g] * sumlx[g]).gt(best[g] * suml2[g]);
            let s = sumlx[g] / suml2[g];
            best_iscale[g] = best_iscale[g].replaced_where(better, iscale[g]);
            scale[g] = scale[g].replaced_where(better, s);
            best[g] = best[g].replaced_where(better, s * sumlx[g]);
        }
    }

    // A group below 1e-15 returns 0 with all-zero quants.
    let mut fits = Fits::default();
    for g in 0..G {
        let u = L::LANES * g..L::LANES * (g + 1);
        scale[g].zero_where(tiny[g]).store(&mut fits.scale[u.clone()]);
        best_iscale[g].store(&mut fits.iscale[u.clone()]);
        tiny[g].store(&mut fits.zero[u]);
    }
    fits
}

/// The rounding of a `make_qx_quants` pass with multipliers `iscale`, from the groups' least and
/// greatest values; groups below 1e-15 are dropped.
#[inline(always)]
fn qx_rounding<L: Lanes, const G: usize>(
    lanes: L,
    finite: bool,
    least: &[L::F32; G],
    most: &[L::F32; G],
    tiny: &[<L::F32 as Vector>::Mask; G],
    iscale: &[L::F32; G],
) -> Rounding {
    let zero = lanes.splat(0.0);
    let (mut a, mut b) = ([zero; G], [zero; G]);
    for g in 0..G {
        a[g] = iscale[g] * least[g];
        b[g] = iscale[g] * most[g];
    }
    rounding(lanes, finite, &a, &b, tiny, -32.0, 31.0)
}

/// How many of the `Q3_K` searches reached each sweep (index 1..=5): the tests check that their
/// rows reach the last.
#[cfg(test)]
pub(super) static Q3_SWEEPS: [std::sync::atomic::AtomicUsize; 6] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 6];

/// Counts a `Q3_K` search's sweep, for the tests.
#[inline(always)]
fn count_sweep(sweep: usize) {
    #[cfg(test)]
    Q3_SWEEPS[sweep].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    let _ = sweep;
}

/// `make_q3_quants(16, 4, …, do_rmse)` for the `LANES·G` groups of 16 in `x`, one group per lane:
/// the quants of the symmetric grid through the largest magnitude, then up to five sweeps that
/// move one quant at a time while the x²-weighted least-squares fit improves. Each line is the
/// reference's, lane-wise; the sweeps stop once no lane changed (a lane whose sweep changed
/// nothing would change nothing in the next one either, so running on is the reference's
/// stopping). Quants are rounded with the reference's bit arithmetic throughout: a sweep's
/// candidate `x·sl2/slx` has no bound.
#[allow(clippy::needless_range_loop)] // `g` indexes several arrays of vectors at once
#[inline(always)]
fn q3_search<L: Lanes, const G: usize>(lanes: L, x: &[f32]) -> (Fits, Levels) {
    let xt = transpose_units::<L, 16, G>(lanes, x);
    let zero = lanes.splat(0.0);
    let (nmax, nmax_f) = (4, 4.0f32);

    // The value of largest magnitude, the first of equals; the weights x² and the products x²·x.
    let (mut max, mut amax) = ([zero; G], [zero; G]);
    let (mut w, mut wx) = ([[zero; G]; 16], [[zero; G]; 16]);
    for ((wi, wxi), xi) in w.iter_mut().zip(&mut wx).zip(&xt) {
        for g in 0..G {
            let ax = xi[g].abs();
            let larger = ax.gt(amax[g]);
            amax[g] = amax[g].replaced_where(larger, ax);
            max[g] = max[g].replaced_where(larger, xi[g]);
            wi[g] = xi[g] * xi[g];
            wxi[g] = wi[g] * xi[g];
        }
    }
    let mut tiny = [zero.eq(zero); G];
    let mut iscale = [zero; G];
    for g in 0..G {
        tiny[g] = amax[g].lt(lanes.splat(1e-15));
        iscale[g] = lanes.splat(-nmax_f) / max[g];
    }

    let mut q = [[zero; G]; 16];
    let (mut sumlx, mut suml2) = ([zero; G], [zero; G]);
    for ((qi, (wi, wxi)), xi) in q.iter_mut().zip(w.iter().zip(&wx)).zip(&xt) {
        for g in 0..G {
            qi[g] = (iscale[g] * xi[g]).nearest_int_clamped(-nmax, nmax - 1);
            sumlx[g] = sumlx[g] + wxi[g] * qi[g];
            suml2[g] = suml2[g] + wi[g] * qi[g] * qi[g];
        }
    }
    for sweep in 1..=5 {
        count_sweep(sweep);
        let mut changed = [zero.lt(zero); G];
        for i in 0..16 {
            for g in 0..G {
                let (wi, wxi, qi) = (w[i][g], wx[i][g], q[i][g]);
                let slx = sumlx[g] - wxi * qi;
                let sl2 = suml2[g] - wi * qi * qi;
                let new_q = (xt[i][g] * sl2 / slx).nearest_int_clamped(-nmax, nmax - 1);
                let new_slx = slx + wxi * new_q;
                let new_sl2 = sl2 + wi * new_q * new_q;
                let better = slx.gt(zero)
                    & !new_q.eq(qi)
                    & new_sl2.gt(zero)
                    & (new_slx * new_slx * suml2[g]).gt(sumlx[g] * sumlx[g] * new_sl2);
                q[i][g] = qi.replaced_where(better, new_q);
                sumlx[g] = sumlx[g].replaced_where(better, new_slx);
                suml2[g] = suml2[g].replaced_where(better, new_sl2);
                changed[g] = changed[g] | better;
            }
        }
        if !(0..G).any(|g| (changed[g] & !tiny[g]).any()) {
            break;
        }
    }

    // A group below 1e-15 returns 0 with all-zero quants (`tiny` marks it).
    let mut fits = Fits::default();
    let mut levels: Levels = [[0.0; 32]; 16];
    for g in 0..G {
        let u = L::LANES * g..L::LANES * (g + 1);
        // `suml2 > 0 ? sumlx / suml2 : 0`
        let scale = (sumlx[g] / suml2[g]).zero_where(!suml2[g].gt(zero));
        scale.zero_where(tiny[g]).store(&mut fits.scale[u.clone()]);
        tiny[g].store(&mut fits.zero[u.clone()]);
        for (li, qi) in levels.iter_mut().zip(&q) {
            qi[g].store(&mut li[u.clone()]);
        }
    }
    (fits, levels)
}
