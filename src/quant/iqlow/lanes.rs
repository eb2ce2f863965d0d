//! The nearest-neighbour scan of `search.rs` eight candidates at a time, compiled for each CPU
//! inside the search's `#[target_feature]` entries (`search_avx2`, `search_neon`).
//!
//! The scan is where the encoders spend their time: every trial scale of every group moves each
//! cell off the grid to the nearest of tens of listed points. Here lane `k` of eight f32 lanes
//! computes candidate `k`'s weighted distance exactly as the reference does, value by value in the
//! same order, each product and sum a separate operation (Rust never fuses them), so every lane is
//! bit for bit the reference's distance; the candidates' values come from the table's columns,
//! eight bytes for one value of eight points. Then the eight distances are taken in list order
//! with the reference's strict `<`, skipped whole when none is below the best so far (a branchless
//! choice of the least lane measured slower). Plain arrays the compiler puts in vectors (two
//! NEON vectors, one AVX2 one): no intrinsics, so the same operations on every CPU.

use super::tables::{Neighbours, COLUMN};

/// The listed point nearest to the cell `xval` (of 8 or 4 values) at `scale` under `weight`, the
/// first of equal distances: its grid index, or `None` where no distance is below `f32::MAX`;
/// what `search::nearest_reference` returns. Inlined into the search's `#[target_feature]` entries.
#[inline(always)]
pub(super) fn nearest(n: Neighbours, xval: &[f32], weight: &[f32], scale: f32) -> Option<usize> {
    match xval.len() {
        8 => scan::<8>(n, xval, weight, scale),
        4 => scan::<4>(n, xval, weight, scale),
        cell => unreachable!("cells of 8 or 4 values, not {cell}"),
    }
}

#[inline(always)]
fn scan<const CELL: usize>(n: Neighbours, xval: &[f32], weight: &[f32], scale: f32) -> Option<usize> {
    let (xval, weight): (&[f32; CELL], &[f32; CELL]) = (xval.try_into().ok()?, weight.try_into().ok()?);
    let mut best_d2 = f32::MAX;
    let mut best = None;
    for (run, ids) in n.columns.chunks_exact(COLUMN * CELL).zip(n.list.chunks(COLUMN)) {
        let mut d2 = [0.0f32; COLUMN];
        for i in 0..CELL {
            let p: &[i8; COLUMN] = run[COLUMN * i..COLUMN * (i + 1)].try_into().expect("a run's column");
            for k in 0..COLUMN {
                let diff = scale * f32::from(p[k]) - xval[i];
                d2[k] += weight[i] * diff * diff;
            }
        }
        // The padding lanes repeat the last point: they may open the scan, never win it. (`|`,
        // not `||`: one vector compare for the eight.)
        #[allow(clippy::needless_bitwise_bool)]
        let any_below = d2.iter().fold(false, |any, &d| any | (d < best_d2));
        if any_below {
            for (&d, &j) in d2.iter().zip(ids) {
                if d < best_d2 {
                    best_d2 = d;
                    best = Some(usize::from(j));
                }
            }
        }
    }
    best
}
