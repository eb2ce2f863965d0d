//! The one check of config.json against the tensors, for every output format, before anything is
//! decoded or written: the keys the architecture needs, typed and bounded; every tensor the config
//! declares present with the shape it implies (a coded linear by its logical features, an int8
//! table by its rows and columns), floats where floats are due; no tensor the model has no place
//! for (a stray layer index, a layer of the other kind, a misspelt name); plain float values
//! finite. The formats copy the config beside the weights, so a contradiction here is a model
//! that transformers, mlx-lm, exllamav3 or llama.cpp refuse to load.
//!
//! Shapes follow transformers' `Qwen3_5*` / `Qwen3_5Moe*` text models (`modeling_qwen3_5*.py`):
//! names under `model.language_model.` (the `…ForConditionalGeneration` layout) or `model.` (the
//! text-only `…ForCausalLM` one), `lm_head` at the top, the MTP head under `mtp.`.

use super::input::Checkpoint;
use super::modules::Catalog;
use super::tensor::{is_float, scan_chunks};
use crate::quant::dense::first_non_finite;
use anyhow::{bail, Context, Result};
use safetensors::Dtype;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Bounds on the sizes a config may claim: far above any released model, low enough that no
/// product of two overflows and no loop over layers or experts runs away.
const MAX_DIM: u64 = 1 << 20;
const MAX_LAYERS: u64 = 4096;
const MAX_HEADS: u64 = 1 << 14;
const MAX_EXPERTS: u64 = 1 << 14;
const MAX_VOCAB: u64 = 1 << 24;
const MAX_CONV_KERNEL: u64 = 64;

/// The text models this tool knows: transformers' `model_type` of the whole model and of its text
/// part, and the family each is.
const MODEL_TYPES: &[(&str, Family)] = &[
    ("qwen3_5", Family::Dense),
    ("qwen3_5_text", Family::Dense),
    ("qwen3_5_moe", Family::Moe),
    ("qwen3_5_moe_text", Family::Moe),
    ("qwen3_next", Family::Next),
];

/// Dense Qwen3.5, Qwen3.5-MoE, or Qwen3-Next (the `MoE` before it: fused linear-attention input
/// projections, sparse layers chosen by `decoder_sparse_step` and `mlp_only_layers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Dense,
    Moe,
    Next,
}

/// What one decoder layer mixes tokens with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    LinearAttention,
    FullAttention,
}

impl LayerType {
    fn name(self) -> &'static str {
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

/// The keys of the text part of config.json (`text_config`, or the top level of a flat config),
/// with the name a message gives each.
struct Keys<'a> {
    text: &'a Map<String, Value>,
    top: &'a Map<String, Value>,
    nested: bool,
}

impl<'a> Keys<'a> {
    fn path(&self, key: &str) -> String {
        if self.nested {
            format!("text_config.{key}")
        } else {
            key.to_string()
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.text.get(key).filter(|v| !v.is_null())
    }

    /// A whole number in `min..=max` the model needs.
    fn count(&self, key: &str, min: u64, max: u64) -> Result<u64> {
        match self.get(key) {
            Some(v) => self.in_range(key, v, min, max),
            None => bail!("config.json has no {}, which the model's tensors are sized by", self.path(key)),
        }
    }

    /// A whole number in `min..=max`, `default` when absent.
    fn count_or(&self, key: &str, default: u64, min: u64, max: u64) -> Result<u64> {
        self.get(key).map_or(Ok(default), |v| self.in_range(key, v, min, max))
    }

    fn in_range(&self, key: &str, v: &Value, min: u64, max: u64) -> Result<u64> {
        match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(n),
            _ => bail!("config.json: {} is {v}, not a whole number from {min} to {max}", self.path(key)),
        }
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => bail!("config.json: {} is {v}, not true or false", self.path(key)),
        }
    }
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
        client_keys(&keys, &model_type, family, vocab)?;
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

    fn key_dim(&self) -> u64 {
        self.linear_key_heads * self.linear_key_dim
    }

    fn value_dim(&self) -> u64 {
        self.linear_value_heads * self.linear_value_dim
    }
}

/// The family config.json names: `model_type` of the text part (or of the whole config), which
/// must agree with the top level's and with the `architectures` it lists.
fn family(keys: &Keys) -> Result<(String, Family)> {
    let known = || MODEL_TYPES.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(", ");
    let read = |map: &Map<String, Value>, key: &str| -> Result<Option<(String, Family)>> {
        match map.get("model_type") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(t)) => match MODEL_TYPES.iter().find(|(k, _)| k == t) {
                Some((_, f)) => Ok(Some((t.clone(), *f))),
                None => bail!(
                    "config.json: {key} is {t:?}, an architecture this tool does not know (it knows {}); \
                     its tensors cannot be checked against the config, and an output no client loads is not written",
                    known()
                ),
            },
            Some(v) => bail!("config.json: {key} is {v}, not a string"),
        }
    };
    let text = read(keys.text, &keys.path("model_type"))?;
    let top = if keys.nested { read(keys.top, "model_type")? } else { None };
    let (model_type, family) = match (text, top) {
        (Some(t), Some(o)) if t.1 != o.1 => {
            bail!("config.json: model_type {:?} and text_config.model_type {:?} are different architectures", o.0, t.0)
        }
        (Some(t), _) | (None, Some(t)) => t,
        (None, None) => {
            bail!("config.json has no model_type: the architecture is unknown (this tool knows {})", known())
        }
    };
    if let Some(archs) = keys.top.get("architectures").filter(|v| !v.is_null()) {
        let Some(list) = archs.as_array().filter(|l| l.iter().all(Value::is_string)) else {
            bail!("config.json: architectures is {archs}, not a list of class names");
        };
        for name in list.iter().filter_map(Value::as_str) {
            let named = match name {
                n if n.starts_with("Qwen3_5MoeFor") => Family::Moe,
                n if n.starts_with("Qwen3_5For") => Family::Dense,
                n if n.starts_with("Qwen3NextFor") => Family::Next,
                _ => bail!(
                    "config.json: architectures names {name:?}, not a class of model_type {model_type:?} \
                     (Qwen3_5For…, Qwen3_5MoeFor… or Qwen3NextFor…)"
                ),
            };
            if named != family {
                bail!("config.json: architectures names {name:?}, a class of another family than model_type {model_type:?}");
            }
        }
    }
    Ok((model_type, family))
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

/// The keys the clients read beyond the tensors' sizes (transformers' config classes, mlx-lm's
/// model arguments, exllamav3's architecture), each held to what every one of them accepts, so
/// that a config they would refuse is refused here by name.
fn client_keys(keys: &Keys, model_type: &str, family: Family, vocab: u64) -> Result<()> {
    if keys.nested && !keys.top.get("model_type").is_some_and(Value::is_string) {
        bail!("config.json has no top-level model_type, which transformers reads the architecture from");
    }
    // The multimodal model types read the text model from text_config alone: a flat config would
    // leave transformers building its default (full-size) text model.
    if !keys.nested && matches!(model_type, "qwen3_5" | "qwen3_5_moe") {
        bail!("config.json: model_type {model_type:?} keeps the text model's keys in text_config, and it has none");
    }
    if family == Family::Dense {
        if let Some(v) = keys.text.get("num_experts").filter(|v| !v.is_null() && v.as_u64() != Some(0)) {
            bail!("config.json: {} is {}, but a dense Qwen3.5 has no experts", keys.path("num_experts"), excerpt(v));
        }
    }
    for map in [keys.top, keys.text] {
        for node in ["vision_config", "rope_parameters", "rope_scaling", "quantization_config"] {
            if let Some(v) = map.get(node).filter(|v| !v.is_null() && !v.is_object()) {
                bail!("config.json: {node} is {}, not an object", excerpt(v));
            }
        }
    }
    match keys.get("rms_norm_eps").and_then(Value::as_f64) {
        Some(e) if e.is_finite() && e > 0.0 && e < 1.0 => {}
        _ => bail!(
            "config.json: {} must be a number between 0 and 1 (every norm divides by it)",
            keys.path("rms_norm_eps")
        ),
    }
    if let Some(act) = keys.text.get("hidden_act").filter(|v| v.as_str() != Some("silu")) {
        bail!(
            "config.json: {} is {}; the Qwen3.5 family's clients run silu only",
            keys.path("hidden_act"),
            excerpt(act)
        );
    }
    if family == Family::Moe {
        if let Some(v) = keys.text.get("norm_topk_prob").filter(|v| v.as_bool() != Some(true)) {
            bail!("config.json: {} is {}; Qwen3.5-MoE's clients require true", keys.path("norm_topk_prob"), excerpt(v));
        }
    }
    if let Some(v) = keys.text.get("max_position_embeddings") {
        keys.in_range("max_position_embeddings", v, 1, MAX_POSITIONS)?;
    }
    for (map, prefix) in [(keys.top, ""), (keys.text, if keys.nested { "text_config." } else { "" })] {
        token_ids(map, prefix, "config.json", vocab)?;
        for rope in ["rope_parameters", "rope_scaling"] {
            if let Some(Value::Object(r)) = map.get(rope) {
                rope_parameters(r, &format!("{prefix}{rope}"))?;
            }
        }
        if let Some(theta) = map.get("rope_theta") {
            positive(theta, &format!("{prefix}rope_theta"))?;
        }
    }
    Ok(())
}

/// Position counts a client may build tables for without an absurd allocation.
const MAX_POSITIONS: u64 = 1 << 24;

/// The rotary settings every client runs: the default rotation, a positive base, a partial factor
/// in (0, 1] and a multimodal section of whole numbers.
fn rope_parameters(r: &Map<String, Value>, at: &str) -> Result<()> {
    match r.get("rope_type").or_else(|| r.get("type")) {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "default" => {}
        Some(v) => bail!("config.json: {at}.rope_type is {}; the clients of this family run \"default\"", excerpt(v)),
    }
    if let Some(theta) = r.get("rope_theta") {
        positive(theta, &format!("{at}.rope_theta"))?;
    }
    if let Some(f) = r.get("partial_rotary_factor") {
        if !f.as_f64().is_some_and(|f| f > 0.0 && f <= 1.0) {
            bail!("config.json: {at}.partial_rotary_factor is {}, not a number in (0, 1]", excerpt(f));
        }
    }
    if let Some(m) = r.get("mrope_section") {
        if !m.as_array().is_some_and(|a| a.len() <= 8 && a.iter().all(|x| x.as_u64().is_some_and(|n| n <= MAX_DIM))) {
            bail!("config.json: {at}.mrope_section is {}, not a short list of whole numbers", excerpt(m));
        }
    }
    Ok(())
}

fn positive(v: &Value, at: &str) -> Result<()> {
    if !v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0) {
        bail!("config.json: {at} is {}, not a finite number > 0", excerpt(v));
    }
    Ok(())
}

/// `bos_token_id` and `pad_token_id` a token or null, `eos_token_id` a token or a list of them;
/// the padding token inside the vocabulary (transformers makes it the embedding's padding row;
/// another id past it is only a warning where a format writes it, as GGUF does).
fn token_ids(map: &Map<String, Value>, prefix: &str, file: &str, vocab: u64) -> Result<()> {
    for key in ["bos_token_id", "pad_token_id", "eos_token_id", "decoder_start_token_id"] {
        let Some(v) = map.get(key).filter(|v| !v.is_null()) else { continue };
        let limit = if key == "pad_token_id" { vocab } else { u64::from(u32::MAX) };
        let token = |v: &Value| v.as_u64().is_some_and(|t| t < limit);
        let ok = token(v) || (key == "eos_token_id" && v.as_array().is_some_and(|a| a.iter().all(token)));
        if !ok && key == "pad_token_id" {
            bail!("{file}: {prefix}{key} is {}, not a token id below the vocabulary size {vocab}", excerpt(v));
        } else if !ok {
            bail!("{file}: {prefix}{key} is {}, not a token id", excerpt(v));
        }
    }
    Ok(())
}

/// What `generation_config.json` holds that transformers validates when it loads a model: the token
/// ids, and lengths and counts that are whole numbers (`max_new_tokens` at least 1).
fn check_generation_config(text: &str, vocab: u64) -> Result<()> {
    let file = "generation_config.json";
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) else {
        bail!("{file} is not a JSON object");
    };
    token_ids(&map, "", file, vocab)?;
    for (key, min) in [
        ("max_new_tokens", 1),
        ("max_length", 1),
        ("min_length", 0),
        ("min_new_tokens", 0),
        ("top_k", 0),
        ("num_beams", 1),
        ("num_return_sequences", 1),
    ] {
        if let Some(v) = map.get(key).filter(|v| !v.is_null()) {
            if !v.as_u64().is_some_and(|n| n >= min && u32::try_from(n).is_ok()) {
                bail!("{file}: {key} is {}, not a whole number ≥ {min}", excerpt(v));
            }
        }
    }
    for key in ["temperature", "top_p", "repetition_penalty"] {
        if let Some(v) = map.get(key).filter(|v| !v.is_null()) {
            if !v.as_f64().is_some_and(|x| x.is_finite() && x >= 0.0) {
                bail!("{file}: {key} is {}, not a finite number ≥ 0", excerpt(v));
            }
        }
    }
    if let Some(v) = map.get("do_sample").filter(|v| !v.is_null() && !v.is_boolean()) {
        bail!("{file}: do_sample is {}, not true or false", excerpt(v));
    }
    Ok(())
}

/// A JSON value for a message: at most a short prefix.
fn excerpt(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(48) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// What the model expects of one tensor.
struct Expected {
    shape: Vec<u64>,
    /// A linear's weight, which may be stored coded or as an int8 table; anything else is a float.
    linear: bool,
    /// Whether the model cannot load without it (not so: the head of tied embeddings, attention
    /// biases off, and the MTP head's tensors, which the MTP rule drops or keeps).
    required: bool,
    /// The keys its shape comes from, for the message.
    from: &'static str,
}

/// One input tensor (or coded linear, or int8 pair) as the model sees it: its Hugging Face name,
/// logical shape and what holds it.
struct Logical<'a> {
    name: String,
    shape: Vec<usize>,
    source: Source<'a>,
}

enum Source<'a> {
    /// A coded linear, by its code tensor.
    Coded(&'a str),
    /// An int8 pair, by its weight.
    Int8(&'a str),
    Plain(Dtype),
}

impl Logical<'_> {
    /// The tensor as a message names it.
    fn describe(&self) -> String {
        match self.source {
            Source::Coded(code) => format!("tensor {} (the coded linear of {code})", self.name),
            Source::Int8(weight) => format!("tensor {} (the int8 table {weight})", self.name),
            Source::Plain(_) => format!("tensor {}", self.name),
        }
    }
}

/// Where a tensor belongs: a decoder layer, an MTP layer, or the model's top.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Top,
    Layer(u64),
    MtpLayer(u64),
}

/// Checks config.json against the tensors of `ck` (classified as `cat`). A directory without
/// config.json is refused; a single `.safetensors` file is the tensors-only case, unchecked.
pub fn check(ck: &Checkpoint, cat: &Catalog) -> Result<()> {
    let Some(config) = &ck.config else {
        if ck.single_file {
            return Ok(());
        }
        bail!(
            "{}: no such file: the model's config.json is missing (transformers, mlx-lm, exllamav3 and llama.cpp \
             all need it, and its keys are what the tensors are checked against)",
            ck.root.join("config.json").display()
        );
    };
    let model = TextModel::from_config(config)?;
    if let Some((_, path)) = ck.copied_files.iter().find(|(name, _)| name == "generation_config.json") {
        check_generation_config(&super::boundary::read_text(path)?, model.vocab)
            .with_context(|| format!("{}", path.display()))?;
    }
    check_tensors(ck, cat, &model)?;
    check_finite_plain(ck, cat)
}

/// The text-model prefix the tensors use: `model.language_model.` when any tensor has it, else
/// `model.`.
fn prefix(ck: &Checkpoint) -> &'static str {
    if ck.tensors.keys().any(|n| n.starts_with("model.language_model.")) {
        "model.language_model."
    } else {
        "model."
    }
}

fn check_tensors(ck: &Checkpoint, cat: &Catalog, model: &TextModel) -> Result<()> {
    let prefix = prefix(ck);
    let all = logical(ck, cat);
    let mut by_scope: BTreeMap<Scope, Vec<&Logical>> = BTreeMap::new();
    for t in &all {
        let scope = match scope_of(&t.name, prefix, model) {
            Ok(s) => s,
            Err(why) => bail!("{}: {why}", t.describe()),
        };
        by_scope.entry(scope).or_default().push(t);
    }
    // A layer the config does not announce first: a stray index is named as such, whatever else.
    let layers = model.layer_types.len() as u64;
    for (scope, tensors) in &by_scope {
        let why = match *scope {
            Scope::Layer(i) if i >= layers => format!(
                "layer {i}, but config.json's num_hidden_layers is {layers}: a stray layer the model has no place for"
            ),
            Scope::MtpLayer(i) if i >= model.mtp_layers => format!(
                "MTP layer {i}, but config.json's mtp_num_hidden_layers is {}: a stray layer the head has no place for",
                model.mtp_layers
            ),
            _ => continue,
        };
        bail!("{}: {why}", tensors[0].describe());
    }
    let none = Vec::new();
    for scope in [Scope::Top].into_iter().chain((0..layers).map(Scope::Layer)) {
        check_scope(scope, by_scope.get(&scope).unwrap_or(&none), prefix, model)?;
    }
    // The MTP layers the tensors hold: the count in the config is only a claim (it may be huge).
    for (scope, present) in by_scope.iter().filter(|(s, _)| matches!(s, Scope::MtpLayer(_))) {
        check_scope(*scope, present, prefix, model)?;
    }
    Ok(())
}

/// The input's tensors as the model sees them: a coded linear as its weight, an int8 pair as its
/// weight, every plain tensor as itself; the vision tower is left out (dropped and reported).
fn logical<'a>(ck: &'a Checkpoint, cat: &'a Catalog) -> Vec<Logical<'a>> {
    let mut out = Vec::new();
    for m in &cat.coded {
        let code = m.tensor(super::modules::Leaf::Code).unwrap_or(&m.path);
        let (name, shape) = match m.experts {
            None => (format!("{}.weight", m.path), vec![m.out_features, m.in_features]),
            Some(e) => (m.path.clone(), vec![e, m.out_features, m.in_features]),
        };
        out.push(Logical { name, shape, source: Source::Coded(code) });
    }
    for m in &cat.int8 {
        out.push(Logical {
            name: format!("{}.weight", m.path),
            shape: m.shape.clone(),
            source: Source::Int8(&m.weight),
        });
    }
    for p in &cat.plain {
        let e = &ck.tensors[&p.name];
        out.push(Logical { name: p.name.clone(), shape: e.shape.clone(), source: Source::Plain(e.dtype) });
    }
    out
}

/// The scope of a tensor name, or why it has none.
fn scope_of(name: &str, prefix: &str, model: &TextModel) -> std::result::Result<Scope, String> {
    let index = |rest: &str| rest.split('.').next().and_then(|i| i.parse::<u64>().ok());
    if let Some(rest) = name.strip_prefix(prefix) {
        if let Some(rest) = rest.strip_prefix("layers.") {
            return index(rest).map(Scope::Layer).ok_or_else(|| "a layer without a layer index".to_string());
        }
        return Ok(Scope::Top);
    }
    if name.starts_with("lm_head.") {
        return Ok(Scope::Top);
    }
    if let Some(rest) = name.strip_prefix("mtp.") {
        if model.mtp_layers == 0 {
            // No head announced: the MTP rule drops it (or keeps it with a warning).
            return Ok(Scope::Top);
        }
        if let Some(rest) = rest.strip_prefix("layers.") {
            return index(rest).map(Scope::MtpLayer).ok_or_else(|| "an MTP layer without a layer index".to_string());
        }
        return Ok(Scope::Top);
    }
    let other = if prefix == "model." { "model.language_model." } else { "model." };
    if name.starts_with(other) {
        return Err(format!(
            "named under {other} while the model's other tensors are under {prefix}: one model uses one layout"
        ));
    }
    Err(format!("no place in a {} model (its tensors are {prefix}…, lm_head and mtp.…)", model.model_type))
}

/// Checks the tensors of one scope against what the config makes of it.
fn check_scope(scope: Scope, present: &[&Logical], prefix: &str, model: &TextModel) -> Result<()> {
    let split_experts = |base: &str| present.iter().any(|t| expert_index(&t.name, base).is_some());
    let (expected, what) = match scope {
        Scope::Top => (top_tensors(prefix, model, present), "the model".to_string()),
        Scope::Layer(i) => {
            let base = format!("{prefix}layers.{i}.");
            let split = split_experts(&format!("{base}mlp.experts."));
            let (t, sparse) = (model.layer_types[i as usize], model.sparse[i as usize]);
            (layer_tensors(&base, t, sparse, model, split), format!("layer {i} ({} in config.json)", t.name()))
        }
        Scope::MtpLayer(i) => {
            let base = format!("mtp.layers.{i}.");
            let split = split_experts(&format!("{base}mlp.experts."));
            let sparse = model.experts.is_some();
            (layer_tensors(&base, LayerType::FullAttention, sparse, model, split), format!("MTP layer {i}"))
        }
    };
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for t in present {
        *count.entry(t.name.as_str()).or_default() += 1;
    }
    // Two inputs of one name are refused later, naming both sources; neither is held to a shape here.
    for t in present.iter().filter(|t| count[t.name.as_str()] == 1) {
        let Some(e) = expected.get(&t.name) else {
            bail!("{}: {what} has no tensor of this name{}", t.describe(), hint(&t.name, scope, model));
        };
        let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
        if shape != e.shape {
            bail!("{}: shape {:?}, but config.json ({}) makes it {:?}", t.describe(), t.shape, e.from, e.shape);
        }
        match t.source {
            Source::Plain(dtype) if !is_any_float(dtype) => {
                bail!("{}: {dtype:?} values, where the model holds floats", t.describe())
            }
            Source::Coded(_) | Source::Int8(_) if !e.linear => {
                bail!("{}: stored as a quantized linear, but the model holds a float vector here", t.describe())
            }
            _ => {}
        }
    }
    // The MTP head's own tensors are left to the MTP rule (an incomplete head is dropped or kept
    // with a warning); the model's are all required.
    if matches!(scope, Scope::MtpLayer(_)) {
        return Ok(());
    }
    if let Some((name, e)) = expected.iter().find(|(n, e)| e.required && !count.contains_key(n.as_str())) {
        if let (Scope::Layer(i), true) = (scope, present.is_empty()) {
            bail!(
                "no tensor of layer {i} (no {name}): config.json's num_hidden_layers is {}, but the checkpoint \
                 holds no layer {i}",
                model.layer_types.len()
            );
        }
        bail!("no tensor {name}: {what} needs it, of shape {:?} ({})", e.shape, e.from);
    }
    Ok(())
}

/// The expert index of `….experts.{e}.{proj}.weight` under `base` (`….mlp.experts.`).
fn expert_index(name: &str, base: &str) -> Option<u64> {
    name.strip_prefix(base)?.split('.').next()?.parse().ok()
}

/// Why a name has no place, when something can be said.
fn hint(name: &str, scope: Scope, model: &TextModel) -> String {
    let Scope::Layer(i) = scope else { return String::new() };
    let other = match model.layer_types[i as usize] {
        LayerType::LinearAttention if name.contains(".self_attn.") => "full_attention",
        LayerType::FullAttention if name.contains(".linear_attn.") => "linear_attention",
        _ => return String::new(),
    };
    format!(" (a tensor of a {other} layer: config.json's layer_types disagrees with the tensors)")
}

fn top_tensors(prefix: &str, model: &TextModel, present: &[&Logical]) -> BTreeMap<String, Expected> {
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

fn layer_tensors(
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

/// Refuses NaN or infinite values in a plain float tensor, by name: passed through, they poison
/// every activation they touch.
fn check_finite_plain(ck: &Checkpoint, cat: &Catalog) -> Result<()> {
    for p in &cat.plain {
        let e = &ck.tensors[&p.name];
        if !is_any_float(e.dtype) {
            continue;
        }
        let el = e.dtype.bitsize() / 8;
        let bytes = ck.bytes(e);
        for chunk in scan_chunks(e.numel()) {
            if let Some(i) = first_non_finite(&bytes[chunk.start * el..chunk.end * el], e.dtype) {
                bail!(
                    "{}: tensor {}: a non-finite value (NaN or infinity) at index {}; no client computes with it",
                    ck.file_of(e).display(),
                    p.name,
                    chunk.start + i
                );
            }
        }
        ck.release(e);
    }
    Ok(())
}

/// Float element types a plain tensor may hold: those this tool computes with, and F64, which
/// passes through.
fn is_any_float(dtype: Dtype) -> bool {
    is_float(dtype) || dtype == Dtype::F64
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A flat Qwen3-Next config, as mlx-lm's model takes it.
    fn qwen3_next() -> Value {
        json!({
            "model_type": "qwen3_next", "hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 256,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "linear_num_value_heads": 2,
            "linear_num_key_heads": 1, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
            "shared_expert_intermediate_size": 128, "mlp_only_layers": [1], "moe_intermediate_size": 64,
            "rms_norm_eps": 1e-6, "vocab_size": 256, "full_attention_interval": 4, "tie_word_embeddings": false,
            "architectures": ["Qwen3NextForCausalLM"]
        })
    }

    #[test]
    fn qwen3_next_layers_follow_the_interval_and_the_sparse_step() {
        let m = TextModel::from_config(&qwen3_next()).unwrap();
        assert_eq!(m.family, Family::Next);
        assert_eq!(m.layer_types[3], LayerType::FullAttention);
        assert!(m.layer_types[..3].iter().all(|&t| t == LayerType::LinearAttention));
        assert_eq!(m.sparse, [true, false, true, true], "layer 1 is in mlp_only_layers");
        assert_eq!(m.intermediate, Some(256));
        let layer = layer_tensors("model.layers.0.", LayerType::LinearAttention, true, &m, false);
        // q, k (64 each), v and z (128 each); b and a (2 each).
        assert_eq!(layer["model.layers.0.linear_attn.in_proj_qkvz.weight"].shape, [384, 128]);
        assert_eq!(layer["model.layers.0.linear_attn.in_proj_ba.weight"].shape, [4, 128]);
        assert_eq!(layer["model.layers.0.linear_attn.conv1d.weight"].shape, [256, 1, 4]);
        assert_eq!(layer["model.layers.0.mlp.experts.gate_up_proj"].shape, [4, 128, 128]);
        let dense = layer_tensors("model.layers.1.", LayerType::LinearAttention, false, &m, false);
        assert_eq!(dense["model.layers.1.mlp.down_proj.weight"].shape, [128, 256]);
    }

    #[test]
    fn the_config_is_read_once_typed_and_bounded() {
        let mut c = qwen3_next();
        c["mtp_num_hidden_layers"] = json!(1_000_000_000_000_000u64);
        assert_eq!(TextModel::from_config(&c).unwrap().mtp_layers, 1_000_000_000_000_000, "only a claim");
        for (key, value, says) in [
            ("hidden_size", json!(1u64 << 40), "not a whole number from 1 to 1048576"),
            ("num_hidden_layers", json!(null), "has no num_hidden_layers"),
            ("mlp_only_layers", json!([9]), "layer index below 4"),
            ("decoder_sparse_step", json!(0), "decoder_sparse_step is 0"),
            ("architectures", json!(["Qwen3_5ForCausalLM"]), "another family"),
            ("model_type", json!("qwen3"), "does not know"),
        ] {
            let mut c = qwen3_next();
            c[key] = value;
            let e = TextModel::from_config(&c).unwrap_err().to_string();
            assert!(e.contains(says), "{key}: {e}");
        }
    }
}
