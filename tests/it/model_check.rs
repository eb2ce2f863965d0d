//! The one check of config.json against the tensors, for every format: a config that contradicts
//! the tensors, a key missing or of the wrong type, a plain tensor of the wrong shape, rank or
//! dtype, a deleted or stray tensor, or no config at all: exit 1 (`input_refused`), one line
//! naming the key or tensor, nothing written, whatever the format.

use crate::common::{copy_tree, escha_convert, fixture, stderr};
use crate::synth::{read_safetensors, write_safetensors, T};
use serde_json::Value;
use std::path::{Path, PathBuf};

const FORMATS: [&str; 4] = ["bf16", "mlx", "gguf", "exl3"];
const L: &str = "model.language_model.layers";

/// A copy of fixture `model` in `tmp/name`.
fn copy(tmp: &Path, name: &str, model: &str) -> PathBuf {
    let dir = tmp.join(name);
    copy_tree(&fixture(model), &dir);
    dir
}

/// `dir` with its config.json edited.
fn with_config(dir: PathBuf, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    dir
}

/// The text config (where Qwen3.5 keeps the model's numbers).
fn text(config: &mut Value) -> &mut serde_json::Map<String, Value> {
    config["text_config"].as_object_mut().unwrap()
}

/// `dir` with the tensors of its main shards edited, written back as one `model.safetensors`
/// (the index and the old shards removed; `mtp/` untouched).
fn with_tensors(dir: PathBuf, edit: impl FnOnce(&mut Vec<T>)) -> PathBuf {
    let mut tensors = Vec::new();
    let shards: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    for shard in &shards {
        for (name, (dtype, shape, data)) in read_safetensors(shard) {
            tensors.push(T::new(&name, Box::leak(dtype.into_boxed_str()), &shape, data));
        }
        std::fs::remove_file(shard).unwrap();
    }
    let _ = std::fs::remove_file(dir.join("model.safetensors.index.json"));
    edit(&mut tensors);
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    dir
}

fn tensor<'a>(ts: &'a mut [T], name: &str) -> &'a mut T {
    ts.iter_mut().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"))
}

/// Converts `input` to every format and requires, for each: exit 1, one error line naming every
/// string of `expect`, `input_refused` in the `--json` document, and nothing written.
fn refused_by_every_format(input: &Path, expect: &[&str]) {
    for format in FORMATS {
        let parent = tempfile::tempdir().unwrap();
        let out = parent.path().join("out");
        let o = escha_convert().arg(input).arg(&out).args(["--format", format, "--json"]).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{format}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{format}: one line: {err}");
        for e in expect {
            assert!(err.contains(e), "{format}: the message should name {e:?}: {err}");
        }
        let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(doc["error"]["code"], "input_refused", "{format}: {doc}");
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0, "{format}: nothing written: {err}");
    }
}

#[test]
fn a_directory_without_config_json_is_refused_by_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    for model in ["dense", "moe"] {
        let dir = copy(tmp.path(), model, model);
        std::fs::remove_file(dir.join("config.json")).unwrap();
        refused_by_every_format(&dir, &[&dir.join("config.json").display().to_string(), "no such file"]);
    }
}

#[test]
fn configs_contradicting_the_tensors_are_refused_by_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        // More layers than the tensors hold.
        (
            with_config(copy(t, "layers-5", "dense"), |c| {
                text(c)["num_hidden_layers"] = 5.into();
                text(c).remove("layer_types");
            }),
            vec!["layer 4", "num_hidden_layers is 5"],
        ),
        // Fewer: layer 3 is a stray.
        (
            with_config(copy(t, "layers-3", "moe"), |c| {
                text(c)["num_hidden_layers"] = 3.into();
                text(c)["layer_types"].as_array_mut().unwrap().pop();
            }),
            vec!["layers.3.", "num_hidden_layers is 3"],
        ),
        (
            with_config(copy(t, "hidden", "moe"), |c| text(c)["hidden_size"] = 256.into()),
            vec!["hidden_size", "[256, 128]", "[256, 256]"],
        ),
        (
            with_config(copy(t, "vocab", "dense"), |c| text(c)["vocab_size"] = 300.into()),
            vec!["vocab_size", "[256, 128]", "[300, 128]"],
        ),
        (
            with_config(copy(t, "heads", "dense"), |c| text(c)["num_attention_heads"] = 2.into()),
            vec!["layers.3.self_attn.", "num_attention_heads"],
        ),
        (
            with_config(copy(t, "kv-heads", "moe"), |c| text(c)["num_key_value_heads"] = 3.into()),
            vec!["num_attention_heads", "num_key_value_heads (3)"],
        ),
        // layer_types against the tensors (layer 3 holds full attention)...
        (
            with_config(copy(t, "layer-types", "dense"), |c| {
                text(c)["layer_types"][3] = "linear_attention".into();
                text(c).remove("full_attention_interval");
            }),
            vec!["layers.3.self_attn.", "layer 3 (linear_attention in config.json)"],
        ),
        // ...and against full_attention_interval, which mlx-lm builds the layers from.
        (
            with_config(copy(t, "interval", "moe"), |c| text(c)["full_attention_interval"] = 2.into()),
            vec!["layer_types[1]", "full_attention_interval 2"],
        ),
        (
            with_config(copy(t, "layer-types-length", "moe"), |c| {
                text(c)["layer_types"].as_array_mut().unwrap().pop();
            }),
            vec!["layer_types has 3 entries", "num_hidden_layers is 4"],
        ),
        (
            with_config(copy(t, "layer-type-name", "dense"), |c| text(c)["layer_types"][0] = "mamba".into()),
            vec!["layer_types[0]", "\"mamba\""],
        ),
        (
            with_config(copy(t, "experts", "moe"), |c| text(c)["num_experts"] = 8.into()),
            vec!["layers.0.mlp.", "num_experts", "[8, 128, 128]"],
        ),
        (
            with_config(copy(t, "experts-used", "moe"), |c| text(c)["num_experts_per_tok"] = 5.into()),
            vec!["num_experts_per_tok is 5", "4 experts"],
        ),
        (
            with_config(copy(t, "moe-width", "moe"), |c| text(c)["moe_intermediate_size"] = 64.into()),
            vec!["mlp.experts.", "moe_intermediate_size"],
        ),
        (
            with_config(copy(t, "linear-heads", "dense"), |c| text(c)["linear_num_value_heads"] = 8.into()),
            vec!["layers.0.linear_attn.", "linear_num_value_heads"],
        ),
        // An untied model without its head.
        (
            with_tensors(copy(t, "no-head", "moe"), |ts| ts.retain(|t| !t.name.starts_with("lm_head."))),
            vec!["no tensor lm_head.weight", "tie_word_embeddings"],
        ),
    ];
    for (input, expect) in cases {
        refused_by_every_format(&input, &expect);
    }
}

#[test]
fn keys_missing_or_of_the_wrong_type_are_refused_by_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (
            with_config(copy(t, "hidden-string", "dense"), |c| text(c)["hidden_size"] = "128".into()),
            vec!["text_config.hidden_size", "\"128\"", "not a whole number"],
        ),
        (
            with_config(copy(t, "hidden-float", "moe"), |c| text(c)["hidden_size"] = 128.5.into()),
            vec!["text_config.hidden_size", "128.5"],
        ),
        (
            with_config(copy(t, "no-vocab", "dense"), |c| {
                text(c).remove("vocab_size");
            }),
            vec!["config.json has no text_config.vocab_size"],
        ),
        (
            with_config(copy(t, "zero-heads", "moe"), |c| text(c)["num_attention_heads"] = 0.into()),
            vec!["text_config.num_attention_heads is 0"],
        ),
        (
            with_config(copy(t, "negative-layers", "dense"), |c| text(c)["num_hidden_layers"] = (-4).into()),
            vec!["text_config.num_hidden_layers is -4"],
        ),
        (
            with_config(copy(t, "tie-string", "dense"), |c| c["tie_word_embeddings"] = "no".into()),
            vec!["tie_word_embeddings", "\"no\""],
        ),
        (
            with_config(copy(t, "layer-types-object", "moe"), |c| text(c)["layer_types"] = serde_json::json!({})),
            vec!["text_config.layer_types", "not a list"],
        ),
        (
            with_config(copy(t, "text-config-list", "dense"), |c| c["text_config"] = serde_json::json!([])),
            vec!["text_config is []"],
        ),
        (
            with_config(copy(t, "eps", "dense"), |c| text(c)["rms_norm_eps"] = "small".into()),
            vec!["text_config.rms_norm_eps"],
        ),
        // transformers' config classes take only a float there (its strict check refuses -1 and "4").
        (
            with_config(copy(t, "init-int", "dense"), |c| text(c)["initializer_range"] = (-1).into()),
            vec!["text_config.initializer_range is -1", "transformers"],
        ),
        (
            with_config(copy(t, "init-top-str", "moe"), |c| c["initializer_range"] = "4".into()),
            vec!["config.json: initializer_range is \"4\""],
        ),
        (
            with_config(copy(t, "aux-int", "moe"), |c| text(c)["router_aux_loss_coef"] = 1.into()),
            vec!["text_config.router_aux_loss_coef is 1"],
        ),
        // An architecture this tool does not know: no pass-through of a config nothing checked.
        (
            with_config(copy(t, "llama", "dense"), |c| {
                c["model_type"] = "llama".into();
                text(c)["model_type"] = "llama".into();
            }),
            vec!["model_type", "\"llama\"", "does not know"],
        ),
        (
            with_config(copy(t, "families", "dense"), |c| {
                c["architectures"] = serde_json::json!(["Qwen3_5MoeForCausalLM"]);
            }),
            vec!["architectures", "Qwen3_5MoeForCausalLM"],
        ),
    ];
    for (input, expect) in cases {
        refused_by_every_format(&input, &expect);
    }
}

#[test]
fn plain_tensors_of_the_wrong_shape_rank_or_dtype_are_refused_by_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let norm = format!("{L}.0.input_layernorm.weight");
    let conv = format!("{L}.1.linear_attn.conv1d.weight");
    let a_log = format!("{L}.2.linear_attn.A_log");
    let gate = format!("{L}.0.mlp.shared_expert_gate.weight");
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (
            with_tensors(copy(t, "shape", "dense"), |ts| {
                let n = tensor(ts, &norm);
                n.shape = vec![64];
                n.data.truncate(128);
            }),
            vec![norm.as_str(), "[64]", "hidden_size", "[128]"],
        ),
        (
            with_tensors(copy(t, "rank", "dense"), |ts| tensor(ts, &conv).shape = vec![512, 4]),
            vec![conv.as_str(), "[512, 4]", "linear_conv_kernel_dim", "[512, 1, 4]"],
        ),
        (
            with_tensors(copy(t, "dtype", "dense"), |ts| tensor(ts, &a_log).dtype = "I32"),
            vec![a_log.as_str(), "I32", "floats"],
        ),
        (
            with_tensors(copy(t, "gate-rank", "moe"), |ts| tensor(ts, &gate).shape = vec![128]),
            vec![gate.as_str(), "[1, 128]"],
        ),
    ];
    for (input, expect) in cases {
        refused_by_every_format(&input, &expect);
    }
}

#[test]
fn deleted_stray_and_extra_tensors_are_refused_by_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let dt_bias = format!("{L}.1.linear_attn.dt_bias");
    let stray = format!("{L}.7.input_layernorm.weight");
    let extra = format!("{L}.0.mlp.extra.weight");
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (
            with_tensors(copy(t, "deleted", "dense"), |ts| ts.retain(|t| t.name != dt_bias)),
            vec!["no tensor", dt_bias.as_str(), "layer 1"],
        ),
        (
            with_tensors(copy(t, "deleted-router", "moe"), |ts| {
                ts.retain(|t| t.name != format!("{L}.2.mlp.gate.weight"));
            }),
            vec!["no tensor", "layers.2.mlp.gate.weight"],
        ),
        (
            with_tensors(copy(t, "stray", "dense"), |ts| {
                tensor(ts, &format!("{L}.0.input_layernorm.weight")).name = stray.clone();
            }),
            vec![stray.as_str(), "layer 7", "num_hidden_layers is 4"],
        ),
        (
            with_tensors(copy(t, "extra", "moe"), |ts| ts.push(T::f16(&extra, &[128], &[0.0; 128]))),
            vec![extra.as_str(), "layer 0", "no tensor of this name"],
        ),
        (
            with_tensors(copy(t, "outside", "dense"), |ts| ts.push(T::f16("decoder.norm.weight", &[128], &[0.0; 128]))),
            vec!["decoder.norm.weight", "no place"],
        ),
        // A NaN in a plain tensor, found before anything is written.
        (
            with_tensors(copy(t, "nan", "moe"), |ts| {
                let n = tensor(ts, &format!("{L}.1.post_attention_layernorm.weight"));
                n.data[6..8].copy_from_slice(&half::f16::NAN.to_le_bytes());
            }),
            vec!["layers.1.post_attention_layernorm.weight", "NaN", "index 3"],
        ),
    ];
    for (input, expect) in cases {
        refused_by_every_format(&input, &expect);
    }
}

#[test]
fn an_exl3_output_read_back_is_held_to_its_config_too() {
    let tmp = tempfile::tempdir().unwrap();
    let exl3 = tmp.path().join("exl3");
    let o = escha_convert().arg(fixture("moe")).arg(&exl3).args(["--format", "exl3", "--quiet"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // Flattened to the text model: the keys are at the top.
    let path = exl3.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["moe_intermediate_size"] = 96.into();
    std::fs::write(&path, config.to_string()).unwrap();
    refused_by_every_format(&exl3, &["mlp.experts.0.down_proj.weight", "moe_intermediate_size", "[128, 96]"]);
}

#[test]
fn keys_the_clients_read_are_refused_by_every_format_when_a_client_would_refuse_them() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let generation = |dir: PathBuf, json: &str| {
        std::fs::write(dir.join("generation_config.json"), json).unwrap();
        dir
    };
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (with_config(copy(t, "no-eps", "dense"), |c| drop(text(c).remove("rms_norm_eps"))), vec!["rms_norm_eps"]),
        (with_config(copy(t, "null-eps", "moe"), |c| text(c)["rms_norm_eps"] = Value::Null), vec!["rms_norm_eps"]),
        (with_config(copy(t, "gelu", "dense"), |c| text(c)["hidden_act"] = "gelu".into()), vec!["hidden_act", "gelu"]),
        (
            with_config(copy(t, "rope-string", "dense"), |c| text(c)["rope_parameters"] = "yarn".into()),
            vec!["rope_parameters", "not an object"],
        ),
        (
            with_config(copy(t, "rope-type", "moe"), |c| text(c)["rope_parameters"]["rope_type"] = 1e308.into()),
            vec!["rope_parameters.rope_type"],
        ),
        (
            with_config(copy(t, "rope-theta", "dense"), |c| text(c)["rope_parameters"]["rope_theta"] = (-1).into()),
            vec!["rope_theta", "-1"],
        ),
        (
            with_config(copy(t, "rotary", "dense"), |c| {
                text(c)["rope_parameters"]["partial_rotary_factor"] = 2.into();
            }),
            vec!["partial_rotary_factor"],
        ),
        (
            with_config(copy(t, "positions", "moe"), |c| text(c)["max_position_embeddings"] = (1u64 << 40).into()),
            vec!["max_position_embeddings"],
        ),
        (
            with_config(copy(t, "bos-list", "dense"), |c| text(c)["bos_token_id"] = serde_json::json!([1, 2])),
            vec!["text_config.bos_token_id"],
        ),
        (with_config(copy(t, "pad-outside", "dense"), |c| c["pad_token_id"] = 100_000.into()), vec!["pad_token_id"]),
        (
            with_config(copy(t, "tie-null", "moe"), |c| text(c)["tie_word_embeddings"] = Value::Null),
            vec!["tie_word_embeddings"],
        ),
        (
            with_config(copy(t, "no-top-type", "dense"), |c| drop(c.as_object_mut().unwrap().remove("model_type"))),
            vec!["top-level model_type"],
        ),
        (with_config(copy(t, "vision-int", "dense"), |c| c["vision_config"] = 5.into()), vec!["vision_config"]),
        (with_config(copy(t, "topk", "moe"), |c| text(c)["norm_topk_prob"] = false.into()), vec!["norm_topk_prob"]),
        (
            with_config(copy(t, "flat", "moe"), |c| {
                let text = c.as_object_mut().unwrap().remove("text_config").unwrap();
                c.as_object_mut().unwrap().extend(text.as_object().unwrap().clone());
                c["model_type"] = "qwen3_5_moe".into();
            }),
            vec!["text_config", "qwen3_5_moe"],
        ),
        (
            with_config(copy(t, "experts", "dense"), |c| drop(text(c).insert("num_experts".into(), (-1).into()))),
            vec!["num_experts"],
        ),
        // A text model's config with a text_config of its own: transformers cannot build it.
        (
            with_config(copy(t, "text-nested-in-flat", "dense"), |c| {
                let inner = text(c).clone();
                *c = Value::Object(inner.clone());
                c["text_config"] = Value::Object(inner);
            }),
            vec!["qwen3_5_text", "text_config"],
        ),
        (
            with_config(copy(t, "text-in-text", "moe"), |c| {
                let inner = text(c).clone();
                text(c).insert("text_config".into(), Value::Object(inner));
            }),
            vec!["text_config holds a text_config"],
        ),
        // Rotary scaling: parameters typed and bounded, types no client runs named.
        (
            with_config(copy(t, "yarn-factor", "dense"), |c| {
                let r = &mut text(c)["rope_parameters"];
                r["rope_type"] = "yarn".into();
                r["factor"] = (-4.0).into();
                r["original_max_position_embeddings"] = 4096.into();
            }),
            vec!["rope_parameters.factor", "-4"],
        ),
        (
            with_config(copy(t, "yarn-original", "moe"), |c| {
                let r = &mut text(c)["rope_parameters"];
                r["rope_type"] = "yarn".into();
                r["factor"] = 4.0.into();
                r["original_max_position_embeddings"] = 4096.5.into();
            }),
            vec!["original_max_position_embeddings", "4096.5"],
        ),
        (
            with_config(copy(t, "rope-junk", "dense"), |c| text(c)["rope_parameters"]["rope_type"] = "junk".into()),
            vec!["rope_parameters.rope_type", "junk", "neither transformers nor mlx-lm"],
        ),
        (
            with_config(copy(t, "mrope-short", "moe"), |c| {
                text(c)["rope_parameters"]["mrope_section"] = serde_json::json!([1]);
            }),
            vec!["rope_parameters.mrope_section", "3 to 8"],
        ),
        (
            with_config(copy(t, "rope-mrope", "dense"), |c| text(c)["rope_parameters"]["rope_type"] = "mrope".into()),
            vec!["rope_type", "mrope", "transformers"],
        ),
        (
            with_config(copy(t, "yarn-attention", "moe"), |c| {
                let r = &mut text(c)["rope_parameters"];
                r["rope_type"] = "yarn".into();
                r["factor"] = 4.0.into();
                r["original_max_position_embeddings"] = 4096.into();
                r["attention_factor"] = 1.5.into();
            }),
            vec!["attention_factor", "mlx-lm"],
        ),
        (
            with_config(copy(t, "scaling-elsewhere", "dense"), |c| {
                text(c).insert(
                    "rope_scaling".into(),
                    serde_json::json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}),
                );
            }),
            vec!["text_config.rope_scaling", "mlx-lm", "text_config.rope_parameters"],
        ),
        (
            generation(copy(t, "no-new-tokens", "dense"), r#"{"max_new_tokens": 0}"#),
            vec!["generation_config.json", "max_new_tokens"],
        ),
        (
            generation(copy(t, "eos-string", "moe"), r#"{"eos_token_id": "2"}"#),
            vec!["generation_config.json", "eos_token_id"],
        ),
    ];
    for (input, expect) in cases {
        refused_by_every_format(&input, &expect);
    }
}

/// Plain values a client exponentiates, held to what it can compute: an `A_log` whose exponential
/// overflows f32 (the decay turns infinite and the logits NaN), a `dt_bias` that scales the decay
/// past it, an F64 value past f32's range.
#[test]
fn values_a_client_exponentiates_are_refused_by_every_format_beyond_what_it_computes() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let a_log = format!("{L}.1.linear_attn.A_log");
    let dt_bias = format!("{L}.2.linear_attn.dt_bias");
    let huge_a = with_tensors(copy(t, "a-log", "dense"), |ts| {
        let x = tensor(ts, &a_log);
        x.data = [1.0f32, 2.0, 100.0, 0.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    });
    refused_by_every_format(&huge_a, &[&a_log, "100", "exponential"]);
    let huge_dt = with_tensors(copy(t, "dt-bias", "moe"), |ts| {
        let x = tensor(ts, &dt_bias);
        // Stored F32 (the fixture's is F16, which holds nothing past the bound).
        x.dtype = "F32";
        x.data = [0.0f32, 0.0, 0.0, -1e30].iter().flat_map(|v| v.to_le_bytes()).collect();
    });
    refused_by_every_format(&huge_dt, &[&dt_bias, "decay"]);
    // Within the bounds, the model converts.
    let fine = with_tensors(copy(t, "a-log-fine", "dense"), |ts| {
        let x = tensor(ts, &a_log);
        x.data = [-30.0f32, 2.0, 31.0, 0.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    });
    let out = t.join("fine-out");
    let o = escha_convert().arg(&fine).arg(&out).arg("--quiet").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}
