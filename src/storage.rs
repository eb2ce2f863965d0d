//! How an output tensor's values are stored: one element type per value (the safetensors dtypes),
//! or blocks that pack a run of values with their scales (ggml's quantized types). Every size and
//! offset the planner and the engine compute goes through here, so a block type is never cut.

use safetensors::Dtype;

/// A ggml block type: `elements` values packed into `bytes` bytes.
#[allow(non_camel_case_types)] // ggml's names
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl BlockType {
    /// Values per block.
    pub fn elements(self) -> usize {
        match self {
            BlockType::Q4_0 | BlockType::Q4_1 | BlockType::Q5_0 | BlockType::Q5_1 | BlockType::Q8_0 => 32,
            BlockType::Q4_K | BlockType::Q5_K | BlockType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub fn bytes(self) -> usize {
        match self {
            BlockType::Q4_0 => 18,
            BlockType::Q4_1 => 20,
            BlockType::Q5_0 => 22,
            BlockType::Q5_1 => 24,
            BlockType::Q8_0 => 34,
            BlockType::Q4_K => 144,
            BlockType::Q5_K => 176,
            BlockType::Q6_K => 210,
        }
    }

    /// The name ggml gives it.
    pub fn name(self) -> &'static str {
        match self {
            BlockType::Q4_0 => "Q4_0",
            BlockType::Q4_1 => "Q4_1",
            BlockType::Q5_0 => "Q5_0",
            BlockType::Q5_1 => "Q5_1",
            BlockType::Q8_0 => "Q8_0",
            BlockType::Q4_K => "Q4_K",
            BlockType::Q5_K => "Q5_K",
            BlockType::Q6_K => "Q6_K",
        }
    }

    /// ggml's type id (`GGML_TYPE_*`).
    pub fn ggml_type(self) -> u32 {
        match self {
            BlockType::Q4_0 => 2,
            BlockType::Q4_1 => 3,
            BlockType::Q5_0 => 6,
            BlockType::Q5_1 => 7,
            BlockType::Q8_0 => 8,
            BlockType::Q4_K => 12,
            BlockType::Q5_K => 13,
            BlockType::Q6_K => 14,
        }
    }

    /// Bits per weight, scales included.
    pub fn bits_per_weight(self) -> f64 {
        (self.bytes() * 8) as f64 / self.elements() as f64
    }
}

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

    /// The name reports and containers print: `BF16`, `Q8_0`.
    pub fn name(self) -> String {
        match self {
            Storage::Element(d) => format!("{d:?}"),
            Storage::Block(b) => b.name().to_string(),
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
    }
}
