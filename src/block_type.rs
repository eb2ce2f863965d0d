//! ggml's block types, the one vocabulary for them: each type's ggml id, name, values per block and
//! bytes per block. The storage sizes tensors with it, the GGUF container writes its ids, the
//! encoders (`quant::blocks`, `quant::legacy`, `quant::kquants`) dispatch on it and llama-quantize's
//! rules (`layout::gguf::mixture`) choose among its values.

/// A ggml block type: [`elements`](BlockType::elements) values packed into
/// [`bytes`](BlockType::bytes) bytes, scales included. Values are ordered as declared.
// The variants are spelled as ggml spells the types; `Q40` would read as "forty".
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockType {
    /// f16 `d`, 16 bytes of 4-bit quants: `x = d·(q − 8)`.
    Q4_0,
    /// f16 `d`, f16 `m`, 16 bytes of 4-bit quants: `x = d·q + m`.
    Q4_1,
    /// f16 `d`, 32 bits of fifth bits, 16 bytes of low nibbles: `x = d·(q − 16)`.
    Q5_0,
    /// f16 `d`, f16 `m`, 32 bits of fifth bits, 16 bytes of low nibbles: `x = d·q + m`.
    Q5_1,
    /// f16 `d`, 32 int8 quants: `x = d·q`.
    Q8_0,
    /// 16 bytes of 4-bit group scales and mins, 64 bytes of 2-bit quants, f16 `d`, f16 `dmin`.
    Q2_K,
    /// 32 bytes of each quant's third bit, 64 bytes of low bit pairs, 12 bytes of 6-bit group
    /// scales, f16 `d`.
    Q3_K,
    /// f16 `d`, f16 `dmin`, 12 bytes of 6-bit group scales and mins, 128 bytes of 4-bit quants.
    Q4_K,
    /// As `Q4_K`, plus 32 bytes holding each quant's fifth bit.
    Q5_K,
    /// 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8 group scales, f16 `d`.
    Q6_K,
    /// f16 `d`, then per group of 32: four 8-bit indexes into a 256-point grid of 8 values and a
    /// 32-bit word of four 7-bit sign sets and a 4-bit scale.
    IQ2_XXS,
    /// f16 `d`, 32 16-bit words (a 9-bit index into a 512-point grid of 8 values, 7 sign bits), 8
    /// bytes of two 4-bit scales (groups of 16).
    IQ2_XS,
    /// f16 `d`, 64 bytes of 8-bit indexes into a 256-point grid of 4 values, 8 32-bit words of four
    /// 7-bit sign sets and a 4-bit scale (groups of 32).
    IQ3_XXS,
    /// f16 `d`, 16 bytes of 4-bit indexes into ggml's non-linear grid: `x = d·grid[q]`.
    IQ4_NL,
    /// f16 `d`, the low 8 bits of 64 indexes into a 512-point grid of 4 values, 8 bytes of their
    /// 9th bits, 32 bytes of signs, 4 bytes of two 4-bit scales (groups of 32).
    IQ3_S,
    /// f16 `d`, the low 8 bits of 32 indexes into a 1024-point grid of 8 values, 32 bytes of signs,
    /// 8 bytes of the indexes' top 2 bits, 8 bytes of two 4-bit scales (groups of 16).
    IQ2_S,
    /// f16 `d`, 16 bits of high scale bits, 4 bytes of low scale nibbles, 128 bytes of 4-bit indexes
    /// into the `IQ4_NL` grid: 8 groups of 32 with 6-bit scales.
    IQ4_XS,
}

/// What ggml's type traits (`ggml.c`'s `type_traits`) say of one block type.
struct Traits {
    /// Its number in ggml's `enum ggml_type` (and in GGUF).
    id: u32,
    /// `type_name`.
    name: &'static str,
    /// `blck_size`: values per block.
    elements: usize,
    /// `type_size`: bytes per block.
    bytes: usize,
}

impl BlockType {
    /// Every block type, in declaration order.
    pub const ALL: [BlockType; 17] = [
        BlockType::Q4_0,
        BlockType::Q4_1,
        BlockType::Q5_0,
        BlockType::Q5_1,
        BlockType::Q8_0,
        BlockType::Q2_K,
        BlockType::Q3_K,
        BlockType::Q4_K,
        BlockType::Q5_K,
        BlockType::Q6_K,
        BlockType::IQ2_XXS,
        BlockType::IQ2_XS,
        BlockType::IQ3_XXS,
        BlockType::IQ4_NL,
        BlockType::IQ3_S,
        BlockType::IQ2_S,
        BlockType::IQ4_XS,
    ];

    /// ggml's K-quants: super-blocks of 256 values whose groups have scales of their own,
    /// quantized against the block's.
    pub const K_QUANTS: [BlockType; 5] =
        [BlockType::Q2_K, BlockType::Q3_K, BlockType::Q4_K, BlockType::Q5_K, BlockType::Q6_K];

    const fn traits(self) -> Traits {
        let (id, name, elements, bytes) = match self {
            BlockType::Q4_0 => (2, "q4_0", 32, 18),
            BlockType::Q4_1 => (3, "q4_1", 32, 20),
            BlockType::Q5_0 => (6, "q5_0", 32, 22),
            BlockType::Q5_1 => (7, "q5_1", 32, 24),
            BlockType::Q8_0 => (8, "q8_0", 32, 34),
            BlockType::Q2_K => (10, "q2_K", 256, 84),
            BlockType::Q3_K => (11, "q3_K", 256, 110),
            BlockType::Q4_K => (12, "q4_K", 256, 144),
            BlockType::Q5_K => (13, "q5_K", 256, 176),
            BlockType::Q6_K => (14, "q6_K", 256, 210),
            BlockType::IQ2_XXS => (16, "iq2_xxs", 256, 66),
            BlockType::IQ2_XS => (17, "iq2_xs", 256, 74),
            BlockType::IQ3_XXS => (18, "iq3_xxs", 256, 98),
            BlockType::IQ4_NL => (20, "iq4_nl", 32, 18),
            BlockType::IQ3_S => (21, "iq3_s", 256, 110),
            BlockType::IQ2_S => (22, "iq2_s", 256, 82),
            BlockType::IQ4_XS => (23, "iq4_xs", 256, 136),
        };
        Traits { id, name, elements, bytes }
    }

    /// ggml's type id (`GGML_TYPE_*`), which GGUF stores.
    pub const fn ggml_type(self) -> u32 {
        self.traits().id
    }

    /// The name ggml gives it (`q8_0`, `q4_K`).
    pub const fn name(self) -> &'static str {
        self.traits().name
    }

    /// Values per block.
    pub const fn elements(self) -> usize {
        self.traits().elements
    }

    /// Bytes per block.
    pub const fn bytes(self) -> usize {
        self.traits().bytes
    }

    /// Bits per weight, scales included.
    pub fn bits_per_weight(self) -> f64 {
        (self.bytes() * 8) as f64 / self.elements() as f64
    }

    /// Whether it is one of [`K_QUANTS`](BlockType::K_QUANTS).
    pub fn is_k_quant(self) -> bool {
        BlockType::K_QUANTS.contains(&self)
    }

    /// Whether it is one of ggml's original 32-value types `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, whose
    /// weighted encoders weigh by the mean square of a whole row.
    pub fn is_legacy(self) -> bool {
        matches!(self, BlockType::Q4_0 | BlockType::Q4_1 | BlockType::Q5_0 | BlockType::Q5_1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_traits() {
        let ids: Vec<u32> = BlockType::ALL.iter().map(|b| b.ggml_type()).collect();
        assert_eq!(ids, [2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 16, 17, 18, 20, 21, 22, 23]);
        let names: Vec<&str> = BlockType::ALL.iter().map(|b| b.name()).collect();
        assert_eq!(
            names,
            [
                "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq2_xxs", "iq2_xs",
                "iq3_xxs", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs"
            ]
        );
        // ggml's bits per weight.
        let bpw: Vec<f64> = BlockType::ALL.iter().map(|b| b.bits_per_weight()).collect();
        assert_eq!(
            bpw,
            [
                4.5, 5.0, 5.5, 6.0, 8.5, 2.625, 3.4375, 4.5, 5.5, 6.5625, 2.0625, 2.3125, 3.0625, 4.5, 3.4375, 2.5625,
                4.25
            ]
        );
        for b in BlockType::ALL {
            let super_block = b.is_k_quant() || !matches!(b, BlockType::IQ4_NL) && b.name().starts_with("iq");
            assert_eq!(b.elements(), if super_block { 256 } else { 32 }, "{}", b.name());
        }
        let mut sorted = BlockType::ALL;
        sorted.sort();
        assert_eq!(sorted, BlockType::ALL);
    }
}
