//! Both IQ4 encoders over [`Lanes`], compiled for each CPU by one `#[target_feature]` entry
//! ([`quantize_blocks_avx2`], [`quantize_blocks_neon`]).
//!
//! The scale search of a group of 32 is sequential within the group but independent between
//! groups, so 8 groups run side by side, one per f32 lane (one vector on AVX2, two on NEON): an
//! `IQ4_XS` super-block, or 8 `IQ4_NL` blocks. The groups' values are transposed so that vector
//! `i` holds element `i` of each group; every lane then does the reference's sequence for its
//! group: each trial multiplier's sums front to back, products and sums as separate operations
//! (no fused multiply-add), IEEE division, the reference's comparisons as ordered compares feeding
//! selects. A group below the 1e-15 threshold is searched anyway and its scale dropped.
//!
//! The nearest level of `x` is found by comparing `x` with the 15 midpoints between consecutive
//! levels ([`MIDPOINTS`]): the level below the first midpoint above `x`, the top level when none is
//! (or `x` is NaN). That is the reference's `x − below < above − x` for every f32 (near a midpoint
//! both differences are exact; the tests check it over all 2³² of them). The compares are
//! halved by taking the levels in pairs ([`Pairs`]): 7 compares with the midpoints between pairs
//! count the pair, a table lookup gives the midpoint inside it, one compare more picks the level.
//! The re-quantization against the stored scales takes 8 consecutive values of one group per
//! vector (no transposing); the per-block scales between are the reference's own code.

use super::{nl_header, write_nl_block, write_xs_block, xs_header, GRID, GROUP, GROUPS, SUPER, TRIES};
use crate::block_type::BlockType;
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;
#[cfg(target_arch = "aarch64")]
use crate::simd::Neon;
use crate::simd::{Lanes, Vector, Words};

/// The midpoints between consecutive levels of [`GRID`] (exact in f32): `x` is nearest level `i`
/// when `MIDPOINTS[i − 1] ≤ x < MIDPOINTS[i]`.
pub(super) const MIDPOINTS: [f32; 15] =
    [-115.5, -93.5, -74.0, -57.0, -42.0, -28.5, -16.0, -4.5, 7.0, 19.0, 31.5, 45.5, 61.0, 79.0, 101.0];

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

/// The nearest-level choice in two steps: the odd midpoints (1, 3, …, 13) split the line into 8
/// pairs of levels, `2n` and `2n + 1`; the pair's even midpoint `2n` splits the pair.
#[derive(Clone, Copy)]
struct Pairs<V> {
    /// `MIDPOINTS[2i + 1]` in every lane.
    odd: [V; 7],
    /// Per pair `n`: its midpoint `MIDPOINTS[2n]`, its lower and its upper level.
    midpoint: [f32; 8],
    lower: [f32; 8],
    upper: [f32; 8],
}

impl<V: Vector> Pairs<V> {
    #[inline(always)]
    fn new<L: Lanes<F32 = V>>(lanes: L) -> Self {
        Pairs {
            odd: std::array::from_fn(|i| lanes.splat(MIDPOINTS[2 * i + 1])),
            midpoint: std::array::from_fn(|n| MIDPOINTS[2 * n]),
            lower: std::array::from_fn(|n| GRID[2 * n] as f32),
            upper: std::array::from_fn(|n| GRID[2 * n + 1] as f32),
        }
    }

    /// Lane by lane, the pair `n` of `x` (7 less the odd midpoints above `x`: a NaN, above none,
    /// is in the top pair), and whether `x` is below the pair's midpoint (the lower level).
    #[inline(always)]
    fn pair<L: Lanes<F32 = V>>(&self, lanes: L, x: V) -> (L::U32, V::Mask) {
        let mut n = lanes.splat_u32(7);
        for &m in &self.odd {
            n = n + lanes.mask_words(x.lt(m));
        }
        (n, x.lt(lanes.lookup8(&self.midpoint, n)))
    }

    /// Lane by lane, the level nearest `x`, as the reference's `best_index` picks it.
    #[inline(always)]
    fn level<L: Lanes<F32 = V>>(&self, lanes: L, x: V) -> V {
        let (n, lower) = self.pair(lanes, x);
        lanes.lookup8(&self.upper, n).replaced_where(lower, lanes.lookup8(&self.lower, n))
    }

    /// Lane by lane, the index of that level: `2n + 1`, less one for the lower level.
    #[inline(always)]
    fn index<L: Lanes<F32 = V>>(&self, lanes: L, x: V) -> L::U32 {
        let (n, lower) = self.pair(lanes, x);
        n + n + lanes.splat_u32(1) + lanes.mask_words(lower)
    }
}

/// Encodes `values` (whole blocks of `kind`) into `out`, exactly one block's bytes per block.
#[inline(always)]
fn quantize_blocks<L: Lanes>(lanes: L, kind: BlockType, values: &[f32], out: &mut [u8]) {
    let (n, size) = (kind.elements(), kind.bytes());
    assert_eq!(values.len() % n, 0, "whole blocks");
    assert_eq!(values.len() / n * size, out.len(), "room for exactly the blocks");
    let pairs = Pairs::new(lanes);
    let mut scales = [0.0f32; GROUPS];
    let mut l = [0u8; SUPER];
    match kind {
        BlockType::IQ4_XS => {
            for (x, o) in values.chunks_exact(SUPER).zip(out.chunks_exact_mut(size)) {
                group_scales(lanes, &pairs, x, &mut scales);
                let header = xs_header(&scales);
                for ((group, li), &idl) in x.chunks_exact(GROUP).zip(l.chunks_exact_mut(GROUP)).zip(&header.inverse) {
                    nearest_indexes(lanes, &pairs, group, idl, li);
                }
                write_xs_block(&header, &l, o);
            }
        }
        BlockType::IQ4_NL => {
            // Eight blocks at a time; the last few padded with zeros, their scales unused.
            let mut padded = [0.0f32; SUPER];
            for (x, o) in values.chunks(SUPER).zip(out.chunks_mut(GROUPS * size)) {
                let x = if x.len() == SUPER {
                    x
                } else {
                    padded[..x.len()].copy_from_slice(x);
                    padded[x.len()..].fill(0.0);
                    &padded
                };
                group_scales(lanes, &pairs, x, &mut scales);
                for ((group, o), &scale) in x.chunks_exact(GROUP).zip(o.chunks_exact_mut(size)).zip(&scales) {
                    let (d, id) = nl_header(scale);
                    let li: &mut [u8; GROUP] = (&mut l[..GROUP]).try_into().unwrap();
                    nearest_indexes(lanes, &pairs, group, id, li);
                    write_nl_block(d, li, o);
                }
            }
        }
        other => unreachable!("{} is not an IQ4 type", other.name()),
    }
}

/// The index of the level nearest `id·v` for each value `v` of `x` (a group of 32), into `l`.
#[inline(always)]
fn nearest_indexes<L: Lanes>(lanes: L, pairs: &Pairs<L::F32>, x: &[f32], id: f32, l: &mut [u8]) {
    let id = lanes.splat(id);
    for (x, l) in x.chunks_exact(L::LANES).zip(l.chunks_exact_mut(L::LANES)) {
        pairs.index(lanes, id * lanes.load(x)).to_f32().store_u8(l);
    }
}

/// The scale search of the reference's `group_scale` for the 8 groups of 32 in `x`, into `scales`
/// (0 for a group below the threshold, where the reference has none).
#[inline(always)]
fn group_scales<L: Lanes>(lanes: L, pairs: &Pairs<L::F32>, x: &[f32], scales: &mut [f32; GROUPS]) {
    if L::LANES == 8 {
        search::<L, 1>(lanes, pairs, x, scales);
    } else {
        search::<L, 2>(lanes, pairs, x, scales);
    }
}

/// [`group_scales`] over `G` vectors of groups (`G·LANES` = 8). Each line is the reference's,
/// lane-wise.
#[allow(clippy::needless_range_loop)] // `g` indexes several arrays of vectors at once
#[inline(always)]
fn search<L: Lanes, const G: usize>(lanes: L, pairs: &Pairs<L::F32>, x: &[f32], scales: &mut [f32; GROUPS]) {
    assert_eq!(G * L::LANES, GROUPS);
    assert_eq!(x.len(), SUPER);
    let zero = lanes.splat(0.0);

    // Lane j of xt[i][g] is element i of group LANES·g + j.
    let mut xt = [[zero; G]; GROUP];
    let mut columns = [zero; 8];
    for g in 0..G {
        for c in 0..GROUP / L::LANES {
            lanes.load_columns(&x[L::LANES * (g * GROUP + c)..], GROUP, &mut columns);
            for (r, &v) in columns[..L::LANES].iter().enumerate() {
                xt[L::LANES * c + r][g] = v;
            }
        }
    }

    // The weights x², and the value of largest magnitude (the first of equals).
    let (mut w, mut max, mut amax) = ([[zero; G]; GROUP], [zero; G], [zero; G]);
    for (wi, xi) in w.iter_mut().zip(&xt) {
        for g in 0..G {
            wi[g] = xi[g] * xi[g];
            let ax = xi[g].abs();
            let larger = ax.gt(amax[g]);
            amax[g] = amax[g].replaced_where(larger, ax);
            max[g] = max[g].replaced_where(larger, xi[g]);
        }
    }

    // Each multiplier's sums over the values in order, then the reference's choice among them.
    let grid0 = GRID[0] as f32;
    let (mut d, mut best) = ([zero; G], [zero; G]);
    for t in 0..2 + 2 * TRIES {
        let mut id = [zero; G];
        for g in 0..G {
            id[g] = if t == 0 {
                lanes.splat(1.0) / (-max[g] / lanes.splat(grid0))
            } else {
                lanes.splat((t - 1 - TRIES + GRID[0] as i32) as f32) / max[g]
            };
        }
        let (mut sumqx, mut sumq2) = ([zero; G], [zero; G]);
        for (xi, wi) in xt.iter().zip(&w) {
            for g in 0..G {
                let q = pairs.level(lanes, id[g] * xi[g]);
                let wq = wi[g] * q;
                sumqx[g] = sumqx[g] + wq * xi[g];
                sumq2[g] = sumq2[g] + wq * q;
            }
        }
        for g in 0..G {
            let positive = sumq2[g].gt(zero);
            let this = sumqx[g] / sumq2[g];
            if t == 0 {
                d[g] = this.zero_where(!positive);
                best[g] = d[g] * sumqx[g];
            } else {
                let better = positive & (sumqx[g] * sumqx[g]).gt(best[g] * sumq2[g]);
                d[g] = d[g].replaced_where(better, this);
                best[g] = best[g].replaced_where(better, this * sumqx[g]);
            }
        }
    }

    for g in 0..G {
        let tiny = amax[g].lt(lanes.splat(1e-15));
        d[g].zero_where(tiny).store(&mut scales[L::LANES * g..]);
    }
}
