//! Output encodings of f32 values.

pub mod dense;
pub mod fp8;
pub mod mlx_affine;
