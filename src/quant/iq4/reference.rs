//! The scalar reference of both IQ4 encoders: ggml's `quantize_row_iq4_nl_impl` without an
//! importance matrix, one group of 32 at a time, with the C code's operations in its order.

use super::{nl_header, write_nl_block, write_xs_block, xs_header, GRID, GROUP, GROUPS, MULTIPLIERS, SUPER, TRIES};
use crate::block_type::BlockType;

/// Encodes `values` (whole blocks of `kind`) into `out`, exactly one block's bytes per block.
pub(super) fn quantize_blocks(kind: BlockType, values: &[f32], out: &mut [u8]) {
    let (n, size) = (kind.elements(), kind.bytes());
    assert_eq!(values.len() / n * size, out.len(), "room for exactly the blocks");
    for (x, o) in values.chunks_exact(n).zip(out.chunks_exact_mut(size)) {
        match kind {
            BlockType::IQ4_NL => quantize_nl_block(x.try_into().unwrap(), o),
            BlockType::IQ4_XS => quantize_xs_block(x.try_into().unwrap(), o),
            other => unreachable!("{} is not an IQ4 type", other.name()),
        }
    }
}

/// ggml's `best_index_int8` over [`GRID`]: the nearest level's index (the upper one when `x` is
/// exactly halfway); a NaN gives the top index. ggml bisects; the level below `x` is found here by
/// counting the levels at or below it instead (the grid is increasing, so it is the same level),
/// which has no branch to mispredict.
#[inline(always)]
pub(super) fn best_index(x: f32) -> u8 {
    let level = |i: usize| GRID[i] as f32;
    if x <= level(0) {
        return 0;
    }
    if x >= level(15) || x.is_nan() {
        return 15;
    }
    // level(below) ≤ x < level(below + 1).
    let below = (1..15).map(|i| usize::from(x >= level(i))).sum::<usize>();
    let above = below + 1;
    if x - level(below) < level(above) - x {
        below as u8
    } else {
        above as u8
    }
}

/// The scale search of `quantize_row_iq4_nl_impl` for one group of 32 (weights x², no importance
/// matrix): `None` for a group below ggml's 1e-15 threshold, else the least-squares scale of the
/// best of the first guess (the largest magnitude at +127, the grid's reach mirrored) and 15 trial
/// scales around −127.
pub(super) fn group_scale(x: &[f32; GROUP]) -> Option<f32> {
    let mut weight = [0.0f32; GROUP];
    for (w, &v) in weight.iter_mut().zip(x) {
        *w = v * v;
    }
    weighted_group_scale(x, &weight)
}

/// [`group_scale`] with the values' weights given: with an importance matrix, ggml weighs value
/// `j` by `qw[j]·√(σ² + x[j]²)`.
pub(super) fn weighted_group_scale(x: &[f32; GROUP], weight: &[f32; GROUP]) -> Option<f32> {
    let (max, amax) = crate::quant::largest_magnitude(x);
    if amax < 1e-15 {
        return None;
    }
    // The first guess puts the largest magnitude at 127/max·max = +127 (level 113); the trials put
    // it at −127 + (−7..=7). Each multiplier's sums run over the values in order, as ggml's do; computing
    // all 16 in one pass over the values only interleaves independent sums.
    let mut ids = [0.0f32; MULTIPLIERS];
    ids[0] = 1.0 / (-max / GRID[0] as f32);
    for (id, itry) in ids[1..].iter_mut().zip(-TRIES..=TRIES) {
        *id = (itry + GRID[0] as i32) as f32 / max;
    }
    let mut sumqx = [0.0f32; MULTIPLIERS];
    let mut sumq2 = [0.0f32; MULTIPLIERS];
    for (&v, &w) in x.iter().zip(weight) {
        for t in 0..ids.len() {
            let q = GRID[best_index(ids[t] * v) as usize] as f32;
            sumqx[t] += w * q * v;
            sumq2[t] += w * q * q;
        }
    }
    let mut d = if sumq2[0] > 0.0 { sumqx[0] / sumq2[0] } else { 0.0 };
    let mut best = d * sumqx[0];
    for t in 1..ids.len() {
        if sumq2[t] > 0.0 && sumqx[t] * sumqx[t] > best * sumq2[t] {
            d = sumqx[t] / sumq2[t];
            best = d * sumqx[t];
        }
    }
    Some(d)
}

/// Encodes one row, `values` (whole blocks of `kind`), with the importance `qw` of its columns (one
/// per value) into `out`, exactly one block's bytes per block: `quantize_row_iq4_nl_impl` with
/// `quant_weights`, σ² twice the block's (`IQ4_NL`) or super-block's (`IQ4_XS`) mean square.
pub(super) fn quantize_blocks_weighted(kind: BlockType, values: &[f32], qw: &[f32], out: &mut [u8]) {
    let (n, size) = (kind.elements(), kind.bytes());
    assert_eq!(values.len() / n * size, out.len(), "room for exactly the blocks");
    for ((x, qw), o) in values.chunks_exact(n).zip(qw.chunks_exact(n)).zip(out.chunks_exact_mut(size)) {
        let sigma2 = x.iter().fold(0.0f32, |s, &v| s + v * v) * (2.0 / n as f32);
        let mut scales = [0.0f32; GROUPS];
        for ((s, group), qw) in scales.iter_mut().zip(x.chunks_exact(GROUP)).zip(qw.chunks_exact(GROUP)) {
            let weight: [f32; GROUP] = std::array::from_fn(|j| qw[j] * (sigma2 + group[j] * group[j]).sqrt());
            *s = weighted_group_scale(group.try_into().unwrap(), &weight).unwrap_or(0.0);
        }
        match kind {
            BlockType::IQ4_NL => nl_block(x.try_into().unwrap(), scales[0], o),
            BlockType::IQ4_XS => xs_block(x.try_into().unwrap(), &scales, o),
            other => unreachable!("{} is not an IQ4 type", other.name()),
        }
    }
}

/// One `IQ4_NL` block: `d` the group's scale in f16, the indexes against the unrounded scale.
fn quantize_nl_block(x: &[f32; GROUP], out: &mut [u8]) {
    nl_block(x, group_scale(x).unwrap_or(0.0), out);
}

/// An `IQ4_NL` block of `x` at its group's `scale`.
fn nl_block(x: &[f32; GROUP], scale: f32, out: &mut [u8]) {
    let (d, id) = nl_header(scale);
    let mut l = [0u8; GROUP];
    for (q, &v) in l.iter_mut().zip(x) {
        *q = best_index(id * v);
    }
    write_nl_block(d, &l, out);
}

/// One `IQ4_XS` super-block: each group's scale as a 6-bit multiple of `d = −max_scale/32` (the
/// group scale of largest magnitude), the indexes against the unrounded `d` times it.
fn quantize_xs_block(x: &[f32; SUPER], out: &mut [u8]) {
    let mut scales = [0.0f32; GROUPS];
    for (s, group) in scales.iter_mut().zip(x.chunks_exact(GROUP)) {
        // A skipped group's scale stays 0, which never becomes the largest.
        *s = group_scale(group.try_into().unwrap()).unwrap_or(0.0);
    }
    xs_block(x, &scales, out);
}

/// An `IQ4_XS` super-block of `x` at its groups' `scales`.
fn xs_block(x: &[f32; SUPER], scales: &[f32; GROUPS], out: &mut [u8]) {
    let header = xs_header(scales);
    let mut l = [0u8; SUPER];
    for ((li, &v), &idl) in l.iter_mut().zip(x).zip(header.inverse.iter().flat_map(|i| [i; GROUP])) {
        *li = best_index(idl * v);
    }
    write_xs_block(&header, &l, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// ggml's bisection, as written in C.
    fn bisect(x: f32) -> u8 {
        let level = |i: usize| GRID[i] as f32;
        if x <= level(0) {
            return 0;
        }
        if x >= level(15) {
            return 15;
        }
        let (mut lo, mut hi) = (0usize, 15usize);
        while hi - lo > 1 {
            let mid = usize::midpoint(lo, hi);
            if x < level(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        if x - level(hi - 1) < level(hi) - x {
            (hi - 1) as u8
        } else {
            hi as u8
        }
    }

    #[test]
    fn best_index_is_ggml_bisection() {
        let mut rng = SplitMix64(0xB15);
        let mut xs: Vec<f32> = (0..100_000).map(|_| (rng.uniform() as f32 - 0.5) * 300.0).collect();
        for (i, &v) in GRID.iter().enumerate() {
            let v = v as f32;
            xs.extend([v, v.next_up(), v.next_down()]);
            if i < 15 {
                let mid = f32::midpoint(v, GRID[i + 1] as f32);
                xs.extend([mid, mid.next_up(), mid.next_down()]);
            }
        }
        xs.extend([f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-45]);
        for x in xs {
            assert_eq!(best_index(x), bisect(x), "{x:e}");
        }
    }

    #[test]
    fn best_index_takes_the_nearest_level() {
        assert_eq!(best_index(-1000.0), 0);
        assert_eq!(best_index(1000.0), 15);
        assert_eq!(best_index(0.0), 8);
        assert_eq!(best_index(-4.5), 8); // halfway between −10 and 1: the upper
        assert_eq!(best_index(-4.6), 7);
        assert_eq!(best_index(-4.4), 8);
        assert_eq!(best_index(f32::NAN), 15);
        for (i, &v) in GRID.iter().enumerate() {
            assert_eq!(best_index(v as f32) as usize, i);
        }
    }
}
