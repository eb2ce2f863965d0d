//! Output encodings of f32 values.

pub mod affine_error;
pub mod dense;
pub mod mlx_affine;
