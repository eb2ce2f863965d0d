//! ggml's K-quant super-block encodings `Q2_K`, `Q3_K`, `Q4_K`, `Q5_K` and `Q6_K`: byte for byte
//! what ggml's reference quantizers (`quantize_row_q{2,3,4,5,6}_K_ref`, no importance matrix,
//! asserts off as in a release build) write, and ggml's dequantization of them.
//!
//! Bit-exactness rests on doing the same IEEE operations in the same order as the C code built
//! with `-ffp-contract=off`: every product and sum below is a separate, un-fused operation (Rust
//! never contracts), sums run front to back, integers become floats exactly where C converts them,
//! and rounding to the nearest integer uses ggml's magic-number trick rather than `f32::round`.
//! `tests/it/kquants_ref.rs` checks all of this against the C code itself.
//!
//! `reference.rs` is the scalar reference of `Q4_K`, `Q5_K` and `Q6_K`, `low.rs` that of `Q2_K` and
//! `Q3_K`. [`quantize_row`] runs the fastest [`Kernel`] this CPU has (AVX2 on `x86_64`, NEON on
//! aarch64, chosen once per process), each bit-identical to the reference for every input: a
//! kernel runs the reference's scale searches for the groups of a block side by side, one group
//! per vector lane (the 8 groups of 32 of `Q4_K` and `Q5_K`, the 16 groups of 16 of `Q2_K`,
//! `Q3_K` and `Q6_K`), every lane doing the reference's operations in the reference's order
//! (`search.rs`, written once over `crate::simd`'s lanes, rounding as `rounding.rs` chooses); the
//! few scalar steps per block (the super-scales, the 4-, 6- and 8-bit group scales, the quants
//! against the stored scales) are the reference's own code (`finish.rs`).

use crate::block_type::BlockType;
pub use crate::cpu::Kernel;
use half::f16;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod finish;
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod kernel_tests;
mod low;
mod reference;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod rounding;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod search;
mod weighted;

pub(crate) use weighted::{fit_affine_weighted, make_qx_quants_weighted};

use low::{dequantize_q2_k_block, dequantize_q3_k_block, quantize_q2_k_block, quantize_q3_k_block};
use reference::{quantize_q4_k_block, quantize_q5_k_block, quantize_q6_k_block};
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
use rounding::PASSES;

/// Values per super-block, for every K-quant type.
pub const QK_K: usize = BlockType::Q4_K.elements();
/// The K-quants whose scale searches the vector kernels run (all of them); any other would be
/// encoded by the scalar reference whatever the kernel.
pub const SEARCHED: [BlockType; 5] =
    [BlockType::Q2_K, BlockType::Q3_K, BlockType::Q4_K, BlockType::Q5_K, BlockType::Q6_K];

/// Bytes of one `Q4_K` super-block: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins, 128
/// bytes of 4-bit quants.
pub const Q4_K_BLOCK_BYTES: usize = BlockType::Q4_K.bytes();
/// Bytes of one `Q5_K` super-block: as `Q4_K` plus 32 bytes holding each quant's fifth bit.
pub const Q5_K_BLOCK_BYTES: usize = BlockType::Q5_K.bytes();
/// Bytes of one `Q6_K` super-block: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8
/// scales, f16 `d`.
pub const Q6_K_BLOCK_BYTES: usize = BlockType::Q6_K.bytes();

/// Appends `values` (a whole number of [`QK_K`]-value super-blocks) encoded as `kind` to `out`.
/// Runs [`Kernel::best`].
pub fn quantize_row(kind: BlockType, values: &[f32], out: &mut Vec<u8>) {
    quantize_row_with(Kernel::best(), kind, values, out);
}

/// [`quantize_row`] on a given kernel; every kernel appends the same bytes.
///
/// # Panics
///
/// If `kind` is not a K-quant or `values` is not whole blocks.
pub fn quantize_row_with(kernel: Kernel, kind: BlockType, values: &[f32], out: &mut Vec<u8>) {
    assert!(kind.is_k_quant(), "{} is not a K-quant", kind.name());
    assert_eq!(values.len() % QK_K, 0, "{} rows hold whole blocks of {QK_K} values", kind.name());
    let len = values.len() / QK_K * kind.bytes();
    if kernel == Kernel::Reference || !SEARCHED.contains(&kind) {
        out.reserve(len);
        for block in values.chunks_exact(QK_K) {
            let x: &[f32; QK_K] = block.try_into().unwrap();
            match kind {
                BlockType::Q2_K => out.extend_from_slice(&quantize_q2_k_block(x)),
                BlockType::Q3_K => out.extend_from_slice(&quantize_q3_k_block(x)),
                BlockType::Q4_K => out.extend_from_slice(&quantize_q4_k_block(x)),
                BlockType::Q5_K => out.extend_from_slice(&quantize_q5_k_block(x)),
                BlockType::Q6_K => out.extend_from_slice(&quantize_q6_k_block(x)),
                _ => unreachable!("a K-quant, asserted above"),
            }
        }
        return;
    }
    let start = out.len();
    out.resize(start + len, 0);
    let blocks = &mut out[start..];
    match kernel {
        Kernel::Reference => unreachable!("handled above"),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the token proves AVX2.
        Kernel::Avx2(lanes) => unsafe { search::quantize_blocks_avx2(lanes, kind, values, blocks) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the token proves NEON.
        Kernel::Neon(lanes) => unsafe { search::quantize_blocks_neon(lanes, kind, values, blocks) },
    }
}

/// Appends one row, `values` (a whole number of [`QK_K`]-value super-blocks), encoded as `kind`
/// with the importance `weights` of its columns (one per value) to `out`: ggml's
/// `quantize_row_q{2,3,4,5,6}_K_impl`, scalar.
///
/// # Panics
///
/// If `kind` is not a K-quant, `values` is not whole blocks, or `weights` is not as long.
pub fn quantize_row_weighted(kind: BlockType, values: &[f32], weights: &[f32], out: &mut Vec<u8>) {
    assert!(kind.is_k_quant(), "{} is not a K-quant", kind.name());
    assert_eq!(values.len() % QK_K, 0, "{} rows hold whole blocks of {QK_K} values", kind.name());
    assert_eq!(values.len(), weights.len(), "one weight per value");
    let start = out.len();
    out.resize(start + values.len() / QK_K * kind.bytes(), 0);
    let blocks = out[start..].chunks_exact_mut(kind.bytes());
    for ((x, w), o) in values.chunks_exact(QK_K).zip(weights.chunks_exact(QK_K)).zip(blocks) {
        weighted::quantize_block(kind, x.try_into().unwrap(), w.try_into().unwrap(), o);
    }
}

/// Appends the values of `blocks` (whole `kind` super-blocks) to `out`, computed as ggml's
/// `dequantize_row_q{2,3,4,5,6}_K` computes them.
pub fn dequantize_row(kind: BlockType, blocks: &[u8], out: &mut Vec<f32>) {
    let size = kind.bytes();
    assert_eq!(blocks.len() % size, 0, "{} data holds whole blocks of {size} bytes", kind.name());
    out.reserve(blocks.len() / size * QK_K);
    for block in blocks.chunks_exact(size) {
        match kind {
            BlockType::Q2_K => dequantize_q2_k_block(block, out),
            BlockType::Q3_K => dequantize_q3_k_block(block, out),
            BlockType::Q4_K => dequantize_q4_k_block(block, out),
            BlockType::Q5_K => dequantize_q5_k_block(block, out),
            BlockType::Q6_K => dequantize_q6_k_block(block, out),
            other => panic!("{} is not a K-quant", other.name()),
        }
    }
}

/// Rounds to the nearest integer, ties to even, as ggml does: adding 1.5·2²³ leaves the integer in
/// the low mantissa bits. Exact for |v| < 2²²; beyond that (ggml asserts against it in debug
/// builds only) the same bit pattern arithmetic is reproduced, NaN giving 0 and ±inf −2²².
#[inline(always)]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12582912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// f32 → f16 bits, round to nearest even, overflow to ±inf: what ggml's bit-trick conversion gives
/// for every input (a NaN, which only the IQ4 scale searches can reach, becomes ggml's quiet NaN
/// with its sign).
#[inline(always)]
pub(crate) fn to_f16_bits(v: f32) -> u16 {
    if v.is_nan() {
        return ((v.to_bits() >> 16) as u16 & 0x8000) | 0x7E00;
    }
    f16::from_f32(v).to_bits()
}

#[inline(always)]
fn f16_at(block: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

/// The `j`-th (0..8) 6-bit scale and min of a `Q4_K`/`Q5_K` scales field: 0..4 sit in the low six
/// bits of bytes 0..4 and 4..8; 4..8 have their low nibbles in bytes 8..12 and their top two bits in
/// the spare top bits of bytes 0..8.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn dequantize_q4_k_block(block: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(block, 0);
    let min = f16_at(block, 2);
    let scales = &block[4..16];
    for (p, qs) in block[16..144].chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * p, scales);
        let (sc2, m2) = scale_min_k4(2 * p + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        out.extend(qs.iter().map(|&q| d1 * (q & 0xF) as f32 - m1));
        out.extend(qs.iter().map(|&q| d2 * (q >> 4) as f32 - m2));
    }
}

fn dequantize_q5_k_block(block: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(block, 0);
    let min = f16_at(block, 2);
    let scales = &block[4..16];
    let qh = &block[16..48];
    for (p, qs) in block[48..176].chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * p, scales);
        let (sc2, m2) = scale_min_k4(2 * p + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * p), 2u8 << (2 * p));
        out.extend(qs.iter().zip(qh).map(|(&q, &h)| d1 * ((q & 0xF) + if h & u1 != 0 { 16 } else { 0 }) as f32 - m1));
        out.extend(qs.iter().zip(qh).map(|(&q, &h)| d2 * ((q >> 4) + if h & u2 != 0 { 16 } else { 0 }) as f32 - m2));
    }
}

fn dequantize_q6_k_block(block: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(block, 208);
    let sc = &block[192..208];
    let mut y = [0.0f32; QK_K];
    for h in 0..2 {
        let ql = &block[64 * h..64 * h + 64];
        let qh = &block[128 + 32 * h..128 + 32 * h + 32];
        let sc = &sc[8 * h..8 * h + 8];
        let y = &mut y[128 * h..128 * h + 128];
        for k in 0..32 {
            let is = k / 16;
            let q1 = ((ql[k] & 0xF) | ((qh[k] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[k + 32] & 0xF) | (((qh[k] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[k] >> 4) | (((qh[k] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[k + 32] >> 4) | (((qh[k] >> 6) & 3) << 4)) as i32 - 32;
            y[k] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[k + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[k + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[k + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
    out.extend_from_slice(&y);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn encode(kind: BlockType, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        quantize_row(kind, values, &mut out);
        out
    }

    fn gaussian(rng: &mut SplitMix64) -> f32 {
        rng.gaussian() as f32
    }

    #[test]
    fn block_sizes() {
        let sizes: Vec<usize> = BlockType::K_QUANTS.iter().map(|k| k.bytes()).collect();
        assert_eq!(sizes, [84, 110, 144, 176, 210]);
        // ggml's bits per weight: 2.625, 3.4375, 4.5, 5.5, 6.5625.
        for (kind, bpw) in BlockType::K_QUANTS.iter().zip([2.625, 3.4375, 4.5, 5.5, 6.5625]) {
            assert_eq!(kind.bytes() as f64 * 8.0 / QK_K as f64, bpw);
            assert_eq!(encode(*kind, &[0.5; 3 * QK_K]).len(), 3 * kind.bytes());
        }
    }

    #[test]
    fn zero_rows_encode_to_zero_bytes() {
        // ggml: a zero group fits with scale 0 and min −0, which round to 0 and f16 +0; Q6_K zeroes
        // the block outright. −0.0 inputs give the same bytes.
        for kind in BlockType::K_QUANTS {
            for z in [0.0f32, -0.0] {
                let bytes = encode(kind, &[z; 2 * QK_K]);
                assert!(bytes.iter().all(|&b| b == 0), "{}: {z:?} row gave {bytes:?}", kind.name());
                let mut back = Vec::new();
                dequantize_row(kind, &bytes, &mut back);
                assert!(back.iter().all(|&v| v == 0.0));
            }
        }
    }

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        let cases =
            [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (0.49999997, 0), (-3.7, -4), (4194303.0, 4194303)];
        for (v, want) in cases {
            assert_eq!(nearest_int(v), want, "{v}");
        }
        // Outside the exact range the bit arithmetic goes on: NaN → 0, ±inf → −2²².
        assert_eq!(nearest_int(f32::NAN), 0);
        assert_eq!(nearest_int(f32::INFINITY), -0x40_0000);
    }

    /// ggml's own f32 → f16 conversion (the FP16 library's bit trick), as a check on `half`.
    fn ggml_fp32_to_fp16(f: f32) -> u16 {
        let scale_to_inf = f32::from_bits(0x7780_0000);
        let scale_to_zero = f32::from_bits(0x0880_0000);
        let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
        let w = f.to_bits();
        let shl1_w = w.wrapping_add(w);
        let sign = w & 0x8000_0000;
        let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
        base += f32::from_bits((bias >> 1) + 0x0780_0000);
        let bits = base.to_bits();
        let nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
        ((sign >> 16) | if shl1_w > 0xFF00_0000 { 0x7E00 } else { nonsign }) as u16
    }

    #[test]
    fn f16_rounding_matches_ggml() {
        // Every f32 exponent with a spread of mantissas, including the halfway points, both signs.
        let mut rng = SplitMix64(7);
        for exp in 0u32..255 {
            for m in [0u32, 1, 0xFFF, 0x1000, 0x1FFF, 0x2000, 0x3FFF, 0x7F_E000, 0x7F_FFFF, 0x40_1000, 0x40_0FFF] {
                for extra in [m, (rng.next_u64() as u32) & 0x7F_FFFF] {
                    for sign in [0, 0x8000_0000] {
                        let v = f32::from_bits(sign | (exp << 23) | extra);
                        assert_eq!(to_f16_bits(v), ggml_fp32_to_fp16(v), "{v:e} ({:#010x})", v.to_bits());
                    }
                }
            }
        }
        for v in [65504.0f32, 65519.996, 65520.0, f32::INFINITY, f32::NEG_INFINITY, 6.1e-5, 5.96e-8, 2.98e-8] {
            assert_eq!(to_f16_bits(v), ggml_fp32_to_fp16(v), "{v:e}");
        }
    }

    #[test]
    fn round_trip_error_is_small() {
        let mut rng = SplitMix64(0x5EED);
        let values: Vec<f32> = (0..16 * QK_K).map(|_| gaussian(&mut rng)).collect();
        let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
        // Relative RMS and worst error bounds with margin over what ggml's own code reaches on
        // Gaussian data (RMS about 0.29, 0.15, 0.071, 0.036 and 0.018).
        let bounds = [(0.33f32, 1.2f32), (0.18, 0.6), (0.085, 0.3), (0.045, 0.3), (0.023, 0.3)];
        for (kind, (bound, worst_bound)) in BlockType::K_QUANTS.iter().zip(bounds) {
            let bytes = encode(*kind, &values);
            let mut back = Vec::new();
            dequantize_row(*kind, &bytes, &mut back);
            assert_eq!(back.len(), values.len());
            let err =
                (values.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum::<f32>() / values.len() as f32).sqrt();
            let worst = values.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(err / rms < bound, "{}: relative RMS error {}", kind.name(), err / rms);
            assert!(worst < worst_bound, "{}: worst error {worst}", kind.name());
        }
    }

    #[test]
    fn constant_rows_decode_close() {
        for kind in BlockType::K_QUANTS {
            for c in [1.0f32, -1.0, 0.37, -1234.5] {
                let bytes = encode(kind, &[c; QK_K]);
                let mut back = Vec::new();
                dequantize_row(kind, &bytes, &mut back);
                for &v in &back {
                    assert!((v - c).abs() <= c.abs() * 2e-3, "{}: {c} came back {v}", kind.name());
                }
            }
        }
    }
}
