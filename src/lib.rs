//! escha-convert: offline conversion of Escha-W2 / EXL3 trellis checkpoints.

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod codec;
pub mod container;
pub mod convert;
pub mod encode;
pub mod inspect;
pub(crate) mod json;
pub mod layout;
pub mod output;
pub mod plan;
pub mod quant;
pub mod rng;
pub mod select;
pub mod transform;
pub mod verify;
