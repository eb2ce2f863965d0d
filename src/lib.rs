//! escha-convert: offline conversion of Escha-W2 / EXL3 trellis checkpoints.
//!
//! The crate is organised along the data flow: [`codec`] turns stored trellis words into exact
//! fp16 values (and back), [`transform`] turns a grid of decoded tiles into the f32 weight of one
//! linear layer.

pub mod codec;
pub mod backend;
pub mod transform;
pub mod checkpoint;
pub mod layout;
pub mod plan;
pub mod output;
pub mod quant;
pub mod rng;
pub mod select;
pub mod convert;
pub mod cli;
pub mod inspect;
pub mod report;
pub mod verify;
