//! escha-convert: offline conversion of Escha-W2 / EXL3 trellis checkpoints.
//!
//! The crate is organised along the data flow: [`codec`] turns stored trellis words into exact
//! fp16 values (and back), [`transform`] turns a grid of decoded tiles into the f32 weight of one
//! linear layer.

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod codec;
pub mod convert;
pub mod inspect;
pub mod layout;
pub mod output;
pub mod plan;
pub mod quant;
pub mod report;
pub mod rng;
pub mod select;
pub mod transform;
pub mod verify;
