//! Output encodings of f32 values.

pub mod affine;
pub mod affine_error;
pub mod blocks;
pub mod dense;
