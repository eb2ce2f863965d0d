//! Output options that more than one format takes: how int8 pairs are written (MLX and GGUF) and
//! the error budget of an automatic choice (`--bits auto`, `--gguf-type auto`). Each format's own
//! options stay with its layout.

use super::flags::FlagWords;

/// How int8 pairs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Mode {
    /// Repacked exactly (MLX 8-bit affine with F32 scales, GGUF `Q8_0`): no new rounding.
    Exact,
    /// Their bf16 dequantization quantized like every other layer.
    Requant,
}

impl Int8Mode {
    /// The value of `--int8` that asks for this mode.
    pub fn name(self) -> &'static str {
        match self {
            Int8Mode::Exact => "exact",
            Int8Mode::Requant => "requant",
        }
    }
}

/// An automatic choice (`--bits auto`, `--gguf-type auto`): each coded linear gets the narrowest
/// storage whose added error is at most `max_added_error · 2^-K`, K its trellis bits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoBits {
    pub max_added_error: f64,
    /// Measure every candidate's error exactly instead of estimating it.
    pub exact: bool,
}

impl AutoBits {
    /// An auto choice with no other flag: R = 0.5 (at most +12% error in total), estimated.
    pub const DEFAULT: AutoBits = AutoBits { max_added_error: 0.5, exact: false };

    /// `--max-added-error R`, and `--measure-error` when the errors are measured.
    pub fn shaping_flags(self, flags: &mut FlagWords) {
        flags.value("--max-added-error", &self.max_added_error.to_string());
        if self.exact {
            flags.switch("--measure-error");
        }
    }
}
