//! Dense output: f32 rounded once to bf16 or f16 (round to nearest, ties to even), or kept f32.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use safetensors::Dtype;

/// Appends `values` encoded as `dtype` (BF16, F16 or F32), little-endian, to `out`.
pub fn encode(values: &[f32], dtype: Dtype, out: &mut Vec<u8>) {
    let start = out.len();
    match dtype {
        Dtype::BF16 => {
            out.resize(start + 2 * values.len(), 0);
            let mut halves = vec![bf16::ZERO; values.len()];
            halves.convert_from_f32_slice(values);
            for (dst, h) in out[start..].chunks_exact_mut(2).zip(&halves) {
                dst.copy_from_slice(&h.to_le_bytes());
            }
        }
        Dtype::F16 => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values; ties go to the even mantissa (1.0).
        let mut out = Vec::new();
        encode(&[1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0], Dtype::BF16, &mut out);
        let got: Vec<f32> = out.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
        assert_eq!(got, [1.0, 1.0 + 4.0 / 256.0]);
    }
}
