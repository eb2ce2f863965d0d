//! The MTP head (multi-token prediction): the tensors a complete head has, and whether one is
//! written. Hugging Face Qwen3.5 repositories keep it as `mtp.*` tensors in the main shards;
//! transformers ignores them, llama.cpp's converter builds its next-token layer from them and
//! needs every tensor of the layer the config announces (`mtp_num_hidden_layers`).

use super::tensor::OutputTensor;
use crate::warning::{Warning, WarningCode};
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};

/// What to do with an MTP head (`--mtp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MtpMode {
    /// Keep a complete head; drop, with a warning, one that cannot be used.
    #[default]
    Auto,
    /// Keep the head as it is, complete or not.
    Keep,
    /// Write no head, and set the config's MTP layer count to 0.
    Drop,
}

impl MtpMode {
    /// The value of `--mtp` that asks for this mode.
    pub fn name(self) -> &'static str {
        match self {
            MtpMode::Auto => "auto",
            MtpMode::Keep => "keep",
            MtpMode::Drop => "drop",
        }
    }
}

/// Whether an output name belongs to the MTP head.
pub fn is_mtp(name: &str) -> bool {
    name.starts_with("mtp.")
}

/// The number of MTP layers `config` announces (0 when it announces none).
pub fn declared_layers(config: Option<&Value>) -> u64 {
    let read = |c: &Value| c.get("mtp_num_hidden_layers").and_then(Value::as_u64);
    config.and_then(|c| c.get("text_config").and_then(read).or_else(|| read(c))).unwrap_or(0)
}

/// `mtp.<leaf>.weight` of the head itself.
const HEAD: &[&str] = &["fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"];
/// `mtp.layers.<i>.<leaf>.weight` of every MTP layer (full attention).
const LAYER: &[&str] = &[
    "input_layernorm",
    "post_attention_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "self_attn.q_norm",
    "self_attn.k_norm",
];
const DENSE_MLP: &[&str] = &["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"];
const MOE_MLP: &[&str] = &[
    "mlp.gate",
    "mlp.shared_expert.gate_proj",
    "mlp.shared_expert.up_proj",
    "mlp.shared_expert.down_proj",
    "mlp.shared_expert_gate",
];

/// The tensors (Hugging Face names) a complete head of the layers `config` announces lacks among
/// `names`.
pub fn missing(names: &HashSet<&str>, config: Option<&Value>) -> Vec<String> {
    let text = config.map(|c| c.get("text_config").unwrap_or(c));
    let experts = text.and_then(|t| t.get("num_experts")).and_then(Value::as_u64).unwrap_or(0);
    let has = |n: &str| names.contains(n);
    let mut out: Vec<String> = HEAD.iter().map(|n| format!("mtp.{n}.weight")).filter(|n| !has(n)).collect();
    // The config's count is only a claim, and so is a layer index in a name: only the layers that
    // hold a tensor are looked at leaf by leaf; the announced layers between them that hold none
    // are named as ranges, never enumerated (a count of 10^15, or a stray `mtp.layers.3999999999`,
    // must not build billions of names).
    let declared = declared_layers(config);
    let present: BTreeSet<u64> = names.iter().filter_map(|n| mtp_layer(n)).filter(|&l| l < declared).collect();
    let mut next = 0;
    for &i in present.iter().chain(std::iter::once(&declared)) {
        match i - next {
            0 => {}
            1 => out.push(format!("mtp.layers.{next}")),
            _ => out.push(format!("mtp.layers.{next} to mtp.layers.{}", i - 1)),
        }
        next = i + 1;
        if i == declared {
            break;
        }
        let l = format!("mtp.layers.{i}");
        let mlp = if experts == 0 { DENSE_MLP } else { MOE_MLP };
        out.extend(LAYER.iter().chain(mlp).map(|leaf| format!("{l}.{leaf}.weight")).filter(|n| !has(n)));
        if experts > 0 {
            // Routed experts: fused, or one module per expert.
            let fused = ["gate_up_proj", "down_proj"].iter().all(|p| has(&format!("{l}.mlp.experts.{p}")));
            let split = (0..experts).all(|e| {
                ["gate_proj", "up_proj", "down_proj"].iter().all(|p| has(&format!("{l}.mlp.experts.{e}.{p}.weight")))
            });
            if !fused && !split {
                out.push(format!("{l}.mlp.experts (the routed experts)"));
            }
        }
    }
    out
}

/// The MTP layer index of a Hugging Face name `mtp.layers.<i>.…`.
fn mtp_layer(name: &str) -> Option<u64> {
    name.strip_prefix("mtp.layers.")?.split('.').next()?.parse().ok()
}

/// Applies `mode` to the output tensors of a checkpoint with config `config`; says what was
/// dropped or kept incomplete in `warnings`.
pub fn apply(mode: MtpMode, tensors: &mut Vec<OutputTensor>, config: Option<&Value>, warnings: &mut Vec<Warning>) {
    let count = tensors.iter().filter(|t| is_mtp(&t.name)).count();
    if count == 0 {
        return;
    }
    let names: HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let lacking = if declared_layers(config) == 0 {
        vec!["a layer count (the config's mtp_num_hidden_layers is 0 or absent)".to_string()]
    } else {
        missing(&names, config)
    };
    let summary = |v: &[String]| {
        let shown: Vec<&str> = v.iter().take(3).map(String::as_str).collect();
        format!(
            "{}{}",
            shown.join(", "),
            if v.len() > 3 { format!(" and {} more", v.len() - 3) } else { String::new() }
        )
    };
    match mode {
        MtpMode::Keep if !lacking.is_empty() => warnings.push(Warning::new(WarningCode::MtpIncompleteKept, format!(
            "kept an incomplete MTP head ({count} tensors; it lacks {}): clients that build the layer from the config fail on it",
            summary(&lacking)
        ))),
        MtpMode::Keep => {}
        MtpMode::Auto if lacking.is_empty() => {}
        MtpMode::Auto | MtpMode::Drop => {
            if mode == MtpMode::Auto {
                warnings.push(Warning::new(WarningCode::MtpDropped, format!(
                    "dropped the MTP head ({count} tensors): it lacks {}, so no client could use it (--mtp keep writes it anyway)",
                    summary(&lacking)
                )));
            }
            tensors.retain(|t| !is_mtp(&t.name));
        }
    }
}

/// Sets the config's MTP layer count to 0, wherever it is given.
pub fn clear_declared_layers(config: &mut Value) {
    if let Some(v) = config.get_mut("mtp_num_hidden_layers") {
        *v = Value::from(0);
    }
    if let Some(v) = config.get_mut("text_config").and_then(|t| t.get_mut("mtp_num_hidden_layers")) {
        *v = Value::from(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(layers: u64) -> Value {
        serde_json::json!({"text_config": {"mtp_num_hidden_layers": layers}})
    }

    #[test]
    fn layers_announced_or_named_are_never_enumerated() {
        let mut names: Vec<String> = HEAD.iter().map(|n| format!("mtp.{n}.weight")).collect();
        names.extend(LAYER.iter().chain(DENSE_MLP).map(|leaf| format!("mtp.layers.0.{leaf}.weight")));
        names.push("mtp.layers.3999999999.input_layernorm.weight".into());
        let set: HashSet<&str> = names.iter().map(String::as_str).collect();
        assert!(missing(&set, Some(&config(1))).is_empty());
        let huge = missing(&set, Some(&config(1_000_000_000_000_000)));
        let lacking = |l: u64| {
            LAYER
                .iter()
                .chain(DENSE_MLP)
                .map(move |leaf| format!("mtp.layers.{l}.{leaf}.weight"))
                .filter(|n| n != "mtp.layers.3999999999.input_layernorm.weight")
        };
        let want: Vec<String> = ["mtp.layers.1 to mtp.layers.3999999998".to_string()]
            .into_iter()
            .chain(lacking(3_999_999_999))
            .chain(["mtp.layers.4000000000 to mtp.layers.999999999999999".to_string()])
            .collect();
        assert_eq!(huge, want);
        assert_eq!(missing(&set, Some(&config(3))), ["mtp.layers.1 to mtp.layers.2"]);
        assert_eq!(missing(&set, Some(&config(2))), ["mtp.layers.1"]);
    }
}
