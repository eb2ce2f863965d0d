//! Output encodings of f32 values.

pub mod dense;
pub mod mlx_affine;
