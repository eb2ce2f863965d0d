//! ggml's 2- and 3-bit grid encodings `IQ2_XXS`, `IQ2_XS`, `IQ2_S`, `IQ3_XXS` and `IQ3_S`:
//! super-blocks of 256 values whose groups of 16 or 32 share a 4-bit scale against an f16
//! super-scale, each cell of 8 (IQ2) or 4 (IQ3) magnitudes an index into a fixed grid of lattice
//! points, signs apart. Byte for byte what ggml's `quantize_iq2_xxs` … `quantize_iq3_s` write for a
//! row and its importance, and ggml's dequantization.
//!
//! `grids.rs` holds the grids (format constants), `tables.rs` the neighbour tables ggml builds
//! from them (once, on first use), `search.rs` the scale search the five share, `lanes.rs` its
//! nearest-neighbour scan eight candidates at a time, `encode.rs` each type's weights and layout,
//! `decode.rs` the decoders. The C code's operations in its order (see `quant::kquants` on
//! bit-exactness): the scalar [`Kernel::Reference`] throughout, the vector kernels lane by lane
//! the same operations, so every kernel writes the same bytes; `tests/it/iq_ref.rs` checks both
//! directions against ggml's C.

mod decode;
mod encode;
mod grids;
#[cfg(test)]
mod kernel_tests;
mod lanes;
mod search;
mod tables;

use crate::block_type::BlockType;
pub use crate::cpu::Kernel;

/// Values per super-block.
pub const QK_K: usize = 256;

/// The types this module encodes, in ggml's id order.
pub const TYPES: [BlockType; 5] =
    [BlockType::IQ2_XXS, BlockType::IQ2_XS, BlockType::IQ3_XXS, BlockType::IQ3_S, BlockType::IQ2_S];

/// Whether ggml refuses to encode `kind` without an importance (`IQ2_XXS`, `IQ2_XS`: it asserts).
pub fn requires_importance(kind: BlockType) -> bool {
    matches!(kind, BlockType::IQ2_XXS | BlockType::IQ2_XS)
}

/// Appends `values` (whole super-blocks) encoded as `kind` (one of [`TYPES`]) to `out`, weighing
/// each value's error by `importance` (one per value, as ggml's `quant_weights`: llama-quantize
/// passes a tensor's per-column importance for every row). Without one, `IQ2_S`, `IQ3_XXS` and
/// `IQ3_S` use ggml's own weights; `IQ2_XXS` and `IQ2_XS`, which ggml does not encode without one
/// ([`requires_importance`]: a caller refuses first), weigh every value by 1.
///
/// Any finite input gives blocks (values beyond f16's range give scales that are not finite, as in
/// ggml); where ggml would abort (a scale search that comes out NaN, from sums that overflow with
/// huge importances), the group is stored as zero.
///
/// Runs [`Kernel::best`].
///
/// # Panics
///
/// If `kind` is not one of [`TYPES`], `values` is not whole super-blocks, or `importance` is not
/// one per value.
pub fn quantize_row(kind: BlockType, values: &[f32], importance: Option<&[f32]>, out: &mut Vec<u8>) {
    quantize_row_with(Kernel::best(), kind, values, importance, out);
}

/// [`quantize_row`] on a given kernel; every kernel appends the same bytes.
///
/// # Panics
///
/// As [`quantize_row`].
pub fn quantize_row_with(
    kernel: Kernel,
    kind: BlockType,
    values: &[f32],
    importance: Option<&[f32]>,
    out: &mut Vec<u8>,
) {
    assert!(TYPES.contains(&kind), "{} is not an IQ2/IQ3 type", kind.name());
    assert_eq!(values.len() % QK_K, 0, "whole super-blocks");
    if let Some(w) = importance {
        assert_eq!(w.len(), values.len(), "one importance per value");
    }
    let size = kind.bytes();
    let start = out.len();
    out.resize(start + values.len() / QK_K * size, 0);
    for (b, (x, o)) in values.chunks_exact(QK_K).zip(out[start..].chunks_exact_mut(size)).enumerate() {
        encode::block(kernel, kind, x, importance.map(|w| &w[b * QK_K..(b + 1) * QK_K]), o);
    }
}

/// Appends the values `blocks` (whole blocks of `kind`, one of [`TYPES`]) decode to, exactly as
/// ggml decodes them.
pub fn dequantize_row(kind: BlockType, blocks: &[u8], out: &mut Vec<f32>) {
    decode::blocks(kind, blocks, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn row(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = SplitMix64(seed);
        (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) as f32 * (1.0 + (rng.uniform() * 4.0) as f32)).collect()
    }

    fn rel_error(kind: BlockType, x: &[f32], w: Option<&[f32]>) -> f64 {
        let mut bytes = Vec::new();
        quantize_row(kind, x, w, &mut bytes);
        assert_eq!(bytes.len(), x.len() / QK_K * kind.bytes());
        let mut back = Vec::new();
        dequantize_row(kind, &bytes, &mut back);
        let err: f64 = x.iter().zip(&back).map(|(&a, &b)| f64::from(a - b).powi(2)).sum();
        let norm: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum();
        err / norm
    }

    #[test]
    fn round_trips_keep_most_of_the_energy() {
        let x = row(7, 4 * QK_K);
        let w: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 13) as f32).collect();
        // Wider types lose less.
        let bounds = [
            (BlockType::IQ2_XXS, 0.2),
            (BlockType::IQ2_XS, 0.15),
            (BlockType::IQ2_S, 0.12),
            (BlockType::IQ3_XXS, 0.06),
            (BlockType::IQ3_S, 0.05),
        ];
        for (kind, bound) in bounds {
            let e = rel_error(kind, &x, Some(&w));
            assert!(e < bound, "{}: relative error {e}", kind.name());
            if !requires_importance(kind) {
                let e = rel_error(kind, &x, None);
                assert!(e < bound, "{} without importance: relative error {e}", kind.name());
            }
        }
    }

    #[test]
    fn hostile_rows_do_not_panic() {
        let n = QK_K;
        let mut rows: Vec<Vec<f32>> = vec![vec![0.0; n], vec![-0.0; n], vec![65504.0; n], vec![1e-45; n]];
        rows.push((0..n).map(|i| if i % 2 == 0 { 3e38 } else { -3e38 }).collect());
        rows.push((0..n).map(|i| f32::from_bits(i as u32 + 1)).collect());
        let weights: Vec<Option<Vec<f32>>> =
            vec![None, Some(vec![0.0; n]), Some(vec![3e38; n]), Some(vec![1e-45; n]), Some(vec![1.0; n])];
        for kind in TYPES {
            for x in &rows {
                for w in &weights {
                    let mut bytes = Vec::new();
                    quantize_row(kind, x, w.as_deref(), &mut bytes);
                    assert_eq!(bytes.len(), kind.bytes());
                    let mut back = Vec::new();
                    dequantize_row(kind, &bytes, &mut back);
                    assert_eq!(back.len(), n);
                }
            }
        }
    }
}
