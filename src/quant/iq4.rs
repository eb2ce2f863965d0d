//! ggml's 4-bit non-linear encodings `IQ4_NL` (blocks of 32 values, one f16 scale) and `IQ4_XS`
//! (super-blocks of 256: 8 groups of 32 with 6-bit scales against an f16 super-scale): each value
//! is an index into a fixed 16-level grid, denser near zero. Byte for byte what llama-quantize
//! writes without an importance matrix (`quantize_iq4_nl` / `quantize_iq4_xs`, both through
//! `quantize_row_iq4_nl_impl` with 7 trial scales either side), and ggml's dequantization.
//!
//! Scalar, with the C code's operations in its order (see `quant::kquants` on bit-exactness);
//! `tests/it/kquants_ref.rs` checks it against ggml's C.

use super::kquants::{nearest_int, to_f16_bits};
use crate::block_type::BlockType;
use half::f16;

/// ggml's `kvalues_iq4nl`: the 16 levels an index stands for, in units of the scale.
pub const GRID: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Values of one `IQ4_NL` block, and of each group of an `IQ4_XS` super-block.
pub const GROUP: usize = 32;
/// Values of one `IQ4_XS` super-block.
pub const SUPER: usize = BlockType::IQ4_XS.elements();
/// The trial scales tried either side of the first guess.
const TRIES: i32 = 7;
/// The multipliers a group's search tries: the first guess and the `2·TRIES + 1` trials.
const MULTIPLIERS: usize = 2 + 2 * TRIES as usize;

/// Appends `values` (whole blocks of `kind`, `IQ4_NL` or `IQ4_XS`) encoded as `kind` to `out`.
///
/// # Panics
///
/// If `kind` is another type or `values` is not whole blocks.
pub fn quantize_row(kind: BlockType, values: &[f32], out: &mut Vec<u8>) {
    let n = kind.elements();
    assert_eq!(values.len() % n, 0, "{} rows hold whole blocks of {n} values", kind.name());
    out.reserve(values.len() / n * kind.bytes());
    for block in values.chunks_exact(n) {
        match kind {
            BlockType::IQ4_NL => out.extend_from_slice(&quantize_nl_block(block.try_into().unwrap())),
            BlockType::IQ4_XS => out.extend_from_slice(&quantize_xs_block(block.try_into().unwrap())),
            other => panic!("{} is not an IQ4 type", other.name()),
        }
    }
}

/// Appends the values of `blocks` (whole blocks of `kind`) to `out`, as ggml's
/// `dequantize_row_iq4_{nl,xs}` computes them.
pub fn dequantize_row(kind: BlockType, blocks: &[u8], out: &mut Vec<f32>) {
    let size = kind.bytes();
    assert_eq!(blocks.len() % size, 0, "{} data holds whole blocks of {size} bytes", kind.name());
    for block in blocks.chunks_exact(size) {
        match kind {
            BlockType::IQ4_NL => {
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                dequantize_group(d, &block[2..18], out);
            }
            BlockType::IQ4_XS => {
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                let high = u16::from_le_bytes([block[2], block[3]]);
                for (ib, qs) in block[8..].chunks_exact(16).enumerate() {
                    let dl = d * (xs_scale(ib, high, &block[4..8]) - 32) as f32;
                    dequantize_group(dl, qs, out);
                }
            }
            other => panic!("{} is not an IQ4 type", other.name()),
        }
    }
}

/// The 32 values of a group of 16 bytes of indexes at scale `d`: the low nibbles first.
fn dequantize_group(d: f32, qs: &[u8], out: &mut Vec<f32>) {
    out.extend(qs.iter().map(|&q| d * GRID[(q & 0xF) as usize] as f32));
    out.extend(qs.iter().map(|&q| d * GRID[(q >> 4) as usize] as f32));
}

/// The 6-bit scale (0..64, 32 meaning zero) of group `ib` of an `IQ4_XS` block: its low nibble in
/// byte `ib / 2` of `low` (low nibble for even groups), its top two bits at bit `2·ib` of `high`.
fn xs_scale(ib: usize, high: u16, low: &[u8]) -> i32 {
    (((low[ib / 2] >> (4 * (ib % 2))) & 0xF) as i32) | ((((high >> (2 * ib)) & 3) as i32) << 4)
}

/// ggml's `best_index_int8` over [`GRID`]: the nearest level's index (the upper one when `x` is
/// exactly halfway); a NaN gives the top index. ggml bisects; the level below `x` is found here by
/// counting the levels at or below it instead (the grid is increasing, so it is the same level),
/// which has no branch to mispredict.
#[inline(always)]
fn best_index(x: f32) -> u8 {
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
/// best of the first guess (the largest magnitude on level −127) and 15 trial scales around it.
fn group_scale(x: &[f32; GROUP]) -> Option<f32> {
    let mut weight = [0.0f32; GROUP];
    for (w, &v) in weight.iter_mut().zip(x) {
        *w = v * v;
    }
    let (max, amax) = super::largest_magnitude(x);
    if amax < 1e-15 {
        return None;
    }
    // The first guess puts the largest magnitude on level −127; the trials stretch the grid by
    // −7..=7 levels. Each multiplier's sums run over the values in order, as ggml's do; computing
    // all 16 in one pass over the values only interleaves independent sums.
    let mut ids = [0.0f32; MULTIPLIERS];
    ids[0] = 1.0 / (-max / GRID[0] as f32);
    for (id, itry) in ids[1..].iter_mut().zip(-TRIES..=TRIES) {
        *id = (itry + GRID[0] as i32) as f32 / max;
    }
    let mut sumqx = [0.0f32; MULTIPLIERS];
    let mut sumq2 = [0.0f32; MULTIPLIERS];
    for (&v, &w) in x.iter().zip(&weight) {
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

/// Packs 32 indexes into 16 bytes: index `j` in the low nibble of byte `j`, index `16 + j` in its
/// high nibble.
fn pack_group(l: &[u8; GROUP], out: &mut [u8]) {
    for j in 0..16 {
        out[j] = l[j] | (l[16 + j] << 4);
    }
}

/// One `IQ4_NL` block: `d` the group's scale in f16, the indexes against the unrounded scale.
fn quantize_nl_block(x: &[f32; GROUP]) -> [u8; 18] {
    let scale = group_scale(x).unwrap_or(0.0);
    let id = if scale == 0.0 { 0.0 } else { 1.0 / scale };
    let mut l = [0u8; GROUP];
    for (q, &v) in l.iter_mut().zip(x) {
        *q = best_index(id * v);
    }
    let mut out = [0u8; 18];
    out[..2].copy_from_slice(&to_f16_bits(scale).to_le_bytes());
    pack_group(&l, &mut out[2..]);
    out
}

/// One `IQ4_XS` super-block: each group's scale as a 6-bit multiple of `d = −max_scale/32` (the
/// group scale of largest magnitude), the indexes against the unrounded `d` times it.
fn quantize_xs_block(x: &[f32; SUPER]) -> [u8; 136] {
    let mut scales = [0.0f32; 8];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for (s, group) in scales.iter_mut().zip(x.chunks_exact(GROUP)) {
        let Some(d) = group_scale(group.try_into().unwrap()) else { continue };
        *s = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let mut out = [0u8; 136];
    let d = -max_scale / 32.0;
    out[..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut high = 0u16;
    for (ib, (group, &s)) in x.chunks_exact(GROUP).zip(&scales).enumerate() {
        let q = nearest_int(id * s).clamp(-32, 31);
        let dl = d * q as f32;
        let idl = if dl == 0.0 { 0.0 } else { 1.0 / dl };
        let mut l = [0u8; GROUP];
        for (li, &v) in l.iter_mut().zip(group) {
            *li = best_index(idl * v);
        }
        pack_group(&l, &mut out[8 + 16 * ib..8 + 16 * ib + 16]);
        let stored = (q + 32) as u8;
        out[4 + ib / 2] |= (stored & 0xF) << (4 * (ib % 2));
        high |= u16::from(stored >> 4) << (2 * ib);
    }
    out[2..4].copy_from_slice(&high.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn round_trip(kind: BlockType, values: &[f32]) -> Vec<f32> {
        let mut bytes = Vec::new();
        quantize_row(kind, values, &mut bytes);
        assert_eq!(bytes.len(), values.len() / kind.elements() * kind.bytes());
        let mut back = Vec::new();
        dequantize_row(kind, &bytes, &mut back);
        back
    }

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

    #[test]
    fn gaussian_rows_come_back_close_and_zeros_exact() {
        let mut rng = SplitMix64(0x1A4);
        let values: Vec<f32> = (0..16 * SUPER).map(|_| rng.gaussian() as f32).collect();
        let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
        for kind in [BlockType::IQ4_NL, BlockType::IQ4_XS] {
            let back = round_trip(kind, &values);
            let err =
                (values.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum::<f32>() / values.len() as f32).sqrt();
            // ggml's own encoding reaches about 0.09 on Gaussian data.
            assert!(err / rms < 0.11, "{}: relative RMS error {}", kind.name(), err / rms);
            assert!(round_trip(kind, &[0.0; 2 * SUPER]).iter().all(|&v| v == 0.0));
        }
    }
}
