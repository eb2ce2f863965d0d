//! ggml block encodings of f32 rows, byte for byte what ggml's quantizers write (with an importance
//! matrix or without), and the lossless `Q8_0` repack of int8 rows.

use super::{iq4, iqlow, kquants, legacy, q8_0};
use crate::block_type::BlockType;
use half::f16;

/// Appends `values` (a whole number of blocks) encoded as `block` to `out`. With `importance`
/// (one value per column of a row), `values` are whole rows of that width and each is encoded as
/// ggml encodes it with those `quant_weights` (which `Q8_0` ignores); without, as ggml's reference
/// quantizers do.
pub fn quantize(block: BlockType, values: &[f32], importance: Option<&[f32]>, out: &mut Vec<u8>) {
    debug_assert_eq!(values.len() % block.elements(), 0);
    if let Some(weights) = importance.filter(|_| block != BlockType::Q8_0) {
        assert!(
            !weights.is_empty() && values.len().is_multiple_of(weights.len()),
            "whole rows of the importance's width"
        );
        for row in values.chunks_exact(weights.len()) {
            match block {
                BlockType::Q4_0 | BlockType::Q4_1 | BlockType::Q5_0 | BlockType::Q5_1 => {
                    legacy::quantize_row_weighted(block, row, weights, out);
                }
                BlockType::IQ4_NL | BlockType::IQ4_XS => iq4::quantize_row_weighted(block, row, weights, out),
                BlockType::IQ2_XXS | BlockType::IQ2_XS | BlockType::IQ2_S | BlockType::IQ3_XXS | BlockType::IQ3_S => {
                    iqlow::quantize_row(block, row, Some(weights), out);
                }
                _ => kquants::quantize_row_weighted(block, row, weights, out),
            }
        }
        return;
    }
    match block {
        BlockType::Q8_0 => q8_0::quantize_row(values, out),
        BlockType::Q4_0 | BlockType::Q4_1 | BlockType::Q5_0 | BlockType::Q5_1 => {
            legacy::quantize_row(block, values, out);
        }
        BlockType::Q2_K | BlockType::Q3_K | BlockType::Q4_K | BlockType::Q5_K | BlockType::Q6_K => {
            kquants::quantize_row(block, values, out);
        }
        BlockType::IQ4_NL | BlockType::IQ4_XS => iq4::quantize_row(block, values, out),
        // Without an importance matrix (see `iqlow::quantize_row` for the two types that need one).
        BlockType::IQ2_XXS | BlockType::IQ2_XS | BlockType::IQ2_S | BlockType::IQ3_XXS | BlockType::IQ3_S => {
            iqlow::quantize_row(block, values, None, out);
        }
    }
}

/// Appends the values `blocks` (whole blocks of `block`) decode to, exactly as ggml decodes them.
pub fn dequantize(block: BlockType, blocks: &[u8], out: &mut Vec<f32>) {
    match block {
        BlockType::Q8_0 => {
            for b in blocks.chunks_exact(34) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                out.extend(b[2..].iter().map(|&q| f32::from(q as i8) * d));
            }
        }
        BlockType::Q4_0 | BlockType::Q4_1 | BlockType::Q5_0 | BlockType::Q5_1 => {
            legacy::dequantize_row(block, blocks, out);
        }
        BlockType::Q2_K | BlockType::Q3_K | BlockType::Q4_K | BlockType::Q5_K | BlockType::Q6_K => {
            kquants::dequantize_row(block, blocks, out);
        }
        BlockType::IQ4_NL | BlockType::IQ4_XS => iq4::dequantize_row(block, blocks, out),
        BlockType::IQ2_XXS | BlockType::IQ2_XS | BlockType::IQ2_S | BlockType::IQ3_XXS | BlockType::IQ3_S => {
            iqlow::dequantize_row(block, blocks, out);
        }
    }
}

/// The largest magnitude a value stored in a ggml block may have: float16's. Each block's scales
/// are f16, and llama.cpp computes with block values in f16 (CUDA dequantizes to f16 for its matrix
/// products, the CPU rounds activations to blocks with f16 scales): a finite weight beyond it would
/// give a file whose logits are NaN.
pub const VALUE_MAX: f32 = 65504.0;

/// The first of `values` a ggml block cannot hold: non-finite, or beyond [`VALUE_MAX`].
pub fn first_unholdable(values: &[f32]) -> Option<usize> {
    values.iter().position(|v| v.is_nan() || v.abs() > VALUE_MAX)
}

/// Byte offsets of the f16 scales in one block of `block` (`d`, and `dmin` or `m` where it has one).
#[cfg(test)]
fn scale_offsets(block: BlockType) -> &'static [usize] {
    match block {
        BlockType::Q4_0
        | BlockType::Q5_0
        | BlockType::Q8_0
        | BlockType::IQ4_NL
        | BlockType::IQ4_XS
        | BlockType::IQ2_XXS
        | BlockType::IQ2_XS
        | BlockType::IQ2_S
        | BlockType::IQ3_XXS
        | BlockType::IQ3_S => &[0],
        BlockType::Q4_1 | BlockType::Q5_1 | BlockType::Q4_K | BlockType::Q5_K => &[0, 2],
        BlockType::Q2_K => &[80, 82],
        BlockType::Q3_K => &[108],
        BlockType::Q6_K => &[208],
    }
}

/// The first block of `blocks` (whole blocks of `block`) with a scale that is not finite.
#[cfg(test)]
fn first_non_finite_scale(block: BlockType, blocks: &[u8]) -> Option<usize> {
    blocks
        .chunks_exact(block.bytes())
        .position(|b| scale_offsets(block).iter().any(|&at| !f16::from_le_bytes([b[at], b[at + 1]]).is_finite()))
}

/// `Q8_0` blocks holding the int8 `codes` (as stored, two's complement bytes) of a row that shares
/// one f16 `scale`: every block's scale is the row's, so the values are exactly `code · scale`.
pub fn q8_0_from_int8(codes: &[u8], scale: f16, out: &mut Vec<u8>) {
    debug_assert_eq!(codes.len() % 32, 0);
    for block in codes.chunks_exact(32) {
        out.extend_from_slice(&scale.to_le_bytes());
        out.extend_from_slice(block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_of_a_known_block() {
        let values: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
        let mut out = Vec::new();
        quantize(BlockType::Q8_0, &values, None, &mut out);
        assert_eq!(out.len(), 34);
        let d = f16::from_le_bytes([out[0], out[1]]);
        assert_eq!(d, f16::from_f32(16.0 / 127.0));
        assert_eq!(out[2] as i8, -127);
        assert_eq!(out[2 + 16] as i8, 0);
        assert_eq!(out[2 + 31] as i8, 119); // 15 · 127 / 16 = 119.06
        let mut zero = Vec::new();
        quantize(BlockType::Q8_0, &[0.0; 32], None, &mut zero);
        assert!(zero.iter().all(|&b| b == 0));
    }

    #[test]
    fn values_within_the_bound_give_finite_scales_in_every_type() {
        for block in BlockType::ALL {
            let n = block.elements();
            let mut values: Vec<f32> = (0..3 * n).map(|i| (i % 7) as f32 - 3.0).collect();
            // The extremes the bound lets through, alone and beside small values.
            values[n + 5] = VALUE_MAX;
            values[2 * n + 1] = -VALUE_MAX;
            values[2 * n + 2] = VALUE_MAX;
            assert_eq!(first_unholdable(&values), None);
            let mut bytes = Vec::new();
            quantize(block, &values, None, &mut bytes);
            assert_eq!(first_non_finite_scale(block, &bytes), None, "{}", block.name());
            // Beyond it, a block's scale may not be finite: the bound refuses it first.
            values[n + 5] = 1e10;
            assert_eq!(first_unholdable(&values), Some(n + 5));
            let mut wide = Vec::new();
            quantize(block, &values, None, &mut wide);
            assert_eq!(first_non_finite_scale(block, &wide), Some(1), "{}", block.name());
            assert_eq!(first_unholdable(&[1.0, f32::NAN]), Some(1));
        }
    }
}
