//! The three EXL3 codebooks: a 16-bit trellis state to an exact fp16 value.
//!
//! Every codebook rounds exactly once to fp16 (round to nearest, ties to even). The formulas here
//! are the reference; [`Codebook::table`] caches them for the scalar decoder.

use half::f16;
use std::sync::OnceLock;

/// Codebook id as stored in `escha_config[3]` (exllamav3 numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Codebook {
    /// QTIP's "3INST": multiply-add hash, two fp16 halves summed. Id 0.
    ThreeInst,
    /// Multiplicative congruential hash, then as 3INST. Id 1; every Escha release uses it.
    Mcg,
    /// Byte-sum of a multiplicative hash, one fp16 fused multiply-add. Id 2.
    Mul1,
}

pub const ALL_CODEBOOKS: [Codebook; 3] = [Codebook::ThreeInst, Codebook::Mcg, Codebook::Mul1];

pub(crate) const INST_MUL: u32 = 89_226_354;
pub(crate) const INST_ADD: u32 = 64_248_484;
pub(crate) const MCG_MUL: u32 = 0xCBAC_1FED;
pub(crate) const MUL1_MUL: u32 = 0x83DC_D12D;
/// Keeps sign and mantissa of both halves and the low bits of their exponents...
pub(crate) const HALVES_MASK: u32 = 0x8FFF_8FFF;
/// ...then forces both exponents into 12..15, so each half lies in ±[0.125, 2).
pub(crate) const HALVES_XOR: u32 = 0x3B60_3B60;
/// MUL1's fp16 constants (bit patterns 0x1EEE and 0xC931).
// The exact decimal value of the fp16 constant; every digit is representable in f32.
#[allow(clippy::excessive_precision)]
pub(crate) const MUL1_SCALE: f32 = 0.006_767_272_949_218_75;
pub(crate) const MUL1_BIAS: f32 = -10.382_812_5;

impl Codebook {
    pub fn from_id(id: i64) -> Option<Self> {
        match id {
            0 => Some(Self::ThreeInst),
            1 => Some(Self::Mcg),
            2 => Some(Self::Mul1),
            _ => None,
        }
    }

    pub fn id(self) -> u8 {
        match self {
            Self::ThreeInst => 0,
            Self::Mcg => 1,
            Self::Mul1 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::ThreeInst => "3INST",
            Self::Mcg => "MCG",
            Self::Mul1 => "MUL1",
        }
    }

    /// RMS of the codebook over all 65536 states; the encoder scales inputs to it.
    pub fn rms(self) -> f32 {
        match self {
            Self::ThreeInst | Self::Mcg => 1.243_710_9,
            Self::Mul1 => 1.0,
        }
    }

    /// The fp16 bit pattern of the value of `state`, computed from the formula.
    pub fn value_bits(self, state: u16) -> u16 {
        let x = state as u32;
        match self {
            Self::ThreeInst => sum_of_halves(x.wrapping_mul(INST_MUL).wrapping_add(INST_ADD)),
            Self::Mcg => sum_of_halves(x.wrapping_mul(MCG_MUL)),
            Self::Mul1 => {
                let y = x.wrapping_mul(MUL1_MUL);
                let byte_sum = y.to_le_bytes().iter().map(|&b| b as u32).sum::<u32>();
                // 1024 + byte_sum is the fp16 0x6400 + byte_sum; the product is exact in f32.
                let v = (1024 + byte_sum) as f32 * MUL1_SCALE + MUL1_BIAS;
                f16::from_f32(v).to_bits()
            }
        }
    }

    /// The value of `state` as f32 (exact: every fp16 is an f32).
    pub fn value(self, state: u16) -> f32 {
        f16::from_bits(self.value_bits(state)).to_f32()
    }

    /// All 65536 values as fp16 bit patterns, built once per process.
    pub fn table(self) -> &'static [u16; 65536] {
        static TABLES: [OnceLock<Box<[u16; 65536]>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        TABLES[self.id() as usize].get_or_init(|| {
            let mut t: Box<[u16; 65536]> = vec![0u16; 65536].into_boxed_slice().try_into().expect("65536 entries");
            for (s, v) in t.iter_mut().enumerate() {
                *v = self.value_bits(s as u16);
            }
            t
        })
    }
}

/// 3INST/MCG tail: mask and xor, then add the two fp16 halves, rounding once.
fn sum_of_halves(y: u32) -> u16 {
    let y = (y & HALVES_MASK) ^ HALVES_XOR;
    let lo = f16::from_bits(y as u16).to_f32();
    let hi = f16::from_bits((y >> 16) as u16).to_f32();
    // Both halves are normal with exponents 12..15, so the f32 sum is exact.
    f16::from_f32(lo + hi).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(cb: Codebook) -> (f64, f64, f32, f32, usize) {
        let vals: Vec<f32> = cb.table().iter().map(|&b| f16::from_bits(b).to_f32()).collect();
        let n = vals.len() as f64;
        let mean = vals.iter().map(|&v| v as f64).sum::<f64>() / n;
        let rms = (vals.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n).sqrt();
        let min = vals.iter().copied().fold(f32::INFINITY, f32::min);
        let max = vals.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut distinct: Vec<u16> = cb.table().to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        (rms, mean, min, max, distinct.len())
    }

    #[test]
    fn whole_table_statistics_match_the_format_document() {
        let (rms, mean, min, max, distinct) = stats(Codebook::Mcg);
        assert!((rms - 1.244112).abs() < 5e-6, "MCG rms {rms}");
        assert!((mean + 0.000037).abs() < 5e-6, "MCG mean {mean}");
        assert_eq!((min, max), (-3.949_218_8, 3.949_218_8));
        assert_eq!(distinct, 10746);

        let (rms, mean, _, _, distinct) = stats(Codebook::ThreeInst);
        assert!((rms - 1.243711).abs() < 5e-6, "3INST rms {rms}");
        assert!((mean - 0.000210).abs() < 5e-6, "3INST mean {mean}");
        assert_eq!(distinct, 10598);

        let (rms, mean, _, _, distinct) = stats(Codebook::Mul1);
        assert!((rms - 1.000312).abs() < 5e-6, "MUL1 rms {rms}");
        assert!((mean + 0.001931).abs() < 5e-6, "MUL1 mean {mean}");
        assert_eq!(distinct, 913);
    }

    #[test]
    fn skipping_the_fp16_rounding_changes_the_documented_number_of_entries() {
        // The format document counts how many MCG entries an unrounded f32 sum would change.
        let changed = (0..=u16::MAX)
            .filter(|&s| {
                let y = (s as u32).wrapping_mul(MCG_MUL);
                let y = (y & HALVES_MASK) ^ HALVES_XOR;
                let raw = f16::from_bits(y as u16).to_f32() + f16::from_bits((y >> 16) as u16).to_f32();
                raw != Codebook::Mcg.value(s)
            })
            .count();
        assert_eq!(changed, 33088);
    }

    #[test]
    fn ids_round_trip() {
        for cb in ALL_CODEBOOKS {
            assert_eq!(Codebook::from_id(cb.id() as i64), Some(cb));
        }
        assert_eq!(Codebook::from_id(3), None);
    }
}
