//! Output encodings of f32 values.

pub mod dense;
pub mod fp8;
