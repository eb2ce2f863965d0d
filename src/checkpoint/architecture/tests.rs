use super::expected::layer_tensors;
use super::family::Family;
use super::model::{LayerType, TextModel};
use serde_json::json;
use serde_json::Value;

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

#[test]
fn rotary_scaling_is_read_where_mlx_lm_reads_it_and_bounded() {
    let with = |key: &str, rope: Value| {
        let mut c = qwen3_next();
        c[key] = rope;
        TextModel::from_config(&c).map(|_| ()).map_err(|e| e.to_string())
    };
    let yarn = json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024});
    assert_eq!(with("rope_scaling", yarn.clone()), Ok(()));
    // Qwen3-Next's mlx-lm model reads rope_scaling only.
    let e = with("rope_parameters", yarn).unwrap_err();
    assert!(e.contains("mlx-lm") && e.contains("rope_scaling"), "{e}");
    // head_dim 64, a quarter rotated: 8 factors each.
    let factors = |n: usize| json!(vec![1.0; n]);
    let longrope = |n| {
        json!({"type": "longrope", "original_max_position_embeddings": 1024,
                              "short_factor": factors(n), "long_factor": factors(8)})
    };
    assert_eq!(with("rope_scaling", longrope(8)), Ok(()));
    assert!(with("rope_scaling", longrope(7)).unwrap_err().contains("short_factor"));
    let llama3 = json!({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1024,
                        "low_freq_factor": 4.0, "high_freq_factor": 4.0});
    assert!(with("rope_scaling", llama3).unwrap_err().contains("high_freq_factor"));
    let disagree = json!({"rope_type": "yarn", "type": "linear", "factor": 2.0});
    assert!(with("rope_scaling", disagree).unwrap_err().contains("rope_scaling.type"));
}
