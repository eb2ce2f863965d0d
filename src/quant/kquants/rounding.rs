//! How the lane-wise searches round a pass's values to quants: the choice of [`Rounding`] for a
//! pass and the rounding itself. A change to how a kernel rounds is an edit here.

use crate::simd::{Lanes, Mask, Vector};

/// How a kernel's pass rounds its values `v` to quants in `lo..=hi`; each gives the reference's
/// `nearest_int(v).clamp(lo, hi)` for a pass it is chosen for.
///
/// Round to nearest even (`vroundps`, `frintn`) equals the reference's magic-number arithmetic for
/// |v| < 2²², and the clamp below `lo` (an even integer) changes nothing unless some `v < lo − ½`,
/// the one above `hi` nothing unless some `v ≥ hi + ½`. A kernel knows the range of a pass's `v`
/// in each group from the `v` of its least and greatest element (`v` is monotonic in the element,
/// and so is every rounding), provided no element is NaN or infinite. A `v` in `[−½, 0)` rounds to
/// −0 where the reference's integer is +0 (unless a clamp at 0 applies); no sum or product of the
/// searches can tell the two apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rounding {
    /// The reference's bit arithmetic, for any `v`: NaN, infinities and huge values included.
    Exact,
    /// Round to nearest even, then the clamps that some element needs: below `lo`, above `hi`.
    Round { lo: bool, hi: bool },
}

impl Rounding {
    /// Index into `PASSES`: `Exact`, then `Round` without clamps, `lo`, `hi`, both.
    #[cfg(test)]
    fn index(self) -> usize {
        match self {
            Rounding::Exact => 0,
            Rounding::Round { lo, hi } => 1 + usize::from(lo) + 2 * usize::from(hi),
        }
    }
}

/// How many passes each [`Rounding`] ran, `Q4_K`/`Q5_K`, `Q6_K`, then `Q2_K`: the tests check
/// that their rows reach every one.
#[cfg(test)]
pub(super) static PASSES: [[std::sync::atomic::AtomicUsize; 5]; 3] =
    [const { [const { std::sync::atomic::AtomicUsize::new(0) }; 5] }; 3];

#[cfg(test)]
pub(super) fn count(search: usize, r: Rounding) {
    PASSES[search][r.index()].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The cheapest [`Rounding`] for a pass whose values lie, lane by lane, between `a` and `b` (the
/// values of the group's least and greatest element), into quants `lo..=hi`. Lanes in `skip`
/// (whose results the search drops) do not count; `finite` says the groups hold no NaN or
/// infinity, without which no bound holds.
#[inline(always)]
pub(super) fn rounding<L: Lanes, const G: usize>(
    lanes: L,
    finite: bool,
    a: &[L::F32; G],
    b: &[L::F32; G],
    skip: &[<L::F32 as Vector>::Mask; G],
    lo: f32,
    hi: f32,
) -> Rounding {
    if !finite {
        return Rounding::Exact;
    }
    let limit = lanes.splat(4_194_304.0);
    let (below, above) = (lanes.splat(lo - 0.5), lanes.splat(hi + 0.5));
    let (mut wild, mut need_lo, mut need_hi) = (false, false, false);
    for g in 0..G {
        // Ordered compares: a NaN bound is out of range, which makes its lane wild whatever the
        // least and greatest of it come out as.
        let in_range = a[g].abs_lt(limit) & b[g].abs_lt(limit);
        let (least, most) = (a[g].min_num(b[g]), a[g].max_num(b[g]));
        let counted = !skip[g];
        wild |= (!in_range & counted).any();
        need_lo |= (least.lt(below) & counted).any();
        need_hi |= (most.ge(above) & counted).any();
    }
    if wild {
        Rounding::Exact
    } else {
        Rounding::Round { lo: need_lo, hi: need_hi }
    }
}

/// The quants `lo..=hi` of a pass, as integers for the exact rounding and as vectors for the
/// clamps of the fast one.
#[derive(Clone, Copy)]
pub(super) struct QuantRange<V> {
    lo: i32,
    hi: i32,
    lo_v: V,
    hi_v: V,
}

impl<V: Vector> QuantRange<V> {
    #[inline(always)]
    pub(super) fn new<L: Lanes<F32 = V>>(lanes: L, lo: i32, hi: i32) -> Self {
        QuantRange { lo, hi, lo_v: lanes.splat(lo as f32), hi_v: lanes.splat(hi as f32) }
    }
}

/// `nearest_int(v).clamp(lo, hi) as f32` lane by lane, for a pass whose [`Rounding`] is `Exact`
/// when `EXACT`, else `Round { lo: LO, hi: HI }`: the bit arithmetic, or nearest-even with only the
/// clamps that can bite.
#[inline(always)]
pub(super) fn quant<V: Vector, const EXACT: bool, const LO: bool, const HI: bool>(v: V, range: QuantRange<V>) -> V {
    if EXACT {
        return v.nearest_int_clamped(range.lo, range.hi);
    }
    let mut q = v.round_ties_even();
    if LO {
        q = q.max_num(range.lo_v);
    }
    if HI {
        q = q.min_num(range.hi_v);
    }
    q
}
