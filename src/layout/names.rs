//! Naming rules shared by the layouts: which tensors are norms, and the model order of names.

/// How a Hugging Face Qwen3.5 `RMSNorm` weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `w − 1`, applied as `x̂·(1 + w)`: input/post-attention layernorms, q/k norms, the final
    /// norm and the MTP norms.
    ZeroCentred,
    /// `w`, applied as `x̂·w`: the gated `linear_attn.norm` of GDN blocks.
    Plain,
}

/// The kind of norm a tensor name is (HF names), or `None` when it is not a norm.
pub fn norm_kind(name: &str) -> Option<NormKind> {
    if name.ends_with("linear_attn.norm.weight") {
        Some(NormKind::Plain)
    } else if name.ends_with("norm.weight") || name.contains("_norm_") && name.ends_with(".weight") {
        Some(NormKind::ZeroCentred)
    } else {
        None
    }
}

/// Sort key that orders `layers.10` after `layers.9`, so shards follow the model's order.
pub fn natural_key(name: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(mut n) = c.to_digit(10).map(u64::from) {
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n.saturating_mul(10).saturating_add(d as u64);
                chars.next();
            }
            key.push((std::mem::take(&mut text), n));
        } else {
            text.push(c);
        }
    }
    key.push((text, u64::MAX));
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_kinds_follow_the_hf_qwen35_convention() {
        let l = "model.language_model.layers.3";
        for n in ["input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"] {
            assert_eq!(norm_kind(&format!("{l}.{n}.weight")), Some(NormKind::ZeroCentred), "{n}");
        }
        assert_eq!(norm_kind("model.language_model.norm.weight"), Some(NormKind::ZeroCentred));
        assert_eq!(norm_kind("mtp.pre_fc_norm_embedding.weight"), Some(NormKind::ZeroCentred));
        assert_eq!(norm_kind(&format!("{l}.linear_attn.norm.weight")), Some(NormKind::Plain));
        assert_eq!(norm_kind(&format!("{l}.linear_attn.conv1d.weight")), None);
    }

    #[test]
    fn natural_order() {
        let mut v = ["layers.10.a", "layers.9.a", "layers.1.b", "layers.1.a"];
        v.sort_by_cached_key(|n| natural_key(n));
        assert_eq!(v, ["layers.1.a", "layers.1.b", "layers.9.a", "layers.10.a"]);
    }
}
