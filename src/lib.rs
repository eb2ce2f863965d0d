//! escha-convert: offline conversion of Escha-W2 / EXL3 trellis checkpoints.
//!
//! Modules in the order data flows through a conversion:
//!
//! 1. [`checkpoint`] opens IN: memory-mapped shards, the index, config.json, and the
//!    classification of tensors into coded linears, int8 pairs and plain tensors, all checked
//!    before anything is decoded;
//! 2. [`codec`] turns stored trellis words into exact fp16 values, with decoders chosen by
//!    [`backend`] (CPU SIMD, the scalar reference, Metal);
//! 3. [`transform`] turns a grid of decoded tiles into the f32 rows of one linear (both
//!    Hadamards, the folded channel scales);
//! 4. [`layout`] decides which output tensors a checkpoint becomes for the chosen
//!    [`layout::OutputFormat`] (Hugging Face dense bf16/f16, MLX affine, GGUF for llama.cpp, EXL3
//!    for exllamav3), `plan` places them in shard files at fixed offsets, and `container` lays
//!    out the files (safetensors, GGUF);
//! 5. [`quant`] encodes rows (bf16/f16 rounding, MLX affine quantization, int8 repack, GGUF
//!    `Q8_0` and K-quants), in the block types [`block_type`] names;
//! 6. [`convert`] runs the work units in parallel and `output` writes them through a staging
//!    directory that is renamed into place only when complete;
//! 7. [`verify`] checks a decode against the unquantized base model, [`inspect`] describes a
//!    checkpoint without decoding it;
//! 8. [`cli`] is the command line.
//!
//! [`encode`] (weights to trellis codes) exists for tests, benchmarks and the fixture generator;
//! conversion never encodes. [`rng`] is the one seeded generator they all share.

pub mod backend;
pub mod block_type;
pub mod card;
pub mod checkpoint;
pub mod cli;
pub mod codec;
pub(crate) mod container;
pub mod convert;
pub(crate) mod cpu;
pub mod encode;
pub mod failure;
pub mod imatrix;
pub mod inspect;
pub(crate) mod json;
pub mod layout;
pub mod merge;
pub(crate) mod output;
pub(crate) mod paths;
pub(crate) mod plan;
pub(crate) mod pool;
pub mod quant;
pub mod rng;
pub(crate) mod select;
pub(crate) mod signals;
pub(crate) mod simd;
pub mod storage;
pub(crate) mod text;
pub mod transform;
pub mod verify;
pub mod warning;
