//! `float8_e4m3fn` (as in Qwen's FP8 releases): 1 sign, 4 exponent (bias 7), 3 mantissa bits, no
//! infinities, 0x7F/0xFF are NaN. Decoding is exact in f32.

/// The value of an e4m3fn byte.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0xF) as i32;
    let man = (b & 7) as f32;
    if exp == 0xF && b & 7 == 7 {
        return f32::NAN;
    }
    let magnitude = if exp == 0 { man * 2f32.powi(-9) } else { (1.0 + man / 8.0) * 2f32.powi(exp - 7) };
    sign * magnitude
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert!(e4m3_to_f32(0x7F).is_nan());
    }
}
