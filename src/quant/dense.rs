//! Dense values: f32 rounded once to bf16 or f16 (round to nearest, ties to even) or kept f32, and
//! such bytes widened back to f32 (F64 rounded to the nearest f32: every value this tool computes
//! with is an f32).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use safetensors::Dtype;

/// Appends `values` encoded as `dtype` (BF16, F16 or F32), little-endian, to `out`.
pub fn encode(values: &[f32], dtype: Dtype, out: &mut Vec<u8>) {
    match dtype {
        Dtype::BF16 => {
            // Convert a chunk into a u16 array (a vectorised loop), then append its bytes.
            let mut halves = [0u16; 256];
            out.reserve(2 * values.len());
            for chunk in values.chunks(halves.len()) {
                for (h, &v) in halves.iter_mut().zip(chunk) {
                    *h = bf16_bits(v).to_le();
                }
                out.extend_from_slice(as_bytes(&halves[..chunk.len()]));
            }
        }
        Dtype::F16 => {
            let start = out.len();
            out.resize(start + 2 * values.len(), 0);
            let mut halves = vec![f16::ZERO; values.len()];
            halves.convert_from_f32_slice(values);
            for (dst, h) in out[start..].chunks_exact_mut(2).zip(&halves) {
                dst.copy_from_slice(&h.to_le_bytes());
            }
        }
        Dtype::F32 => out.extend(values.iter().flat_map(|v| v.to_le_bytes())),
        other => panic!("dense encoding to {other:?} is not defined"),
    }
}

/// Appends little-endian `bytes` of `dtype` widened to f32 (exact), the inverse of [`encode`]; F64
/// rounded to the nearest f32 (beyond f32's range: an infinity, which the finite check after the
/// output's rounding refuses, naming the tensor); `false` (nothing appended) when `dtype` is not
/// BF16, F16, F32 or F64.
pub fn decode(bytes: &[u8], dtype: Dtype, out: &mut Vec<f32>) -> bool {
    match dtype {
        #[allow(clippy::cast_possible_truncation)] // rounding to nearest is the point
        Dtype::F64 => out.extend(bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap()) as f32)),
        Dtype::F32 => out.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()))),
        Dtype::F16 => out.extend(bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())),
        Dtype::BF16 => out.extend(bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        _ => return false,
    }
    true
}

/// The first element of encoded `bytes` of `dtype` (a float type; `None` for any other) that is an
/// infinity or a NaN: a value the dtype cannot hold (or a non-finite input) would make a model that
/// loads and computes garbage.
pub fn first_non_finite(bytes: &[u8], dtype: Dtype) -> Option<usize> {
    let half = |mask: u16| bytes.chunks_exact(2).position(|b| u16::from_le_bytes([b[0], b[1]]) & mask == mask);
    match dtype {
        Dtype::BF16 => half(0x7F80),
        Dtype::F16 => half(0x7C00),
        Dtype::F32 => bytes.chunks_exact(4).position(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()),
        Dtype::F64 => {
            bytes.chunks_exact(8).position(|b| !f64::from_le_bytes(b.try_into().expect("8 bytes")).is_finite())
        }
        _ => None,
    }
}

/// Why `value` (before rounding) came out non-finite in `dtype`.
pub fn non_finite_reason(value: f32, dtype: Dtype) -> String {
    match dtype {
        _ if !value.is_finite() => format!("the value is {value}"),
        Dtype::F16 => format!("{value} does not fit float16 (at most 65504); --format bf16 keeps the f32 range"),
        other => format!("{value} does not fit {other:?}"),
    }
}

/// The smallest normal magnitude of float `dtype` (BF16, F16, F32), below which it keeps fewer
/// significant bits than its own precision.
pub fn smallest_normal(dtype: Dtype) -> Option<f32> {
    match dtype {
        Dtype::F16 => Some(f16::MIN_POSITIVE.to_f32()),
        Dtype::BF16 | Dtype::F32 => Some(f32::MIN_POSITIVE),
        _ => None,
    }
}

/// The largest magnitude of `values` when they are not all zero but all below `dtype`'s normal
/// range: held in `dtype`, every one of them keeps fewer bits than the format promises, or none.
pub fn below_normal_range(values: &[f32], dtype: Dtype) -> Option<f32> {
    let normal = smallest_normal(dtype)?;
    let largest = values.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    (largest > 0.0 && largest < normal).then_some(largest)
}

/// The bytes of a u16 slice in memory order.
fn as_bytes(v: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and every byte pattern is a valid u8; the view covers exactly
    // the slice's memory and borrows it.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), 2 * v.len()) }
}

/// f32 → bf16 with round to nearest, ties to even, as integer arithmetic the compiler vectorises
/// (the same result as `half::bf16::from_f32`, NaN kept quiet).
#[inline]
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16; // wraps only for NaN, discarded below
    let quiet_nan = (b >> 16) | 0x40;
    // A select, not a branch, so the loop vectorises.
    (if b & 0x7FFF_FFFF > 0x7F80_0000 { quiet_nan } else { rounded }) as u16
}

/// `x` rounded to odd in f32: truncated toward zero, with the last bit set when that dropped
/// anything. For a 16-bit float (at most 11 significant bits, 24 ≥ 11 + 2), rounding the result to
/// nearest is rounding `x` itself to nearest: no double rounding.
pub fn round_to_odd(x: f64) -> f32 {
    let nearest = x as f32;
    if f64::from(nearest) == x || !nearest.is_finite() {
        return nearest;
    }
    // Toward zero: one step back when rounding to nearest went away from zero.
    let mut bits = nearest.to_bits();
    if f64::from(nearest).abs() > x.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_all_below_the_normal_range_are_found_and_zeros_are_not() {
        assert_eq!(below_normal_range(&[0.0, 1e-5, -3e-5, 1e-7], Dtype::F16), Some(3e-5));
        assert_eq!(below_normal_range(&[0.0, 1e-5, -3e-5, 0.5], Dtype::F16), None);
        assert_eq!(below_normal_range(&[1e-5, -3e-5], Dtype::BF16), None);
        assert_eq!(below_normal_range(&[1e-39, 0.0], Dtype::BF16), Some(1e-39));
        assert_eq!(below_normal_range(&[0.0, 0.0], Dtype::F16), None);
        assert_eq!(below_normal_range(&[1e-7], Dtype::I8), None);
    }

    #[test]
    fn bf16_bits_agree_with_half_everywhere_that_matters() {
        // Every exponent with mantissas at, around and between the rounding boundaries, plus
        // infinities and NaN.
        let mut checked = 0;
        for hi in 0..=u16::MAX as u32 {
            for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000] {
                let x = f32::from_bits(hi << 16 | lo);
                let want = bf16::from_f32(x);
                let got = bf16_bits(x);
                if x.is_nan() {
                    assert!(bf16::from_bits(got).is_nan());
                } else {
                    assert_eq!(got, want.to_bits(), "{x:e}");
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 65536 * 8);
    }

    #[test]
    fn f64_is_read_as_the_nearest_f32() {
        let values = [1.5f64, -0.1, 1.0 + f64::EPSILON, 1e300, f64::from(f32::MAX)];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = Vec::new();
        assert!(decode(&bytes, Dtype::F64, &mut out));
        assert_eq!(out, [1.5, -0.1f32, 1.0, f32::INFINITY, f32::MAX]);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values; ties go to the even mantissa (1.0).
        let mut out = Vec::new();
        encode(&[1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0], Dtype::BF16, &mut out);
        let got: Vec<f32> = out.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
        assert_eq!(got, [1.0, 1.0 + 4.0 / 256.0]);
    }

    #[test]
    fn rounding_to_odd_then_to_f16_is_one_rounding() {
        // −0.8477 (f16) × 1.015265 (f32): rounded to nearest f32 first, the product lands on an
        // f16 tie and a second rounding to nearest goes the wrong way.
        let x = f64::from(f16::from_bits(0xBAC8).to_f32()) * f64::from(1.015_265_f32);
        assert_eq!(f16::from_f32(x as f32).to_bits(), 0xBAE2, "the double rounding this avoids");
        assert_eq!(f16::from_f32(round_to_odd(x)).to_bits(), 0xBAE3);
        assert_eq!(round_to_odd(0.5), 0.5);
        assert_eq!(round_to_odd(-1e-60).to_bits(), 0x8000_0001);
        assert_eq!(round_to_odd(1.0 + 1e-12).to_bits(), 1.0f32.to_bits() | 1);
    }
}
