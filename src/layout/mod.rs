//! Target layouts: which output tensors a checkpoint becomes, with names, shapes and dtypes.

pub mod hf;
pub mod mlx;

use safetensors::Dtype;

/// How one output tensor is made from the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// Reconstruct coded module `catalog.coded[i]`: `[OC, IC]`, or `[E, OC, IC]` for a stack.
    Coded(usize),
    /// Dequantize int8 pair `catalog.int8[i]`: `[rows, cols]`.
    Int8(usize),
    /// The bias of coded module `catalog.coded[i]`, cast to the output dtype.
    Bias(usize),
    /// Copy an input tensor, casting 16-bit floats to the output dtype.
    Copy(String),
    /// MLX layout: affine-quantized modules, their scales and biases, norms with +1 (see
    /// [`mlx`]).
    Mlx(mlx::MlxRecipe),
}

/// What kind of tensor an output is, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Coded,
    CodedExperts,
    Int8,
    Norm,
    Bias,
    Plain,
    /// Scales or biases of an affine-quantized module.
    QuantParams,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Coded => "coded",
            Kind::CodedExperts => "coded_experts",
            Kind::Int8 => "int8",
            Kind::Norm => "norm",
            Kind::Bias => "bias",
            Kind::Plain => "plain",
            Kind::QuantParams => "quant_params",
        }
    }
}

/// One tensor of the output checkpoint.
#[derive(Clone, Debug)]
pub struct OutputTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub recipe: Recipe,
    pub kind: Kind,
}

impl OutputTensor {
    pub fn byte_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }

    /// Weights the tensor holds, counting packed affine words as the values they pack.
    pub fn weights(&self) -> u64 {
        let n = self.shape.iter().product::<usize>() as u64;
        match &self.recipe {
            Recipe::Mlx(mlx::MlxRecipe::Quantized { spec, .. }) => n * 32 / spec.bits as u64,
            Recipe::Mlx(mlx::MlxRecipe::Int8Exact { .. }) => n * 4,
            Recipe::Mlx(mlx::MlxRecipe::Companion) => 0,
            _ => n,
        }
    }
}

/// Dense output element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseDtype {
    Bf16,
    F16,
}

impl DenseDtype {
    pub fn dtype(self) -> Dtype {
        match self {
            DenseDtype::Bf16 => Dtype::BF16,
            DenseDtype::F16 => Dtype::F16,
        }
    }
}

/// How a Hugging Face Qwen3.5 RMSNorm weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `w − 1`, applied as `x̂·(1 + w)`: input/post-attention layernorms, q/k norms, the final
    /// norm and the MTP norms.
    ZeroCentred,
    /// `w`, applied as `x̂·w`: the gated `linear_attn.norm` of GDN blocks.
    Plain,
}

/// The kind of norm a tensor name is (HF names), or `None` when it is not a norm.
pub fn norm_kind(name: &str) -> Option<NormKind> {
    if name.ends_with("linear_attn.norm.weight") {
        Some(NormKind::Plain)
    } else if name.ends_with("norm.weight") || name.contains("_norm_") && name.ends_with(".weight") {
        Some(NormKind::ZeroCentred)
    } else {
        None
    }
}

/// Sort key that orders `layers.10` after `layers.9`, so shards follow the model's order.
pub fn natural_key(name: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut n = c.to_digit(10).unwrap() as u64;
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n.saturating_mul(10).saturating_add(d as u64);
                chars.next();
            }
            key.push((std::mem::take(&mut text), n));
        } else {
            text.push(c);
        }
    }
    key.push((text, u64::MAX));
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_kinds_follow_the_hf_qwen35_convention() {
        let l = "model.language_model.layers.3";
        for n in ["input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"] {
            assert_eq!(norm_kind(&format!("{l}.{n}.weight")), Some(NormKind::ZeroCentred), "{n}");
        }
        assert_eq!(norm_kind("model.language_model.norm.weight"), Some(NormKind::ZeroCentred));
        assert_eq!(norm_kind("mtp.pre_fc_norm_embedding.weight"), Some(NormKind::ZeroCentred));
        assert_eq!(norm_kind(&format!("{l}.linear_attn.norm.weight")), Some(NormKind::Plain));
        assert_eq!(norm_kind(&format!("{l}.linear_attn.conv1d.weight")), None);
    }
}
