//! Who decodes tiles: a CPU decoder (SIMD or the scalar reference) or the Metal GPU kernel.
//!
//! Every backend is a [`TileDecoder`]: "decode these tiles into this buffer", bit-identical to the
//! scalar reference. The conversion engine takes `&dyn TileDecoder`; a [`Backend`] owns the one the
//! user chose and hands it out. Without the cargo feature `metal`, [`metal`] is a stub with the
//! same API whose constructor returns [`BackendError::MetalNotCompiled`].

pub use crate::codec::TileDecoder;
use crate::codec::{best_decoder, ScalarDecoder};

#[cfg(feature = "metal")]
pub mod metal;
#[cfg(not(feature = "metal"))]
#[path = "metal_stub.rs"]
pub mod metal;

pub use metal::MetalDecoder;

/// The backend the user asked for (`--backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The fastest CPU decoder; the GPU only when asked for.
    Auto,
    /// The fastest decoder this CPU supports (bit-identical to the scalar one).
    Cpu,
    /// The scalar reference decoder.
    Scalar,
    /// The Metal GPU kernel (macOS, a build with `--features metal`; bit-identical too).
    Metal,
}

/// Why a backend cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("this build has no Metal support; on macOS build with `--features metal`")]
    MetalNotCompiled,
    #[error("Metal is only available on macOS")]
    MetalNotMacos,
    #[error("no Metal GPU is available on this machine; use `--backend cpu`")]
    NoMetalDevice,
    #[error("Metal could not be set up: {0}")]
    MetalSetup(String),
}

/// The chosen tile decoder.
pub enum Backend {
    Cpu(&'static dyn TileDecoder),
    Metal(Box<MetalDecoder>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu(d) => write!(f, "Backend::Cpu({})", d.name()),
            Self::Metal(m) => write!(f, "Backend::Metal({m:?})"),
        }
    }
}

impl Backend {
    pub fn new(kind: BackendKind) -> Result<Self, BackendError> {
        Ok(match kind {
            BackendKind::Auto | BackendKind::Cpu => Self::Cpu(best_decoder()),
            BackendKind::Scalar => Self::Cpu(&ScalarDecoder),
            BackendKind::Metal => Self::Metal(Box::new(MetalDecoder::new()?)),
        })
    }

    /// The decoder to pass to the conversion engine.
    pub fn decoder(&self) -> &dyn TileDecoder {
        match self {
            Self::Cpu(d) => *d,
            Self::Metal(m) => m.as_ref(),
        }
    }

    pub fn name(&self) -> &'static str {
        self.decoder().name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_backends_are_always_there() {
        assert_eq!(Backend::new(BackendKind::Scalar).unwrap().name(), "scalar");
        assert_eq!(Backend::new(BackendKind::Cpu).unwrap().name(), best_decoder().name());
        assert_eq!(Backend::new(BackendKind::Auto).unwrap().name(), best_decoder().name());
    }

    #[cfg(not(feature = "metal"))]
    #[test]
    fn metal_without_the_feature_is_a_clear_error() {
        let e = Backend::new(BackendKind::Metal).unwrap_err();
        assert!(matches!(e, BackendError::MetalNotCompiled));
        assert!(e.to_string().contains("--features metal"));
        const { assert!(!metal::COMPILED) };
    }
}
