//! The integration tests, as one test crate (one link instead of one per file).

mod common;
mod kernel_cases;
mod synth;

mod architecture;
mod bad_input;
mod batch;
mod bits_auto;
mod cli_conventions;
mod convert_cli;
mod decoder_props;
mod destinations;
mod edges;
mod encoder;
mod exl3;
mod fuzz_catalogue;
mod gguf;
mod gguf_low_bit;
mod gguf_vocab;
mod golden;
mod hub;
mod inspect;
mod json_contract;
mod kquants_ref;
mod links;
mod memory;
mod metal_gpu;
mod metal_kernel_shim;
mod reconstruct;
mod verify;
mod verify_html;
