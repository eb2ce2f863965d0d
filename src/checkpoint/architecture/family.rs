//! Which text model config.json names: its `model_type` (of the text part, or of the whole
//! config), held to the top level's and to the classes `architectures` lists.

use super::keys::Keys;
use anyhow::{bail, Result};
use serde_json::{Map, Value};

/// The text models this tool knows: transformers' `model_type` of the whole model and of its text
/// part, and the family each is.
pub(super) const MODEL_TYPES: &[(&str, Family)] = &[
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

/// The family config.json names: `model_type` of the text part (or of the whole config), which
/// must agree with the top level's and with the `architectures` it lists.
pub(super) fn family(keys: &Keys) -> Result<(String, Family)> {
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
