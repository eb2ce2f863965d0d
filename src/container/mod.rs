//! Output containers: how planned tensors are laid out in files. A container is the second seam
//! of the output side, beside the format ([`crate::layout`]): a new file format is one new file
//! here implementing [`Container`].

mod api;
pub mod gguf;
mod safetensors;

pub use self::safetensors::Safetensors;
pub use api::{Container, MetaValue, Metadata, ShardAt, TensorInfo};
pub use gguf::Gguf;
