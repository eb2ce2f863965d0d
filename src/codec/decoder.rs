//! The tile-decoder interface and its scalar reference implementation.

use super::codebook::Codebook;
use super::tile::{bytes_per_tile, tile_states, TILE_LEN};
use half::f16;

/// Turns stored tile bytes into trellis states and exact codebook values.
///
/// Every implementation must be bit-identical to [`ScalarDecoder`]. Tiles are given as their
/// stored bytes (int16 words, little-endian), several consecutive tiles at a time; outputs are in
/// trellis order, 256 per tile (scatter them with [`super::tile::PERM`]).
pub trait TileDecoder: Send + Sync {
    /// A short name for reports ("scalar", "avx2", "neon").
    fn name(&self) -> &'static str;

    /// Decodes `bytes.len() / bytes_per_tile(k)` tiles into `out` (256 values per tile).
    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]);

    /// Whether one call with many tiles (a whole 128-row strip) is much cheaper than many calls
    /// with a few: true for accelerators with a per-call round trip.
    fn prefers_large_batches(&self) -> bool {
        false
    }

    /// Extracts the 256 states of each tile, as `decode_tiles` sees them.
    fn states(&self, bytes: &[u8], k: u32, out: &mut [u16]) {
        for (tile, states) in bytes.chunks_exact(bytes_per_tile(k)).zip(out.chunks_exact_mut(TILE_LEN)) {
            tile_states(tile, k, states);
        }
    }
}

/// The reference decoder: the documented window rule and the codebook table, one value at a time.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScalarDecoder;

impl TileDecoder for ScalarDecoder {
    fn name(&self) -> &'static str {
        "scalar"
    }

    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        let table = cb.table();
        let mut states = [0u16; TILE_LEN];
        for (tile, values) in bytes.chunks_exact(bytes_per_tile(k)).zip(out.chunks_exact_mut(TILE_LEN)) {
            tile_states(tile, k, &mut states);
            for (v, &s) in values.iter_mut().zip(states.iter()) {
                *v = f16::from_bits(table[s as usize]).to_f32();
            }
        }
    }
}
