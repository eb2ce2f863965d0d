//! Memory in proportion to the input: no input makes `inspect`, `--dry-run` or a conversion use
//! memory out of proportion to its size. Every run here is of a hostile copy of a fixture (a few
//! hundred kB) whose numbers claim billions of layers, tokens, heads or elements, under an
//! address-space limit far above what a normal run needs, and must end with exit 0 or 1 within a
//! deadline: never a signal (an allocation the limit refuses aborts the process), never a panic.

use crate::common::{copy_tree, escha_convert, fixture, limit_address_space, output_within, stderr};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The address-space limit of every run: 1 GiB. A normal run of either fixture (`-j 2`) reserves
/// at most about 340 MiB of address space (`VmPeak` at exit: 205 MiB for `inspect`, 337 MiB for a
/// conversion, mostly malloc's per-thread arenas, reserved rather than used), passes under a limit
/// as low as 16 MiB (`inspect`) to 24 MiB (a conversion), and touches under 10 MiB; a count taken
/// from a claim rather than from the bytes costs gigabytes.
const LIMIT: u64 = 1 << 30;
/// Far longer than any run of a fixture takes (well under a second each).
const DEADLINE: Duration = Duration::from_secs(60);

/// The commands every input is run with (OUT added where one is written).
const RUNS: &[(&str, &[&str])] = &[
    ("inspect", &[]),
    ("inspect --json", &["--json"]),
    ("--dry-run", &["--dry-run"]),
    ("bf16", &["--format", "bf16"]),
    ("mlx", &["--format", "mlx"]),
    ("gguf q4_k_m", &["--format", "gguf", "--gguf-type", "q4_k_m"]),
    // An MTP head written whatever it lacks: its layers counted from its tensors' names.
    ("gguf q4_k_m --mtp keep", &["--format", "gguf", "--gguf-type", "q4_k_m", "--mtp", "keep"]),
];

/// Runs every command of [`RUNS`] on `input` under the limit; returns what broke the contract
/// (for a `normal` input, anything but success).
fn check(input: &Path, normal: bool) -> Vec<String> {
    let case = input.file_name().unwrap().to_string_lossy().into_owned();
    let mut wrong = Vec::new();
    for (what, args) in RUNS {
        let parent = tempfile::tempdir().unwrap();
        let mut cmd = escha_convert();
        if what.starts_with("inspect") {
            cmd.arg("inspect").arg(input);
        } else {
            // Two threads: the limit then bounds what the input makes the tool allocate, not the
            // stacks and allocator arenas of one thread per core.
            cmd.arg(input).arg(parent.path().join("out")).args(["--quiet", "-j", "2"]);
        }
        cmd.args(*args).env("RUST_BACKTRACE", "0").env("RAYON_NUM_THREADS", "2");
        limit_address_space(&mut cmd, LIMIT);
        let o = match output_within(&mut cmd, DEADLINE) {
            Ok(o) => o,
            Err(e) => {
                wrong.push(format!("{case} {what}: {e}"));
                continue;
            }
        };
        let err = stderr(&o);
        let first = err.lines().find(|l| !l.contains(": warning: ")).unwrap_or_default();
        if normal && !o.status.success() || !matches!(o.status.code(), Some(0 | 1)) || err.contains("panicked") {
            wrong.push(format!("{case} {what}: {:?}: {}", o.status, err.trim_end()));
        } else if o.status.code() == Some(1) && !first.starts_with("escha-convert: error: ") {
            wrong.push(format!("{case} {what}: exit 1 without an error line: {}", err.trim_end()));
        }
    }
    wrong
}

/// A copy of fixture `model` named `name` under `tmp`.
fn copy_of(tmp: &Path, name: &str, model: &str) -> PathBuf {
    let dir = tmp.join(name);
    copy_tree(&fixture(model), &dir);
    dir
}

/// Edits a JSON file in place.
fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// A copy of fixture `model` whose config.json's text config has `key` set to `value`.
fn with_config(tmp: &Path, name: &str, model: &str, key: &str, value: u64) -> PathBuf {
    let dir = copy_of(tmp, name, model);
    edit_json(&dir.join("config.json"), |c| c["text_config"][key] = Value::from(value));
    dir
}

/// Rewrites the header of the safetensors file `path` with `edit` (the tensor bytes unchanged,
/// the header padded to 8 bytes as writers do).
fn edit_header(path: &Path, edit: impl FnOnce(&mut Map<String, Value>)) {
    let bytes = std::fs::read(path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    edit(&mut header);
    let mut text = serde_json::to_string(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + len..]);
    std::fs::write(path, out).unwrap();
}

/// Renames tensor `old` to `new` in `map` (a header or a weight map), keeping its place.
fn rename(map: &mut Map<String, Value>, old: &str, new: &str) {
    assert!(map.contains_key(old), "{old}");
    *map = std::mem::take(map).into_iter().map(|(k, v)| (if k == old { new.to_string() } else { k }, v)).collect();
}

/// The shard of the dense fixture's index that holds `tensor`.
fn shard_of(dir: &Path, tensor: &str) -> PathBuf {
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    dir.join(index["weight_map"][tensor].as_str().unwrap())
}

/// Every hostile input, built under `tmp`.
fn hostile_inputs(tmp: &Path) -> Vec<PathBuf> {
    let mut inputs = Vec::new();
    // 1. A tensor of a transformer block far past the last, in its shard's header and the index.
    let dir = copy_of(tmp, "stray-block-3999999999", "dense");
    let (old, new) = (
        "model.language_model.layers.3.input_layernorm.weight",
        "model.language_model.layers.3999999999.input_layernorm.weight",
    );
    edit_header(&shard_of(&dir, old), |h| rename(h, old, new));
    edit_json(&dir.join("model.safetensors.index.json"), |i| {
        rename(i["weight_map"].as_object_mut().unwrap(), old, new);
    });
    inputs.push(dir);
    // The same in the MTP head, whose config claims layers enough to reach it.
    let dir = with_config(tmp, "stray-mtp-layer-3999999999", "dense", "mtp_num_hidden_layers", 1_000_000_000_000_000);
    let (old, new) = ("mtp.layers.0.input_layernorm.weight", "mtp.layers.3999999999.input_layernorm.weight");
    edit_header(&dir.join("mtp").join("model.safetensors"), |h| rename(h, old, new));
    inputs.push(dir);
    // 2.-5. Counts in config.json that no tensor bears out.
    for (model, key, value) in [
        ("dense", "num_hidden_layers", 4_000_000_000),
        ("dense", "vocab_size", 4_000_000_000),
        ("dense", "mtp_num_hidden_layers", 1_000_000_000_000_000),
        ("dense", "num_attention_heads", 4_000_000_000),
        ("dense", "num_key_value_heads", 4_000_000_000),
        ("dense", "head_dim", 4_000_000_000),
        ("dense", "linear_num_key_heads", 4_000_000_000),
        ("dense", "linear_num_value_heads", 4_000_000_000),
        ("dense", "linear_value_head_dim", 4_000_000_000),
        ("dense", "intermediate_size", 4_000_000_000),
        ("dense", "hidden_size", 4_000_000_000),
        ("dense", "num_attention_heads", 1 << 62),
        ("dense", "linear_num_value_heads", 1 << 62),
        ("dense", "intermediate_size", 1 << 62),
        ("moe", "num_experts", 4_000_000_000),
        ("moe", "moe_intermediate_size", 4_000_000_000),
        ("moe", "mtp_num_hidden_layers", 1_000_000_000_000_000),
    ] {
        inputs.push(with_config(tmp, &format!("{model}-{key}-{value}"), model, key, value));
    }
    // 6. A header that declares a tensor of 2^62 elements in a few bytes.
    for tensor in
        ["model.language_model.layers.3.input_layernorm.weight", "model.language_model.layers.0.mlp.up_proj.escha_code"]
    {
        let dir = copy_of(tmp, &format!("shape-2^31x2^31-{tensor}"), "dense");
        edit_header(&shard_of(&dir, tensor), |h| h[tensor]["shape"] = Value::from(vec![1u64 << 31, 1u64 << 31]));
        inputs.push(dir);
    }
    inputs
}

#[test]
fn normal_runs_of_the_fixtures_fit_the_limit() {
    // (The MoE fixture's MTP head is incomplete: GGUF refuses to keep it, so only dense counts
    // among the normal runs of `--mtp keep`; the hostile runs hold both to exit 0 or 1.)
    let mut wrong: Vec<String> = check(&fixture("dense"), true);
    wrong.extend(check(&fixture("moe"), false));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_input_makes_memory_out_of_proportion_to_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    let wrong: Vec<String> = hostile_inputs(tmp.path()).iter().flat_map(|input| check(input, false)).collect();
    assert!(wrong.is_empty(), "{} runs broke the contract:\n{}", wrong.len(), wrong.join("\n"));
}
