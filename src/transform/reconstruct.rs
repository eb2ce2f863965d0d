//! Reconstruction of one coded linear (or one expert of a stacked one) to f32, in nn.Linear
//! orientation `[out, in]`:
//!
//! `W = diag(sv) · Hn · W_innerᵀ · Hn · diag(su)`, with `su = rin·s_in`, `sv = rout·s_out` and `Hn`
//! the block-diagonal normalised 128-point Hadamard.
//!
//! The work unit is one block of 128 output channels: it needs only the tile column strip
//! `code[:, 8b..8b+8]` and yields 128 finished rows, so memory stays bounded by the input width.

use super::hadamard::{fwht_across_rows, fwht_blocks, HADAMARD_SIZE};
use crate::codec::{bytes_per_tile, Codebook, TileDecoder, PERM, TILE_EDGE, TILE_LEN};

/// Tiles per 128-wide block.
const TILES_PER_BLOCK: usize = HADAMARD_SIZE / TILE_EDGE;
/// `Hn·X·Hn = (H·X·H)/128`: both normalisations as one exact power of two.
const HADAMARD_NORM: f32 = 1.0 / HADAMARD_SIZE as f32;

/// One coded linear (or one expert): its codes and folded scale vectors, all at padded size.
#[derive(Clone, Copy, Debug)]
pub struct CodedLinear<'a> {
    /// The tile grid `[IC_p/16, OC_p/16, 16K]` as stored (int16 little-endian bytes).
    pub code: &'a [u8],
    /// Bits per weight.
    pub k: u32,
    pub codebook: Codebook,
    /// `rin·s_in`, length `IC_p` (input features).
    pub su: &'a [f32],
    /// `rout·s_out`, length `OC_p` (output channels).
    pub sv: &'a [f32],
}

impl CodedLinear<'_> {
    /// Padded input width `IC_p`.
    pub fn in_features(&self) -> usize {
        self.su.len()
    }

    /// Padded output width `OC_p`.
    pub fn out_features(&self) -> usize {
        self.sv.len()
    }

    /// Number of 128-row output blocks.
    pub fn blocks(&self) -> usize {
        self.out_features() / HADAMARD_SIZE
    }

    /// Reconstructs output channels `128·block .. 128·block + 128` into `out`, a row-major
    /// `[128, IC_p]` buffer (every input feature, padding included).
    pub fn reconstruct_block(&self, decoder: &dyn TileDecoder, block: usize, out: &mut [f32]) {
        let ic = self.in_features();
        let in_tiles = ic / TILE_EDGE;
        let out_tiles = self.out_features() / TILE_EDGE;
        let tile_bytes = bytes_per_tile(self.k);
        assert!(ic % HADAMARD_SIZE == 0 && self.out_features() % HADAMARD_SIZE == 0);
        assert_eq!(self.code.len(), in_tiles * out_tiles * tile_bytes, "code size");
        assert_eq!(out.len(), HADAMARD_SIZE * ic, "block buffer size");

        // Where trellis position t of a tile lands in the transposed strip, relative to the tile.
        let scatter: [usize; TILE_LEN] = std::array::from_fn(|t| {
            let p = PERM[t] as usize;
            (p % TILE_EDGE) * ic + p / TILE_EDGE
        });
        let mut values = [0f32; TILES_PER_BLOCK * TILE_LEN];
        for i in 0..in_tiles {
            let first = (i * out_tiles + block * TILES_PER_BLOCK) * tile_bytes;
            let strip = &self.code[first..first + TILES_PER_BLOCK * tile_bytes];
            decoder.decode_tiles(strip, self.k, self.codebook, &mut values);
            for (j, tile) in values.chunks_exact(TILE_LEN).enumerate() {
                let base = j * TILE_EDGE * ic + i * TILE_EDGE;
                for (&v, &s) in tile.iter().zip(scatter.iter()) {
                    out[base + s] = v;
                }
            }
        }

        fwht_blocks(out); // along input features, within each row
        fwht_across_rows(out, ic); // along output channels

        let sv = &self.sv[block * HADAMARD_SIZE..(block + 1) * HADAMARD_SIZE];
        for (row, &s) in out.chunks_exact_mut(ic).zip(sv) {
            let row_scale = s * HADAMARD_NORM;
            for (w, &u) in row.iter_mut().zip(self.su) {
                *w = *w * row_scale * u;
            }
        }
    }

    /// The whole weight `[OC, IC]`, padding sliced off (`out_features ≤ OC_p`, `in_features ≤ IC_p`).
    pub fn reconstruct(&self, decoder: &dyn TileDecoder, out_features: usize, in_features: usize) -> Vec<f32> {
        let ic_p = self.in_features();
        let mut w = Vec::with_capacity(out_features * in_features);
        let mut block = vec![0f32; HADAMARD_SIZE * ic_p];
        for b in 0..self.blocks() {
            self.reconstruct_block(decoder, b, &mut block);
            let rows = (out_features.saturating_sub(b * HADAMARD_SIZE)).min(HADAMARD_SIZE);
            for row in block.chunks_exact(ic_p).take(rows) {
                w.extend_from_slice(&row[..in_features]);
            }
        }
        w
    }
}

/// `r·s` in f32, the documented fold of an fp16 sign×scale vector and an optional f32 scale.
pub fn fold_scales(r: &[f32], s: Option<&[f32]>) -> Vec<f32> {
    match s {
        Some(s) => r.iter().zip(s).map(|(a, b)| a * b).collect(),
        None => r.to_vec(),
    }
}
