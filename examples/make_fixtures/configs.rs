//! The JSON side of a checkpoint: config.json, the side files, the tokenizer, layer metadata.

use super::{
    CONV_KERNEL, EXPERTS, EXPERTS_PER_TOK, HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE, KV_HEADS, LAYERS, LIN_K_DIM,
    LIN_K_HEADS, LIN_V_DIM, LIN_V_HEADS, MOE_INTERMEDIATE, SHARED_INTERMEDIATE, VOCAB,
};
use crate::files::write_json;
use crate::linears::is_linear_layer;
use anyhow::Result;
use serde_json::{json, Value};
use std::path::Path;

fn layer_types() -> Vec<&'static str> {
    (0..LAYERS).map(|i| if is_linear_layer(i) { "linear_attention" } else { "full_attention" }).collect()
}

fn text_config(moe: bool) -> Value {
    let mut c = json!({
        "model_type": if moe { "qwen3_5_moe_text" } else { "qwen3_5_text" },
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "layer_types": layer_types(),
        "full_attention_interval": 4,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "attn_output_gate": true,
        "linear_num_key_heads": LIN_K_HEADS,
        "linear_key_head_dim": LIN_K_DIM,
        "linear_num_value_heads": LIN_V_HEADS,
        "linear_value_head_dim": LIN_V_DIM,
        "linear_conv_kernel_dim": CONV_KERNEL,
        "vocab_size": VOCAB,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10]
        },
        "max_position_embeddings": 4096,
        "mtp_num_hidden_layers": 1,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2
    });
    if moe {
        let m = c.as_object_mut().unwrap();
        for (k, v) in [
            ("num_experts", json!(EXPERTS)),
            ("num_experts_per_tok", json!(EXPERTS_PER_TOK)),
            ("moe_intermediate_size", json!(MOE_INTERMEDIATE)),
            ("shared_expert_intermediate_size", json!(SHARED_INTERMEDIATE)),
            ("decoder_sparse_step", json!(1)),
            ("norm_topk_prob", json!(true)),
            ("mlp_only_layers", json!([])),
            ("router_aux_loss_coef", json!(0.001)),
            ("output_router_logits", json!(false)),
        ] {
            m.insert(k.into(), v);
        }
    }
    c
}

fn vision_config() -> Value {
    json!({
        "model_type": "qwen3_5",
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": HIDDEN,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
        "hidden_act": "gelu_pytorch_tanh",
        "deepstack_visual_indexes": []
    })
}

/// config.json of the base model; `quant` is appended as `quantization_config` when given.
pub fn model_config(moe: bool, quant: Option<Value>) -> Value {
    let mut c = json!({
        "architectures": [if moe { "Qwen3_5MoeForConditionalGeneration" } else { "Qwen3_5ForConditionalGeneration" }],
        "model_type": if moe { "qwen3_5_moe" } else { "qwen3_5" },
        "text_config": text_config(moe),
        "vision_config": vision_config(),
        "tie_word_embeddings": false,
        "transformers_version": "5.8.0"
    });
    if let Some(q) = quant {
        c.as_object_mut().unwrap().insert("quantization_config".into(), q);
    }
    c
}

pub fn fp8_quant_config() -> Value {
    json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
}

pub fn write_side_files(dir: &Path, quant_method: &str) -> Result<()> {
    write_json(
        &dir.join("generation_config.json"),
        &json!({"bos_token_id": 1, "eos_token_id": [2], "pad_token_id": 0, "do_sample": true,
                "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "5.8.0"}),
    )?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 4096, "bos_token": null,
                "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": false,
                "chat_template": CHAT_TEMPLATE}),
    )?;
    write_json(&dir.join("tokenizer.json"), &tokenizer())?;
    // Must never be copied into a converted output (tools treat it as proof of an Escha checkpoint).
    write_json(
        &dir.join("quantize_config.json"),
        &json!({"quant_method": quant_method, "format_version": "2.0",
                "global_config": {"codebook": "cbA", "bits": 2.0}}),
    )
}

/// A `ChatML` template, as Qwen's tokenizers carry (shortened).
const CHAT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The split pattern of Qwen3.5's tokenizer.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A byte-level BPE tokenizer shaped like Qwen3.5's (its pre-tokenizer, normalizer, added tokens),
/// small enough for the fixtures' 256-entry vocabulary: 232 byte tokens, 16 merges, five added
/// tokens (three special), and ids 253–255 unused.
fn tokenizer() -> Value {
    // GPT-2's byte-to-character map: printable bytes stand for themselves, the rest from U+0100 on.
    let mut printable: Vec<u32> = (0x21..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars: Vec<char> = printable.iter().map(|&b| char::from_u32(b).unwrap()).collect();
    let mut next = 0x100;
    for b in 0..=255u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(char::from_u32(next).unwrap());
            next += 1;
        }
    }
    let mut vocab = serde_json::Map::new();
    for (id, c) in chars.iter().take(232).enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    let merges = [
        ("Ġ", "t"),
        ("h", "e"),
        ("Ġt", "he"),
        ("Ġ", "a"),
        ("i", "n"),
        ("e", "r"),
        ("o", "n"),
        ("Ġ", "s"),
        ("r", "e"),
        ("a", "t"),
        ("e", "n"),
        ("Ġ", "w"),
        ("o", "r"),
        ("Ġ", "c"),
        ("i", "s"),
        ("Ġ", "o"),
    ];
    for (i, (a, b)) in merges.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(232 + i));
    }
    let added = |id: usize, content: &str, special: bool| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": special})
    };
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            added(248, "<|endoftext|>", true), added(249, "<|im_start|>", true), added(250, "<|im_end|>", true),
            added(251, "<think>", false), added(252, "</think>", false),
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_SPLIT}, "behavior": "Isolated", "invert": false},
            byte_level.clone(),
        ]},
        "post_processor": byte_level.clone(),
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>()},
    })
}

pub fn layer_meta_entry(k: u32, bits: f64, ic: usize, oc: usize) -> Value {
    json!({"K": k, "bits": bits, "in_features": ic, "out_features": oc})
}
