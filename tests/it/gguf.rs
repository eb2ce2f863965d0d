//! `--format gguf` as llama.cpp and its user see it: a GGUF v3 file (or a `gguf-split` set) whose
//! header, alignment and tensor data llama.cpp's loader accepts (read by `gguf_reader.rs`), the
//! same bytes on every run; a split set that is the single file cut in pieces; `--force` that
//! replaces only its own earlier output; failures that leave nothing behind; and `--dry-run --json`
//! / `--json` that tell the truth. The refusals are in `gguf_refusals.rs`.

use crate::common::{copy_tree, escha_convert, fixture, limit_address_space, output_within, snapshot, stderr};
use crate::gguf_reader::{check_layout, ggml_type, tensor_bytes, GgufFile, Val};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};
// ---------------------------------------------------------------------------------------------
// Running the tool.

pub(crate) fn convert(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let o = escha_convert().arg(input).arg(out).args(["--format", "gguf", "--quiet"]).args(extra).output().unwrap();
    assert!(o.status.success(), "{} {extra:?}: {}", input.display(), stderr(&o));
    o
}

/// Every file of a directory (outputs are flat), name → bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

fn gguf_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    files(dir).into_iter().filter(|(n, _)| Path::new(n).extension().is_some_and(|e| e == "gguf")).collect()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// A copy of fixture `model` in `tmp`/`name`, with `edit` applied to its `file` (JSON).
pub(crate) fn edited(tmp: &Path, name: &str, model: &str, file: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let dir = tmp.join(name);
    copy_tree(&fixture(model), &dir);
    let path = dir.join(file);
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    dir
}

/// The text config of a fixture's config.json (where Qwen3.5 keeps the model's numbers).
pub(crate) fn text(config: &mut Value) -> &mut serde_json::Map<String, Value> {
    config["text_config"].as_object_mut().unwrap()
}

/// Runs the tool on `input` into a fresh OUT under a 4 GiB address-space limit and a 60 s
/// deadline (300 s emulated); returns its output, the time it took, and the parent of OUT.
pub(crate) fn run_bounded(input: &Path, extra: &[&str]) -> (Output, Duration, tempfile::TempDir) {
    let parent = tempfile::tempdir().unwrap();
    let mut cmd = escha_convert();
    cmd.arg(input).arg(parent.path().join("out")).args(["--format", "gguf", "--quiet", "-j", "2"]).args(extra);
    cmd.env("RUST_BACKTRACE", "0");
    limit_address_space(&mut cmd, 4 << 30);
    let t0 = Instant::now();
    let o = output_within(&mut cmd, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{} {extra:?}: {e}", input.display()));
    (o, t0.elapsed(), parent)
}

/// The failure contract: exit 1 (not a signal, not a panic), one error line containing every
/// `expect`, no OUT, no staging directory and no lock beside it, the input untouched. Returns
/// the message, or what was wrong.
pub(crate) fn failure(input: &Path, extra: &[&str], expect: &[&str]) -> Result<String, String> {
    let before = snapshot(input);
    let (o, took, parent) = run_bounded(input, extra);
    let err = stderr(&o);
    let case = format!("{} {extra:?}", input.file_name().unwrap().to_string_lossy());
    assert_eq!(snapshot(input), before, "{case}: the input is untouched");
    let left = names_in(parent.path());
    if o.status.code() != Some(1) {
        return Err(format!("{case}: exit {:?} after {took:?} (expected 1); left {left:?}; stderr: {err}", o.status));
    }
    if !left.is_empty() {
        return Err(format!("{case}: left {left:?} beside OUT; stderr: {err}"));
    }
    if err.trim_end().lines().count() != 1 || !err.starts_with("escha-convert: error: ") {
        return Err(format!("{case}: not one error line: {err}"));
    }
    if let Some(missing) = expect.iter().find(|e| !err.contains(*e)) {
        return Err(format!("{case}: the message does not name {missing:?}: {err}"));
    }
    Ok(err)
}

pub(crate) fn fails(input: &Path, extra: &[&str], expect: &[&str]) -> String {
    failure(input, extra, expect).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------------------------
// 1. The file is what llama.cpp reads, the same bytes every time.

#[test]
fn the_file_is_what_llama_cpp_reads_and_the_same_bytes_every_run() {
    let tmp = tempfile::tempdir().unwrap();
    for (model, arch) in [("dense", "qwen35"), ("moe", "qwen35moe")] {
        for ty in ["bf16", "q8_0", "q4_k_m"] {
            let case = format!("{model} {ty}");
            let outs: Vec<PathBuf> = ["-j1", "-j2", "-j2 again"]
                .iter()
                .map(|j| {
                    let out = tmp.path().join(format!("{model}-{ty}-{}", j.replace(' ', "-")));
                    convert(&fixture(model), &out, &["--gguf-type", ty, &j[..3]]);
                    out
                })
                .collect();
            assert_eq!(names_in(&outs[0]), [".escha-convert.json", "README.md", "model.gguf"], "{case}");
            let f = check_layout(&outs[0].join("model.gguf"));
            assert_eq!(f.get("general.architecture"), Some(&Val::Str(arch.into())), "{case}");
            assert!(matches!(f.get(&format!("{arch}.block_count")), Some(Val::Int(4, n)) if *n > 0), "{case}");
            assert!(
                matches!(f.get("tokenizer.ggml.tokens"), Some(Val::Arr(8, t)) if !t.is_empty()),
                "{case}: the vocabulary is in the header"
            );
            assert!(f.tensors.iter().any(|t| t.name == "token_embd.weight"), "{case}");
            let one = gguf_files(&outs[0]);
            for other in &outs[1..] {
                assert!(one == gguf_files(other), "{case}: {} differs from {}", other.display(), outs[0].display());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. A split set is the single file cut at tensor boundaries, as gguf-split writes it.

#[test]
fn a_split_set_is_the_single_file_in_pieces() {
    let tmp = tempfile::tempdir().unwrap();
    for (model, arch) in [("dense", "qwen35"), ("moe", "qwen35moe")] {
        let single = tmp.path().join(format!("{model}-single"));
        convert(&fixture(model), &single, &[]);
        let whole = check_layout(&single.join("model.gguf"));
        let split = tmp.path().join(format!("{model}-split"));
        convert(&fixture(model), &split, &["--max-shard-size", "200KB"]);
        let names: Vec<String> = gguf_files(&split).into_keys().collect();
        let n = names.len();
        assert!(n >= 3, "{model}: {names:?}");
        let expected: Vec<String> = (1..=n).map(|i| format!("model-{i:05}-of-{n:05}.gguf")).collect();
        assert_eq!(names, expected, "{model}: gguf-split's names");
        assert!(!split.join("model.gguf").exists());

        let mut union = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let f = check_layout(&split.join(name));
            let case = format!("{model} {name}");
            assert_eq!(f.get("split.no"), Some(&Val::Int(2, i as i128)), "{case}: split.no is a u16");
            assert_eq!(f.get("split.count"), Some(&Val::Int(2, n as i128)), "{case}: split.count is a u16");
            assert_eq!(
                f.get("split.tensors.count"),
                Some(&Val::Int(5, whole.tensors.len() as i128)),
                "{case}: split.tensors.count is an i32"
            );
            if i == 0 {
                assert_eq!(f.get("general.architecture"), Some(&Val::Str(arch.into())), "{case}");
                for key in ["tokenizer.ggml.tokens".to_string(), format!("{arch}.block_count")] {
                    assert_eq!(f.get(&key), whole.get(&key), "{case}: {key}");
                }
                let model_keys: Vec<&str> = f.keys().into_iter().filter(|k| !k.starts_with("split.")).collect();
                assert_eq!(model_keys, whole.keys(), "{case}: the first file holds every model key, in order");
            } else {
                let mut keys = f.keys();
                keys.sort_unstable();
                assert_eq!(keys, ["split.count", "split.no", "split.tensors.count"], "{case}: only the split keys");
            }
            assert!(!f.tensors.is_empty(), "{case}: no empty file");
            for t in &f.tensors {
                union.push((t.name.clone(), t.dims.clone(), t.ty, f.data(t).to_vec()));
            }
        }
        assert_eq!(union.len(), whole.tensors.len(), "{model}: every tensor once");
        let mut union: BTreeMap<String, (Vec<u64>, u32, Vec<u8>)> =
            union.into_iter().map(|(name, dims, ty, data)| (name, (dims, ty, data))).collect();
        for t in &whole.tensors {
            let (dims, ty, data) = union.remove(&t.name).unwrap_or_else(|| panic!("{model}: {} not split", t.name));
            assert_eq!((&dims, ty), (&t.dims, t.ty), "{model}: {}", t.name);
            assert!(data == whole.data(t), "{model}: {}: the split file's bytes differ from the single file's", t.name);
        }
        assert!(union.is_empty(), "{model}: tensors only the split set has: {:?}", union.keys());
    }
}

// ---------------------------------------------------------------------------------------------
// 3. --force and GGUF outputs.

#[test]
fn force_replaces_an_earlier_gguf_output_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let dense = fixture("dense");
    let run =
        |out: &Path, args: &[&str]| escha_convert().arg(&dense).arg(out).arg("--quiet").args(args).output().unwrap();
    let out = tmp.path().join("out");
    let ok = |o: Output, what: &str| assert!(o.status.success(), "{what}: {}", stderr(&o));
    ok(run(&out, &["--format", "gguf"]), "first run");
    ok(run(&out, &["--format", "gguf", "--force"]), "gguf over gguf");
    ok(run(&out, &["--format", "gguf", "--force", "--max-shard-size", "200KB"]), "split over single");
    assert!(names_in(&out).iter().all(|n| n.starts_with("model-") || n == ".escha-convert.json" || n == "README.md"));
    ok(run(&out, &["--format", "gguf", "--force"]), "single over split");
    assert_eq!(names_in(&out), [".escha-convert.json", "README.md", "model.gguf"], "no split file is left over");
    ok(run(&out, &["--force"]), "bf16 over gguf");
    assert!(out.join("model-00001-of-00001.safetensors").is_file() && !out.join("model.gguf").exists());
    ok(run(&out, &["--format", "gguf", "--force"]), "gguf over bf16");
    assert_eq!(names_in(&out), [".escha-convert.json", "README.md", "model.gguf"], "no safetensors file is left over");

    // A model.gguf someone else wrote: no marker, so not ours.
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("model.gguf"), b"GGUF\x03\x00\x00\x00 someone else's model").unwrap();
    let before = snapshot(&theirs);
    let o = run(&theirs, &["--format", "gguf", "--force"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("model.gguf") && stderr(&o).contains("nothing shows that this tool wrote it"),
        "{}",
        stderr(&o)
    );
    assert_eq!(snapshot(&theirs), before, "left byte for byte");
    assert_eq!(names_in(tmp.path()), ["out", "theirs"], "no staging and no lock left");

    // Our output with a file added is no longer only ours.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let before = snapshot(&out);
    let o = run(&out, &["--format", "gguf", "--force"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("notes.txt"), "names the file: {}", stderr(&o));
    assert_eq!(snapshot(&out), before);
    assert_eq!(names_in(tmp.path()), ["out", "theirs"], "no staging and no lock left");
}

// ---------------------------------------------------------------------------------------------
// 4. Failures leave nothing behind.

#[test]
fn a_failure_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    // A pre-tokenizer whose llama.cpp name nobody knows: refused, naming what was found.
    let odd = edited(tmp.path(), "odd-pre", "dense", "tokenizer.json", |t| {
        t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = Value::from(r"\p{L}+|\s+");
    });
    fails(&odd, &[], &["tokenizer.json", r"p{L}+|", "pre-tokenizer", "--gguf-vocab none"]);
    // --gguf-vocab none converts it: the same tensors, no tokenizer keys but the one that says so.
    let none = tmp.path().join("none");
    convert(&odd, &none, &["--gguf-vocab", "none"]);
    let plain = tmp.path().join("plain");
    convert(&fixture("dense"), &plain, &[]);
    let (a, b) = (check_layout(&none.join("model.gguf")), check_layout(&plain.join("model.gguf")));
    assert!(a.keys().iter().all(|k| !k.starts_with("tokenizer.") || *k == "tokenizer.ggml.model"), "{:?}", a.keys());
    assert_eq!(a.get("tokenizer.ggml.model"), Some(&Val::Str("none".into())));
    assert!(b.keys().iter().any(|k| k.starts_with("tokenizer.")));
    assert_eq!(a.get("qwen35.block_count"), b.get("qwen35.block_count"));
    let infos = |f: &GgufFile| f.tensors.iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty)).collect::<Vec<_>>();
    assert_eq!(infos(&a), infos(&b));
    for (x, y) in a.tensors.iter().zip(&b.tensors) {
        assert!(a.data(x) == b.data(y), "{}", x.name);
    }

    // No tokenizer.json at all: the message says how to go on.
    let bare = tmp.path().join("bare");
    copy_tree(&fixture("dense"), &bare);
    std::fs::remove_file(bare.join("tokenizer.json")).unwrap();
    fails(&bare, &[], &["tokenizer.json", "--gguf-vocab none"]);

    // An architecture llama.cpp's GGUF layout is not written for.
    let llama = edited(tmp.path(), "llama", "dense", "config.json", |c| {
        c["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    });
    fails(&llama, &[], &["config.json", "LlamaForCausalLM"]);

    // A NaN in a norm: refused by name before anything is written.
    let nan = tmp.path().join("nan");
    copy_tree(&fixture("dense"), &nan);
    poke_f16(
        &nan.join("model-00001-of-00002.safetensors"),
        "model.language_model.layers.3.post_attention_layernorm.weight",
        5,
        0x7e00,
    );
    let norm = "model.language_model.layers.3.post_attention_layernorm.weight";
    fails(&nan, &[], &[norm, "NaN", "index 5"]);
    fails(&nan, &["--max-shard-size", "200KB"], &[norm, "NaN"]);
}

/// Sets element `index` of F16 tensor `name` in safetensors file `path` to the bits `bits`.
fn poke_f16(path: &Path, name: &str, index: usize, bits: u16) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header[name]["dtype"], "F16", "{name}");
    let at = 8 + n + header[name]["data_offsets"][0].as_u64().unwrap() as usize + 2 * index;
    bytes[at..at + 2].copy_from_slice(&bits.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 6. --dry-run --json and --json say what is written.

#[test]
fn json_and_dry_run_json_list_what_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    for model in ["dense", "moe"] {
        for shard in [None, Some("200KB")] {
            let case = format!("{model} {shard:?}");
            let mut args = vec!["--json"];
            if let Some(s) = shard {
                args.extend(["--max-shard-size", s]);
            }
            let out = tmp.path().join(format!("{model}-{}", shard.unwrap_or("one")));
            let dry = escha_convert()
                .arg(fixture(model))
                .arg(&out)
                .args(["--format", "gguf", "--quiet", "--dry-run"])
                .args(&args)
                .output()
                .unwrap();
            assert!(dry.status.success(), "{case}: {}", stderr(&dry));
            assert!(!out.exists(), "{case}: a dry run writes nothing");
            let plan: Value = serde_json::from_slice(&dry.stdout).unwrap();
            assert_eq!(plan["dry_run"], true);
            assert_eq!(plan["would_refuse"], Value::Null, "{case}");

            let real: Value = serde_json::from_slice(&convert(&fixture(model), &out, &args).stdout).unwrap();
            assert_eq!(plan["shards"], real["shards"], "{case}: the planned shards are the written ones");
            assert_eq!(plan["tensors"], real["tensors"], "{case}: the planned tensors are the written ones");
            assert_eq!(plan["format"], "gguf");

            // Every file written is listed, and nothing else.
            let listed: BTreeSet<String> =
                real["files"].as_array().unwrap().iter().map(|f| f["file"].as_str().unwrap().to_string()).collect();
            assert_eq!(listed, names_in(&out).into_iter().collect(), "{case}");
            let shards = real["shards"].as_array().unwrap();
            let on_disk = gguf_files(&out);
            assert_eq!(shards.len(), on_disk.len(), "{case}");
            let mut total = 0;
            for s in shards {
                let name = s["file"].as_str().unwrap();
                let bytes = &on_disk[name];
                assert_eq!(s["bytes"], bytes.len() as u64, "{case}: {name}'s size");
                let f = check_layout(&out.join(name));
                assert_eq!(s["tensors"], f.tensors.len(), "{case}: {name}'s tensor count");
                total += bytes.len() as u64;
            }
            assert_eq!(real["bytes_written"], total, "{case}");

            // The tensor list: every tensor, in its file, with its ggml type, shape and size.
            let mut headers: BTreeMap<String, (String, String, Vec<u64>, u64)> = BTreeMap::new();
            for name in on_disk.keys() {
                for t in check_layout(&out.join(name)).tensors {
                    let dims: Vec<u64> = t.dims.iter().rev().copied().collect();
                    headers.insert(t.name.clone(), (name.clone(), ggml_type(t.ty).0.into(), dims, tensor_bytes(&t)));
                }
            }
            let tensors = real["tensors"].as_array().unwrap();
            assert_eq!(tensors.len(), headers.len(), "{case}");
            for t in tensors {
                let name = t["name"].as_str().unwrap();
                let (file, dtype, dims, bytes) = &headers[name];
                assert_eq!(t["file"], *file, "{case}: {name}");
                assert_eq!(t["dtype"], *dtype, "{case}: {name}");
                assert_eq!(t["bytes"], *bytes, "{case}: {name}");
                let shape: Vec<u64> = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
                assert_eq!(&shape, dims, "{case}: {name}");
            }
        }
    }
}
