//! From decoded tiles to the f32 weight of one linear layer.

pub mod hadamard;
pub mod reconstruct;

pub use reconstruct::{fold_scales, CodedLinear};
