//! The biases of coded linears in every format: by default each is treated as the source's own
//! runtime treats it (Escha's reference runtime never applies one, exllamav3 adds an EXL3
//! linear's), and whenever a non-zero one is left out the run says so (`bias_dropped`).

use crate::common::{convert_json as convert, copy_tree, escha_convert, fixture, stderr};
use crate::synth::{bf16s, edit_tensors, f16s, read_dir_safetensors as tensors, read_safetensors};
use std::path::{Path, PathBuf};

/// The attention projections whose biases a Qwen2-style model carries.
const QKV: [&str; 3] = ["q_proj", "k_proj", "v_proj"];
const ATTN: &str = "model.language_model.layers.3.self_attn";

/// Whether tensor `name` is a bias (leaf `bias`).
fn is_bias(name: &str) -> bool {
    name.rsplit_once('.').is_some_and(|(_, leaf)| leaf == "bias")
}

/// The report's warnings with code `code`: their messages.
fn warnings(report: &serde_json::Value, code: &str) -> Vec<String> {
    let all = report["warnings"].as_array().unwrap();
    all.iter().filter(|w| w["code"] == code).map(|w| w["message"].as_str().unwrap().to_string()).collect()
}

/// A native EXL3 checkpoint with Qwen2-style biases: the dense fixture with a bias on its
/// q/k/v projections only, converted to EXL3 with them kept.
fn exl3_with_qkv_biases(tmp: &Path) -> PathBuf {
    let escha = tmp.join("escha");
    copy_tree(&fixture("dense"), &escha);
    edit_tensors(&escha, |name, _| !is_bias(name) || QKV.iter().any(|p| name == format!("{ATTN}.{p}.bias")));
    let exl3 = tmp.join("exl3-in");
    convert(&escha, &exl3, &["--format", "exl3", "--bias", "keep"]);
    exl3
}

#[test]
fn escha_biases_dropped_by_default_are_reported_in_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    for format in [&["--format", "exl3"][..], &["--format", "bf16"], &["--format", "mlx"], &["--format", "gguf"]] {
        let report = convert(&fixture("dense"), &tmp.path().join(format[1]), &[format, &["--dry-run"]].concat());
        let dropped = warnings(&report, "bias_dropped");
        assert_eq!(dropped.len(), 1, "{format:?}: {}", report["warnings"]);
        assert!(dropped[0].contains("dropped 25 non-zero bias tensors"), "{format:?}: {dropped:?}");
        assert!(dropped[0].contains("the reference runtime never applies them"), "{format:?}: {dropped:?}");
    }
    // Written, not only planned: the EXL3 output holds no bias, and says so on stderr.
    let out = tmp.path().join("written");
    let o = escha_convert().arg(fixture("dense")).arg(&out).args(["--format", "exl3"]).output().unwrap();
    assert!(o.status.success());
    assert!(stderr(&o).contains("dropped 25 non-zero bias tensors"));
    assert!(!tensors(&out).keys().any(|n| is_bias(n)));
}

#[test]
fn exl3_biases_are_kept_by_default_as_exllamav3_applies_them() {
    let tmp = tempfile::tempdir().unwrap();
    let input = exl3_with_qkv_biases(tmp.path());
    let stored = tensors(&input);
    for p in QKV {
        assert_eq!(stored[&format!("{ATTN}.{p}.bias")].0, "F16", "exllamav3 reads an F16 `P.bias`");
    }

    // EXL3 → EXL3: the same bytes, where exllamav3 reads them, and nothing to warn about.
    let report = convert(&input, &tmp.path().join("exl3"), &["--format", "exl3"]);
    let got = tensors(&tmp.path().join("exl3"));
    for p in QKV {
        let name = format!("{ATTN}.{p}.bias");
        assert_eq!(got[&name], stored[&name], "{name}");
    }
    assert_eq!(got.keys().filter(|n| is_bias(n)).count(), 3);
    assert_eq!(report["counts"]["bias"], 3, "{report}");
    assert!(warnings(&report, "bias_dropped").is_empty() && warnings(&report, "bias_kept").is_empty(), "{report}");
    let card = std::fs::read_to_string(tmp.path().join("exl3/README.md")).unwrap();
    assert!(card.contains("--bias keep"), "the card's command writes the same output:\n{card}");
    assert!(card.contains("which exllamav3 adds after the matmul"), "{card}");

    // EXL3 → bf16: the same values, rounded once to bf16.
    let report = convert(&input, &tmp.path().join("bf16"), &["--format", "bf16"]);
    let got = tensors(&tmp.path().join("bf16"));
    for p in QKV {
        let name = format!("{ATTN}.{p}.bias");
        let want: Vec<f32> = f16s(&stored[&name].2).iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        assert_eq!(got[&name].0, "BF16", "{name}");
        assert_eq!(bf16s(&got[&name].2), want, "{name}");
    }
    assert!(warnings(&report, "bias_dropped").is_empty(), "{report}");

    // EXL3 → GGUF: llama.cpp's attention bias slots.
    let report = convert(&input, &tmp.path().join("gguf"), &["--format", "gguf", "--dry-run"]);
    let names: Vec<&str> = report["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    for n in ["blk.3.attn_q.bias", "blk.3.attn_k.bias", "blk.3.attn_v.bias"] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
}

#[test]
fn exl3_biases_dropped_on_request_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let input = exl3_with_qkv_biases(tmp.path());
    for format in ["exl3", "bf16"] {
        let out = tmp.path().join(format);
        let report = convert(&input, &out, &["--format", format, "--bias", "drop"]);
        assert!(!tensors(&out).keys().any(|n| is_bias(n)), "{format}");
        let dropped = warnings(&report, "bias_dropped");
        assert_eq!(dropped.len(), 1, "{format}: {}", report["warnings"]);
        assert!(dropped[0].contains("dropped 3 non-zero bias tensors of EXL3 linears"), "{dropped:?}");
        assert!(dropped[0].contains("exllamav3 adds"), "{dropped:?}");
    }
}

#[test]
fn an_exl3_bias_llama_cpp_has_no_slot_for_is_refused_with_the_way_out() {
    // Every coded linear of the dense fixture with a bias, as an EXL3 checkpoint: llama.cpp has no
    // slot for the biases of linear attention or the MLP.
    let tmp = tempfile::tempdir().unwrap();
    let exl3 = tmp.path().join("exl3-in");
    convert(&fixture("dense"), &exl3, &["--format", "exl3", "--bias", "keep"]);
    let o = escha_convert().arg(&exl3).arg(tmp.path().join("gguf")).args(["--format", "gguf"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("tensor blk.0.attn_qkv.bias") && err.contains("--bias drop"), "{err}");
    let report = convert(&exl3, &tmp.path().join("dropped"), &["--format", "gguf", "--bias", "drop"]);
    let dropped = warnings(&report, "bias_dropped");
    assert!(
        dropped.len() == 1 && dropped[0].contains("dropped 25 non-zero bias tensors of EXL3 linears"),
        "{dropped:?}"
    );
}

#[test]
fn expert_biases_the_stacked_layouts_have_no_slot_for_are_dropped_with_a_word() {
    // A native per-expert EXL3 MoE whose down projections carry biases: transformers' fused experts
    // and llama.cpp's expert tensors have no slot for them; the experts are stacked all the same.
    let tmp = tempfile::tempdir().unwrap();
    let escha = tmp.path().join("escha");
    copy_tree(&fixture("moe"), &escha);
    let mut rng = crate::synth::Rng::new(5);
    let mut biases = Vec::new();
    edit_tensors(&escha, |name, t| {
        if let Some(path) = name.strip_suffix(".experts.down_proj.escha_rout") {
            let v = rng.vec(t.shape.iter().product(), -0.01, 0.01);
            biases.push(crate::synth::T::f16(&format!("{path}.experts.down_proj.bias"), &t.shape, &v));
        }
        true
    });
    let shard = escha.join("model-00001-of-00001.safetensors");
    let mut all: Vec<crate::synth::T> = read_safetensors(&shard)
        .into_iter()
        .map(|(n, (d, s, b))| crate::synth::T::new(&n, Box::leak(d.into_boxed_str()), &s, b))
        .collect();
    let index = escha.join("model.safetensors.index.json");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    for b in &biases {
        json["weight_map"][&b.name] = "model-00001-of-00001.safetensors".into();
    }
    std::fs::write(&index, json.to_string()).unwrap();
    all.extend(biases);
    crate::synth::write_safetensors(&shard, &all);
    let exl3 = tmp.path().join("exl3-in");
    convert(&escha, &exl3, &["--format", "exl3", "--bias", "keep"]);
    assert!(tensors(&exl3).contains_key("model.language_model.layers.0.mlp.experts.3.down_proj.bias"));

    for (format, fused) in
        [("bf16", "model.language_model.layers.0.mlp.experts.down_proj"), ("gguf", "blk.0.ffn_down_exps.weight")]
    {
        let report = convert(&exl3, &tmp.path().join(format), &["--format", format, "--dry-run"]);
        let names: Vec<&str> =
            report["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert!(names.contains(&fused), "{format}: {names:?}");
        assert!(!names.iter().any(|n| n.contains(".experts.0.") || n.contains("exps.bias")), "{format}: {names:?}");
        let dropped = warnings(&report, "bias_dropped");
        assert!(dropped.len() == 1 && dropped[0].contains("no slot for them"), "{format}: {dropped:?}");
    }
}
