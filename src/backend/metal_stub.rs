//! Stand-in for the Metal backend in builds without the cargo feature `metal`: the same API, and
//! a constructor that says how to get the real one.

use super::BackendError;
use crate::codec::{Codebook, TileDecoder};
use std::convert::Infallible;

/// Whether this build can use Metal at all.
pub const COMPILED: bool = false;

/// Never constructed in this build.
#[derive(Debug)]
pub struct MetalDecoder {
    never: Infallible,
}

impl MetalDecoder {
    /// Always [`BackendError::MetalNotCompiled`].
    pub fn new() -> Result<Self, BackendError> {
        Err(BackendError::MetalNotCompiled)
    }

    #[must_use]
    pub fn with_min_gpu_tiles(self, _tiles: usize) -> Self {
        self
    }

    pub fn device_name(&self) -> String {
        match self.never {}
    }

    pub fn gpu_ok(&self) -> bool {
        match self.never {}
    }
}

impl TileDecoder for MetalDecoder {
    fn name(&self) -> &'static str {
        match self.never {}
    }

    fn decode_tiles(&self, _bytes: &[u8], _k: u32, _cb: Codebook, _out: &mut [f32]) {
        match self.never {}
    }
}
