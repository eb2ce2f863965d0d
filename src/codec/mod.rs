//! The EXL3 trellis codec: codebooks, tile bit layout, decoders (scalar reference and SIMD) and
//! the tail-biting Viterbi encoder.

pub mod codebook;
pub mod decoder;
pub mod simd;
pub mod tile;

pub use codebook::{Codebook, ALL_CODEBOOKS};
pub use decoder::{ScalarDecoder, TileDecoder};
pub use simd::best_decoder;
pub use tile::{bytes_per_tile, words_per_tile, K_RANGE, PERM, TILE_EDGE, TILE_LEN};

/// Decodes a whole `[IT, OT]` grid of tiles into the bare inner matrix `W_inner[IC, OC]`
/// (row-major, rows = input features), with `IC = 16·IT` and `OC = 16·OT`.
pub fn decode_inner(
    decoder: &dyn TileDecoder,
    code: &[u8],
    in_tiles: usize,
    out_tiles: usize,
    k: u32,
    cb: Codebook,
) -> Vec<f32> {
    let oc = TILE_EDGE * out_tiles;
    let mut inner = vec![0f32; in_tiles * out_tiles * TILE_LEN];
    let mut values = vec![0f32; out_tiles * TILE_LEN];
    let row_bytes = out_tiles * bytes_per_tile(k);
    for i in 0..in_tiles {
        decoder.decode_tiles(&code[i * row_bytes..(i + 1) * row_bytes], k, cb, &mut values);
        for (j, tile) in values.chunks_exact(TILE_LEN).enumerate() {
            for (t, &v) in tile.iter().enumerate() {
                let p = PERM[t] as usize;
                let (r, c) = (p / TILE_EDGE, p % TILE_EDGE);
                inner[(TILE_EDGE * i + r) * oc + TILE_EDGE * j + c] = v;
            }
        }
    }
    inner
}
