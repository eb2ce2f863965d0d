//! The legacy encoders over this CPU's vectors (`crate::simd`), written once for every
//! architecture: a block's values are loaded once, the largest magnitude (or the minimum and the
//! maximum) is a vector reduction, and every quant is the reference's own operations lane by lane
//! (`x·id + 8.5`, `(x − min)·id + 0.5`, …), then a truncation, a clamp and a packing into nibbles and
//! fifth bits. The scales stay scalar, as in the reference.
//!
//! The reference converts each argument to an 8-bit integer the way x86-64 C does (the low byte of
//! a 32-bit truncation), which only a truncation and a clamp reproduce while the argument is above
//! −1 and small; a block with any argument outside that range (a non-finite value, a `1/d` that
//! overflows) is handed back to the reference whole.

use super::{inverse, reference, to_f16_bits, QK};
use crate::block_type::BlockType;
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;
#[cfg(target_arch = "aarch64")]
use crate::simd::Neon;
use crate::simd::{Lanes, Mask, Vector};

/// Vectors per block on the narrowest lanes (four).
const MAX_VECTORS: usize = QK / 4;

/// Writes every block of `values` encoded as `kind` into `out` (room for exactly those blocks)
/// with this CPU's vectors; false, having written nothing, where it has none.
pub(super) fn quantize_blocks(kind: BlockType, values: &[f32], out: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(lanes) = Avx2::detect() {
        // SAFETY: the token proves AVX2.
        unsafe { encode_blocks_avx2(lanes, kind, values, out) };
        return true;
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(lanes) = Neon::detect() {
        // SAFETY: the token proves NEON.
        unsafe { encode_blocks_neon(lanes, kind, values, out) };
        return true;
    }
    false
}

/// [`encode_blocks`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn encode_blocks_avx2(lanes: Avx2, kind: BlockType, values: &[f32], out: &mut [u8]) {
    encode_blocks(lanes, kind, values, out);
}

/// [`encode_blocks`] compiled for NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
fn encode_blocks_neon(lanes: Neon, kind: BlockType, values: &[f32], out: &mut [u8]) {
    encode_blocks(lanes, kind, values, out);
}

/// Every block of `values` as `kind` into `out`, block by block through the vectors, or through the
/// reference where they decline.
#[inline(always)]
fn encode_blocks<L: Lanes>(lanes: L, kind: BlockType, values: &[f32], out: &mut [u8]) {
    let n = QK / L::LANES;
    for (x, o) in values.chunks_exact(QK).zip(out.chunks_exact_mut(kind.bytes())) {
        let x: &[f32; QK] = x.try_into().unwrap();
        let mut v = [lanes.splat(0.0); MAX_VECTORS];
        for (i, vi) in v[..n].iter_mut().enumerate() {
            *vi = lanes.load(&x[i * L::LANES..]);
        }
        let v = &v[..n];
        let encoded = match kind {
            BlockType::Q4_0 => symmetric_quants(lanes, v, 8.0).map(|(d, q)| {
                o[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
                store_nibbles(lanes, &q[..n], &mut o[2..18]);
            }),
            BlockType::Q4_1 => affine_quants(lanes, x, v, 15.0, 128.0).map(|(d, min, q)| {
                o[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
                o[2..4].copy_from_slice(&to_f16_bits(min).to_le_bytes());
                store_nibbles(lanes, &q[..n], &mut o[4..20]);
            }),
            BlockType::Q5_0 => symmetric_quants(lanes, v, 16.0).map(|(d, q)| {
                o[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
                let (qh, qs) = o[2..22].split_at_mut(4);
                store_five_bits(lanes, &q[..n], qh, qs);
            }),
            // ggml converts Q5_1's quants without a clamp, keeping their low five bits: below 32
            // the clamp to 31 changes nothing, and that is where the vectors answer.
            BlockType::Q5_1 => affine_quants(lanes, x, v, 31.0, 32.0).map(|(d, min, q)| {
                o[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
                o[2..4].copy_from_slice(&to_f16_bits(min).to_le_bytes());
                let (qh, qs) = o[4..24].split_at_mut(4);
                store_five_bits(lanes, &q[..n], qh, qs);
            }),
            other => unreachable!("{} is not a legacy type", other.name()),
        };
        if encoded.is_none() {
            reference::quantize_block(kind, x, o);
        }
    }
}

/// A `_0` type's scale `d` (the signed value of largest magnitude over `−levels`) and quants
/// `min(trunc(x·id + levels + ½), 2·levels − 1)`, or None where the reference must decide.
#[inline(always)]
fn symmetric_quants<L: Lanes>(lanes: L, v: &[L::F32], levels: f32) -> Option<(f32, [L::F32; MAX_VECTORS])> {
    let amax = v.iter().fold(lanes.splat(0.0), |m, &vi| m.max_num(vi.abs())).max_lane_num();
    // The reference keeps the first value of that magnitude (and +0 for a block of zeros): the
    // sign of whichever of ±amax comes first. A NaN in the block may leave neither, or gives a NaN
    // quant argument below.
    let (plus, minus) = (lanes.splat(amax), lanes.splat(-amax));
    let (mut at_plus, mut at_minus) = (0u32, 0u32);
    for (i, &vi) in v.iter().enumerate() {
        at_plus |= vi.eq(plus).to_bits() << (i * L::LANES);
        at_minus |= vi.eq(minus).to_bits() << (i * L::LANES);
    }
    let max = if amax == 0.0 {
        0.0
    } else if at_plus | at_minus == 0 {
        return None;
    } else if at_plus.trailing_zeros() < at_minus.trailing_zeros() {
        amax
    } else {
        -amax
    };
    let d = max / -levels;
    let (id, offset) = (lanes.splat(inverse(d)), lanes.splat(levels + 0.5));
    let q = quants(lanes, v, |vi| vi * id + offset, 2.0 * levels - 1.0, 128.0)?;
    Some((d, q))
}

/// A `_1` type's scale `d = (max − min) / top`, minimum and quants
/// `min(trunc((x − min)·id + ½), top)`, or None where the reference must decide. `below` bounds the
/// arguments the vectors take (see [`quants`]).
#[inline(always)]
fn affine_quants<L: Lanes>(
    lanes: L,
    x: &[f32; QK],
    v: &[L::F32],
    top: f32,
    below: f32,
) -> Option<(f32, f32, [L::F32; MAX_VECTORS])> {
    let (mut lo, mut hi) = (v[0], v[0]);
    for &vi in &v[1..] {
        lo = lo.min_num(vi);
        hi = hi.max_num(vi);
    }
    let (min, max) = (first_equal(x, lo.min_lane_num()), first_equal(x, hi.max_lane_num()));
    let d = (max - min) / top;
    let (m, id, half) = (lanes.splat(min), lanes.splat(inverse(d)), lanes.splat(0.5));
    let q = quants(lanes, v, |vi| (vi - m) * id + half, top, below)?;
    Some((d, min, q))
}

/// `extreme` as the reference's strict comparisons keep it, which for a zero is the block's first
/// zero, of whichever sign (the reductions here keep either).
#[inline(always)]
fn first_equal(x: &[f32; QK], extreme: f32) -> f32 {
    if extreme == 0.0 {
        x.iter().copied().find(|&v| v == 0.0).unwrap_or(extreme)
    } else {
        extreme
    }
}

/// `min(trunc(t), top)` for `t = argument(x)` of each vector, where every `t` lies in
/// `−1 < t < below`; None otherwise. Within that range the truncation is C's conversion and the
/// clamp is its `MIN(top, …)` (`below` at most 128, so that no quant wraps to a negative `int8_t`).
#[inline(always)]
fn quants<L: Lanes>(
    lanes: L,
    v: &[L::F32],
    argument: impl Fn(L::F32) -> L::F32,
    top: f32,
    below: f32,
) -> Option<[L::F32; MAX_VECTORS]> {
    let (above, below, top) = (lanes.splat(-1.0), lanes.splat(below), lanes.splat(top));
    let mut q = [lanes.splat(0.0); MAX_VECTORS];
    // Comparisons with NaN are false, so a NaN argument is out of range.
    let mut in_range = above.eq(above);
    for (qi, &vi) in q.iter_mut().zip(v) {
        let t = argument(vi);
        in_range = in_range & t.gt(above) & t.lt(below);
        *qi = t.trunc().min_num(top);
    }
    in_range.all().then_some(q)
}

/// Writes 4-bit quants as ggml packs them: byte `j` holds quant `j` in its low half and quant
/// `j + 16` in its high half.
#[inline(always)]
fn store_nibbles<L: Lanes>(lanes: L, q: &[L::F32], to: &mut [u8]) {
    let sixteen = lanes.splat(16.0);
    let (low, high) = q.split_at(q.len() / 2);
    for (i, (&l, &h)) in low.iter().zip(high).enumerate() {
        (l + h * sixteen).store_u8(&mut to[i * L::LANES..]);
    }
}

/// Writes 5-bit quants as `Q5_0` and `Q5_1` pack them: their fifth bits into `qh` (quant `j`'s at
/// bit `j`, little-endian), their low four bits into `qs` as [`store_nibbles`] does.
#[inline(always)]
fn store_five_bits<L: Lanes>(lanes: L, q: &[L::F32], qh: &mut [u8], qs: &mut [u8]) {
    let sixteen = lanes.splat(16.0);
    let mut low = [sixteen; MAX_VECTORS];
    let mut fifth_bits = 0u32;
    for (i, (l, &qi)) in low.iter_mut().zip(q).enumerate() {
        let fifth = qi.ge(sixteen);
        fifth_bits |= fifth.to_bits() << (i * L::LANES);
        *l = qi.replaced_where(fifth, qi - sixteen);
    }
    qh.copy_from_slice(&fifth_bits.to_le_bytes());
    store_nibbles(lanes, &low[..q.len()], qs);
}

#[cfg(test)]
mod tests {
    use super::super::{quantize_row, quantize_row_reference};
    use super::*;
    use crate::rng::SplitMix64;

    const LEGACY: [BlockType; 4] = [BlockType::Q4_0, BlockType::Q4_1, BlockType::Q5_0, BlockType::Q5_1];

    fn check(values: &[f32], what: &str) {
        for kind in LEGACY {
            let (mut want, mut got) = (vec![7u8], vec![7u8]);
            quantize_row_reference(kind, values, &mut want);
            quantize_row(kind, values, &mut got);
            if let Some(b) = (0..want.len() / kind.bytes()).find(|&b| {
                let r = 1 + b * kind.bytes()..1 + (b + 1) * kind.bytes();
                got[r.clone()] != want[r]
            }) {
                panic!("{} {what}: block {b} differs: {:?}", kind.name(), &values[b * QK..(b + 1) * QK]);
            }
            assert_eq!(got, want, "{} {what}", kind.name());
        }
    }

    fn block(f: impl FnMut(usize) -> f32) -> Vec<f32> {
        (0..QK).map(f).collect()
    }

    #[test]
    fn this_cpu_has_vectors() {
        // Otherwise the tests below would compare the reference with itself.
        assert!(quantize_blocks(BlockType::Q4_0, &[0.0; QK], &mut [0; 18]));
    }

    /// Which of `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` hand `x` back to the reference.
    fn declined<L: Lanes>(lanes: L, x: &[f32; QK]) -> [bool; 4] {
        let mut v = [lanes.splat(0.0); MAX_VECTORS];
        for (i, vi) in v[..QK / L::LANES].iter_mut().enumerate() {
            *vi = lanes.load(&x[i * L::LANES..]);
        }
        let v = &v[..QK / L::LANES];
        [
            symmetric_quants(lanes, v, 8.0).is_none(),
            affine_quants(lanes, x, v, 15.0, 128.0).is_none(),
            symmetric_quants(lanes, v, 16.0).is_none(),
            affine_quants(lanes, x, v, 31.0, 32.0).is_none(),
        ]
    }

    #[test]
    fn vectors_answer_finite_blocks() {
        // The reference takes only blocks whose conversions leave the safe range, never ordinary
        // ones: otherwise the comparisons here would prove little.
        #[cfg(target_arch = "x86_64")]
        let lanes = Avx2::detect().expect("AVX2");
        #[cfg(target_arch = "aarch64")]
        let lanes = Neon::detect().expect("NEON");
        let mut rng = SplitMix64(0xb10c);
        for _ in 0..1000 {
            let x: [f32; QK] = std::array::from_fn(|_| rng.gaussian() as f32);
            assert_eq!(declined(lanes, &x), [false; 4], "{x:?}");
        }
        for x in [[0.0; QK], [-0.0; QK], [1.0; QK], [65504.0; QK], [1e-30; QK]] {
            assert_eq!(declined(lanes, &x), [false; 4], "{x:?}");
        }
        let mut nan = [0.5; QK];
        nan[17] = f32::NAN;
        assert_eq!(declined(lanes, &nan), [true; 4]);
    }

    #[test]
    fn zeros_and_constants() {
        check(&[0.0; 2 * QK], "zeros");
        check(&[-0.0; QK], "negative zeros");
        check(&block(|i| if i % 3 == 1 { -0.0 } else { 0.0 }), "mixed zeros");
        check(&block(|i| if i % 5 == 0 { 0.0 } else { -0.0 }), "mixed zeros, +0 first");
        for c in [1.0f32, -1.0, 0.37, -1234.5, 3e-3, 65504.0, f32::MAX, -f32::MAX] {
            check(&[c; QK], &format!("constant {c}"));
        }
        // Minimum or maximum zero, of either sign, behind or ahead of the other zero.
        check(&block(|i| [0.5, -0.0, 0.0, 2.0][i % 4]), "positive with zeros");
        check(&block(|i| [-0.5, 0.0, -0.0, -2.0][i % 4]), "negative with zeros");
    }

    #[test]
    fn non_finite_blocks() {
        let mut rng = SplitMix64(0x1e6a);
        let random: Vec<f32> = (0..8 * QK).map(|_| rng.gaussian() as f32).collect();
        for (at, bad) in [(0, f32::NAN), (7, f32::INFINITY), (31, f32::NEG_INFINITY), (16, -f32::NAN)] {
            let mut v = random.clone();
            v[QK + at] = bad;
            v[5 * QK + (at + 3) % QK] = bad;
            check(&v, &format!("{bad} at {at}"));
        }
        check(&[f32::NAN; QK], "all NaN");
        check(&[f32::INFINITY; QK], "all +inf");
        check(&block(|i| if i % 2 == 0 { f32::INFINITY } else { f32::NEG_INFINITY }), "±inf");
        check(&block(|i| if i == 9 { f32::NAN } else { 0.0 }), "NaN among zeros");
    }

    #[test]
    fn tiny_and_huge_values() {
        for bits in [1u32, 9, 0x0001_0000, 0x007f_ffff, 0x0080_0000, 0x0100_0000, 0x7f7f_ffff, 0x7f00_0000] {
            let m = f32::from_bits(bits);
            check(&block(|i| if i == 4 { m } else { 0.0 }), &format!("lone {bits:#x}"));
            check(&block(|i| m * (i as f32 - 15.5) / 16.0), &format!("ramp to {bits:#x}"));
            check(&block(|i| if i % 2 == 0 { m } else { -m }), &format!("±{bits:#x}"));
        }
        // A range max − min that overflows.
        check(&block(|i| if i < 16 { f32::MAX } else { -f32::MAX }), "range overflow");
        check(&block(|i| f32::MAX / 2.0 * ((i % 3) as f32 - 1.0)), "huge spread");
    }

    #[test]
    fn ties_and_random_blocks() {
        let mut rng = SplitMix64(0x7135);
        let random: Vec<f32> = (0..256 * QK).map(|_| rng.gaussian() as f32).collect();
        check(&random, "gaussian");
        // Values a multiple of half a step from the extremes, so that x·id + offset lands on and
        // around integers; with both signs of the extreme first.
        for levels in [8.0f32, 15.0, 16.0, 31.0] {
            for _ in 0..200 {
                let scale = (rng.next_u64() % 1000 + 1) as f32 / 64.0;
                let top = (levels * 2.0) as u64 + 1;
                let v = block(|i| match i {
                    0 => scale * levels,
                    1 => -scale * levels,
                    _ => scale * ((rng.next_u64() % top) as f32 / 2.0 - levels / 2.0),
                });
                check(&v, "half steps");
                let nudged: Vec<f32> = v.iter().map(|v| if v.to_bits() % 3 == 0 { v.next_up() } else { *v }).collect();
                check(&nudged, "nudged half steps");
            }
        }
        // Equal magnitudes of both signs: the first one sets the sign of d.
        check(
            &block(|i| {
                if i == 3 {
                    -4.0
                } else if i == 20 {
                    4.0
                } else {
                    1.0
                }
            }),
            "-amax first",
        );
        check(
            &block(|i| {
                if i == 3 {
                    4.0
                } else if i == 20 {
                    -4.0
                } else {
                    1.0
                }
            }),
            "+amax first",
        );
    }
}
