//! SIMD tile decoders, chosen at run time.

use super::decoder::{ScalarDecoder, TileDecoder};

/// The fastest decoder this CPU supports.
pub fn best_decoder() -> &'static dyn TileDecoder {
    &ScalarDecoder
}
