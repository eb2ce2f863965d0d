//! Reconstruction of one coded linear (or one expert of a stacked one) to f32, in nn.Linear
//! orientation `[out, in]`:
//!
//! `W = diag(sv) · Hn · W_innerᵀ · Hn · diag(su)`, with `su = rin·s_in`, `sv = rout·s_out` and `Hn`
//! the block-diagonal normalised 128-point Hadamard.
//!
//! The work unit is one block of 128 output channels: it needs only the tile column strip
//! `code[:, 8b..8b+8]` and yields 128 finished rows, so memory stays bounded by the input width.

use super::hadamard::{Square, HADAMARD_SIZE};
use crate::codec::{bytes_per_tile, Codebook, TileDecoder, TILE_EDGE, TILE_LEN};

/// Tiles per 128-wide block.
const TILES_PER_BLOCK: usize = HADAMARD_SIZE / TILE_EDGE;
/// Tiles per 128×128 square.
const SQUARE_TILES: usize = TILES_PER_BLOCK * TILES_PER_BLOCK;
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
        assert_eq!(out.len(), HADAMARD_SIZE * ic, "block buffer size");
        // Work on one 128×128 square (128 output channels × 128 input features) at a time, so
        // that both transforms run in cache. The operations per element are those of a
        // whole-strip transform: all input-side butterflies, then all output-side ones, then
        // the scales, so the result does not depend on this tiling.
        let mut square = Square::default();
        if decoder.prefers_large_batches() {
            // One decode call for the whole strip (an accelerator amortises its round trip).
            let values = self.decode_strip(decoder, block, 0..ic / HADAMARD_SIZE);
            for c in 0..ic / HADAMARD_SIZE {
                for (ti, row) in values[c * SQUARE_TILES * TILE_LEN..][..SQUARE_TILES * TILE_LEN]
                    .chunks_exact(TILES_PER_BLOCK * TILE_LEN)
                    .enumerate()
                {
                    scatter_transposed(row, ti, &mut square);
                }
                self.finish_square(&mut square, block, c, &mut out[c * HADAMARD_SIZE..], ic);
            }
        } else {
            for c in 0..ic / HADAMARD_SIZE {
                self.reconstruct_square_into(decoder, block, c, &mut square, &mut out[c * HADAMARD_SIZE..], ic);
            }
        }
    }

    /// Reconstructs the squares `col_blocks` of output block `block` (128 output channels × 128
    /// input features each), left to right, and hands each to `f(col_block, square)` as 128 rows
    /// of 128 values, row-major. The values are those [`Self::reconstruct_block`] writes, but
    /// only one square is held at a time, so a caller that consumes them (`verify`) works in
    /// cache whatever the input width.
    pub fn for_each_square(
        &self,
        decoder: &dyn TileDecoder,
        block: usize,
        col_blocks: std::ops::Range<usize>,
        mut f: impl FnMut(usize, &[f32]),
    ) {
        let mut square = Square::default();
        let mut out = vec![0f32; HADAMARD_SIZE * HADAMARD_SIZE];
        if decoder.prefers_large_batches() && col_blocks.len() > 1 {
            let values = self.decode_strip(decoder, block, col_blocks.clone());
            for (c, tiles) in col_blocks.zip(values.chunks_exact(SQUARE_TILES * TILE_LEN)) {
                for (ti, row) in tiles.chunks_exact(TILES_PER_BLOCK * TILE_LEN).enumerate() {
                    scatter_transposed(row, ti, &mut square);
                }
                self.finish_square(&mut square, block, c, &mut out, HADAMARD_SIZE);
                f(c, &out);
            }
        } else {
            for c in col_blocks {
                self.reconstruct_square_into(decoder, block, c, &mut square, &mut out, HADAMARD_SIZE);
                f(c, &out);
            }
        }
    }

    /// Reconstructs one 128×128 square: output channels of `block` × input features
    /// `128·col_block ..`, into `out` with row stride `stride`. Since `Hn` is block-diagonal, a
    /// square depends only on its own 8×8 tiles: this is how `verify --sample` checks a block
    /// without decoding the whole strip.
    pub fn reconstruct_square(
        &self,
        decoder: &dyn TileDecoder,
        block: usize,
        col_block: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        self.reconstruct_square_into(decoder, block, col_block, &mut Square::default(), out, stride);
    }

    fn reconstruct_square_into(
        &self,
        decoder: &dyn TileDecoder,
        block: usize,
        c: usize,
        square: &mut Square,
        out: &mut [f32],
        stride: usize,
    ) {
        self.check_shapes();
        let out_tiles = self.out_features() / TILE_EDGE;
        let tile_bytes = bytes_per_tile(self.k);
        let mut values = [0f32; TILES_PER_BLOCK * TILE_LEN];
        for ti in 0..TILES_PER_BLOCK {
            let i = c * TILES_PER_BLOCK + ti;
            let first = (i * out_tiles + block * TILES_PER_BLOCK) * tile_bytes;
            decoder.decode_tiles(
                &self.code[first..first + TILES_PER_BLOCK * tile_bytes],
                self.k,
                self.codebook,
                &mut values,
            );
            scatter_transposed(&values, ti, square);
        }
        self.finish_square(square, block, c, out, stride);
    }

    /// Both transforms and both scales of a filled square.
    fn finish_square(&self, square: &mut Square, block: usize, c: usize, out: &mut [f32], stride: usize) {
        let sv = &self.sv[block * HADAMARD_SIZE..(block + 1) * HADAMARD_SIZE];
        let row_scales: [f32; HADAMARD_SIZE] = std::array::from_fn(|o| sv[o] * HADAMARD_NORM);
        let su: &[f32; HADAMARD_SIZE] = self.su[c * HADAMARD_SIZE..(c + 1) * HADAMARD_SIZE].try_into().unwrap();
        square.transform_scaled(&row_scales, su, out, stride);
    }

    /// The values of the tiles of the strip `code[:, 8·block .. 8·block + 8]` that the squares
    /// `col_blocks` cover, tile row by tile row, from one decode call.
    fn decode_strip(&self, decoder: &dyn TileDecoder, block: usize, col_blocks: std::ops::Range<usize>) -> Vec<f32> {
        self.check_shapes();
        let in_tiles = col_blocks.start * TILES_PER_BLOCK..col_blocks.end * TILES_PER_BLOCK;
        let out_tiles = self.out_features() / TILE_EDGE;
        let run = TILES_PER_BLOCK * bytes_per_tile(self.k);
        let mut codes = Vec::with_capacity(in_tiles.len() * run);
        for i in in_tiles.clone() {
            let first = (i * out_tiles + block * TILES_PER_BLOCK) * bytes_per_tile(self.k);
            codes.extend_from_slice(&self.code[first..first + run]);
        }
        let mut values = vec![0f32; in_tiles.len() * TILES_PER_BLOCK * TILE_LEN];
        decoder.decode_tiles(&codes, self.k, self.codebook, &mut values);
        values
    }

    fn check_shapes(&self) {
        let (ic, oc) = (self.in_features(), self.out_features());
        assert!(ic % HADAMARD_SIZE == 0 && oc % HADAMARD_SIZE == 0, "dims must be multiples of 128");
        assert_eq!(self.code.len(), (ic / TILE_EDGE) * (oc / TILE_EDGE) * bytes_per_tile(self.k), "code size");
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

/// Writes the 8 tiles of tile row `ti` of a square (trellis order, one tile per output column
/// strip) into `square[output channel][input feature]`.
///
/// Positions `2p` and `2p + 1` of a tile are neighbours in the transposed tile (same output
/// channel, consecutive input features), so values move in pairs: position `s = 32m + 8q + 2e`
/// (pair `e` of group `q` of lane block `m`) lands at output channel `m + 8(e >> 1)`, input
/// features `2q + 8(e & 1)` and the next one (see `PERM`).
fn scatter_transposed(values: &[f32], ti: usize, square: &mut Square) {
    for (j, tile) in values.chunks_exact(TILE_LEN).enumerate() {
        for (m, lanes) in tile.chunks_exact(32).enumerate() {
            for e in 0..4 {
                let row = square.row_mut(j * TILE_EDGE + m + 8 * (e >> 1));
                let dst = &mut row[ti * TILE_EDGE + 8 * (e & 1)..][..8];
                for q in 0..4 {
                    dst[2 * q..2 * q + 2].copy_from_slice(&lanes[8 * q + 2 * e..8 * q + 2 * e + 2]);
                }
            }
        }
    }
}

/// `r·s` in f32, the documented fold of an fp16 sign×scale vector and an optional f32 scale.
pub fn fold_scales(r: &[f32], s: Option<&[f32]>) -> Vec<f32> {
    match s {
        Some(s) => r.iter().zip(s).map(|(a, b)| a * b).collect(),
        None => r.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::PERM;

    #[test]
    fn scatter_places_every_value_where_perm_says() {
        let values: Vec<f32> = (0..TILES_PER_BLOCK * TILE_LEN).map(|v| v as f32).collect();
        for ti in [0, 5] {
            let mut square = Square::default();
            scatter_transposed(&values, ti, &mut square);
            for (j, tile) in values.chunks_exact(TILE_LEN).enumerate() {
                for (t, &v) in tile.iter().enumerate() {
                    let (row, col) = (PERM[t] as usize / TILE_EDGE, PERM[t] as usize % TILE_EDGE);
                    // Tile rows are input features, columns output channels; the square is transposed.
                    assert_eq!(square.row(TILE_EDGE * j + col)[TILE_EDGE * ti + row], v);
                }
            }
        }
    }
}
