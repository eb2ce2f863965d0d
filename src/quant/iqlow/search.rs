//! The scale search all five encoders share: a group's values folded to magnitudes, trial scales
//! around a first guess, each value rounded to a level and each cell of 8 (IQ2) or 4 (IQ3) values
//! moved to the nearest grid point when its levels are not one; the trial whose least-squares
//! scale explains most of the weighted energy wins, and the cells off the grid are placed again at
//! that scale. The C code's operations in its order (`quantize_row_iq2_xxs_impl` and its siblings,
//! `iq2_find_best_neighbour`, `make_qp_quants`), so the chosen bytes are ggml's. The search is
//! one body compiled twice: with the scalar scan of the neighbours (the reference) and, in one
//! `#[target_feature]` entry per CPU, with `lanes.rs`'s scan of eight at a time inlined.

use super::tables::{Lookup, Table};
use crate::cpu::Kernel;
use crate::quant::kquants::nearest_int;
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;
#[cfg(target_arch = "aarch64")]
use crate::simd::Neon;

/// ggml's `GROUP_MAX_EPS`: below it a group's largest magnitude counts as zero.
pub(super) const EPS: f32 = 1e-15;
/// ggml's `GROUP_MAX_EPS_IQ3_XXS` and `GROUP_MAX_EPS_IQ2_S`.
pub(super) const EPS_COARSE: f32 = 1e-8;

/// C's `MAX(a, b)`: `a > b ? a : b`.
#[inline(always)]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// The largest of `x` as ggml's scans take it.
pub(super) fn max_of(x: &[f32]) -> f32 {
    x[1..].iter().fold(x[0], |m, &v| c_max(m, v))
}

/// Folds each 8 values of `x` to magnitudes in `xval`, returning each 8's sign bits (bit `i` set
/// where value `i` was negated). With `even`, an odd count of negations is made even by leaving
/// the value of least `weight·x²` negative and its bit flipped, as the types whose 8th sign bit is
/// implied by parity need.
pub(super) fn fold_signs(x: &[f32], weight: &[f32], even: bool, xval: &mut [f32], signs: &mut [u8]) {
    for (k, s) in signs.iter_mut().enumerate() {
        let (xb, w, v) = (&x[8 * k..8 * k + 8], &weight[8 * k..8 * k + 8], &mut xval[8 * k..8 * k + 8]);
        let mut bits = 0u8;
        let mut flips = 0;
        for i in 0..8 {
            if xb[i] >= 0.0 {
                v[i] = xb[i];
            } else {
                v[i] = -xb[i];
                flips += 1;
                bits |= 1 << i;
            }
        }
        if even && flips % 2 == 1 {
            let (mut imin, mut min) = (0, w[0] * xb[0] * xb[0]);
            for i in 1..8 {
                let a = w[i] * xb[i] * xb[i];
                if a < min {
                    min = a;
                    imin = i;
                }
            }
            v[imin] = -v[imin];
            bits ^= 1 << imin;
        }
        *s = bits;
    }
}

/// ggml's `make_qp_quants` for non-negative levels up to `nmax`: the scale only (the levels it
/// leaves behind are never used by the caller). ggml stores the levels as bytes, so a negative
/// one (from the one value folding may leave negative) is read back as 256 + l: reproduced.
pub(super) fn make_qp_scale(nmax: i32, x: &[f32], w: &[f32]) -> f32 {
    let max = x.iter().fold(0.0f32, |m, &v| c_max(m, v));
    if max < EPS {
        return 0.0;
    }
    let mut levels = [0u8; 32];
    let levels = &mut levels[..x.len()];
    let mut iscale = nmax as f32 / max;
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = nearest_int(iscale * v) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..x.len() {
        let diff = x[i] - scale * f32::from(levels[i]);
        best_mse += w[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..x.len() {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            mse += w[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..x.len() {
        let l = nearest_int(iscale * x[i]).min(nmax);
        levels[i] = l as u8;
        sumlx += w[i] * x[i] * l as f32;
        suml2 += w[i] * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for i in 0..x.len() {
            let (wi, li) = (w[i], f32::from(levels[i]));
            let mut slx = sumlx - wi * x[i] * li;
            let mut sl2 = suml2 - wi * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != i32::from(levels[i]) {
                    slx += wi * x[i] * new_l as f32;
                    sl2 += wi * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        levels[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `iq2_find_best_neighbour` / `iq3_find_best_neighbour`, the reference for `lanes.rs`: the
/// grid point of `list` nearest to `xval` at `scale` under `weight` (the first of equals). `None`
/// where no distance is below `f32::MAX` (ggml aborts there).
pub(super) fn nearest_reference(
    table: &Table,
    list: &[u16],
    xval: &[f32],
    weight: &[f32],
    scale: f32,
) -> Option<usize> {
    let mut best_d2 = f32::MAX;
    let mut best = None;
    for &j in list {
        let mut d2 = 0.0f32;
        for (i, &p) in table.point(usize::from(j)).iter().enumerate() {
            let diff = scale * f32::from(p) - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            best = Some(usize::from(j));
        }
    }
    best
}

/// Rounds the cell `xval` at the inverse scale `id` to levels in `l`; if those are not a grid
/// point, moves them to the nearest listed one at `scale` (with `LANES`, found by `lanes.rs`, which
/// chooses the same). Returns whether they were on the grid, or `None` where no neighbour could be
/// chosen.
#[inline(always)]
fn place<const LANES: bool>(
    table: &Table,
    xval: &[f32],
    waux: &[f32],
    id: f32,
    scale: f32,
    l: &mut [i8],
) -> Option<bool> {
    for (v, &x) in l.iter_mut().zip(xval) {
        *v = nearest_int(0.5 * (id * x - 1.0)).clamp(0, table.levels - 1) as i8;
    }
    let n = match table.lookup(l) {
        Lookup::On(_) => return Some(true),
        Lookup::Off(n) => n,
    };
    let j = if LANES {
        super::lanes::nearest(n, xval, waux, scale)
    } else {
        nearest_reference(table, n.list, xval, waux, scale)
    }?;
    for (v, &p) in l.iter_mut().zip(table.point(j)) {
        *v = (p - 1) / 2;
    }
    Some(false)
}

/// How a type places the cells again once the trials have chosen a scale.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Replace {
    /// Every cell, whenever the scale is positive (`IQ2_XXS`).
    All,
    /// The cells the winning trial had to move, if any (`IQ2_XS`, `IQ2_S`, `IQ3_XXS`).
    Moved,
    /// Every cell, if the winning trial moved any or no trial won (`IQ3_S`).
    AllIfMoved,
}

/// One type's search parameters.
pub(super) struct Search {
    /// Which implementation finds the nearest listed points.
    pub kernel: Kernel,
    pub table: &'static Table,
    /// Trials `−tries..=tries`, at `(2·kmax − 1 + is·step) / max`.
    pub tries: i32,
    pub step: f32,
    pub replace: Replace,
}

/// The search of one group: `xval` its folded values, `weight` and `waux` (the square roots) its
/// weights, `max` the largest value the trials divide by, `scale` the first guess. Writes the
/// levels to `l`; returns the scale, negative where the signs must be flipped, NaN where ggml
/// would abort (`scale >= 0` fails, or no neighbour was found). Runs `s.kernel`: every kernel
/// gives the same levels and scale.
pub(super) fn search(
    s: &Search,
    xval: &[f32],
    weight: &[f32],
    waux: &[f32],
    max: f32,
    scale: f32,
    l: &mut [i8],
) -> f32 {
    match s.kernel {
        Kernel::Reference => search_with::<false>(s, xval, weight, waux, max, scale, l),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the token proves AVX2.
        Kernel::Avx2(lanes) => unsafe { search_avx2(lanes, s, xval, weight, waux, max, scale, l) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the token proves NEON.
        Kernel::Neon(lanes) => unsafe { search_neon(lanes, s, xval, weight, waux, max, scale, l) },
    }
}

/// [`search`] with the lane-wise scan, compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
fn search_avx2(
    _: Avx2,
    s: &Search,
    xval: &[f32],
    weight: &[f32],
    waux: &[f32],
    max: f32,
    scale: f32,
    l: &mut [i8],
) -> f32 {
    search_with::<true>(s, xval, weight, waux, max, scale, l)
}

/// [`search`] with the lane-wise scan, compiled for NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
fn search_neon(
    _: Neon,
    s: &Search,
    xval: &[f32],
    weight: &[f32],
    waux: &[f32],
    max: f32,
    scale: f32,
    l: &mut [i8],
) -> f32 {
    search_with::<true>(s, xval, weight, waux, max, scale, l)
}

#[inline(always)]
fn search_with<const LANES: bool>(
    s: &Search,
    xval: &[f32],
    weight: &[f32],
    waux: &[f32],
    max: f32,
    mut scale: f32,
    l: &mut [i8],
) -> f32 {
    let t = s.table;
    let (cell, n) = (t.cell, xval.len());
    let kmax = t.levels;
    let mut aux = [0i8; 32];
    let aux = &mut aux[..n];
    let mut on_grid = [s.replace != Replace::AllIfMoved; 8];
    let mut on_grid_aux = [true; 8];
    let mut best = 0.0f32;
    for is in -s.tries..=s.tries {
        let id = ((2 * kmax - 1) as f32 + is as f32 * s.step) / max;
        let this_scale = 1.0 / id;
        for (k, on) in on_grid_aux[..n / cell].iter_mut().enumerate() {
            let r = k * cell..(k + 1) * cell;
            match place::<LANES>(t, &xval[r.clone()], &waux[r.clone()], id, this_scale, &mut aux[r]) {
                Some(placed) => *on = placed,
                None => return f32::NAN,
            }
        }
        let (sumqx, sumq2) = sums(xval, weight, aux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l.copy_from_slice(aux);
            on_grid = on_grid_aux;
        }
    }
    let moved = on_grid[..n / cell].iter().any(|&on| !on);
    let again = match s.replace {
        Replace::All => scale > 0.0,
        Replace::Moved | Replace::AllIfMoved => moved && scale > 0.0,
    };
    if again {
        let id = 1.0 / scale;
        for (k, &on) in on_grid[..n / cell].iter().enumerate() {
            if s.replace == Replace::Moved && on {
                continue;
            }
            let r = k * cell..(k + 1) * cell;
            if place::<LANES>(t, &xval[r.clone()], &waux[r.clone()], id, scale, &mut l[r]).is_none() {
                return f32::NAN;
            }
        }
        let (sumqx, sumq2) = sums(xval, weight, l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    // ggml aborts where a cell is off the grid (the levels `make_qp_quants` left, when its scale is
    // NaN and no trial won).
    if l.chunks_exact(cell).any(|c| t.index_of(c).is_none()) {
        return f32::NAN;
    }
    scale
}

/// `Σ w·x·q` and `Σ w·q²` with `q = 2l + 1`, in the C code's order.
fn sums(xval: &[f32], weight: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for i in 0..xval.len() {
        let (w, q) = (weight[i], f32::from(2 * l[i] + 1));
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The 4-bit code of a group scale against the block's `1/d`: `nearest((id·s − 1)/2)` in 0..=15.
pub(super) fn scale_code(id: f32, s: f32) -> u8 {
    nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15) as u8
}
