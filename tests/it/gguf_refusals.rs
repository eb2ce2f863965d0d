//! `--format gguf` refusing what llama.cpp could not use: hostile configs and tokenizers refused
//! with a clear message, in bounded time and memory, leaving nothing behind; and an exit 0 that is
//! always a file llama.cpp loads (what it would refuse, or compute as NaN, is refused first).

use crate::common::{copy_tree, fixture, stderr};
use crate::gguf::{convert, edited, fails, failure, run_bounded, text};
use crate::gguf_reader::{check_layout, Val};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
// ---------------------------------------------------------------------------------------------
// 5. Hostile input: refused clearly, quickly, within bounded memory, leaving nothing.

#[test]
fn hostile_configs_and_tokenizers_are_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let mut wrong = Vec::new();
    let mut check =
        |input: PathBuf, extra: &[&str], expect: &[&str]| wrong.extend(failure(&input, extra, expect).err());
    // A token id the embedding has no row for.
    check(
        edited(t, "token-past-vocab", "dense", "tokenizer.json", |tk| {
            tk["model"]["vocab"]["zzz"] = Value::from(300);
        }),
        &[],
        &["tokenizer.json", "300", "vocab_size"],
    );
    check(
        edited(t, "added-past-vocab", "moe", "tokenizer.json", |tk| {
            let added = tk["added_tokens"].as_array_mut().unwrap();
            let mut extra = added[0].clone();
            extra["id"] = Value::from(1u64 << 40);
            extra["content"] = Value::from("<|far|>");
            added.push(extra);
        }),
        &[],
        &["tokenizer.json", &(1u64 << 40).to_string(), "vocab_size"],
    );
    // V heads that do not divide among the key heads.
    check(
        edited(t, "v-heads", "dense", "config.json", |c| {
            text(c)["linear_num_value_heads"] = Value::from(5);
        }),
        &[],
        &["config.json", "5", "2"],
    );
    // layer_types of the wrong length.
    check(
        edited(t, "layer-types", "moe", "config.json", |c| {
            text(c)["layer_types"].as_array_mut().unwrap().pop();
        }),
        &[],
        &["config.json", "layer_types"],
    );
    // A vocab_size beyond any count.
    check(
        edited(t, "vocab-1e12", "dense", "config.json", |c| {
            text(c)["vocab_size"] = Value::from(1_000_000_000_000u64);
        }),
        &[],
        &["config.json", "vocab_size"],
    );
    all_refused(&wrong);
}

/// Fails listing every case in `wrong` (all of them, not just the first).
pub(crate) fn all_refused(wrong: &[String]) {
    assert!(wrong.is_empty(), "{} hostile inputs not refused as promised:\n{}", wrong.len(), wrong.join("\n"));
}

/// Configs whose numbers contradict the tensors or that no header can hold: writing them would
/// give a file llama.cpp refuses (or a header of gigabytes), so they are refused up front.
#[test]
fn configs_that_no_loadable_file_can_follow_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let mut wrong = Vec::new();
    let mut check =
        |input: PathBuf, extra: &[&str], expect: &[&str]| wrong.extend(failure(&input, extra, expect).err());
    // A vocab_size that fits u32 but no memory (4·10^9 padding tokens).
    check(
        edited(t, "vocab-4e9", "dense", "config.json", |c| {
            text(c)["vocab_size"] = Value::from(4_000_000_000u64);
        }),
        &[],
        &["config.json", "vocab_size"],
    );
    // A vocab_size the embedding does not have: llama.cpp would refuse the file
    // ("tensor 'token_embd.weight' has wrong shape").
    check(
        edited(t, "vocab-300", "dense", "config.json", |c| {
            text(c)["vocab_size"] = Value::from(300);
        }),
        &[],
        &["vocab_size", "300", "256"],
    );
    // No linear-attention key heads: llama.cpp cannot load ssm.group_count 0.
    check(
        edited(t, "no-key-heads", "dense", "config.json", |c| {
            text(c)["linear_num_key_heads"] = Value::from(0);
        }),
        &[],
        &["config.json", "linear_num_key_heads"],
    );
    // More transformer blocks than the checkpoint has: block_count would promise blk.4.*.
    check(
        edited(t, "layers-5", "dense", "config.json", |c| {
            text(c)["num_hidden_layers"] = Value::from(5);
            text(c).remove("layer_types");
        }),
        &[],
        &["num_hidden_layers"],
    );
    // Every layer full attention, or every one linear: llama.cpp's hybrid memory then has no
    // recurrent state (or KV cache) to give a buffer, and its first decode aborts. With both kinds
    // the model converts.
    let mlp = crate::synth::coded_linear(
        &mut crate::synth::Rng::new(7),
        "model.language_model.layers.1.mlp.up_proj",
        None,
        128,
        128,
        2,
        false,
        false,
    );
    let write = |name: &str, layer_types: Vec<&'static str>| {
        let model = crate::synth::Model { layer_types, linear: [1, 128, 1, 128], ..crate::synth::Model::dense(128, 1) };
        crate::synth::write_model(&t.join(name), &mlp, &model)
    };
    let no_vocab = ["--gguf-vocab", "none"];
    check(write("all-full", vec!["full_attention"; 2]), &no_vocab, &["no linear-attention layer"]);
    check(write("all-linear", vec!["linear_attention"; 2]), &no_vocab, &["no full-attention layer"]);
    convert(&write("hybrid", vec!["linear_attention", "full_attention"]), &t.join("hybrid-out"), &no_vocab);
    all_refused(&wrong);
    // An absurd MTP layer count with --mtp keep (which writes the head it has): the header counts
    // the one layer the tensors hold, quickly, never a block count they do not bear out.
    for (name, v) in [("mtp-1e15", 1_000_000_000_000_000u64), ("mtp-4e9", 4_000_000_000), ("mtp-1e8", 100_000_000)] {
        let input = edited(t, name, "dense", "config.json", |c| {
            text(c)["mtp_num_hidden_layers"] = Value::from(v);
        });
        let (o, took, parent) = run_bounded(&input, &["--mtp", "keep"]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert!(took < Duration::from_secs(30), "{name}: {took:?}");
        let f = check_layout(&parent.path().join("out/model.gguf"));
        assert_eq!(f.get("qwen35.block_count"), Some(&Val::Int(4, 5)), "{name}: 4 blocks and the MTP layer");
        assert_eq!(f.get("qwen35.nextn_predict_layers"), Some(&Val::Int(4, 1)), "{name}");
    }
}

#[test]
fn an_absurd_mtp_layer_count_drops_the_head_quickly() {
    let tmp = tempfile::tempdir().unwrap();
    let input = edited(tmp.path(), "mtp-1e15", "dense", "config.json", |c| {
        text(c)["mtp_num_hidden_layers"] = Value::from(1_000_000_000_000_000u64);
    });
    let (o, took, parent) = run_bounded(&input, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(took < Duration::from_secs(30), "{took:?}");
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let warnings = report["warnings"].to_string();
    assert!(warnings.contains("dropped the MTP head"), "{warnings}");
    let f = check_layout(&parent.path().join("out/model.gguf"));
    assert_eq!(f.get("qwen35.block_count"), Some(&Val::Int(4, 4)), "the 4 transformer blocks only");
    assert!(f.get("qwen35.nextn_predict_layers").is_none());
    assert!(f.tensors.iter().all(|t| !t.name.contains("nextn")));
}

// ---------------------------------------------------------------------------------------------
// 7. Exit 0 is a file llama.cpp loads: what it would refuse or compute as NaN is refused first.

/// The shard of fixture copy `dir` holding tensor `name`.
fn shard_of(dir: &Path, name: &str) -> PathBuf {
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    dir.join(index["weight_map"][name].as_str().unwrap_or_else(|| panic!("{name} is in no shard")))
}

/// Sets every element of F32 tensor `name` in fixture copy `dir` to `f(index, value)`.
fn map_f32(dir: &Path, name: &str, f: impl Fn(usize, f32) -> f32) {
    let path = shard_of(dir, name);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header[name]["dtype"], "F32", "{name}");
    let [start, end] = [0, 1].map(|i| 8 + n + header[name]["data_offsets"][i].as_u64().unwrap() as usize);
    for (i, v) in bytes[start..end].chunks_exact_mut(4).enumerate() {
        let x = f(i, f32::from_le_bytes(v.try_into().unwrap()));
        v.copy_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// Renames tensor `from` to `to` in fixture copy `dir`: its shard's header and the index.
fn rename_tensor(dir: &Path, from: &str, to: &str) {
    let path = shard_of(dir, from);
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let entry = header.remove(from).unwrap();
    header.insert(to.into(), entry);
    let mut text = serde_json::to_vec(&header).unwrap();
    text.resize(text.len().div_ceil(8) * 8, b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&path, out).unwrap();
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let map = index["weight_map"].as_object_mut().unwrap();
    let shard = map.remove(from).unwrap();
    map.insert(to.into(), shard);
    std::fs::write(index_path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
}

const L0: &str = "model.language_model.layers.0";

#[test]
fn weights_beyond_float16_are_refused_in_blocks_naming_tensor_row_and_block() {
    let tmp = tempfile::tempdir().unwrap();
    // One output channel of a coded linear scaled into the 10^7s and 10^10s (finite in f32 and
    // bf16): a Q8_0 scale of max/127 passes f16's 65504 at the first, a K-quant's at the second;
    // llama.cpp's kernels compute with block values in f16, so both are refused.
    for (scale, ty) in [(1e9f32, "q8_0"), (1e12, "q4_k_m")] {
        let dir = tmp.path().join(format!("{ty}-{scale}"));
        copy_tree(&fixture("dense"), &dir);
        map_f32(&dir, &format!("{L0}.mlp.down_proj.escha_s_out"), |i, v| if i == 5 { v * scale } else { v });
        let err = fails(&dir, &["--gguf-type", ty], &["blk.0.ffn_down.weight", "row 5, block ", "65504"]);
        assert!(err.contains("bf16"), "{ty}: the message names the way out: {err}");
        // The bf16 GGUF holds the same weights.
        let (o, _, _) = run_bounded(&dir, &["--gguf-type", "bf16"]);
        assert!(o.status.success(), "{ty}: {}", stderr(&o));
        // auto never chooses a block type for them: the linear stays BF16.
        let (o, _, _) = run_bounded(&dir, &["--gguf-type", "auto", "--json"]);
        assert!(o.status.success(), "{ty}: {}", stderr(&o));
        let report: Value = serde_json::from_slice(&o.stdout).unwrap();
        let choices = report["width_choices"].as_array().unwrap();
        let down = choices.iter().find(|c| c["tensor"] == "blk.0.ffn_down.weight").unwrap();
        assert_eq!(down["gguf_type"], "BF16", "{ty}: {down}");
    }
}

#[test]
fn auto_reports_the_error_of_the_bytes_it_writes_for_small_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let choice = |dir: &Path, extra: &[&str]| -> Value {
        let (o, _, _) = run_bounded(dir, &[&["--gguf-type", "auto", "--json"], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        let report: Value = serde_json::from_slice(&o.stdout).unwrap();
        let all = report["width_choices"].as_array().unwrap().clone();
        all.into_iter().find(|c| c["tensor"] == "blk.0.ffn_down.weight").expect("a choice for blk.0.ffn_down.weight")
    };
    for scale in [1e-3f32, 1e-6] {
        let dir = tmp.path().join(format!("small-{scale}"));
        copy_tree(&fixture("dense"), &dir);
        map_f32(&dir, &format!("{L0}.mlp.down_proj.escha_s_out"), |_, v| v * scale);
        let (estimated, measured) = (choice(&dir, &[]), choice(&dir, &["--measure-error"]));
        let actual = measured["actual"].as_f64().unwrap();
        assert!(
            actual <= measured["budget"].as_f64().unwrap(),
            "{scale}: the written bytes are within budget: {measured}"
        );
        assert_eq!(estimated["gguf_type"], measured["gguf_type"], "{scale}: the estimate chooses what measuring does");
        let predicted = estimated["predicted"].as_f64().unwrap();
        assert!(
            (predicted - actual).abs() <= 0.3 * actual.max(1e-3),
            "{scale}: reported {predicted}, the bytes hold {actual}"
        );
    }
}

#[test]
fn a_stray_layer_index_is_refused_without_allocating_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("stray");
    copy_tree(&fixture("dense"), &dir);
    let from = format!("{L0}.input_layernorm.weight");
    rename_tensor(&dir, &from, "model.language_model.layers.3999999999.input_layernorm.weight");
    // run_bounded holds the address space to 4 GiB: the block count must come from the tensors.
    for extra in [&[][..], &["--dry-run"], &["--gguf-type", "q4_k_m", "--dry-run"], &["--mtp", "drop"]] {
        fails(&dir, extra, &["layers.3999999999", "num_hidden_layers"]);
    }
}

#[test]
fn layers_beyond_num_hidden_layers_are_refused_not_made_an_mtp_head() {
    let tmp = tempfile::tempdir().unwrap();
    let input = edited(tmp.path(), "layers-3", "dense", "config.json", |c| {
        text(c)["num_hidden_layers"] = Value::from(3);
        text(c)["layer_types"].as_array_mut().unwrap().pop();
    });
    for extra in [&[][..], &["--mtp", "drop"], &["--mtp", "keep"]] {
        fails(&input, extra, &["layers.3.", "layer 3", "num_hidden_layers is 3"]);
    }
}

#[test]
fn configs_contradicting_the_tensors_are_refused_before_decoding() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let mut wrong = Vec::new();
    let mut check =
        |input: PathBuf, extra: &[&str], expect: &[&str]| wrong.extend(failure(&input, extra, expect).err());
    // Layer 0 declared full attention while it holds linear attention.
    check(
        edited(t, "layer-types", "dense", "config.json", |c| {
            text(c)["layer_types"][0] = Value::from("full_attention");
            text(c).remove("full_attention_interval");
        }),
        &["--gguf-type", "auto"],
        &["layers.0.linear_attn.", "layer 0 (full_attention in config.json)"],
    );
    check(
        edited(t, "hidden", "moe", "config.json", |c| {
            text(c)["hidden_size"] = Value::from(64);
        }),
        &[],
        &["shape", "hidden_size"],
    );
    check(
        edited(t, "heads", "dense", "config.json", |c| {
            text(c)["num_attention_heads"] = Value::from(2);
        }),
        &[],
        &["layers.3.self_attn.", "num_attention_heads"],
    );
    check(
        edited(t, "kv-heads", "moe", "config.json", |c| {
            text(c)["num_key_value_heads"] = Value::from(4);
        }),
        &[],
        &["num_key_value_heads", "4"],
    );
    check(
        edited(t, "no-context", "dense", "config.json", |c| {
            text(c).remove("max_position_embeddings");
        }),
        &[],
        &["max_position_embeddings", "context_length"],
    );
    check(
        edited(t, "experts-used", "moe", "config.json", |c| {
            text(c)["num_experts_per_tok"] = Value::from(9);
        }),
        &[],
        &["num_experts_per_tok is 9", "4 experts"],
    );
    check(
        edited(t, "interval-0", "dense", "config.json", |c| {
            text(c).remove("layer_types");
            text(c)["full_attention_interval"] = Value::from(0);
        }),
        &[],
        &["full_attention_interval"],
    );
    // What ggml asserts of rope and of the norms' epsilon.
    for (name, edit, expect) in [
        ("rotary", "partial_rotary_factor", 2.0),
        ("rotary-negative", "partial_rotary_factor", -0.25),
        ("theta-0", "rope_theta", 0.0),
    ] {
        check(
            edited(t, name, "dense", "config.json", |c| {
                text(c)["rope_parameters"][edit] = Value::from(expect);
            }),
            &[],
            &["config.json", edit],
        );
    }
    check(
        edited(t, "mrope", "moe", "config.json", |c| {
            text(c)["rope_parameters"]["mrope_section"] = serde_json::json!([64, 64, 64]);
        }),
        &[],
        &["mrope_section"],
    );
    check(
        edited(t, "eps", "dense", "config.json", |c| {
            text(c)["rms_norm_eps"] = Value::from(-1e-6);
        }),
        &[],
        &["rms_norm_eps"],
    );
    // A fused gate/up whose true width (escha_config's OC) is odd cannot be split in halves.
    let odd = t.join("odd-gate-up");
    copy_tree(&fixture("moe"), &odd);
    let config = format!("{L0}.mlp.experts.gate_up_proj.escha_config");
    let path = shard_of(&odd, &config);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let at = 8 + n + header[&config]["data_offsets"][0].as_u64().unwrap() as usize + 6 * 4;
    bytes[at..at + 4].copy_from_slice(&255i32.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    check(odd, &[], &["gate_up_proj", "255"]);
    // An incomplete MTP head kept on request has no next-token block llama.cpp can load.
    check(fixture("moe"), &["--mtp", "keep"], &["blk.4.", "MTP head is incomplete", "--mtp drop"]);
    all_refused(&wrong);
}

#[test]
fn the_card_says_what_the_file_holds_of_the_mtp_head() {
    let tmp = tempfile::tempdir().unwrap();
    for (extra, kept) in [(&[][..], true), (&["--mtp", "drop"][..], false)] {
        let out = tmp.path().join(format!("out-{kept}"));
        convert(&fixture("dense"), &out, extra);
        let f = check_layout(&out.join("model.gguf"));
        let card = std::fs::read_to_string(out.join("README.md")).unwrap();
        let line = card.lines().find(|l| l.contains("MTP head")).expect("an MTP line");
        assert_eq!(f.get("qwen35.nextn_predict_layers").is_some(), kept);
        assert_eq!(f.tensors.iter().any(|t| t.name.starts_with("blk.4.nextn.")), kept);
        if kept {
            assert!(line.contains("kept") && line.contains("nextn_predict_layers"), "{line}");
        } else {
            assert!(line.contains("not written") && !line.contains("mtp_num_hidden_layers"), "{line}");
        }
    }
}
