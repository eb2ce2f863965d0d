//! Fast tile decoders, chosen at run time; all bit-identical to the scalar reference.
//!
//! `x86_64` with AVX2 gets [`Avx2Decoder`]; every other target (aarch64 included) gets
//! [`PortableDecoder`], plain integer code that the compiler vectorises.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod portable;

#[cfg(target_arch = "x86_64")]
pub use avx2::Avx2Decoder;
pub use portable::PortableDecoder;

use super::decoder::TileDecoder;

/// The fastest decoder this CPU supports.
pub fn best_decoder() -> &'static dyn TileDecoder {
    #[cfg(target_arch = "x86_64")]
    if let Some(d) = Avx2Decoder::get() {
        return d;
    }
    &PortableDecoder
}
