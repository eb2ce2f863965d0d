//! Fast tile decoders, chosen at run time; all bit-identical to the scalar reference.
//!
//! `x86_64` with AVX2 gets [`Avx2Decoder`]; aarch64 gets `NeonDecoder` (NEON is part of its base
//! ISA); every other target gets [`PortableDecoder`], plain integer code that the compiler
//! vectorises. The portable decoder is built and tested everywhere.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
mod neon;
mod portable;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod windows;

#[cfg(target_arch = "x86_64")]
pub use avx2::Avx2Decoder;
#[cfg(target_arch = "aarch64")]
pub use neon::NeonDecoder;
pub use portable::PortableDecoder;

use super::decoder::TileDecoder;

/// The decoder used where no run-time check picks a faster one: NEON on aarch64.
#[cfg(target_arch = "aarch64")]
const BASELINE: &dyn TileDecoder = &NeonDecoder;
#[cfg(not(target_arch = "aarch64"))]
const BASELINE: &dyn TileDecoder = &PortableDecoder;

/// The fastest decoder this CPU supports.
pub fn best_decoder() -> &'static dyn TileDecoder {
    #[cfg(target_arch = "x86_64")]
    if let Some(d) = Avx2Decoder::get() {
        return d;
    }
    BASELINE
}
