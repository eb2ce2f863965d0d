//! Output options that more than one format takes: how int8 pairs are written (MLX and GGUF) and
//! the error budget of an automatic choice (`--bits auto`, `--gguf-type auto`), and what becomes of
//! the biases of coded linears (every format). Each format's own options stay with its layout.

use super::flags::FlagWords;
use crate::checkpoint::{Catalog, CodedModule, Leaf};

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
        let with_bias: Vec<&CodedModule> = cat.coded.iter().filter(|m| m.tensor(Leaf::Bias).is_some()).collect();
        let keeps_some = with_bias.iter().any(|m| self.keeps(m));
        let drops_some = with_bias.iter().any(|m| !self.keeps(m));
        match (keeps_some, drops_some) {
            (false, _) => BiasMode::Drop,
            (true, false) => BiasMode::Keep,
            (true, true) => BiasMode::Auto,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CodedSource;
    use crate::codec::Codebook;

    fn linear(source: CodedSource, bias: bool) -> CodedModule {
        let leaves = bias.then(|| (Leaf::Bias, "p.bias".to_string())).into_iter().collect();
        CodedModule {
            path: "p".into(),
            source,
            leaves,
            experts: None,
            k: 2,
            codebook: Codebook::Mcg,
            in_padded: 128,
            out_padded: 128,
            in_features: 128,
            out_features: 128,
        }
    }

    #[test]
    fn auto_is_recorded_as_the_one_choice_it_made() {
        let cat = |coded| Catalog { coded, ..Catalog::default() };
        let (escha, exl3) = (CodedSource::Escha, CodedSource::Exl3);
        let cases = [
            (vec![linear(escha, true), linear(exl3, false)], BiasMode::Drop),
            (vec![linear(exl3, true), linear(escha, false)], BiasMode::Keep),
            (vec![linear(escha, true), linear(exl3, true)], BiasMode::Auto),
            (vec![linear(exl3, false)], BiasMode::Drop),
        ];
        for (coded, want) in cases {
            assert_eq!(BiasMode::Auto.resolved(&cat(coded.clone())), want, "{coded:?}");
            for explicit in [BiasMode::Drop, BiasMode::Keep] {
                assert_eq!(explicit.resolved(&cat(coded.clone())), explicit);
            }
        }
    }
}
