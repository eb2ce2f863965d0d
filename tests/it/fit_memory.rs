//! `--fit-memory M [--context N] [--reserve R]`: `--max-size` from a machine's memory, less the
//! K/V cache the client allocates for N tokens, the linear-attention state and an allowance.

use crate::common::{escha_convert, exit_code, fixture, stderr};
use serde_json::Value;
use std::path::Path;

const FORMATS: [&str; 2] = ["mlx", "gguf"];
const FIXTURES: [&str; 2] = ["dense", "moe"];

/// `convert FIXTURE OUT --quiet --json ARGS`: the exit code, the document and stderr.
fn run(name: &str, out: &Path, args: &[&str]) -> (i32, Value, String) {
    let o = escha_convert().arg(fixture(name)).arg(out).args(["--quiet", "--json"]).args(args).output().unwrap();
    let doc = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (exit_code(&o), doc, stderr(&o))
}

/// The text model's keys of a fixture's config.json.
fn text_config(name: &str) -> Value {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap()).unwrap();
    config["text_config"].clone()
}

/// What the clients allocate for `context` tokens, from config.json alone: the K/V cache of the
/// full-attention layers (`element` bytes a value, whole steps of 256 tokens) and the recurrent
/// state of the linear-attention layers (f32).
fn expected(text: &Value, context: u64, element: u64) -> (u64, u64) {
    let n = |k: &str| text[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    let types: Vec<&str> = text["layer_types"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let full = types.iter().filter(|t| **t == "full_attention").count() as u64;
    let linear = types.iter().filter(|t| **t == "linear_attention").count() as u64;
    let cells = context.div_ceil(256) * 256;
    let kv = full * cells * 2 * n("num_key_value_heads") * n("head_dim") * element;
    let (key_dim, value_dim) = (
        n("linear_num_key_heads") * n("linear_key_head_dim"),
        n("linear_num_value_heads") * n("linear_value_head_dim"),
    );
    let conv = (n("linear_conv_kernel_dim") - 1) * (2 * key_dim + value_dim);
    let state = n("linear_num_value_heads") * n("linear_key_head_dim") * n("linear_value_head_dim");
    (kv, linear * (conv + state) * 4)
}

/// Bytes of a K or V value in the client's cache for a planned output: llama.cpp's default F16;
/// mlx-lm computes in the dtype of the embedding's scales (F32 for an exact int8 repack).
fn element_bytes(format: &str, doc: &Value) -> u64 {
    if format == "gguf" {
        return 2;
    }
    let scales = doc["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"].as_str().unwrap().ends_with("embed_tokens.scales"));
    match scales.map(|t| t["dtype"].as_str().unwrap()) {
        Some("F32") => 4,
        _ => 2,
    }
}

#[test]
fn the_size_is_memory_less_the_cache_and_the_reserve_as_config_json_sizes_them() {
    let tmp = tempfile::tempdir().unwrap();
    for format in FORMATS {
        for name in FIXTURES {
            let text = text_config(name);
            // The fixtures' max_position_embeddings (4096) is below the default 8192: the default
            // is then the model's own length.
            let cases: [(&[&str], u64, u64); 3] = [
                (&["--fit-memory", "6MB", "--context", "1000", "--reserve", "500KB"], 1000, 500_000),
                (&["--fit-memory", "6MB", "--reserve", "0"], 4096, 0),
                // The default allowance: a third of M, at least 1 GiB.
                (&["--fit-memory", "4GB"], 4096, 4_000_000_000 / 3),
            ];
            for (args, context, allowance) in cases {
                let (code, doc, stderr) =
                    run(name, &tmp.path().join("out"), &[&["--format", format, "--dry-run"], args].concat());
                assert_eq!(code, 0, "{format} {name} {args:?}: {stderr}");
                let budget = &doc["budget"];
                let (kv, state) = expected(&text, context, element_bytes(format, &doc));
                let memory = budget["memory"].as_u64().unwrap();
                assert_eq!(budget["context"].as_u64(), Some(context), "{format} {name} {args:?}");
                assert_eq!(budget["kv_cache_bytes"].as_u64(), Some(kv), "{format} {name} {args:?}");
                assert_eq!(budget["reserve_bytes"].as_u64(), Some(state + allowance), "{format} {name} {args:?}");
                assert_eq!(
                    budget["max_size"].as_u64(),
                    Some(memory - kv - state - allowance),
                    "{format} {name} {args:?}"
                );
                assert!(budget["bytes"].as_u64().unwrap() <= budget["max_size"].as_u64().unwrap());
            }
        }
    }
}

#[test]
fn the_floor_of_the_default_allowance_is_one_gib() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, doc, stderr) =
        run("dense", &tmp.path().join("out"), &["--format", "gguf", "--dry-run", "--fit-memory", "2GB"]);
    assert_eq!(code, 0, "{stderr}");
    let (kv, state) = expected(&text_config("dense"), 4096, 2);
    assert_eq!(doc["budget"]["reserve_bytes"].as_u64(), Some(state + (1 << 30)));
    assert_eq!(doc["budget"]["max_size"].as_u64(), Some(2_000_000_000 - kv - state - (1 << 30)));
}

/// The model files of `dir` (every `.safetensors` and `.gguf`), by name.
fn model_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors" || x == "gguf"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}

#[test]
fn the_output_is_the_one_max_size_makes_of_that_size() {
    let tmp = tempfile::tempdir().unwrap();
    for (format, name) in [("mlx", "dense"), ("gguf", "moe"), ("mlx", "moe"), ("gguf", "dense")] {
        let fitted = tmp.path().join(format!("{format}-{name}-fitted"));
        let args = ["--format", format, "--fit-memory", "5MB", "--context", "1500", "--reserve", "1MB"];
        let (code, doc, stderr) = run(name, &fitted, &args);
        assert_eq!(code, 0, "{stderr}");
        let size = doc["budget"]["max_size"].as_u64().unwrap().to_string();
        let sized = tmp.path().join(format!("{format}-{name}-sized"));
        let (code, other, stderr) = run(name, &sized, &["--format", format, "--max-size", &size]);
        assert_eq!(code, 0, "{stderr}");
        assert!(other["budget"].get("memory").is_none(), "--max-size reports no memory: {}", other["budget"]);
        assert_eq!(model_files(&fitted), model_files(&sized), "{format} {name}: the same model files");
        // The card shows the arithmetic and records the flags with their defaults spelled out.
        let card = std::fs::read_to_string(fitted.join("README.md")).unwrap();
        assert!(card.contains("--fit-memory 5000000 --context 1500 --reserve 1000000"), "{card}");
        assert!(card.contains("5.00 MB of memory − ") && card.contains("for the model files"), "{card}");
    }
}

#[test]
fn the_card_s_command_spells_out_the_defaults_it_resolved() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let (code, _, stderr) = run("dense", &out, &["--format", "gguf", "--fit-memory", "3GB"]);
    assert_eq!(code, 0, "{stderr}");
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(card.contains("--fit-memory 3000000000 --context 4096 --reserve 1073741824"), "{card}");
}

/// A size as the reports write it.
fn human(b: u64) -> String {
    match b {
        b if b >= 1_000_000_000 => format!("{:.2} GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.2} MB", b as f64 / 1e6),
        b if b >= 1_000 => format!("{:.1} kB", b as f64 / 1e3),
        b => format!("{b} B"),
    }
}

#[test]
fn dry_run_shows_the_arithmetic() {
    let tmp = tempfile::tempdir().unwrap();
    let o = escha_convert()
        .arg(fixture("dense"))
        .arg(tmp.path().join("out"))
        .args(["--format", "gguf", "--dry-run", "--fit-memory", "5MB", "--context", "1024", "--reserve", "1MB"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (kv, state) = expected(&text_config("dense"), 1024, 2);
    let left = 5_000_000 - kv - state - 1_000_000;
    let line = String::from_utf8_lossy(&o.stdout).lines().find(|l| l.starts_with("--fit-memory: ")).map(String::from);
    let line = line.expect("a --fit-memory line");
    assert_eq!(
        line,
        format!(
            "--fit-memory: 5.00 MB of memory − {} of K/V cache for 1024 tokens of context − {} of reserve ({} of \
             linear-attention state, 1.00 MB for the runtime and the OS) = {} for the model files",
            human(kv),
            human(state + 1_000_000),
            human(state),
            human(left)
        )
    );
}

/// A usage error (exit 2, the failure document's code `usage`), nothing written; stderr.
fn refused(name: &str, args: &[&str]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let (code, doc, stderr) = run(name, &out, args);
    assert_eq!(code, 2, "{args:?}: {stderr}");
    assert_eq!(doc["error"]["code"], "usage", "{args:?}: {doc}");
    assert!(!out.exists(), "{args:?}: nothing is written");
    stderr
}

#[test]
fn bad_values_are_usage_errors_naming_the_numbers() {
    let (kv, state) = expected(&text_config("dense"), 4096, 2);
    for format in FORMATS {
        let f = ["--format", format];
        let e = refused("dense", &[&f[..], &["--fit-memory", "5MB", "--context", "5000"]].concat());
        assert!(e.contains("--context 5000 is beyond the model's max_position_embeddings (4096"), "{e}");
        let e = refused("dense", &[&f[..], &["--fit-memory", "2MB", "--reserve", "0"]].concat());
        assert!(
            e.contains(&format!("--fit-memory 2000000 (2.00 MB) − {kv} bytes of K/V cache (4096 tokens"))
                && e.contains(&format!("{state} bytes of reserve"))
                && e.contains("no room"),
            "{e}"
        );
        // Room, but less than the smallest output: the room and the smallest size named (the
        // cache at 2 bytes a value, the least any plan's client takes).
        let e = refused("dense", &[&f[..], &["--fit-memory", "500KB", "--context", "256", "--reserve", "0"]].concat());
        let (kv, _) = expected(&text_config("dense"), 256, 2);
        let left = 500_000 - kv - state;
        assert!(
            e.contains(&format!("= {left} bytes")) && e.contains("the smallest output this format can make is"),
            "{e}"
        );
        for junk in [&["--fit-memory", "lots"][..], &["--fit-memory", "0"], &["--fit-memory", "5MB", "--context", "0"]]
        {
            refused("dense", &[&f[..], junk].concat());
        }
        for junk in [&["--fit-memory", "5MB", "--context", "1k"][..], &["--fit-memory", "5MB", "--reserve", "x"]] {
            refused("dense", &[&f[..], junk].concat());
        }
        let e = refused("dense", &[&f[..], &["--fit-memory", "5MB", "--max-size", "3MB"]].concat());
        assert!(e.contains("'--fit-memory <M>' cannot be used with '--max-size <SIZE>'"), "{e}");
        for alone in [&["--context", "1000"][..], &["--reserve", "1MB"]] {
            let e = refused("dense", &[&f[..], alone].concat());
            assert!(e.contains("--fit-memory <M>"), "{e}");
        }
    }
    let e = refused("dense", &["--format", "exl3", "--fit-memory", "5MB"]);
    assert!(e.contains("--fit-memory applies to --format mlx and gguf only"), "{e}");
    let e = refused("dense", &["--format", "gguf", "--fit-memory", "5MB", "--gguf-type", "q4_k_m"]);
    assert!(e.contains("--fit-memory and --gguf-type conflict"), "{e}");
}

#[test]
fn a_model_without_config_json_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let input = crate::synth::write_checkpoint(&tmp.path().join("in"), &crate::synth::small_checkpoint(14));
    let out = tmp.path().join("out");
    for format in FORMATS {
        let o = escha_convert()
            .arg(input.join("model.safetensors"))
            .arg(&out)
            .args(["--quiet", "--format", format, "--fit-memory", "5MB"])
            .output()
            .unwrap();
        let e = stderr(&o);
        if format == "gguf" {
            // GGUF refuses a single file first: its model keys are written from config.json.
            assert_eq!(o.status.code(), Some(1), "{e}");
            assert!(e.contains("a single .safetensors file has no config.json"), "{e}");
        } else {
            assert_eq!(o.status.code(), Some(2), "{e}");
            assert!(e.contains("--fit-memory sizes the K/V cache and the recurrent state from config.json"), "{e}");
        }
        assert!(!out.exists());
    }
}
