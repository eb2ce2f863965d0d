//! Hugging Face layout (the source model family's own): what transformers and mlx-lm load as
//! they load the base model.
//!
//! * coded linear `P` → `P.weight` `[out, in]`; an `[E]` stack → `P` `[E, out, in]` (the fused
//!   Qwen3.5-MoE expert parameters `mlp.experts.gate_up_proj` / `down_proj` carry no suffix);
//! * int8 pair `P` → `P.weight`;
//! * norms are kept exactly as stored: HF Qwen3.5 norms are zero-centred and the runtime adds 1;
//! * every other tensor passes through, 16-bit floats cast to the output dtype, F32 kept F32;
//! * `bias` of coded linears only with `keep_bias`.

use super::{natural_key, norm_kind, DenseDtype, Kind, OutputTensor, Recipe};
use crate::checkpoint::{Catalog, Checkpoint, Leaf};
use safetensors::Dtype;

pub fn layout(ck: &Checkpoint, cat: &Catalog, dtype: DenseDtype, keep_bias: bool) -> Vec<OutputTensor> {
    let out = dtype.dtype();
    let mut tensors = Vec::new();
    for (i, m) in cat.coded.iter().enumerate() {
        let (name, shape, kind) = match m.experts {
            None => (format!("{}.weight", m.path), vec![m.out_features, m.in_features], Kind::Coded),
            Some(e) => (m.path.clone(), vec![e, m.out_features, m.in_features], Kind::CodedExperts),
        };
        tensors.push(OutputTensor { name, dtype: out, shape, recipe: Recipe::Coded(i), kind });
        if keep_bias && m.tensor(Leaf::Bias).is_some() {
            let shape = match m.experts {
                None => vec![m.out_features],
                Some(e) => vec![e, m.out_features],
            };
            let name = format!("{}.bias", m.path);
            tensors.push(OutputTensor { name, dtype: out, shape, recipe: Recipe::Bias(i), kind: Kind::Bias });
        }
    }
    for (i, m) in cat.int8.iter().enumerate() {
        let name = format!("{}.weight", m.path);
        tensors.push(OutputTensor {
            name,
            dtype: out,
            shape: m.shape.clone(),
            recipe: Recipe::Int8(i),
            kind: Kind::Int8,
        });
    }
    for p in &cat.plain {
        let entry = &ck.tensors[&p.name];
        let dtype = match entry.dtype {
            Dtype::F16 | Dtype::BF16 => out,
            other => other,
        };
        let kind = if norm_kind(&p.name).is_some() { Kind::Norm } else { Kind::Plain };
        tensors.push(OutputTensor {
            name: p.name.clone(),
            dtype,
            shape: entry.shape.clone(),
            recipe: Recipe::Copy(p.name.clone()),
            kind,
        });
    }
    tensors.sort_by_cached_key(|t| natural_key(&t.name));
    tensors
}
