//! What the config makes of each tensor (its shape, whether a linear, whether required), and the
//! input's tensors as the model sees them.

use super::family::Family;
use super::model::{LayerType, TextModel};
use crate::checkpoint::tensor::is_float;
use safetensors::Dtype;
use std::collections::BTreeMap;

/// What the model expects of one tensor.
pub(super) struct Expected {
    pub(super) shape: Vec<u64>,
    /// A linear's weight, which may be stored coded or as an int8 table; anything else is a float.
    pub(super) linear: bool,
    /// Whether the model cannot load without it (not so: the head of tied embeddings, attention
    /// biases off, and the MTP head's tensors, which the MTP rule drops or keeps).
    pub(super) required: bool,
    /// The keys its shape comes from, for the message.
    pub(super) from: &'static str,
}

/// One input tensor (or coded linear, or int8 pair) as the model sees it: its Hugging Face name,
/// logical shape and what holds it.
pub(super) struct Logical<'a> {
    pub(super) name: String,
    pub(super) shape: Vec<usize>,
    pub(super) source: Source<'a>,
}

pub(super) enum Source<'a> {
    /// A coded linear, by its code tensor.
    Coded(&'a str),
    /// An int8 pair, by its weight.
    Int8(&'a str),
    Plain(Dtype),
}

impl Logical<'_> {
    /// The tensor as a message names it.
    pub(super) fn describe(&self) -> String {
        match self.source {
            Source::Coded(code) => format!("tensor {} (the coded linear of {code})", self.name),
            Source::Int8(weight) => format!("tensor {} (the int8 table {weight})", self.name),
            Source::Plain(_) => format!("tensor {}", self.name),
        }
    }
}

pub(super) fn top_tensors(prefix: &str, model: &TextModel, present: &[&Logical]) -> BTreeMap<String, Expected> {
    let (h, v) = (model.hidden, model.vocab);
    let mut out = BTreeMap::new();
    let mut put = |name: String, shape: Vec<u64>, linear: bool, required: bool, from: &'static str| {
        out.insert(name, Expected { shape, linear, required, from });
    };
    put(format!("{prefix}embed_tokens.weight"), vec![v, h], true, true, "vocab_size, hidden_size");
    put(format!("{prefix}norm.weight"), vec![h], false, true, "hidden_size");
    let untied = !model.tie_word_embeddings;
    put("lm_head.weight".into(), vec![v, h], true, untied, "vocab_size, hidden_size, tie_word_embeddings");
    if model.mtp_layers > 0 {
        put("mtp.fc.weight".into(), vec![h, 2 * h], true, false, "hidden_size");
        for n in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"] {
            put(format!("mtp.{n}.weight"), vec![h], false, false, "hidden_size");
        }
    } else {
        // A head of no announced layers: whatever it holds is the MTP rule's to drop.
        for t in present.iter().filter(|t| t.name.starts_with("mtp.")) {
            let shape = t.shape.iter().map(|&d| d as u64).collect();
            put(t.name.clone(), shape, true, false, "");
        }
    }
    out
}

pub(super) fn layer_tensors(
    base: &str,
    t: LayerType,
    sparse: bool,
    model: &TextModel,
    split_experts: bool,
) -> BTreeMap<String, Expected> {
    let h = model.hidden;
    let mtp = base.starts_with("mtp.");
    let mut out = BTreeMap::new();
    let mut put = |leaf: String, shape: Vec<u64>, linear: bool, from: &'static str| {
        out.insert(format!("{base}{leaf}"), Expected { shape, linear, required: !mtp, from });
    };
    put("input_layernorm.weight".into(), vec![h], false, "hidden_size");
    put("post_attention_layernorm.weight".into(), vec![h], false, "hidden_size");
    match t {
        LayerType::LinearAttention => {
            let (kd, vd, vh) = (model.key_dim(), model.value_dim(), model.linear_value_heads);
            let conv = 2 * kd + vd;
            let from =
                "hidden_size, linear_num_key_heads, linear_key_head_dim, linear_num_value_heads, linear_value_head_dim";
            if model.family == Family::Next {
                put("linear_attn.in_proj_qkvz.weight".into(), vec![conv + vd, h], true, from);
                put(
                    "linear_attn.in_proj_ba.weight".into(),
                    vec![2 * vh, h],
                    true,
                    "hidden_size, linear_num_value_heads",
                );
            } else {
                put("linear_attn.in_proj_qkv.weight".into(), vec![conv, h], true, from);
                put("linear_attn.in_proj_z.weight".into(), vec![vd, h], true, from);
                put("linear_attn.in_proj_b.weight".into(), vec![vh, h], true, "hidden_size, linear_num_value_heads");
                put("linear_attn.in_proj_a.weight".into(), vec![vh, h], true, "hidden_size, linear_num_value_heads");
            }
            put(
                "linear_attn.conv1d.weight".into(),
                vec![conv, 1, model.conv_kernel],
                false,
                "linear_conv_kernel_dim and the linear-attention head sizes",
            );
            put("linear_attn.dt_bias".into(), vec![vh], false, "linear_num_value_heads");
            put("linear_attn.A_log".into(), vec![vh], false, "linear_num_value_heads");
            put("linear_attn.norm.weight".into(), vec![model.linear_value_dim], false, "linear_value_head_dim");
            put("linear_attn.out_proj.weight".into(), vec![h, vd], true, from);
        }
        LayerType::FullAttention => {
            let (q, kv) = (model.heads * model.head_dim, model.kv_heads * model.head_dim);
            let from = "hidden_size, num_attention_heads, num_key_value_heads, head_dim";
            // The query projection carries the output gate beside the queries.
            put("self_attn.q_proj.weight".into(), vec![2 * q, h], true, from);
            put("self_attn.k_proj.weight".into(), vec![kv, h], true, from);
            put("self_attn.v_proj.weight".into(), vec![kv, h], true, from);
            put("self_attn.o_proj.weight".into(), vec![h, q], true, from);
            put("self_attn.q_norm.weight".into(), vec![model.head_dim], false, "head_dim");
            put("self_attn.k_norm.weight".into(), vec![model.head_dim], false, "head_dim");
            if model.attention_bias {
                let from = "attention_bias, num_attention_heads, num_key_value_heads, head_dim";
                put("self_attn.q_proj.bias".into(), vec![2 * q], false, from);
                put("self_attn.k_proj.bias".into(), vec![kv], false, from);
                put("self_attn.v_proj.bias".into(), vec![kv], false, from);
                put("self_attn.o_proj.bias".into(), vec![h], false, from);
            }
        }
    }
    match (model.intermediate, model.experts) {
        (Some(i), _) if !sparse => {
            let from = "hidden_size, intermediate_size";
            put("mlp.gate_proj.weight".into(), vec![i, h], true, from);
            put("mlp.up_proj.weight".into(), vec![i, h], true, from);
            put("mlp.down_proj.weight".into(), vec![h, i], true, from);
        }
        (_, Some(x)) if sparse => {
            put("mlp.gate.weight".into(), vec![x.count, h], true, "num_experts, hidden_size");
            let from = "num_experts, moe_intermediate_size, hidden_size";
            if split_experts {
                // exllamav3's own layout: one linear per expert.
                for e in 0..x.count {
                    put(format!("mlp.experts.{e}.gate_proj.weight"), vec![x.intermediate, h], true, from);
                    put(format!("mlp.experts.{e}.up_proj.weight"), vec![x.intermediate, h], true, from);
                    put(format!("mlp.experts.{e}.down_proj.weight"), vec![h, x.intermediate], true, from);
                }
            } else {
                put("mlp.experts.gate_up_proj".into(), vec![x.count, 2 * x.intermediate, h], true, from);
                put("mlp.experts.down_proj".into(), vec![x.count, h, x.intermediate], true, from);
            }
            let (s, from) = (x.shared_intermediate, "shared_expert_intermediate_size, hidden_size");
            put("mlp.shared_expert.gate_proj.weight".into(), vec![s, h], true, from);
            put("mlp.shared_expert.up_proj.weight".into(), vec![s, h], true, from);
            put("mlp.shared_expert.down_proj.weight".into(), vec![h, s], true, from);
            put("mlp.shared_expert_gate.weight".into(), vec![1, h], true, "hidden_size");
        }
        _ => {}
    }
    out
}

/// Float element types a plain tensor may hold: those this tool computes with, and F64, which
/// passes through.
pub(super) fn is_any_float(dtype: Dtype) -> bool {
    is_float(dtype) || dtype == Dtype::F64
}
