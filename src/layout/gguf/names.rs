//! Hugging Face Qwen3.5 names → llama.cpp's GGUF names (`qwen35`, `qwen35moe`), with the value
//! transform llama.cpp's converter applies to each: the zero-centred norms get their 1 added
//! (`linear_attn.norm` is stored plain), `A_log` becomes `ssm_a = −exp(A_log)`. MTP tensors become
//! the next-token layers after the last transformer block.

use crate::layout::Adjust;

/// An output name and the transform of its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub name: String,
    pub adjust: Adjust,
}

/// Layer leaves (after `layers.N.`), HF → GGUF, without the `.weight` suffix.
const LAYER: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "post_attention_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("linear_attn.in_proj_qkv", "attn_qkv"),
    ("linear_attn.in_proj_z", "attn_gate"),
    ("linear_attn.in_proj_a", "ssm_alpha"),
    ("linear_attn.in_proj_b", "ssm_beta"),
    ("linear_attn.conv1d", "ssm_conv1d"),
    ("linear_attn.norm", "ssm_norm"),
    ("linear_attn.out_proj", "ssm_out"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("mlp.gate", "ffn_gate_inp"),
    ("mlp.shared_expert.gate_proj", "ffn_gate_shexp"),
    ("mlp.shared_expert.up_proj", "ffn_up_shexp"),
    ("mlp.shared_expert.down_proj", "ffn_down_shexp"),
    ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
    ("mlp.experts.gate_proj", "ffn_gate_exps"),
    ("mlp.experts.up_proj", "ffn_up_exps"),
    ("mlp.experts.down_proj", "ffn_down_exps"),
];

/// The MTP head's own tensors (`mtp.<leaf>.weight`) as leaves of its first next-token layer.
const MTP_HEAD: &[(&str, &str)] = &[
    ("fc", "nextn.eh_proj"),
    ("pre_fc_norm_embedding", "nextn.enorm"),
    ("pre_fc_norm_hidden", "nextn.hnorm"),
    ("norm", "nextn.shared_head_norm"),
];

/// The fused expert tensor that becomes `ffn_gate_exps` and `ffn_up_exps` (its first and second
/// half of rows).
pub const FUSED_GATE_UP: &str = "mlp.experts.gate_up_proj";

/// The GGUF name of HF tensor `name` in a model of `layers` transformer blocks, or `None` for a
/// name llama.cpp has no place for.
pub fn map(name: &str, layers: u64) -> Option<Mapped> {
    let (gguf, hf_leaf) = if let Some(rest) = name.strip_prefix("mtp.") {
        if let Some(rest) = rest.strip_prefix("layers.") {
            let (i, leaf) = rest.split_once('.')?;
            let block = layers.checked_add(i.parse::<u64>().ok()?)?;
            (format!("blk.{block}.{}", layer_leaf(leaf)?), leaf.to_string())
        } else {
            let (head, suffix) = rest.split_once('.')?;
            let (_, g) = MTP_HEAD.iter().find(|(h, _)| *h == head)?;
            (format!("blk.{layers}.{g}.{suffix}"), format!("{g}.{suffix}"))
        }
    } else {
        let rest = name.strip_prefix("model.language_model.").or_else(|| name.strip_prefix("model.")).unwrap_or(name);
        match rest {
            "embed_tokens.weight" => ("token_embd.weight".into(), rest.into()),
            "norm.weight" => ("output_norm.weight".into(), rest.into()),
            "lm_head.weight" => ("output.weight".into(), rest.into()),
            _ => {
                let (n, leaf) = rest.strip_prefix("layers.")?.split_once('.')?;
                let block: u64 = n.parse().ok()?;
                (format!("blk.{block}.{}", layer_leaf(leaf)?), leaf.to_string())
            }
        }
    };
    let plus_one = hf_leaf.ends_with("norm.weight") && !hf_leaf.ends_with("linear_attn.norm.weight");
    let neg_exp = hf_leaf.ends_with("A_log");
    Some(Mapped { name: gguf, adjust: Adjust { plus_one, neg_exp, ..Adjust::default() } })
}

/// A layer leaf (`self_attn.q_proj.weight`, `linear_attn.A_log`) in GGUF form.
fn layer_leaf(leaf: &str) -> Option<String> {
    match leaf {
        "linear_attn.A_log" => return Some("ssm_a".into()),
        "linear_attn.dt_bias" => return Some("ssm_dt.bias".into()),
        _ => {}
    }
    let (module, suffix) = match leaf.rsplit_once('.') {
        Some((m, s @ ("weight" | "bias"))) => (m, s),
        // Fused expert parameters carry no suffix in HF names.
        _ => (leaf, "weight"),
    };
    let (_, g) = LAYER.iter().find(|(h, _)| *h == module)?;
    Some(format!("{g}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(hf: &str) -> String {
        map(hf, 4).unwrap().name
    }

    #[test]
    fn names_follow_llama_cpp() {
        let l = "model.language_model.layers.2";
        assert_eq!(name(&format!("{l}.linear_attn.in_proj_qkv.weight")), "blk.2.attn_qkv.weight");
        assert_eq!(name(&format!("{l}.linear_attn.A_log")), "blk.2.ssm_a");
        assert_eq!(name(&format!("{l}.linear_attn.dt_bias")), "blk.2.ssm_dt.bias");
        assert_eq!(name(&format!("{l}.mlp.experts.down_proj")), "blk.2.ffn_down_exps.weight");
        assert_eq!(name("lm_head.weight"), "output.weight");
        assert_eq!(name("mtp.fc.weight"), "blk.4.nextn.eh_proj.weight");
        assert_eq!(name("mtp.layers.0.self_attn.q_proj.weight"), "blk.4.attn_q.weight");
        assert!(map("model.visual.blocks.0.weight", 4).is_none());
    }

    #[test]
    fn transforms_follow_llama_cpp() {
        let l = "model.language_model.layers.0";
        assert!(map(&format!("{l}.input_layernorm.weight"), 4).unwrap().adjust.plus_one);
        assert!(map(&format!("{l}.self_attn.q_norm.weight"), 4).unwrap().adjust.plus_one);
        assert!(!map(&format!("{l}.linear_attn.norm.weight"), 4).unwrap().adjust.plus_one);
        assert!(map("mtp.pre_fc_norm_hidden.weight", 4).unwrap().adjust.plus_one);
        assert!(map("mtp.norm.weight", 4).unwrap().adjust.plus_one);
        assert!(map(&format!("{l}.linear_attn.A_log"), 4).unwrap().adjust.neg_exp);
    }
}
