//! The values of flags that choose a library enum (`--format`, `--bits`, `--int8`, `--gguf-type`,
//! `--gguf-vocab`, `--mtp`, `--bias`, `--backend`): their spelling and help on the command line,
//! each mapped to the library's value here, so clap stays at the edge.

use crate::backend::BackendKind;
use crate::layout::{BiasMode, GgufType, Int8Mode, MtpMode};
use crate::quant::affine::BITS;
use clap::builder::TypedValueParser;
use clap::ValueEnum;

/// `--int8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Int8Arg {
    /// Repack int8 weights exactly as 8-bit affine (F32 scales): no new rounding.
    Exact,
    /// Quantize their bf16 dequantization at `--bits`/`--group-size` like every other layer.
    Requant,
}

impl From<Int8Arg> for Int8Mode {
    fn from(a: Int8Arg) -> Self {
        match a {
            Int8Arg::Exact => Int8Mode::Exact,
            Int8Arg::Requant => Int8Mode::Requant,
        }
    }
}

/// `--gguf-type`: the type of every tensor llama.cpp does not keep in F32: what its converter
/// writes (`bf16`, `f16`, `f32`, `q8_0`), one K-quant for every tensor llama-quantize quantizes
/// (`q4_k`, `q5_k`, `q6_k`), llama-quantize's mixtures (`q2_k`, `q3_k_s`, `q3_k_m`, `q3_k_l`,
/// `iq4_xs`, `q4_k_m`, `q5_k_m`, and the low-bit `iq2_xxs` … `iq3_m`, `q2_k_s`), or per coded
/// linear within the error budget (`auto`).
#[allow(non_camel_case_types)] // llama.cpp's names
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GgufTypeArg {
    /// As llama.cpp's converter writes these models by default.
    Bf16,
    F16,
    F32,
    /// As the converter's `--outtype q8_0`, from the exact reconstruction.
    #[value(name = "q8_0")]
    Q8_0,
    /// `Q4_K` for every tensor llama-quantize quantizes (its fallbacks where rows are not 256-blocks).
    #[value(name = "q4_k")]
    Q4_K,
    #[value(name = "q5_k")]
    Q5_K,
    #[value(name = "q6_k")]
    Q6_K,
    /// llama-quantize's `Q4_K_M` mixture.
    #[value(name = "q4_k_m")]
    Q4_K_M,
    /// llama-quantize's `Q5_K_M` mixture.
    #[value(name = "q5_k_m")]
    Q5_K_M,
    /// llama-quantize's `Q2_K` mixture.
    #[value(name = "q2_k")]
    Q2_K,
    /// llama-quantize's `Q3_K_S` mixture.
    #[value(name = "q3_k_s")]
    Q3_K_S,
    /// llama-quantize's `Q3_K_M` mixture.
    #[value(name = "q3_k_m")]
    Q3_K_M,
    /// llama-quantize's `Q3_K_L` mixture.
    #[value(name = "q3_k_l")]
    Q3_K_L,
    /// llama-quantize's `IQ4_XS` mixture.
    #[value(name = "iq4_xs")]
    IQ4_XS,
    /// llama-quantize's `IQ2_XXS` mixture.
    #[value(name = "iq2_xxs")]
    IQ2_XXS,
    /// llama-quantize's `IQ2_XS` mixture.
    #[value(name = "iq2_xs")]
    IQ2_XS,
    /// llama-quantize's `IQ2_S` mixture.
    #[value(name = "iq2_s")]
    IQ2_S,
    /// llama-quantize's `IQ2_M` mixture.
    #[value(name = "iq2_m")]
    IQ2_M,
    /// llama-quantize's `IQ3_XXS` mixture.
    #[value(name = "iq3_xxs")]
    IQ3_XXS,
    /// llama-quantize's `IQ3_XS` mixture.
    #[value(name = "iq3_xs")]
    IQ3_XS,
    /// llama-quantize's `IQ3_S` mixture.
    #[value(name = "iq3_s")]
    IQ3_S,
    /// llama-quantize's `IQ3_M` mixture.
    #[value(name = "iq3_m")]
    IQ3_M,
    /// llama-quantize's `Q2_K_S` mixture.
    #[value(name = "q2_k_s")]
    Q2_K_S,
    /// Per coded linear, the narrowest of `Q2_K`, `Q3_K`, `IQ4_XS`, `Q4_K`, `Q5_K`, `Q6_K` and
    /// `Q8_0` within the error budget (`--max-added-error`), else BF16.
    Auto,
}

impl From<GgufTypeArg> for GgufType {
    fn from(a: GgufTypeArg) -> Self {
        match a {
            GgufTypeArg::Bf16 => GgufType::Bf16,
            GgufTypeArg::F16 => GgufType::F16,
            GgufTypeArg::F32 => GgufType::F32,
            GgufTypeArg::Q8_0 => GgufType::Q8_0,
            GgufTypeArg::Q4_K => GgufType::Q4_K,
            GgufTypeArg::Q5_K => GgufType::Q5_K,
            GgufTypeArg::Q6_K => GgufType::Q6_K,
            GgufTypeArg::Q4_K_M => GgufType::Q4_K_M,
            GgufTypeArg::Q5_K_M => GgufType::Q5_K_M,
            GgufTypeArg::Q2_K => GgufType::Q2_K,
            GgufTypeArg::Q3_K_S => GgufType::Q3_K_S,
            GgufTypeArg::Q3_K_M => GgufType::Q3_K_M,
            GgufTypeArg::Q3_K_L => GgufType::Q3_K_L,
            GgufTypeArg::IQ4_XS => GgufType::IQ4_XS,
            GgufTypeArg::IQ2_XXS => GgufType::IQ2_XXS,
            GgufTypeArg::IQ2_XS => GgufType::IQ2_XS,
            GgufTypeArg::IQ2_S => GgufType::IQ2_S,
            GgufTypeArg::IQ2_M => GgufType::IQ2_M,
            GgufTypeArg::IQ3_XXS => GgufType::IQ3_XXS,
            GgufTypeArg::IQ3_XS => GgufType::IQ3_XS,
            GgufTypeArg::IQ3_S => GgufType::IQ3_S,
            GgufTypeArg::IQ3_M => GgufType::IQ3_M,
            GgufTypeArg::Q2_K_S => GgufType::Q2_K_S,
            GgufTypeArg::Auto => GgufType::Auto,
        }
    }
}

/// `--mtp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MtpArg {
    /// Keep a complete head; drop, with a warning, one that cannot be used.
    Auto,
    /// Keep the head as it is, complete or not.
    Keep,
    /// Write no head, and set the config's MTP layer count to 0.
    Drop,
}

impl From<MtpArg> for MtpMode {
    fn from(a: MtpArg) -> Self {
        match a {
            MtpArg::Auto => MtpMode::Auto,
            MtpArg::Keep => MtpMode::Keep,
            MtpArg::Drop => MtpMode::Drop,
        }
    }
}

/// `--backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The fastest CPU decoder; the GPU only when asked for.
    Auto,
    /// The fastest decoder this CPU supports (bit-identical to the scalar one).
    Cpu,
    /// The scalar reference decoder.
    Scalar,
    /// The Metal GPU kernel (macOS, a build with `--features metal`; bit-identical too).
    Metal,
}

impl From<BackendArg> for BackendKind {
    fn from(a: BackendArg) -> Self {
        match a {
            BackendArg::Auto => BackendKind::Auto,
            BackendArg::Cpu => BackendKind::Cpu,
            BackendArg::Scalar => BackendKind::Scalar,
            BackendArg::Metal => BackendKind::Metal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value is spelled on the command line as the library's `name()` writes it into the
    /// output's flags.
    #[test]
    fn spellings_agree_with_the_library_names() {
        let spelled = |v: Option<clap::builder::PossibleValue>| v.unwrap().get_name().to_string();
        for a in GgufTypeArg::value_variants() {
            assert_eq!(spelled(a.to_possible_value()), GgufType::from(*a).name());
        }
        for a in Int8Arg::value_variants() {
            assert_eq!(spelled(a.to_possible_value()), Int8Mode::from(*a).name());
        }
        for a in MtpArg::value_variants() {
            assert_eq!(spelled(a.to_possible_value()), MtpMode::from(*a).name());
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// Dense bfloat16, Hugging Face layout.
    Bf16,
    /// Dense float16, Hugging Face layout.
    F16,
    /// MLX layout, affine-quantized (`--bits`, `--group-size`, `--int8`), as `mlx_lm.convert -q`
    /// writes it; mlx-lm loads it directly.
    Mlx,
    /// GGUF for llama.cpp (`--gguf-type`, `--gguf-vocab`): one file, or splits above
    /// --max-shard-size.
    Gguf,
    /// EXL3 for exllamav3 (TabbyAPI): the trellis codes exactly as stored, one module per expert,
    /// `s_in`/`s_out` folded into the f16 channel scales; a text-only model.
    Exl3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VocabArg {
    /// The tokenizer from `tokenizer.json`, `tokenizer_config.json` and `config.json` (an error when it
    /// cannot be mapped with certainty).
    Auto,
    /// No tokenizer: tensors and model keys only.
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BiasArg {
    /// Each bias as the source's runtime treats it: an EXL3 linear's kept (exllamav3 adds it), an
    /// Escha linear's dropped (the reference serving runtime never applies it).
    Auto,
    /// Leave coded linears' bias tensors out (warned where one is non-zero).
    Drop,
    /// Write them as `<module>.bias`.
    Keep,
}

impl From<BiasArg> for BiasMode {
    fn from(a: BiasArg) -> BiasMode {
        match a {
            BiasArg::Auto => BiasMode::Auto,
            BiasArg::Drop => BiasMode::Drop,
            BiasArg::Keep => BiasMode::Keep,
        }
    }
}

/// `--bits`: a width MLX offers, or auto.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bits {
    Fixed(u32),
    Auto,
}

fn parse_bits(s: &str) -> Result<Bits, String> {
    match s.trim() {
        t if t.eq_ignore_ascii_case("auto") => Ok(Bits::Auto),
        t => t
            .parse()
            .ok()
            .filter(|b| BITS.contains(b))
            .map(Bits::Fixed)
            .ok_or_else(|| format!("{s:?}: MLX affine widths are {BITS:?}, or auto")),
    }
}

/// `--bits`: read by [`parse_bits`], its values listed for the shell completions.
#[derive(Clone)]
pub struct BitsParser;

impl TypedValueParser for BitsParser {
    type Value = Bits;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Bits, clap::Error> {
        let parse: fn(&str) -> Result<Bits, String> = parse_bits;
        parse.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        let names = BITS.iter().map(ToString::to_string).chain(["auto".to_string()]);
        Some(Box::new(names.map(clap::builder::PossibleValue::new)))
    }
}
