//! The legacy encoders one block at a time, scalar: ggml's `quantize_row_q{4,5}_{0,1}_ref` operation
//! for operation, including what x86-64 builds of that C do where a conversion is undefined. The
//! vector path ([`super::lanes`]) is held to these, and falls back on them for such blocks.

use super::{inverse, to_f16_bits, QK};
use crate::block_type::BlockType;

/// Writes `x` encoded as `kind` into `out` (exactly one block's bytes).
///
/// # Panics
///
/// If `kind` is not `Q4_0`, `Q4_1`, `Q5_0` or `Q5_1`.
pub(super) fn quantize_block(kind: BlockType, x: &[f32; QK], out: &mut [u8]) {
    match kind {
        BlockType::Q4_0 => out.copy_from_slice(&quantize_q4_0_block(x)),
        BlockType::Q4_1 => out.copy_from_slice(&quantize_q4_1_block(x)),
        BlockType::Q5_0 => out.copy_from_slice(&quantize_q5_0_block(x)),
        BlockType::Q5_1 => out.copy_from_slice(&quantize_q5_1_block(x)),
        other => panic!("{} is not a legacy type", other.name()),
    }
}

/// C's conversion of a float to `int8_t` or `uint8_t` as gcc compiles it for x86-64
/// (`cvttss2si`/`cvttps2dq` to a 32-bit integer, then its low byte): truncation toward zero and
/// wrap-around for values that fit an `i32`, and the "integer indefinite" `0x8000_0000` (so a
/// low byte of 0) for NaN and for values of magnitude 2³¹ or more. The C standard leaves every
/// value outside the 8-bit range undefined; Rust's `as u8` would saturate instead.
#[inline(always)]
fn c_float_to_low_byte(v: f32) -> u8 {
    let i = if v.abs() < 2147483648.0 { v as i32 } else { i32::MIN };
    i as u8
}

/// C's `(uint8_t) MIN(top, (int8_t) v)`: the comparison is signed, so a negative `int8_t` (out of
/// range input only) passes through and wraps to a large byte.
#[inline(always)]
fn c_min_int8(top: i8, v: f32) -> u8 {
    let b = c_float_to_low_byte(v) as i8;
    b.min(top) as u8
}

/// The signed value of largest magnitude, the first such one on ties (C's `amax < fabsf(v)`:
/// NaN never wins, and a block of zeros gives +0).
#[inline(always)]
fn signed_absmax(x: &[f32; QK]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// The block's minimum and maximum as C's `if (v < min) …; if (v > max) …` from ±`FLT_MAX` finds
/// them: NaN is skipped, and of +0 and −0 the first seen stays.
#[inline(always)]
fn min_max(x: &[f32; QK]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Splits 5-bit quants into `qs` (value j's low nibble in byte j's low half, value j + 16's in its
/// high half) and the 32 fifth bits (value j's at bit j), the layout `Q5_0` and `Q5_1` share.
#[inline(always)]
fn pack_five_bits(q: &[u8; QK]) -> (u32, [u8; QK / 2]) {
    let mut qh = 0u32;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        let (q0, q1) = (q[j], q[j + QK / 2]);
        qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    (qh, qs)
}

fn quantize_q4_0_block(x: &[f32; QK]) -> [u8; 18] {
    // `max / -8`; an all-zero block gives d = −0 (stored as f16 0x8000) and id = 0.
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    let mut out = [0u8; 18];
    out[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
    for j in 0..QK / 2 {
        let q0 = c_min_int8(15, x[j] * id + 8.5);
        let q1 = c_min_int8(15, x[j + QK / 2] * id + 8.5);
        // C ORs `xi1 << 4` into a uint8_t: its high bits drop, a wrapped xi0 keeps all of its.
        out[2 + j] = q0 | (q1 << 4);
    }
    out
}

fn quantize_q4_1_block(x: &[f32; QK]) -> [u8; 20] {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    let mut out = [0u8; 20];
    out[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
    out[2..4].copy_from_slice(&to_f16_bits(min).to_le_bytes());
    for j in 0..QK / 2 {
        let q0 = c_min_int8(15, (x[j] - min) * id + 0.5);
        let q1 = c_min_int8(15, (x[j + QK / 2] - min) * id + 0.5);
        out[4 + j] = q0 | (q1 << 4);
    }
    out
}

fn quantize_q5_0_block(x: &[f32; QK]) -> [u8; 22] {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    let q: [u8; QK] = std::array::from_fn(|i| c_min_int8(31, x[i] * id + 16.5));
    let (qh, qs) = pack_five_bits(&q);
    let mut out = [0u8; 22];
    out[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
    out[2..6].copy_from_slice(&qh.to_le_bytes());
    out[6..22].copy_from_slice(&qs);
    out
}

fn quantize_q5_1_block(x: &[f32; QK]) -> [u8; 24] {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    // No MIN(31, …) here in ggml, the plain `(uint8_t)` conversion: the largest argument,
    // (max − min)·id + 0.5, is 31.5 up to rounding and truncates to 31 (bits above the fifth would
    // be dropped by pack_five_bits, as C drops them).
    let q: [u8; QK] = std::array::from_fn(|i| c_float_to_low_byte((x[i] - min) * id + 0.5));
    let (qh, qs) = pack_five_bits(&q);
    let mut out = [0u8; 24];
    out[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
    out[2..4].copy_from_slice(&to_f16_bits(min).to_le_bytes());
    out[4..8].copy_from_slice(&qh.to_le_bytes());
    out[8..24].copy_from_slice(&qs);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_conversions_follow_x86() {
        assert_eq!(c_float_to_low_byte(300.7), 44);
        assert_eq!(c_float_to_low_byte(-1.5), 0xFF);
        assert_eq!(c_float_to_low_byte(f32::NAN), 0);
        assert_eq!(c_float_to_low_byte(f32::INFINITY), 0);
        assert_eq!(c_float_to_low_byte(-3e9), 0);
        assert_eq!(c_float_to_low_byte(2147483520.0), 0x80);
        assert_eq!(c_min_int8(15, -1.5), 0xFF);
        assert_eq!(c_min_int8(15, 200.0), 0xC8);
        assert_eq!(c_min_int8(15, 100.0), 15);
        // A block whose largest magnitude is a subnormal so small that 1/d overflows: every
        // product is ±inf or NaN, and every quant comes out 0 with d = f16 −0.
        let mut x = [0.0f32; QK];
        x[5] = f32::from_bits(9);
        let b = quantize_q4_0_block(&x);
        assert!(b.iter().enumerate().all(|(i, &v)| v == if i == 1 { 0x80 } else { 0 }), "{b:?}");
    }
}
