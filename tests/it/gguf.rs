//! `--format gguf` as llama.cpp and its user see it: a GGUF v3 file (or a `gguf-split` set) whose
//! header, alignment and tensor data llama.cpp's loader accepts, the same bytes on every run; a
//! split set that is the single file cut in pieces; `--force` that replaces only its own earlier
//! output; failures that leave nothing behind; hostile configs and tokenizers refused with a clear
//! message, in bounded time and memory; and `--dry-run --json` / `--json` that tell the truth.
//!
//! The header is read by a parser of its own here (not the crate's), so a writer bug cannot hide
//! behind a reader with the same bug.

use crate::common::{copy_tree, escha_convert, fixture, limit_address_space, output_within, snapshot};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// A GGUF reader, from the format's specification (ggml/docs/gguf.md).

/// A metadata value: integers of every width as `Int` with their GGUF type id.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Val {
    Int(u32, i128),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Arr(u32, Vec<Val>),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorInfo {
    pub(crate) name: String,
    /// Innermost first, as ggml counts them.
    pub(crate) dims: Vec<u64>,
    ty: u32,
    /// Within the data section.
    offset: u64,
}

pub(crate) struct GgufFile {
    version: u32,
    /// In file order.
    kv: Vec<(String, Val)>,
    pub(crate) tensors: Vec<TensorInfo>,
    data_start: u64,
    bytes: Vec<u8>,
}

impl TensorInfo {
    /// gguf-py's name of its ggml type (`Q4_K`).
    pub(crate) fn type_name(&self) -> &'static str {
        ggml_type(self.ty).0
    }
}

impl GgufFile {
    pub(crate) fn get(&self, key: &str) -> Option<&Val> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(crate) fn keys(&self) -> Vec<&str> {
        self.kv.iter().map(|(k, _)| k.as_str()).collect()
    }

    /// The data bytes of tensor `t` (one of this file's).
    fn data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_start + t.offset) as usize;
        &self.bytes[start..start + tensor_bytes(t) as usize]
    }
}

struct Cursor<'a>(&'a [u8], usize);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        assert!(self.1 + n <= self.0.len(), "the header runs past the end of the file at byte {}", self.1);
        self.1 += n;
        &self.0[self.1 - n..self.1]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8(self.take(n).to_vec()).expect("GGUF strings are UTF-8")
    }
    fn value(&mut self, ty: u32) -> Val {
        let int = |c: &mut Self, n: usize, signed: bool| {
            let b = c.take(n);
            let mut v = [0u8; 16];
            v[..n].copy_from_slice(b);
            if signed && b[n - 1] & 0x80 != 0 {
                v[n..].fill(0xff);
            }
            i128::from_le_bytes(v)
        };
        match ty {
            0 | 2 | 4 | 10 => Val::Int(ty, int(self, [1, 0, 2, 0, 4, 0, 0, 0, 0, 0, 8][ty as usize], false)),
            1 | 3 | 5 | 11 => Val::Int(ty, int(self, [0, 1, 0, 2, 0, 4, 0, 0, 0, 0, 0, 8][ty as usize], true)),
            6 => Val::F32(f32::from_le_bytes(self.take(4).try_into().unwrap())),
            12 => Val::F64(f64::from_le_bytes(self.take(8).try_into().unwrap())),
            7 => {
                let b = self.take(1)[0];
                assert!(b <= 1, "a bool of {b}");
                Val::Bool(b == 1)
            }
            8 => Val::Str(self.string()),
            9 => {
                let elem = self.u32();
                let n = self.u64();
                Val::Arr(elem, (0..n).map(|_| self.value(elem)).collect())
            }
            other => panic!("GGUF value type {other}"),
        }
    }
}

fn parse(path: &Path) -> GgufFile {
    let bytes = std::fs::read(path).unwrap();
    let mut c = Cursor(&bytes, 0);
    assert_eq!(c.take(4), b"GGUF", "{}: magic", path.display());
    let version = c.u32();
    let n_tensors = c.u64();
    let n_kv = c.u64();
    let kv = (0..n_kv)
        .map(|_| {
            let key = c.string();
            let ty = c.u32();
            (key, c.value(ty))
        })
        .collect();
    let tensors = (0..n_tensors)
        .map(|_| {
            let name = c.string();
            let n_dims = c.u32();
            assert!((1..=4).contains(&n_dims), "{name}: {n_dims} dimensions");
            let dims = (0..n_dims).map(|_| c.u64()).collect();
            TensorInfo { name, dims, ty: c.u32(), offset: c.u64() }
        })
        .collect();
    let data_start = (c.1 as u64).div_ceil(ALIGN) * ALIGN;
    GgufFile { version, kv, tensors, data_start, bytes }
}

const ALIGN: u64 = 32;

/// (name, values per block, bytes per block) of a ggml type id.
fn ggml_type(ty: u32) -> (&'static str, u64, u64) {
    match ty {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        30 => ("BF16", 1, 2),
        other => panic!("ggml type {other}, not one this tool writes"),
    }
}

fn tensor_bytes(t: &TensorInfo) -> u64 {
    let (name, block, size) = ggml_type(t.ty);
    assert!(t.dims[0].is_multiple_of(block), "{}: rows of {} values are not whole {name} blocks", t.name, t.dims[0]);
    t.dims.iter().product::<u64>() / block * size
}

/// Checks everything llama.cpp's loader (gguf.cpp and llama-model-loader) checks of the layout,
/// and returns the parsed file.
pub(crate) fn check_layout(path: &Path) -> GgufFile {
    let f = parse(path);
    let what = path.display();
    assert_eq!(f.version, 3, "{what}: version");
    match f.get("general.alignment") {
        None | Some(Val::Int(4, 32)) => {}
        Some(other) => panic!("{what}: general.alignment {other:?}, expected absent or u32 32"),
    }
    let mut keys = BTreeSet::new();
    for k in f.keys() {
        assert!(keys.insert(k), "{what}: key {k} twice");
    }
    assert_eq!(f.data_start % ALIGN, 0);
    assert!(f.data_start <= f.bytes.len() as u64, "{what}: the data section starts past the end of the file");
    // gguf.cpp requires each tensor at the padded end of the one before it, and reads the data
    // section as the sum of the padded sizes, the last tensor's padding included.
    let mut names = BTreeSet::new();
    let mut end = 0;
    for t in &f.tensors {
        assert!(t.name.len() <= 63, "{what}: tensor name {} is {} bytes, ggml holds 63", t.name, t.name.len());
        assert!(names.insert(t.name.as_str()), "{what}: tensor {} twice", t.name);
        assert_eq!(t.offset % ALIGN, 0, "{what}: {} at offset {}", t.name, t.offset);
        assert_eq!(t.offset, end, "{what}: {} is not at the padded end of the tensor before it", t.name);
        end = (t.offset + tensor_bytes(t)).div_ceil(ALIGN) * ALIGN;
    }
    let last = f.tensors.last().expect("tensors");
    assert_eq!(
        f.bytes.len() as u64,
        f.data_start + end,
        "{what}: file length against data start {} + last offset {} + last size {} (padded to {ALIGN})",
        f.data_start,
        last.offset,
        tensor_bytes(last)
    );
    f
}

// ---------------------------------------------------------------------------------------------
// Running the tool.

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

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
