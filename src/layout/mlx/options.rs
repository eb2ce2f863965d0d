//! The settings of an MLX-layout conversion: the run's options and the fixed settings of
//! exactly repacked int8 tables and of `MoE` routers.

use crate::layout::options::{AutoBits, Int8Mode};
use crate::quant::affine::AffineSpec;
use safetensors::Dtype;

/// Options of an MLX-layout conversion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlxOptions {
    /// The run's default bits and group size.
    pub spec: AffineSpec,
    pub int8: Int8Mode,
    /// `--bits auto`: each coded linear at its own width.
    pub auto: Option<AutoBits>,
    /// `--max-size`: every quantized tensor at the width and group size the size budget chose.
    pub fitted: bool,
}

impl MlxOptions {
    /// `--format mlx` with no other flag: 4 bits, group size 64, int8 repacked exactly.
    pub const DEFAULT: MlxOptions =
        MlxOptions { spec: AffineSpec { bits: 4, group_size: 64 }, int8: Int8Mode::Exact, auto: None, fitted: false };
}

/// Scales and biases of exactly repacked int8 modules: F32 keeps the repack exact.
pub const INT8_SCALE_DTYPE: Dtype = Dtype::F32;

/// The setting mlx-lm's `MoE` `quant_predicate` gives routers.
pub const ROUTER_SPEC: AffineSpec = AffineSpec { bits: 8, group_size: 64 };
