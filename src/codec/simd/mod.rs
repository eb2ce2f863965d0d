//! Fast tile decoders, chosen at run time; all bit-identical to the scalar reference.
//!
//! A CPU with vectors (the crate's `simd` lanes: AVX2 on `x86_64`, NEON on aarch64) gets [`VectorDecoder`];
//! every other gets [`PortableDecoder`], plain integer code that the compiler vectorises. The
//! portable decoder is built and tested everywhere.

mod portable;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod vector;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod windows;

pub use portable::PortableDecoder;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub use vector::VectorDecoder;

use super::decoder::TileDecoder;

/// The fastest decoder this CPU supports, detected on the first call.
pub fn best_decoder() -> &'static dyn TileDecoder {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        static VECTOR: std::sync::OnceLock<Option<VectorDecoder>> = std::sync::OnceLock::new();
        if let Some(d) = VECTOR.get_or_init(VectorDecoder::detect) {
            return d;
        }
    }
    &PortableDecoder
}
