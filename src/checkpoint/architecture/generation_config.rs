//! `generation_config.json`, held to what transformers validates when it loads a model.

use super::client_keys::token_ids;
use super::keys::excerpt;
use anyhow::{bail, Result};
use serde_json::Value;

/// What `generation_config.json` holds that transformers validates when it loads a model: the token
/// ids, and lengths and counts that are whole numbers (`max_new_tokens` at least 1).
pub(super) fn check_generation_config(text: &str, vocab: u64) -> Result<()> {
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
