//! ggml's original ("legacy") 32-value block encodings `Q4_0`, `Q4_1`, `Q5_0` and `Q5_1`: byte for
//! byte what ggml's reference quantizers `quantize_row_q{4,5}_{0,1}_ref` (no importance matrix)
//! write, and ggml's dequantization of them. llama-quantize falls back to these for tensors whose
//! rows are not a multiple of 256 values when a K-quant is asked for.
//!
//! The `_0` types are symmetric: `x ≈ d·(q − 8)` (resp. `q − 16`), `d` the signed value of largest
//! magnitude divided by −8 (−16), so that value itself lands on q = 0. The `_1` types are affine:
//! `x ≈ d·q + m` with `m` the block minimum and `d = (max − min)/15` (`/31`).
//!
//! Bit-exactness rests on the same IEEE operations in the same order as the C code built with
//! `-ffp-contract=off` (Rust never fuses), and on C's float → 8-bit integer conversions
//! (`(int8_t)(x·id + 8.5f)` and friends), which truncate toward zero rather than round. Where the
//! converted value does not fit (this happens only for blocks whose largest magnitude or range is
//! so tiny that `1/d` overflows, for a range `max − min` that overflows, and for non-finite
//! input), C leaves the result undefined; this module reproduces what x86-64 builds of ggml
//! produce (the low byte of a 32-bit truncation, 0 for NaN and beyond ±2³¹), which other targets
//! (aarch64 saturates) do not.
//! Callers should pass finite values; `tests/it/kquants_ref.rs` checks all of this against the C
//! code itself.
//!
//! `reference` is that C one block at a time; `lanes` computes the same bytes with this CPU's
//! vectors and hands the blocks whose conversions leave the safe range back to it.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod lanes;
mod reference;
mod weighted;

use crate::block_type::BlockType;
use half::f16;

/// Values per block, for every type here.
pub const QK: usize = 32;

/// Appends `values` (a whole number of [`QK`]-value blocks) encoded as `kind` to `out`, with this
/// CPU's vectors where it has them; the bytes are [`quantize_row_reference`]'s.
///
/// # Panics
///
/// If `values` is not whole blocks, or `kind` is not `Q4_0`, `Q4_1`, `Q5_0` or `Q5_1`.
pub fn quantize_row(kind: BlockType, values: &[f32], out: &mut Vec<u8>) {
    let blocks = room_for_blocks(kind, values, out);
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if lanes::quantize_blocks(kind, values, blocks) {
        return;
    }
    quantize_blocks_reference(kind, values, blocks);
}

/// [`quantize_row`] one block at a time, scalar: the reference the vector path is held to.
///
/// # Panics
///
/// As [`quantize_row`].
pub fn quantize_row_reference(kind: BlockType, values: &[f32], out: &mut Vec<u8>) {
    let blocks = room_for_blocks(kind, values, out);
    quantize_blocks_reference(kind, values, blocks);
}

/// Appends one row, `values` (whole blocks), encoded as `kind` with the importance `weights` of its
/// columns (one per value) to `out`: ggml's `quantize_row_q{4,5}_{0,1}_impl`, scalar. The whole row
/// is needed: its mean square enters every block's weights.
///
/// # Panics
///
/// As [`quantize_row`], and if `weights` is not as long as `values`.
pub fn quantize_row_weighted(kind: BlockType, values: &[f32], weights: &[f32], out: &mut Vec<u8>) {
    assert_eq!(values.len(), weights.len(), "one weight per value");
    let blocks = room_for_blocks(kind, values, out);
    weighted::quantize_row(kind, values, weights, blocks);
}

/// Checks `kind` and `values`, and appends zeros for their blocks to `out`: those bytes.
fn room_for_blocks<'a>(kind: BlockType, values: &[f32], out: &'a mut Vec<u8>) -> &'a mut [u8] {
    assert!(
        matches!(kind, BlockType::Q4_0 | BlockType::Q4_1 | BlockType::Q5_0 | BlockType::Q5_1),
        "{} is not a legacy type",
        kind.name()
    );
    assert_eq!(values.len() % QK, 0, "{} rows hold whole blocks of {QK} values", kind.name());
    let start = out.len();
    out.resize(start + values.len() / QK * kind.bytes(), 0);
    &mut out[start..]
}

fn quantize_blocks_reference(kind: BlockType, values: &[f32], out: &mut [u8]) {
    for (x, o) in values.chunks_exact(QK).zip(out.chunks_exact_mut(kind.bytes())) {
        reference::quantize_block(kind, x.try_into().unwrap(), o);
    }
}

/// Appends the values of `blocks` (whole `kind` blocks) to `out`, computed as ggml's
/// `dequantize_row_q{4,5}_{0,1}` computes them.
pub fn dequantize_row(kind: BlockType, blocks: &[u8], out: &mut Vec<f32>) {
    let size = kind.bytes();
    assert_eq!(blocks.len() % size, 0, "{} data holds whole blocks of {size} bytes", kind.name());
    out.reserve(blocks.len() / size * QK);
    for block in blocks.chunks_exact(size) {
        let d = f16_at(block, 0);
        match kind {
            BlockType::Q4_0 => {
                let qs = &block[2..18];
                out.extend(qs.iter().map(|&q| ((q & 0xF) as i32 - 8) as f32 * d));
                out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
            }
            BlockType::Q4_1 => {
                let m = f16_at(block, 2);
                let qs = &block[4..20];
                out.extend(qs.iter().map(|&q| (q & 0xF) as f32 * d + m));
                out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
            }
            BlockType::Q5_0 => {
                let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                let (lo, hi) = five_bit_quants(qh, &block[6..22]);
                out.extend(lo.iter().chain(&hi).map(|&q| (q as i32 - 16) as f32 * d));
            }
            BlockType::Q5_1 => {
                let m = f16_at(block, 2);
                let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
                let (lo, hi) = five_bit_quants(qh, &block[8..24]);
                out.extend(lo.iter().chain(&hi).map(|&q| q as f32 * d + m));
            }
            other => panic!("{} is not a legacy type", other.name()),
        }
    }
}

/// f32 → f16 bits as ggml's `GGML_FP32_TO_FP16` (the FP16 library's bit trick): round to nearest
/// even and overflow to ±inf, which `half` matches for every non-NaN value; NaN becomes the sign
/// and `0x7E00`. (Only an all-infinite `_1` block makes a NaN scale, as inf − inf.)
#[inline(always)]
fn to_f16_bits(v: f32) -> u16 {
    if v.is_nan() {
        ((v.to_bits() >> 16) & 0x8000) as u16 | 0x7E00
    } else {
        f16::from_f32(v).to_bits()
    }
}

#[inline(always)]
fn f16_at(block: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

/// C's `d ? 1.0f/d : 0.0f`: NaN counts as non-zero.
#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// The inverse of the packing of 5-bit quants (`reference::pack_five_bits`): the 5-bit quants of values 0..16 and 16..32.
#[inline(always)]
fn five_bit_quants(qh: u32, qs: &[u8]) -> ([u8; QK / 2], [u8; QK / 2]) {
    let mut lo = [0u8; QK / 2];
    let mut hi = [0u8; QK / 2];
    for j in 0..QK / 2 {
        lo[j] = (qs[j] & 0x0F) | ((((qh >> j) << 4) & 0x10) as u8);
        hi[j] = (qs[j] >> 4) | (((qh >> (j + 12)) & 0x10) as u8);
    }
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    const LEGACY: [BlockType; 4] = [BlockType::Q4_0, BlockType::Q4_1, BlockType::Q5_0, BlockType::Q5_1];

    fn encode(kind: BlockType, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        quantize_row(kind, values, &mut out);
        out
    }

    fn decode(kind: BlockType, blocks: &[u8]) -> Vec<f32> {
        let mut out = Vec::new();
        dequantize_row(kind, blocks, &mut out);
        out
    }

    fn gaussian(rng: &mut SplitMix64) -> f32 {
        rng.gaussian() as f32
    }

    #[test]
    fn rows_are_whole_blocks() {
        for kind in LEGACY {
            let bytes = encode(kind, &[0.5; 3 * QK]);
            assert_eq!(bytes.len(), 3 * kind.bytes());
            assert_eq!(decode(kind, &bytes).len(), 3 * QK);
        }
    }

    #[test]
    #[should_panic(expected = "whole blocks")]
    fn partial_blocks_are_refused() {
        encode(BlockType::Q4_0, &[1.0; QK + 1]);
    }

    #[test]
    fn zero_rows() {
        // Q4_0/Q5_0: d = +0/−8 = −0 (f16 0x8000), every quant at the middle (8 resp. 16).
        let q4_0 = encode(BlockType::Q4_0, &[0.0; QK]);
        assert_eq!(q4_0[..2], [0x00, 0x80]);
        assert!(q4_0[2..].iter().all(|&b| b == 0x88));
        let q5_0 = encode(BlockType::Q5_0, &[0.0; QK]);
        assert_eq!(q5_0[..6], [0x00, 0x80, 0xFF, 0xFF, 0xFF, 0xFF]);
        assert!(q5_0[6..].iter().all(|&b| b == 0));
        // Q4_1/Q5_1: d = 0, m = the first zero's sign, quants 0.
        for kind in [BlockType::Q4_1, BlockType::Q5_1] {
            assert!(encode(kind, &[0.0; QK]).iter().all(|&b| b == 0));
            let neg = encode(kind, &[-0.0; QK]);
            assert_eq!(neg[..4], [0, 0, 0x00, 0x80]);
            assert!(neg[4..].iter().all(|&b| b == 0));
        }
        for kind in LEGACY {
            for z in [0.0f32, -0.0] {
                assert!(decode(kind, &encode(kind, &[z; 2 * QK])).iter().all(|&v| v == 0.0));
            }
        }
    }

    #[test]
    fn extremes_land_on_the_grid_ends() {
        // Q4_0: the largest magnitude maps to q = 0 (exactly back), its negation to 16, clamped
        // to 15; Q5_0 likewise with 16 and 32 → 31.
        let mut x = [0.0f32; QK];
        x[3] = -2.0;
        x[20] = 2.0;
        let b = encode(BlockType::Q4_0, &x);
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 0.25);
        assert_eq!(b[2 + 3] & 0xF, 0);
        assert_eq!(b[2 + 4] >> 4, 15);
        let back = decode(BlockType::Q4_0, &b);
        assert_eq!((back[3], back[20]), (-2.0, 1.75));
        let back = decode(BlockType::Q5_0, &encode(BlockType::Q5_0, &x));
        assert_eq!((back[3], back[20]), (-2.0, 1.875));
        // Q4_1/Q5_1: min and max both come back exactly on a grid of exact steps.
        let mut x: [f32; QK] = std::array::from_fn(|i| i as f32 - 1.0);
        x[QK - 1] = 30.0;
        let back = decode(BlockType::Q5_1, &encode(BlockType::Q5_1, &x));
        assert_eq!(back, x);
        let back = decode(BlockType::Q4_1, &encode(BlockType::Q4_1, &x));
        assert_eq!(back[0], -1.0);
        assert!((back[QK - 1] - 30.0).abs() < 0.01, "{}", back[QK - 1]);
    }

    #[test]
    fn truncation_not_rounding() {
        // id = −1: x·id + 8.5 = 8 − k exactly for x = k + ½, and values a hair either side of the
        // tie truncate to different quants.
        let mut x = [0.0f32; QK];
        x[0] = 8.0;
        x[1] = 2.5; // −2.5 + 8.5 = 6
        x[2] = 2.5f32.next_up().next_up(); // 6 − 2⁻²¹ → 5
        x[3] = 2.5f32.next_down(); // 6 + 2⁻²², a tie in f32 that rounds to even 6 → 6
        x[4] = -0.5f32.next_down(); // 0.49999997 + 8.5 rounds up to 9 in f32 before truncating
        let b = encode(BlockType::Q4_0, &x);
        let nib = |i: usize| if i < 16 { b[2 + i] & 0xF } else { b[2 + i - 16] >> 4 };
        assert_eq!([nib(0), nib(1), nib(2), nib(3), nib(4)], [0, 6, 5, 6, 9]);
    }

    #[test]
    fn round_trip_error_is_small() {
        let mut rng = SplitMix64(0x001E_6AC7);
        let values: Vec<f32> = (0..64 * QK).map(|_| gaussian(&mut rng)).collect();
        let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
        // Relative RMS error bounds with margin over what ggml's code reaches on Gaussian data
        // (0.087, 0.080, 0.044 and 0.038 for these values).
        for (kind, bound) in LEGACY.iter().zip([0.1f32, 0.095, 0.052, 0.046]) {
            let back = decode(*kind, &encode(*kind, &values));
            assert_eq!(back.len(), values.len());
            let err =
                (values.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum::<f32>() / values.len() as f32).sqrt();
            assert!(err / rms < bound, "{}: relative RMS error {}", kind.name(), err / rms);
            // No value is off by more than one quantization step of its block.
            for (block, got) in values.chunks_exact(QK).zip(back.chunks_exact(QK)) {
                let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let step = match kind {
                    BlockType::Q4_0 => amax / 8.0,
                    BlockType::Q5_0 => amax / 16.0,
                    BlockType::Q4_1 => 2.0 * amax / 15.0,
                    BlockType::Q5_1 => 2.0 * amax / 31.0,
                    other => unreachable!("{other:?}"),
                };
                for (a, b) in block.iter().zip(got) {
                    assert!((a - b).abs() <= step * 1.01, "{}: {a} came back {b}", kind.name());
                }
            }
        }
    }

    #[test]
    fn constant_rows() {
        for c in [1.0f32, -1.0, 0.37, -1234.5, 3e-3] {
            // The _1 types store the constant as m (f16) with d = 0.
            for kind in [BlockType::Q4_1, BlockType::Q5_1] {
                for &v in &decode(kind, &encode(kind, &[c; QK])) {
                    assert_eq!(v, f16::from_f32(c).to_f32(), "{}: {c}", kind.name());
                }
            }
            // The _0 types map it to q = 0, d = −c/8 (−c/16) in f16.
            for kind in [BlockType::Q4_0, BlockType::Q5_0] {
                for &v in &decode(kind, &encode(kind, &[c; QK])) {
                    assert!((v - c).abs() <= c.abs() * 1e-3, "{}: {c} came back {v}", kind.name());
                }
            }
        }
    }
}
