//! Output encodings of f32 values.

pub mod affine;
pub mod affine_error;
pub mod block_error;
pub mod blocks;
pub mod budget;
pub mod dense;
pub mod iq4;
pub mod kquants;
pub mod legacy;
pub mod q8_0;
