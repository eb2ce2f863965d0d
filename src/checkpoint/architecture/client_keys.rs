//! The keys the clients read beyond the tensors' sizes, held to what every client accepts.

use super::family::Family;
use super::keys::{excerpt, positive, Keys, MAX_POSITIONS};
use super::rope::{rope_parameters, RopeContext};
use anyhow::{bail, Result};
use serde_json::{Map, Value};

/// The keys the clients read beyond the tensors' sizes (transformers' config classes, mlx-lm's
/// model arguments, exllamav3's architecture), each held to what every one of them accepts, so
/// that a config they would refuse is refused here by name.
pub(super) fn client_keys(keys: &Keys, model_type: &str, family: Family, vocab: u64, head_dim: u64) -> Result<()> {
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
    // transformers' config classes type these as float and check the type strictly: an integer,
    // a string or null there fails to load.
    let top = if keys.nested { &[("initializer_range", "")][..] } else { &[] };
    let text = if keys.nested { "text_config." } else { "" };
    let floats = [("initializer_range", text), ("rms_norm_eps", text), ("router_aux_loss_coef", text)];
    for &(key, prefix) in top.iter().chain(&floats) {
        let map = if prefix.is_empty() && keys.nested { keys.top } else { keys.text };
        if let Some(v) = map.get(key).filter(|v| !v.as_f64().is_some_and(f64::is_finite) || !v.is_f64()) {
            bail!(
                "config.json: {prefix}{key} is {}, not a finite decimal number; transformers' config takes a float \
                 there and refuses anything else",
                excerpt(v)
            );
        }
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
    // mlx-lm reads Qwen3-Next's rotation from rope_scaling, Qwen3.5's from the text part's
    // rope_parameters (its own defaults standing in when absent).
    let mlx_key = if family == Family::Next { "rope_scaling".to_string() } else { keys.path("rope_parameters") };
    for (map, prefix) in [(keys.top, ""), (keys.text, if keys.nested { "text_config." } else { "" })] {
        token_ids(map, prefix, "config.json", vocab)?;
        for rope in ["rope_parameters", "rope_scaling"] {
            if let Some(Value::Object(r)) = map.get(rope) {
                let at = format!("{prefix}{rope}");
                let cx = RopeContext {
                    at: &at,
                    mlx_reads: at == mlx_key,
                    mlx_key: &mlx_key,
                    model_type,
                    head_dim,
                    theta: keys.get("rope_theta").and_then(Value::as_f64),
                    partial: keys.get("partial_rotary_factor").and_then(Value::as_f64),
                };
                rope_parameters(r, &cx)?;
            }
        }
        if let Some(theta) = map.get("rope_theta") {
            positive(theta, &format!("{prefix}rope_theta"))?;
        }
    }
    Ok(())
}

/// `bos_token_id` and `pad_token_id` a token or null, `eos_token_id` a token or a list of them;
/// the padding token inside the vocabulary (transformers makes it the embedding's padding row;
/// another id past it is only a warning where a format writes it, as GGUF does).
pub(super) fn token_ids(map: &Map<String, Value>, prefix: &str, file: &str, vocab: u64) -> Result<()> {
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
