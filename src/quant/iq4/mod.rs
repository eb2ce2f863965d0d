//! ggml's 4-bit non-linear encodings `IQ4_NL` (blocks of 32 values, one f16 scale) and `IQ4_XS`
//! (super-blocks of 256: 8 groups of 32 with 6-bit scales against an f16 super-scale): each value
//! is an index into a fixed 16-level grid, denser near zero. Byte for byte what llama-quantize
//! writes without an importance matrix (`quantize_iq4_nl` / `quantize_iq4_xs`, both through
//! `quantize_row_iq4_nl_impl` with 7 trial scales either side), and ggml's dequantization.
//!
//! `reference.rs` is the scalar reference, with the C code's operations in its order (see
//! `quant::kquants` on bit-exactness); `tests/it/kquants_ref.rs` checks it against ggml's C.
//! [`quantize_row`] runs the fastest [`Kernel`] this CPU has (AVX2 on `x86_64`, NEON on aarch64),
//! each bit-identical to the reference for every input: `lanes.rs` runs the scale searches of 8
//! groups of 32 side by side, one group per vector lane, every lane doing the reference's
//! operations in the reference's order, and picks the nearest levels lane-wise. The per-block
//! scalar steps between (the super-scale and the 6-bit group scales of `IQ4_XS`, the f16 scale of
//! `IQ4_NL`) are shared by both (`xs_header`, `nl_header`).

use crate::block_type::BlockType;
pub use crate::cpu::Kernel;
use half::f16;
use kquants::{nearest_int, to_f16_bits};

use super::kquants;

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod kernel_tests;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod lanes;
mod reference;

/// ggml's `kvalues_iq4nl`: the 16 levels an index stands for, in units of the scale.
pub const GRID: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Values of one `IQ4_NL` block, and of each group of an `IQ4_XS` super-block.
pub const GROUP: usize = 32;
/// Values of one `IQ4_XS` super-block.
pub const SUPER: usize = BlockType::IQ4_XS.elements();
/// Groups of one `IQ4_XS` super-block.
const GROUPS: usize = SUPER / GROUP;
/// The trial scales tried either side of the first guess.
const TRIES: i32 = 7;
/// The multipliers a group's search tries: the first guess and the `2·TRIES + 1` trials.
const MULTIPLIERS: usize = 2 + 2 * TRIES as usize;

/// Appends `values` (whole blocks of `kind`, `IQ4_NL` or `IQ4_XS`) encoded as `kind` to `out`.
/// Runs [`Kernel::best`].
///
/// # Panics
///
/// If `kind` is another type or `values` is not whole blocks.
pub fn quantize_row(kind: BlockType, values: &[f32], out: &mut Vec<u8>) {
    quantize_row_with(Kernel::best(), kind, values, out);
}

/// [`quantize_row`] on a given kernel; every kernel appends the same bytes.
///
/// # Panics
///
/// If `kind` is not `IQ4_NL` or `IQ4_XS` or `values` is not whole blocks.
pub fn quantize_row_with(kernel: Kernel, kind: BlockType, values: &[f32], out: &mut Vec<u8>) {
    assert!(matches!(kind, BlockType::IQ4_NL | BlockType::IQ4_XS), "{} is not an IQ4 type", kind.name());
    let n = kind.elements();
    assert_eq!(values.len() % n, 0, "{} rows hold whole blocks of {n} values", kind.name());
    let start = out.len();
    out.resize(start + values.len() / n * kind.bytes(), 0);
    let blocks = &mut out[start..];
    match kernel {
        Kernel::Reference => reference::quantize_blocks(kind, values, blocks),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the token proves AVX2.
        Kernel::Avx2(lanes) => unsafe { lanes::quantize_blocks_avx2(lanes, kind, values, blocks) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the token proves NEON.
        Kernel::Neon(lanes) => unsafe { lanes::quantize_blocks_neon(lanes, kind, values, blocks) },
    }
}

/// Appends one row, `values` (whole blocks of `kind`), encoded as `kind` with the importance
/// `weights` of its columns (one per value) to `out`: ggml's `quantize_iq4_{nl,xs}` with
/// `quant_weights`, scalar.
///
/// # Panics
///
/// As [`quantize_row_with`], and if `weights` is not as long as `values`.
pub fn quantize_row_weighted(kind: BlockType, values: &[f32], weights: &[f32], out: &mut Vec<u8>) {
    assert!(matches!(kind, BlockType::IQ4_NL | BlockType::IQ4_XS), "{} is not an IQ4 type", kind.name());
    assert_eq!(values.len() % kind.elements(), 0, "{} rows hold whole blocks", kind.name());
    assert_eq!(values.len(), weights.len(), "one weight per value");
    let start = out.len();
    out.resize(start + values.len() / kind.elements() * kind.bytes(), 0);
    reference::quantize_blocks_weighted(kind, values, weights, &mut out[start..]);
}

/// Appends the values of `blocks` (whole blocks of `kind`) to `out`, as ggml's
/// `dequantize_row_iq4_{nl,xs}` computes them.
pub fn dequantize_row(kind: BlockType, blocks: &[u8], out: &mut Vec<f32>) {
    let size = kind.bytes();
    assert_eq!(blocks.len() % size, 0, "{} data holds whole blocks of {size} bytes", kind.name());
    for block in blocks.chunks_exact(size) {
        match kind {
            BlockType::IQ4_NL => {
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                dequantize_group(d, &block[2..18], out);
            }
            BlockType::IQ4_XS => {
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                let high = u16::from_le_bytes([block[2], block[3]]);
                for (ib, qs) in block[8..].chunks_exact(16).enumerate() {
                    let dl = d * (xs_scale(ib, high, &block[4..8]) - 32) as f32;
                    dequantize_group(dl, qs, out);
                }
            }
            other => panic!("{} is not an IQ4 type", other.name()),
        }
    }
}

/// The 32 values of a group of 16 bytes of indexes at scale `d`: the low nibbles first.
fn dequantize_group(d: f32, qs: &[u8], out: &mut Vec<f32>) {
    out.extend(qs.iter().map(|&q| d * GRID[(q & 0xF) as usize] as f32));
    out.extend(qs.iter().map(|&q| d * GRID[(q >> 4) as usize] as f32));
}

/// The 6-bit scale (0..64, 32 meaning zero) of group `ib` of an `IQ4_XS` block: its low nibble in
/// byte `ib / 2` of `low` (low nibble for even groups), its top two bits at bit `2·ib` of `high`.
fn xs_scale(ib: usize, high: u16, low: &[u8]) -> i32 {
    (((low[ib / 2] >> (4 * (ib % 2))) & 0xF) as i32) | ((((high >> (2 * ib)) & 3) as i32) << 4)
}

/// Packs 32 indexes into 16 bytes: index `j` in the low nibble of byte `j`, index `16 + j` in its
/// high nibble.
fn pack_group(l: &[u8; GROUP], out: &mut [u8]) {
    for j in 0..16 {
        out[j] = l[j] | (l[16 + j] << 4);
    }
}

/// An `IQ4_NL` block's f16 scale from its group's scale (0 for a group the search skipped), and the
/// multiplier its values are re-quantized with: the inverse of the unrounded scale.
fn nl_header(scale: f32) -> (u16, f32) {
    let id = if scale == 0.0 { 0.0 } else { 1.0 / scale };
    (to_f16_bits(scale), id)
}

/// The per-block part of an `IQ4_XS` super-block, from its groups' scales (0 for a group the
/// search skipped): the super-scale, the stored 6-bit group scales, the multipliers each group's
/// values are re-quantized with.
struct XsHeader {
    /// `d = −max_scale/32` in f16, `max_scale` the group scale of largest magnitude.
    d: u16,
    /// Each group's scale as a multiple of the unrounded `d`, in `−32..32`, plus 32.
    stored: [u8; GROUPS],
    /// The inverse of the unrounded `d` times each group's multiple (0 where that is 0).
    inverse: [f32; GROUPS],
}

fn xs_header(scales: &[f32; GROUPS]) -> XsHeader {
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for &s in scales {
        if s.abs() > amax_scale {
            amax_scale = s.abs();
            max_scale = s;
        }
    }
    let d = -max_scale / 32.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut header = XsHeader { d: to_f16_bits(d), stored: [0; GROUPS], inverse: [0.0; GROUPS] };
    for ((stored, inverse), &s) in header.stored.iter_mut().zip(&mut header.inverse).zip(scales) {
        let q = nearest_int(id * s).clamp(-32, 31);
        let dl = d * q as f32;
        *inverse = if dl == 0.0 { 0.0 } else { 1.0 / dl };
        *stored = (q + 32) as u8;
    }
    header
}

/// Writes an `IQ4_NL` block: the f16 scale `d` and the indexes `l`.
fn write_nl_block(d: u16, l: &[u8; GROUP], out: &mut [u8]) {
    out[..2].copy_from_slice(&d.to_le_bytes());
    pack_group(l, &mut out[2..18]);
}

/// Writes an `IQ4_XS` super-block: `header` and the indexes `l`.
fn write_xs_block(header: &XsHeader, l: &[u8; SUPER], out: &mut [u8]) {
    out[..2].copy_from_slice(&header.d.to_le_bytes());
    let mut high = 0u16;
    out[4..8].fill(0);
    for (ib, (group, &stored)) in l.chunks_exact(GROUP).zip(&header.stored).enumerate() {
        pack_group(group.try_into().unwrap(), &mut out[8 + 16 * ib..8 + 16 * ib + 16]);
        out[4 + ib / 2] |= (stored & 0xF) << (4 * (ib % 2));
        high |= u16::from(stored >> 4) << (2 * ib);
    }
    out[2..4].copy_from_slice(&high.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn round_trip(kind: BlockType, values: &[f32]) -> Vec<f32> {
        let mut bytes = Vec::new();
        quantize_row(kind, values, &mut bytes);
        assert_eq!(bytes.len(), values.len() / kind.elements() * kind.bytes());
        let mut back = Vec::new();
        dequantize_row(kind, &bytes, &mut back);
        back
    }

    #[test]
    fn gaussian_rows_come_back_close_and_zeros_exact() {
        let mut rng = SplitMix64(0x1A4);
        let values: Vec<f32> = (0..16 * SUPER).map(|_| rng.gaussian() as f32).collect();
        let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
        for kind in [BlockType::IQ4_NL, BlockType::IQ4_XS] {
            let back = round_trip(kind, &values);
            let err =
                (values.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum::<f32>() / values.len() as f32).sqrt();
            // ggml's own encoding reaches about 0.09 on Gaussian data.
            assert!(err / rms < 0.11, "{}: relative RMS error {}", kind.name(), err / rms);
            assert!(round_trip(kind, &[0.0; 2 * SUPER]).iter().all(|&v| v == 0.0));
        }
    }
}
