//! What a format chose for one tensor from its weights (`--bits auto`, `--gguf-type auto`,
//! `--max-size`): the encoding, and the figures the report and `--json` give for it.

use serde::Serialize;

/// An encoding a format chose for one tensor from its weights: an MLX affine width, or a GGUF
/// storage type. In JSON `"bits": 4` or `"gguf_type": "Q5_K"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Chosen {
    Bits(u32),
    GgufType(String),
}

impl std::fmt::Display for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Chosen::Bits(b) => write!(f, "{b} bits"),
            Chosen::GgufType(t) => f.write_str(t),
        }
    }
}

/// What a format chose for one tensor from its weights (`--bits auto`, `--gguf-type auto`).
#[derive(Clone, Debug, Serialize)]
pub struct WidthChoice {
    pub tensor: String,
    /// The trellis bits per weight of the coded source.
    pub k: u32,
    #[serde(flatten)]
    pub chosen: Chosen,
    /// Bits per weight of the chosen encoding, its scales included.
    pub bits_per_weight: f64,
    /// The largest added relative error allowed: `R · 2^-K`.
    pub budget: f64,
    /// The estimated added error of the choice.
    pub predicted: f64,
    /// The measured added error of the choice (`--measure-error`).
    pub actual: Option<f64>,
    /// What the estimate alone would have chosen (`--measure-error`).
    pub estimate: Option<Chosen>,
    /// `--max-size`: the MLX group size chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_size: Option<usize>,
    /// `--max-size`: bytes of the tensor, its scales and biases included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// `--max-size`: the predicted added error over `2^-K` (`2^-8` for a table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}
