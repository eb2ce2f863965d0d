//! Output options that more than one format takes: how int8 pairs are written (MLX and GGUF) and
//! the error budget of an automatic choice (`--bits auto`, `--gguf-type auto`), and what becomes of
//! the biases of coded linears (every format). Each format's own options stay with its layout.

use crate::checkpoint::{Catalog, CodedModule, Leaf};

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

/// What becomes of the bias tensors of coded linears (`--bias`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BiasMode {
    /// Each bias as the source's own runtime treats it: kept where that runtime adds it after the
    /// matmul (a native EXL3 linear: exllamav3 does), dropped where it never does (Escha-W2: the
    /// reference runtime).
    Auto,
    /// Every bias left out.
    Drop,
    /// Every bias written as `<module>.bias`.
    Keep,
}

impl BiasMode {
    /// The value of `--bias` that asks for this mode.
    pub fn name(self) -> &'static str {
        match self {
            BiasMode::Auto => "auto",
            BiasMode::Drop => "drop",
            BiasMode::Keep => "keep",
        }
    }

    /// Whether the bias of coded linear `m` (if it has one) is written.
    pub fn keeps(self, m: &CodedModule) -> bool {
        match self {
            BiasMode::Auto => m.source_applies_bias(),
            BiasMode::Drop => false,
            BiasMode::Keep => true,
        }
    }

    /// The mode that makes the same choice for every bias of `cat` in one word: `auto` resolves to
    /// `drop` or `keep` where its choice is the same for every coded linear with a bias (the
    /// flags recorded in the marker and on the card then say what was done), and stays `auto`
    /// only where it keeps some and drops others.
    #[must_use]
    pub fn resolved(self, cat: &Catalog) -> BiasMode {
        if self != BiasMode::Auto {
            return self;
        }
        let with_bias = cat.coded.iter().filter(|m| m.tensor(Leaf::Bias).is_some());
        let (kept, dropped): (Vec<_>, Vec<_>) = with_bias.partition(|m| m.source_applies_bias());
        match (kept.is_empty(), dropped.is_empty()) {
            (true, _) => BiasMode::Drop,
            (false, true) => BiasMode::Keep,
            (false, false) => BiasMode::Auto,
        }
    }
}
