//! What a tensor name says about where it sits: its layer, its projection kind, a short label,
//! and the order the kinds are listed in.

use crate::layout::mtp::is_mtp;

/// The layer index of `…layers.N.…`.
pub fn layer_of(name: &str) -> Option<usize> {
    let mut rest = name;
    while let Some(i) = rest.find("layers.") {
        let boundary = i == 0 || rest.as_bytes()[i - 1] == b'.';
        let tail = &rest[i + 7..];
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        if boundary && digits > 0 && matches!(tail.as_bytes().get(digits), None | Some(b'.')) {
            return tail[..digits].parse().ok();
        }
        rest = &rest[i + 7..];
    }
    None
}

/// The projection kind: what follows `layers.N.<block>.` without `.weight` (`q_proj`,
/// `experts.gate_up_proj`, `shared_expert.up_proj`, …); the whole name when there is no layer.
pub fn kind_of(name: &str) -> String {
    let name = name.strip_suffix(".weight").unwrap_or(name);
    let Some(layer) = layer_of(name) else { return name.to_string() };
    let marker = format!("layers.{layer}.");
    let rest = name.find(&marker).map_or(name, |i| &name[i + marker.len()..]);
    match rest.split_once('.') {
        Some((_, inner)) => inner.to_string(),
        None => rest.to_string(),
    }
}

/// A short row label: `L3 self_attn.q_norm` for layer tensors (`MTP L0 input_layernorm` for the
/// MTP head's, which are not the model's layer 0), the name without `.weight` otherwise.
pub fn short_label(name: &str) -> String {
    let trimmed = name.strip_suffix(".weight").unwrap_or(name);
    let head = if is_mtp(trimmed) { "MTP " } else { "" };
    let label = match layer_of(trimmed) {
        Some(l) => {
            let marker = format!("layers.{l}.");
            match trimmed.find(&marker) {
                Some(i) => format!("{head}L{l} {}", &trimmed[i + marker.len()..]),
                None => trimmed.to_string(),
            }
        }
        None => trimmed.to_string(),
    };
    if label.chars().count() > 44 {
        let head: String = label.chars().take(43).collect();
        format!("{head}…")
    } else {
        label
    }
}

/// Projection kinds in the order a layer computes them; others follow, alphabetically.
const KIND_ORDER: [&str; 18] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_b",
    "in_proj_a",
    "out_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "experts.gate_up_proj",
    "experts.down_proj",
    "shared_expert.gate_proj",
    "shared_expert.up_proj",
    "shared_expert.down_proj",
    "shared_expert_gate",
];

/// A sort key for a projection kind.
pub fn kind_rank(kind: &str) -> (usize, String) {
    (KIND_ORDER.iter().position(|k| *k == kind).unwrap_or(KIND_ORDER.len()), kind.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_and_kind_come_from_the_name() {
        let n = "model.language_model.layers.12.self_attn.q_proj.weight";
        assert_eq!(layer_of(n), Some(12));
        assert_eq!(kind_of(n), "q_proj");
        assert_eq!(kind_of("model.language_model.layers.0.mlp.experts.gate_up_proj"), "experts.gate_up_proj");
        assert_eq!(kind_of("model.layers.3.mlp.shared_expert.down_proj.weight"), "shared_expert.down_proj");
        assert_eq!(layer_of("model.sublayers.3.x"), None);
        assert_eq!(layer_of("layers.7x.a"), None);
        assert_eq!(layer_of("lm_head.weight"), None);
        assert_eq!(kind_of("lm_head.weight"), "lm_head");
        assert_eq!(short_label("model.layers.3.self_attn.q_norm.weight"), "L3 self_attn.q_norm");
        // The MTP head's layer is not the model's layer 0.
        let l0 = "model.language_model.layers.0.input_layernorm.weight";
        assert_eq!(short_label(l0), "L0 input_layernorm");
        assert_eq!(short_label("mtp.layers.0.input_layernorm.weight"), "MTP L0 input_layernorm");
        assert_eq!(short_label("mtp.norm.weight"), "mtp.norm");
    }
}
