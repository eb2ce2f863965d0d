//! Encoders: weights to trellis codes, the inverse of the decode path.
//!
//! Conversion never encodes. These exist so that tests, benchmarks and the fixture generator can
//! make Escha checkpoints from known weights: [`tile`] codes one 16×16 tile with a tail-biting
//! Viterbi search, [`linear`] codes a whole weight (random signs, RMS scales, both Hadamards).

pub mod linear;
pub mod tile;

pub use linear::{encode_linear, EncodedLinear};
pub use tile::TileEncoder;
