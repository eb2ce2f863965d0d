//! The CPU this process runs on: which instruction sets it has, and which [`Kernel`] the encoders
//! that have several take.
//!
//! The SIMD paths enter their `#[target_feature]` code only after the features were detected:
//! through a token of [`crate::simd`] (made by [`Avx2::detect`](crate::simd::Avx2::detect) and its
//! kin, the one place that asks the CPU) or, for the code not yet written over those tokens,
//! through [`has_avx2`], which asks for the token.

#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;
#[cfg(target_arch = "aarch64")]
use crate::simd::Neon;
use std::sync::OnceLock;

/// Whether this CPU has AVX2, and FMA and F16C with it.
#[cfg(target_arch = "x86_64")]
pub fn has_avx2() -> bool {
    Avx2::detect().is_some()
}

/// One implementation of a kernel that has several (the K-quants, MLX affine, the square
/// Hadamard): the scalar reference or a CPU's vectors, all giving the same bytes. A vector kernel
/// holds its `crate::simd` token, so it can only be had on a CPU that runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// The scalar reference, one block or group at a time.
    Reference,
    /// AVX2 (`x86_64`), eight lanes.
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    /// NEON (aarch64), four lanes.
    #[cfg(target_arch = "aarch64")]
    Neon(Neon),
}

impl Kernel {
    /// Every kernel this CPU runs, the reference first and the fastest last.
    pub fn available() -> Vec<Kernel> {
        let mut v = vec![Kernel::Reference];
        #[cfg(target_arch = "x86_64")]
        v.extend(Avx2::detect().map(Kernel::Avx2));
        #[cfg(target_arch = "aarch64")]
        v.extend(Neon::detect().map(Kernel::Neon));
        v
    }

    /// The fastest kernel this CPU runs, detected on the first call.
    pub fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| *Kernel::available().last().expect("the reference is always available"))
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Reference => "reference",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2(_) => "avx2",
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon(_) => "neon",
        }
    }
}
