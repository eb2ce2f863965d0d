//! The legacy types with an importance matrix: ggml's `quantize_row_q{4,5}_{0,1}_impl`, scalar.
//! Unlike the reference encoders, these fit each block by weighted least squares (the `_0` types
//! with `make_qx_quants`, the `_1` types with `make_qkx3_quants`), each value weighted by its
//! column's importance times `√(σ² + x²)`, σ² the mean square of the whole row.

use super::{to_f16_bits, QK};
use crate::block_type::BlockType;
use crate::quant::kquants::{fit_affine_weighted, make_qx_quants_weighted};

/// Writes one row, `x` (whole blocks), encoded as `kind` with importance `qw` (one per value) into
/// `out` (exactly its blocks' bytes).
///
/// # Panics
///
/// If `kind` is not `Q4_0`, `Q4_1`, `Q5_0` or `Q5_1`.
pub(super) fn quantize_row(kind: BlockType, x: &[f32], qw: &[f32], out: &mut [u8]) {
    let sum_x2 = x.iter().fold(0.0f32, |s, &v| s + v * v);
    let sigma2 = sum_x2 / x.len() as f32;
    let mut weight = [0.0f32; QK];
    let mut l = [0u8; QK];
    for ((xb, qw), y) in x.chunks_exact(QK).zip(qw.chunks_exact(QK)).zip(out.chunks_exact_mut(kind.bytes())) {
        for j in 0..QK {
            weight[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
        }
        match kind {
            BlockType::Q4_0 | BlockType::Q5_0 => {
                let nmax = if kind == BlockType::Q4_0 { 8 } else { 16 };
                let d = make_qx_quants_weighted(nmax, xb, &mut l, &weight);
                y[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
                pack(kind, &l, &mut y[2..]);
            }
            BlockType::Q4_1 | BlockType::Q5_1 => {
                let nmax = if kind == BlockType::Q4_1 { 15 } else { 31 };
                let (d, min) = fit_affine_weighted::<QK>(nmax, xb, &weight, &mut l);
                y[0..2].copy_from_slice(&to_f16_bits(d).to_le_bytes());
                y[2..4].copy_from_slice(&to_f16_bits(-min).to_le_bytes());
                pack(kind, &l, &mut y[4..]);
            }
            other => panic!("{} is not a legacy type", other.name()),
        }
    }
}

/// The quants after the scales: 4-bit ones as nibbles (value j low, j + 16 high), 5-bit ones with
/// their fifth bits first as a little-endian `u32`.
fn pack(kind: BlockType, l: &[u8; QK], out: &mut [u8]) {
    let qs = if matches!(kind, BlockType::Q4_0 | BlockType::Q4_1) {
        out
    } else {
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            qh |= u32::from((l[j] & 0x10) >> 4) << j;
            qh |= u32::from((l[j + QK / 2] & 0x10) >> 4) << (j + QK / 2);
        }
        out[..4].copy_from_slice(&qh.to_le_bytes());
        &mut out[4..]
    };
    for j in 0..QK / 2 {
        qs[j] = (l[j] & 0x0F) | ((l[j + QK / 2] & 0x0F) << 4);
    }
}
