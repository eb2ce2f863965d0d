//! ggml's `Q8_0`: per 32 values an f16 scale `d = max|x| / 127` and `round(x / d)` as i8 (rounded
//! half away from zero; all zeros when the block is zero), as `quantize_row_q8_0_ref` writes it.
//!
//! A block's values are loaded once into vectors (`crate::simd`): the largest magnitude is a
//! vector maximum, the quants a product, a rounding and a narrowing per vector, every lane the
//! reference's one operation. The scale stays scalar, as in the reference. A block holding a NaN or
//! an infinity, or values so small that `1 / d` overflows, takes the scalar path, which says what
//! such a block gives.

use crate::block_type::BlockType;
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;
#[cfg(target_arch = "aarch64")]
use crate::simd::Neon;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::simd::{Lanes, Mask, Vector};
use half::f16;

/// Values per block.
pub const QK8_0: usize = BlockType::Q8_0.elements();
/// Bytes of one block: f16 `d`, then 32 int8 quants.
pub const BLOCK_BYTES: usize = BlockType::Q8_0.bytes();

/// Appends `values` (whole blocks) encoded as `Q8_0` to `out`, with this CPU's vectors where it
/// has them; the bytes are [`quantize_row_reference`]'s.
pub fn quantize_row(values: &[f32], out: &mut Vec<u8>) {
    assert_eq!(values.len() % QK8_0, 0, "Q8_0 rows hold whole blocks of {QK8_0} values");
    let start = out.len();
    out.resize(start + values.len() / QK8_0 * BLOCK_BYTES, 0);
    let blocks = &mut out[start..];
    #[cfg(target_arch = "x86_64")]
    if let Some(lanes) = Avx2::detect() {
        // SAFETY: the token proves AVX2.
        unsafe { quantize_blocks_avx2(lanes, values, blocks) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(lanes) = Neon::detect() {
        // SAFETY: the token proves NEON.
        unsafe { quantize_blocks_neon(lanes, values, blocks) };
        return;
    }
    for (x, o) in values.chunks_exact(QK8_0).zip(blocks.chunks_exact_mut(BLOCK_BYTES)) {
        quantize_block(x, o);
    }
}

/// [`quantize_row`] one block at a time, scalar: the reference the vector path is held to.
pub fn quantize_row_reference(values: &[f32], out: &mut Vec<u8>) {
    assert_eq!(values.len() % QK8_0, 0, "Q8_0 rows hold whole blocks of {QK8_0} values");
    let start = out.len();
    out.resize(start + values.len() / QK8_0 * BLOCK_BYTES, 0);
    for (x, o) in values.chunks_exact(QK8_0).zip(out[start..].chunks_exact_mut(BLOCK_BYTES)) {
        quantize_block(x, o);
    }
}

/// One block, scalar.
fn quantize_block(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    let (d, inverse) = scale(amax);
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (q, &v) in out[2..BLOCK_BYTES].iter_mut().zip(x) {
        *q = (v * inverse).round() as i8 as u8;
    }
}

/// The scale `d` of a block whose largest magnitude is `amax`, and the multiplier of its quants.
#[inline(always)]
fn scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d == 0.0 { 0.0 } else { 1.0 / d })
}

/// [`quantize_blocks`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_blocks_avx2(lanes: Avx2, values: &[f32], out: &mut [u8]) {
    quantize_blocks(lanes, values, out);
}

/// [`quantize_blocks`] compiled for NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
fn quantize_blocks_neon(lanes: Neon, values: &[f32], out: &mut [u8]) {
    quantize_blocks(lanes, values, out);
}

/// Every block of `values` into `out` (room for exactly those blocks).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
fn quantize_blocks<L: Lanes>(lanes: L, values: &[f32], out: &mut [u8]) {
    let n = QK8_0 / L::LANES;
    let zero = lanes.splat(0.0);
    let inf = lanes.splat(f32::INFINITY);
    for (x, o) in values.chunks_exact(QK8_0).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let mut v = [zero; QK8_0 / 4];
        let (mut amax, mut finite) = (zero, zero.eq(zero));
        for (i, vi) in v[..n].iter_mut().enumerate() {
            *vi = lanes.load(&x[i * L::LANES..]);
            let a = vi.abs();
            amax = amax.max_num(a);
            finite = finite & a.lt(inf);
        }
        let (d, inverse) = scale(amax.max_lane_num());
        // An infinite multiplier (a block of tiny values) makes NaN and infinite products, which
        // the scalar conversion to i8 saturates and the vector one does not.
        if !finite.all() || !inverse.is_finite() {
            quantize_block(x, o);
            continue;
        }
        o[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        let inverse = lanes.splat(inverse);
        for (i, vi) in v[..n].iter().enumerate() {
            (*vi * inverse).round_half_away().store_i8(&mut o[2 + i * L::LANES..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn check(values: &[f32], what: &str) {
        let (mut want, mut got) = (vec![7u8], vec![7u8]);
        quantize_row_reference(values, &mut want);
        quantize_row(values, &mut got);
        assert_eq!(got, want, "{what}");
    }

    #[test]
    fn vectors_give_the_reference_bytes() {
        let mut rng = SplitMix64(0x0808);
        let random: Vec<f32> = (0..64 * QK8_0).map(|_| rng.gaussian() as f32).collect();
        check(&random, "gaussian");
        // Quants exactly halfway between two integers, both signs: 127 · k / 254 for a block whose
        // largest magnitude is 254 (d = 2).
        let ties: Vec<f32> = (0..QK8_0).map(|i| if i == 0 { 254.0 } else { (i as f32 - 16.0) + 0.5 }).collect();
        check(&ties, "ties");
        let negative_ties: Vec<f32> = ties.iter().map(|v| -v).collect();
        check(&negative_ties, "negative ties");
        check(&[0.0; 2 * QK8_0], "zeros");
        check(&[-0.0; QK8_0], "negative zeros");
        let mut odd = random[..4 * QK8_0].to_vec();
        odd[3] = f32::NAN;
        odd[QK8_0 + 5] = f32::INFINITY;
        odd[2 * QK8_0 + 7] = f32::NEG_INFINITY;
        odd[3 * QK8_0 + 1] = f32::MIN_POSITIVE / 8.0;
        check(&odd, "non-finite and subnormal values");
        let mut tiny = [1e-40f32; QK8_0];
        tiny[4] = 0.0;
        tiny[5] = -3e-41;
        check(&tiny, "tiny values");
        for bits in [0x3f00_0000u32, 0x3eff_ffff, 0x4b00_0001, 0x7f7f_ffff, 0x0000_0001] {
            let mut block: Vec<f32> = (0..QK8_0).map(|i| i as f32 * 0.37 - 5.0).collect();
            block[9] = f32::from_bits(bits);
            block[10] = -f32::from_bits(bits);
            check(&block, &format!("{bits:#x}"));
        }
        // Every rounding of x·(1/d) near a tie, from random scales.
        for _ in 0..2000 {
            let amax = (rng.next_u64() % 1000 + 1) as f32 / 7.0;
            let block: Vec<f32> = (0..QK8_0)
                .map(|i| if i == 0 { amax } else { amax * ((rng.next_u64() % 255) as f32 - 127.0) / 254.0 })
                .collect();
            check(&block, "near ties");
        }
    }
}
