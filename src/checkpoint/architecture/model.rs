//! The text model config.json describes: its family, sizes and layer kinds, each key read once,
//! typed and bounded.

use super::client_keys::client_keys;
use super::family::{family, Family, MODEL_TYPES};
use super::keys::{
    excerpt, Keys, MAX_CONV_KERNEL, MAX_DIM, MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB,
};
use anyhow::{bail, Result};
use serde_json::{Map, Value};

/// What one decoder layer mixes tokens with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    LinearAttention,
    FullAttention,
}

impl LayerType {
    pub(super) fn name(self) -> &'static str {
        match self {
            LayerType::LinearAttention => "linear_attention",
            LayerType::FullAttention => "full_attention",
        }
    }
}

/// The routed experts of a Qwen3.5-MoE layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    pub count: u64,
    pub per_token: u64,
    pub intermediate: u64,
    pub shared_intermediate: u64,
}

/// The text model's sizes as config.json gives them, each key read once, typed and bounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextModel {
    pub model_type: String,
    pub family: Family,
    pub hidden: u64,
    pub vocab: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub attention_bias: bool,
    pub linear_key_heads: u64,
    pub linear_key_dim: u64,
    pub linear_value_heads: u64,
    pub linear_value_dim: u64,
    pub conv_kernel: u64,
    /// The dense MLP's width, when a layer has one.
    pub intermediate: Option<u64>,
    pub experts: Option<Experts>,
    /// Whether each layer's MLP is the routed experts (else the dense MLP).
    pub sparse: Vec<bool>,
    pub layer_types: Vec<LayerType>,
    pub tie_word_embeddings: bool,
    pub mtp_layers: u64,
    /// `max_position_embeddings`, when given: the longest context the model was made for.
    pub max_positions: Option<u64>,
}

impl TextModel {
    /// Reads and checks the keys of `config` (the whole config.json).
    pub fn from_config(config: &Value) -> Result<TextModel> {
        let Some(top) = config.as_object() else { bail!("config.json is not a JSON object") };
        let (text, nested) = match top.get("text_config") {
            None | Some(Value::Null) => (top, false),
            Some(Value::Object(t)) => (t, true),
            Some(v) => bail!("config.json: text_config is {v}, not an object"),
        };
        if nested {
            text_at_top_only(top, text)?;
        }
        let keys = Keys { text, top, nested };
        let (model_type, family) = family(&keys)?;
        let hidden = keys.count("hidden_size", 1, MAX_DIM)?;
        let layers = keys.count("num_hidden_layers", 1, MAX_LAYERS)?;
        let vocab = keys.count("vocab_size", 1, MAX_VOCAB)?;
        let heads = keys.count("num_attention_heads", 1, MAX_HEADS)?;
        let kv_heads = keys.count("num_key_value_heads", 1, MAX_HEADS)?;
        if heads % kv_heads != 0 {
            bail!(
                "config.json: {} ({heads}) is not a multiple of {} ({kv_heads}): each key-value head serves a whole group of query heads",
                keys.path("num_attention_heads"),
                keys.path("num_key_value_heads")
            );
        }
        let head_dim = keys.count("head_dim", 1, MAX_DIM)?;
        let linear_key_heads = keys.count("linear_num_key_heads", 1, MAX_HEADS)?;
        let linear_key_dim = keys.count("linear_key_head_dim", 1, MAX_DIM)?;
        let linear_value_heads = keys.count("linear_num_value_heads", 1, MAX_HEADS)?;
        let linear_value_dim = keys.count("linear_value_head_dim", 1, MAX_DIM)?;
        if linear_value_heads % linear_key_heads != 0 {
            bail!(
                "config.json: {} ({linear_value_heads}) is not a multiple of {} ({linear_key_heads}): each linear-attention key head serves a whole group of value heads",
                keys.path("linear_num_value_heads"),
                keys.path("linear_num_key_heads")
            );
        }
        let conv_kernel = keys.count("linear_conv_kernel_dim", 1, MAX_CONV_KERNEL)?;
        let sparse = sparse_layers(&keys, family, layers)?;
        let intermediate =
            if sparse.iter().all(|&s| s) { None } else { Some(keys.count("intermediate_size", 1, MAX_DIM)?) };
        let experts = if sparse.iter().any(|&s| s) { Some(experts(&keys)?) } else { None };
        let layer_types = layer_types(&keys, layers)?;
        client_keys(&keys, &model_type, family, vocab, head_dim)?;
        let attention_bias = keys.flag("attention_bias", false)?;
        let tie_word_embeddings = tie_word_embeddings(&keys)?;
        // Only a claim: the head's layers are those its tensors hold (the MTP rule's to judge).
        let mtp_layers = keys.count_or("mtp_num_hidden_layers", 0, 0, u64::MAX)?;
        let max_positions = keys
            .get("max_position_embeddings")
            .map(|v| keys.in_range("max_position_embeddings", v, 1, MAX_POSITIONS))
            .transpose()?;
        Ok(TextModel {
            model_type,
            family,
            hidden,
            vocab,
            heads,
            kv_heads,
            head_dim,
            attention_bias,
            linear_key_heads,
            linear_key_dim,
            linear_value_heads,
            linear_value_dim,
            conv_kernel,
            intermediate,
            experts,
            sparse,
            layer_types,
            tie_word_embeddings,
            mtp_layers,
            max_positions,
        })
    }

    pub(super) fn key_dim(&self) -> u64 {
        self.linear_key_heads * self.linear_key_dim
    }

    pub(super) fn value_dim(&self) -> u64 {
        self.linear_value_heads * self.linear_value_dim
    }
}

/// A text model's config holds no `text_config`: transformers takes one for a sub-config and fails
/// to build the model (`'dict' object has no attribute 'to_dict'`). So a config whose top-level
/// model type is a text model's (`…_text`, `qwen3_next`) is flat, and a `text_config` holds no
/// `text_config` of its own.
fn text_at_top_only(top: &Map<String, Value>, text: &Map<String, Value>) -> Result<()> {
    if let Some(Value::String(t)) = top.get("model_type") {
        if MODEL_TYPES.iter().any(|(k, _)| k == t) && !matches!(t.as_str(), "qwen3_5" | "qwen3_5_moe") {
            bail!(
                "config.json: model_type {t:?} is a text model's, whose keys stand at the top, but the config also \
                 has a text_config: transformers cannot build the model from it (flatten it, or name the whole \
                 model's type)"
            );
        }
    }
    if text.get("text_config").is_some_and(|v| !v.is_null()) {
        bail!(
            "config.json: text_config holds a text_config of its own; transformers cannot build the text model \
             from it (a text model's config has no text_config)"
        );
    }
    Ok(())
}

/// The routed experts' keys, required where a layer routes to them.
fn experts(keys: &Keys) -> Result<Experts> {
    let count = keys.count("num_experts", 1, MAX_EXPERTS)?;
    let per_token = keys.count("num_experts_per_tok", 1, MAX_EXPERTS)?;
    if per_token > count {
        bail!(
            "config.json: {} is {per_token}, more than the {count} experts of {}",
            keys.path("num_experts_per_tok"),
            keys.path("num_experts")
        );
    }
    let intermediate = keys.count("moe_intermediate_size", 1, MAX_DIM)?;
    let shared_intermediate = keys.count("shared_expert_intermediate_size", 1, MAX_DIM)?;
    Ok(Experts { count, per_token, intermediate, shared_intermediate })
}

/// Which layers route to experts: every layer of Qwen3.5-MoE, none of dense Qwen3.5; in
/// Qwen3-Next, with experts, every `decoder_sparse_step`-th layer not in `mlp_only_layers`.
fn sparse_layers(keys: &Keys, family: Family, layers: u64) -> Result<Vec<bool>> {
    match family {
        Family::Dense => return Ok(vec![false; layers as usize]),
        Family::Moe => return Ok(vec![true; layers as usize]),
        Family::Next => {}
    }
    let experts = keys.count_or("num_experts", 0, 0, MAX_EXPERTS)?;
    let step = keys.count_or("decoder_sparse_step", 1, 1, MAX_LAYERS)?;
    let path = keys.path("mlp_only_layers");
    let only: Vec<u64> = match keys.get("mlp_only_layers") {
        None => Vec::new(),
        Some(Value::Array(list)) => {
            list.iter().map(|v| v.as_u64().filter(|&i| i < layers)).collect::<Option<_>>().ok_or_else(|| {
                anyhow::anyhow!("config.json: {path} holds something other than a layer index below {layers}")
            })?
        }
        Some(v) => bail!("config.json: {path} is {v}, not a list of layer indexes"),
    };
    Ok((0..layers).map(|i| experts > 0 && !only.contains(&i) && (i + 1) % step == 0).collect())
}

/// `layer_types`, one per layer, each known; without it, every `full_attention_interval`-th layer
/// is full attention (4 unless given), as transformers builds it. When both are given they must
/// agree: mlx-lm builds the layers from the interval, transformers and llama.cpp from the list.
fn layer_types(keys: &Keys, layers: u64) -> Result<Vec<LayerType>> {
    let interval = match keys.get("full_attention_interval") {
        None => None,
        Some(v) => Some(keys.in_range("full_attention_interval", v, 1, MAX_LAYERS)?),
    };
    let from_interval = |interval: u64| -> Vec<LayerType> {
        (0..layers)
            .map(|i| if (i + 1) % interval == 0 { LayerType::FullAttention } else { LayerType::LinearAttention })
            .collect()
    };
    let Some(list) = keys.get("layer_types") else { return Ok(from_interval(interval.unwrap_or(4))) };
    let path = keys.path("layer_types");
    let Some(list) = list.as_array() else { bail!("config.json: {path} is {list}, not a list") };
    if list.len() as u64 != layers {
        bail!(
            "config.json: {path} has {} entries, but {} is {layers}: one per layer",
            list.len(),
            keys.path("num_hidden_layers")
        );
    }
    let types = list
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            Some("linear_attention") => Ok(LayerType::LinearAttention),
            Some("full_attention") => Ok(LayerType::FullAttention),
            _ => bail!("config.json: {path}[{i}] is {t}, not \"linear_attention\" or \"full_attention\""),
        })
        .collect::<Result<Vec<_>>>()?;
    if let Some(interval) = interval {
        if let Some(i) = from_interval(interval).iter().zip(&types).position(|(a, b)| a != b) {
            bail!(
                "config.json: {path}[{i}] is {:?}, but {} {interval} makes layer {i} {:?}: clients that build the \
                 layers from the interval (mlx-lm) and from the list (transformers, llama.cpp) would disagree",
                types[i].name(),
                keys.path("full_attention_interval"),
                from_interval(interval)[i].name()
            );
        }
    }
    Ok(types)
}

/// Whether the head shares the embedding: the top level's key (where a composite model keeps it)
/// and the text part's must not contradict each other.
fn tie_word_embeddings(keys: &Keys) -> Result<bool> {
    // Absent means false; present, even as null, it must be a boolean (transformers refuses null).
    let read = |map: &Map<String, Value>, at: &str| match map.get("tie_word_embeddings") {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => bail!("config.json: {at} is {}, not true or false", excerpt(v)),
    };
    let text = read(keys.text, &keys.path("tie_word_embeddings"))?;
    if !keys.nested {
        return Ok(text.unwrap_or(false));
    }
    match (read(keys.top, "tie_word_embeddings")?, text) {
        (Some(top), Some(text)) if top != text => {
            bail!("config.json: tie_word_embeddings is {top} but text_config.tie_word_embeddings is {text}")
        }
        (top, text) => Ok(top.or(text).unwrap_or(false)),
    }
}
