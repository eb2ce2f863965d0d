//! How an output tensor's values are stored: one element type per value (the safetensors dtypes),
//! or blocks that pack a run of values with their scales (ggml's quantized types, named by
//! [`BlockType`]). Every size and offset the planner and the engine compute goes through here, so a
//! block type is never cut.

use crate::block_type::BlockType;
use safetensors::Dtype;

/// How an output tensor is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    Element(Dtype),
    Block(BlockType),
}

impl From<Dtype> for Storage {
    fn from(d: Dtype) -> Self {
        Storage::Element(d)
    }
}

impl Storage {
    /// Values per storage unit (1 for an element type).
    pub fn block_elements(self) -> usize {
        match self {
            Storage::Element(_) => 1,
            Storage::Block(b) => b.elements(),
        }
    }

    /// Bytes of `values` values, which must be a whole number of blocks.
    pub fn byte_len(self, values: usize) -> usize {
        match self {
            Storage::Element(d) => values * d.bitsize() / 8,
            Storage::Block(b) => values / b.elements() * b.bytes(),
        }
    }

    /// The element type, for containers and encoders that know only those.
    pub fn element(self) -> Option<Dtype> {
        match self {
            Storage::Element(d) => Some(d),
            Storage::Block(_) => None,
        }
    }

    /// The name reports and containers print: `BF16`, `Q8_0`; a block type's is ggml's in upper
    /// case, as gguf-py and llama.cpp's file types spell it.
    pub fn name(self) -> String {
        match self {
            Storage::Element(d) => format!("{d:?}"),
            Storage::Block(b) => b.name().to_ascii_uppercase(),
        }
    }

    /// Bits per weight, block scales included.
    pub fn bits_per_weight(self) -> f64 {
        match self {
            Storage::Element(d) => d.bitsize() as f64,
            Storage::Block(b) => b.bits_per_weight(),
        }
    }

    pub fn is_float_element(self) -> bool {
        matches!(self, Storage::Element(Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(Storage::from(Dtype::BF16).byte_len(10), 20);
        assert_eq!(Storage::Block(BlockType::Q8_0).byte_len(64), 68);
        assert_eq!(Storage::Block(BlockType::Q8_0).name(), "Q8_0");
        assert_eq!(Storage::Block(BlockType::Q4_K).name(), "Q4_K");
    }
}
