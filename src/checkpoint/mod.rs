//! Reading an input checkpoint: shards (memory-mapped), the index, config.json, typed access to
//! tensor values, the classification of tensors into modules, and the check of config.json
//! against them.

pub mod architecture;
mod boundary;
mod expert;
mod fingerprint;
pub mod fp8;
pub mod hub;
mod input;
mod missing;
mod modules;
mod regular;
mod shard;
pub mod tensor;

pub use boundary::input_extent;
pub use expert::ExpertLinear;
pub use hub::{locate, source_name, HubSource, Located};
pub use input::{Checkpoint, COPIED_FILES};
pub use missing::closeness;
pub use modules::{catalog, Catalog, CodedModule, CodedSource, Int8Module, Leaf, PlainTensor};
pub use regular::{kind as file_kind, open_regular, read_text};
pub use shard::Shard;
pub use tensor::TensorEntry;
