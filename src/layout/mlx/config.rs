//! The config.json of an MLX output, and what it says of the tensors: mlx-lm's `model_type`, the
//! `quantization` map of every module's width and group size, the index's parameter count, and
//! the fragment a tensors-only output holds for the user to merge into the model's own config.

use super::options::MlxOptions;
use super::tensors::is_router;
use crate::checkpoint::architecture::{Family as ModelFamily, TextModel};
use crate::layout::tensor::{Encoding, OutputTensor};
use crate::quant::affine::AffineSpec;
use serde_json::{json, Map, Value};

/// The config fragment a tensors-only output holds: the keys mlx-lm needs beyond the model's own
/// config.json.
pub(super) const QUANTIZATION_FILE: &str = "quantization.json";

/// How a tensors-only output becomes loadable: one shell line, run as written.
pub(super) const TENSORS_ONLY_STEP: &str = "copy the model's own config.json and tokenizer files into OUT, then merge \
     quantization.json (each module's width and group size, which mlx-lm reads) into config.json: cd OUT && \
     python3 -c \"import json; c = json.load(open('config.json')); c.update(json.load(open('quantization.json'))); \
     json.dump(c, open('config.json', 'w'), indent=4)\"";

/// The keys [`QUANTIZATION_FILE`] gives config.json: `quantization` and `quantization_config` as
/// [`config_json`] writes them, and the `model_type` of the module the tensors are laid out for
/// (the family from their names, as [`family`](super::tensors::family) reads them without a config).
pub(super) fn config_fragment(tensors: &[OutputTensor], opts: MlxOptions) -> Value {
    let moe = is_moe(tensors);
    let model_type = match (tensors.iter().any(|t| t.name.starts_with("language_model.")), moe) {
        (true, false) => ModelFamily::Dense,
        (true, true) => ModelFamily::Moe,
        (false, _) => ModelFamily::Next,
    };
    let q = quantization(tensors, opts, moe);
    json!({ "model_type": mlx_model_type(model_type), "quantization": q, "quantization_config": q })
}

/// mlx-lm's module for a model family: the `model_type` the MLX config.json names.
fn mlx_model_type(family: ModelFamily) -> &'static str {
    match family {
        ModelFamily::Dense => "qwen3_5",
        ModelFamily::Moe => "qwen3_5_moe",
        ModelFamily::Next => "qwen3_next",
    }
}

/// The module path (MLX name without `.weight`) and setting of every quantized module.
pub fn quantized_modules(tensors: &[OutputTensor]) -> Vec<(String, AffineSpec)> {
    tensors
        .iter()
        .filter_map(|t| {
            let spec = match &t.recipe.as_ref()?.encoding {
                Encoding::Affine { spec, .. } => *spec,
                Encoding::Int8Affine { group_size, .. } => AffineSpec { bits: 8, group_size: *group_size },
                _ => return None,
            };
            Some((t.name.strip_suffix(".weight")?.to_string(), spec))
        })
        .collect()
}

/// `config.json`'s `quantization`: the run's defaults plus one entry per module that differs
/// (and, as mlx-lm writes them, every `MoE` router).
pub fn quantization(tensors: &[OutputTensor], opts: MlxOptions, moe: bool) -> Value {
    let mut q = Map::new();
    q.insert("group_size".into(), json!(opts.spec.group_size));
    q.insert("bits".into(), json!(opts.spec.bits));
    q.insert("mode".into(), json!("affine"));
    for (path, spec) in quantized_modules(tensors) {
        if spec != opts.spec || (moe && is_router(&path)) {
            q.insert(path, json!({ "group_size": spec.group_size, "bits": spec.bits }));
        }
    }
    Value::Object(q)
}

/// The MLX `config.json`: the input config without Escha's `quantization_config`,
/// `_name_or_path` and `vision_config` (as mlx-lm's `save_config` drops them), with identical
/// `quantization` and `quantization_config`, top-level keys sorted. `model_type` names the module
/// mlx-lm builds the family with (exllamav3's text-only `qwen3_5_text` is no module of mlx-lm's),
/// and the text model's keys stand where that module reads them: `text_config` or the top level
/// for Qwen3.5, the top level for Qwen3-Next.
pub fn config_json(config: &Value, quantization: Value) -> Value {
    let Some(obj) = config.as_object() else { return config.clone() };
    let family = TextModel::from_config(config).ok().map(|m| m.family);
    let mut out: Map<String, Value> = obj
        .iter()
        .filter(|(k, v)| {
            let dropped =
                matches!(k.as_str(), "quantization_config" | "quantization" | "_name_or_path" | "vision_config");
            // A null `text_config` is a flat config to the model check, and a crash to mlx-lm.
            let text = k.as_str() == "text_config" && v.is_null();
            !dropped && !text
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(family) = family {
        out.insert("model_type".into(), json!(mlx_model_type(family)));
    }
    out.insert("quantization".into(), quantization.clone());
    out.insert("quantization_config".into(), quantization);
    let mut out: Vec<(String, Value)> = out.into_iter().collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Value::Object(out.into_iter().collect())
}

/// The index's `total_parameters` as mlx-lm counts them: a quantized module counts its
/// unpacked weight (`packed·32/bits`), scales and biases count nothing, the parameters of leaf
/// modules their elements.
pub fn total_parameters(tensors: &[OutputTensor]) -> u64 {
    tensors
        .iter()
        .map(|t| match t.recipe.as_ref().map(|r| &r.encoding) {
            // mlx-lm counts leaf modules only: the GDN block's own parameters are left out.
            Some(Encoding::Float | Encoding::Bytes) if t.name.ends_with(".A_log") || t.name.ends_with(".dt_bias") => 0,
            _ => t.weights(),
        })
        .sum()
}

/// Whether the layout has `MoE` routers (for [`quantization`]).
pub fn is_moe(tensors: &[OutputTensor]) -> bool {
    tensors.iter().any(|t| t.name.contains(".switch_mlp."))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `model_type` the model check accepts becomes mlx-lm's module, its keys where that
    /// module reads them.
    #[test]
    fn model_type_is_mlx_lms_module() {
        let q = json!({"group_size": 64, "bits": 4, "mode": "affine"});
        // Read when the test runs: the Metal type-check builds the tests without the fixtures.
        let read = |f: &str| -> Value {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(f).join("config.json");
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        };
        let (dense, moe) = (read("dense"), read("moe"));
        for (c, want) in [(&dense, "qwen3_5"), (&moe, "qwen3_5_moe")] {
            assert_eq!(config_json(c, q.clone())["model_type"], want);
            // exllamav3's text-only config: flat, `qwen3_5_text` / `qwen3_5_moe_text`.
            let flat = c["text_config"].clone();
            assert!(flat["model_type"].as_str().unwrap().ends_with("_text"));
            let out = config_json(&flat, q.clone());
            assert_eq!(out["model_type"], want);
            assert_eq!(out["hidden_size"], 128);
            let mut null_text = flat.clone();
            null_text["text_config"] = Value::Null;
            assert!(config_json(&null_text, q.clone()).get("text_config").is_none());
        }
        // Qwen3-Next is flat (mlx-lm's qwen3_next reads the top level only): the model check
        // refuses it nested, and a flat one keeps its keys where they stand.
        let mut next = moe["text_config"].clone();
        next["model_type"] = json!("qwen3_next");
        let mut nested = moe.clone();
        nested["model_type"] = json!("qwen3_next");
        assert!(TextModel::from_config(&nested).is_err());
        let out = config_json(&next, q);
        assert_eq!(out["model_type"], "qwen3_next");
        assert_eq!(out["num_experts"], moe["text_config"]["num_experts"]);
    }

    #[test]
    fn config_is_sorted_and_carries_both_copies() {
        let c = json!({"model_type": "qwen3_5", "vision_config": {}, "quantization_config": {"quant_method": "escha"}, "architectures": ["x"]});
        let q = json!({"group_size": 64, "bits": 4, "mode": "affine"});
        let out = config_json(&c, q.clone());
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["architectures", "model_type", "quantization", "quantization_config"]);
        assert_eq!(out["quantization"], q);
        assert_eq!(out["quantization_config"], q);
    }
}
