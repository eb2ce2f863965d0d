//! Rotary scaling as the model cards document it (`YaRN` under `text_config.rope_parameters`):
//! every format converts it and carries it where its client reads it (config.json for
//! transformers, mlx-lm and exllamav3; llama.cpp's `rope.scaling.*` keys in GGUF); a scaling one
//! client would not run is refused for that client's format only, naming it.

use crate::common::{copy_tree, escha_convert, fixture, stderr};
use crate::gguf_reader::{check_layout, Val};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// A copy of fixture `model` with `edit` applied to its text config.
fn edited(tmp: &Path, name: &str, model: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> PathBuf {
    let dir = tmp.join(name);
    copy_tree(&fixture(model), &dir);
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(config["text_config"].as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    dir
}

/// The Qwen3.6 card's long-context settings, scaled to the fixtures' 4096 positions.
fn yarn(text: &mut serde_json::Map<String, Value>) {
    let rope = text["rope_parameters"].as_object_mut().unwrap();
    rope.insert("rope_type".into(), "yarn".into());
    rope.insert("factor".into(), 4.0.into());
    rope.insert("original_max_position_embeddings".into(), 4096.into());
    text.insert("max_position_embeddings".into(), 16384.into());
}

fn run(input: &Path, out: &Path, format: &str) -> std::process::Output {
    escha_convert().arg(input).arg(out).args(["--format", format, "--quiet"]).output().unwrap()
}

/// The rope dictionary of an output's config.json: under `text_config` or, flattened, at the top.
fn rope_of(out: &Path) -> Value {
    let config: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    config.get("text_config").unwrap_or(&config)["rope_parameters"].clone()
}

#[test]
fn yarn_as_the_card_documents_it_converts_in_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    for model in ["dense", "moe"] {
        let input = edited(tmp.path(), model, model, yarn);
        for format in ["bf16", "mlx", "gguf", "exl3"] {
            let out = tmp.path().join(format!("{model}-{format}"));
            let o = run(&input, &out, format);
            assert!(o.status.success(), "{model} {format}: {}", stderr(&o));
            if format == "gguf" {
                let arch = if model == "moe" { "qwen35moe" } else { "qwen35" };
                let f = check_layout(&out.join("model.gguf"));
                let key = |k: &str| f.get(&format!("{arch}.rope.scaling.{k}"));
                assert!(matches!(key("type"), Some(Val::Str(s)) if s == "yarn"), "{model}: {:?}", key("type"));
                assert!(matches!(key("factor"), Some(Val::F32(x)) if *x == 4.0), "{model}: {:?}", key("factor"));
                assert!(
                    matches!(key("original_context_length"), Some(Val::Int(4, 4096))),
                    "{model}: {:?}",
                    key("original_context_length")
                );
                continue;
            }
            if format == "exl3" {
                let card = std::fs::read_to_string(out.join("README.md")).unwrap();
                assert!(card.contains("max_position_embeddings / original_max_position_embeddings"), "{card}");
            }
            let rope = rope_of(&out);
            assert_eq!(rope["rope_type"], "yarn", "{model} {format}: {rope}");
            assert_eq!(rope["factor"], json!(4.0), "{model} {format}: {rope}");
            assert_eq!(rope["original_max_position_embeddings"], 4096, "{model} {format}: {rope}");
        }
    }
}

#[test]
fn a_scaling_one_client_does_not_run_is_refused_for_its_format_only() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let cases = [
        // llama.cpp's converter writes no scaling for dynamic; exllamav3 raises on it.
        (
            edited(t, "dynamic", "dense", |c| {
                c["rope_parameters"]["rope_type"] = "dynamic".into();
                c["rope_parameters"]["factor"] = 2.0.into();
            }),
            &["gguf", "exl3"][..],
            &["bf16", "mlx"][..],
            "dynamic",
        ),
        // qwen35's loader reads no YaRN beta: it would run 32.
        (
            edited(t, "beta", "moe", |c| {
                yarn(c);
                c["rope_parameters"]["beta_fast"] = 16.into();
            }),
            &["gguf"][..],
            &["bf16", "mlx", "exl3"][..],
            "beta_fast",
        ),
    ];
    for (input, refused, converted, key) in cases {
        for format in refused {
            let out = t.join(format!("{key}-{format}"));
            let o = run(&input, &out, format);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{key} {format}: {err}");
            let client = if *format == "gguf" { "llama.cpp" } else { "exllamav3" };
            assert!(err.contains(key) && err.contains(client), "{key} {format}: {err}");
            assert!(!out.exists(), "{key} {format}: nothing written");
        }
        for format in converted {
            let out = t.join(format!("{key}-{format}"));
            let o = run(&input, &out, format);
            assert!(o.status.success(), "{key} {format}: {}", stderr(&o));
        }
    }
}
