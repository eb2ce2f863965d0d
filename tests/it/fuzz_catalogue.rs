//! A bounded fuzz run over the checkpoint catalogue: shard headers, the index and config.json of a
//! small sharded checkpoint are mutated (JSON nodes replaced by hostile values, keys renamed,
//! bytes flipped, files cut short), and `inspect`, a dry run and a conversion are run in-process on
//! each. Whatever the input, each returns an error or a result within a time bound: no panic, no
//! abort, no hang, and a failed conversion leaves no OUT. `PROPTEST_CASES` sets the number of cases.

use crate::synth::*;
use escha_convert::convert::{convert, ConvertOptions};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

const SHARDS: [&str; 2] = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
const INDEX: &str = "model.safetensors.index.json";

/// Which file a mutation edits.
#[derive(Clone, Copy, Debug)]
enum Target {
    Header(usize),
    Index,
    Config,
}

#[derive(Clone, Debug)]
enum Mutation {
    /// Replace the `node`-th JSON node (depth-first, modulo the count) with `value`.
    Replace { target: Target, node: usize, value: Value },
    /// Rename the `node`-th object key to `key`.
    Rename { target: Target, node: usize, key: String },
    /// Insert `key: value` into the top-level object (config: also into `text_config`).
    Insert { target: Target, key: String, value: Value },
    /// Overwrite one byte of a shard at `at` (modulo its length).
    Byte { shard: usize, at: usize, value: u8 },
    /// Cut a shard to `keep` per mille of its length.
    Truncate { shard: usize, keep: u16 },
}

fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(1e15)),
        Just(json!(u64::MAX)),
        Just(json!(1e308)),
        Just(json!(0.5)),
        Just(json!("")),
        Just(json!("../../../etc/passwd")),
        Just(json!("/etc/passwd")),
        Just(json!("F64")),
        Just(json!("I8")),
        Just(json!("BF16")),
        Just(json!("model-00001-of-00002.safetensors")),
        Just(json!([])),
        Just(json!([0])),
        Just(json!([1_000_000_000_000_000u64, 1_000_000_000_000_000u64])),
        Just(json!([4_294_967_296u64, 4_294_967_296u64])),
        Just(json!([0, 18_446_744_073_709_551_615u64])),
        Just(json!(null)),
        Just(json!({})),
        Just(json!(true)),
        any::<i64>().prop_map(|v| json!(v)),
    ]
}

fn hostile_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("__metadata__".to_string()),
        Just("../escape".to_string()),
        Just("model.language_model.layers.0.mlp.up_proj.escha_x".to_string()),
        Just("model.language_model.layers.0.mlp.up_proj.ESCHA_S_OUT".to_string()),
        Just("model.language_model.layers.99999999999.mlp.up_proj.escha_code".to_string()),
        Just("mtp.layers.0.mlp.up_proj.weight".to_string()),
        Just("a\u{0}b".to_string()),
        "[a-z_.0-9]{1,40}",
    ]
}

fn config_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("mtp_num_hidden_layers"),
        Just("num_hidden_layers"),
        Just("hidden_size"),
        Just("vocab_size"),
        Just("tie_word_embeddings"),
        Just("quantization_config"),
        Just("layer_types"),
        Just("num_experts"),
        Just("text_config"),
        Just("architectures"),
    ]
    .prop_map(str::to_string)
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![(0..SHARDS.len()).prop_map(Target::Header), Just(Target::Index), Just(Target::Config)]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (target(), any::<usize>(), hostile_value()).prop_map(|(target, node, value)| Mutation::Replace { target, node, value }),
        2 => (target(), any::<usize>(), hostile_key()).prop_map(|(target, node, key)| Mutation::Rename { target, node, key }),
        2 => (target(), config_key(), hostile_value()).prop_map(|(target, key, value)| Mutation::Insert { target, key, value }),
        1 => (0..SHARDS.len(), any::<usize>(), any::<u8>()).prop_map(|(shard, at, value)| Mutation::Byte { shard, at, value }),
        1 => (0..SHARDS.len(), 0..1000u16).prop_map(|(shard, keep)| Mutation::Truncate { shard, keep }),
    ]
}

/// The unmutated checkpoint: two shards, an index and config.json.
fn checkpoint(dir: &Path) {
    let tensors = small_checkpoint(23);
    write_checkpoint(dir, &[]);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let (a, b): (Vec<T>, Vec<T>) = tensors.into_iter().partition(|t| !t.name.ends_with("escha_code"));
    let mut map = serde_json::Map::new();
    for (shard, part) in SHARDS.iter().zip([&a, &b]) {
        write_safetensors(&dir.join(shard), part);
        for t in part {
            map.insert(t.name.clone(), json!(shard));
        }
    }
    std::fs::write(dir.join(INDEX), json!({"metadata": {"total_size": 0}, "weight_map": map}).to_string()).unwrap();
}

/// JSON pointers of every node of `v`, depth first.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                pointers(c, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                pointers(c, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// Applies `edit` to a file's JSON (a shard's header, rewritten with its new length).
fn edit_json(dir: &Path, target: Target, edit: impl FnOnce(&mut Value)) {
    let (path, header) = match target {
        Target::Header(k) => (dir.join(SHARDS[k]), true),
        Target::Index => (dir.join(INDEX), false),
        Target::Config => (dir.join("config.json"), false),
    };
    // An earlier mutation may have broken the file: then this one leaves it as it is.
    let Ok(bytes) = std::fs::read(&path) else { return };
    let (json_bytes, data) = if header {
        let Some(n) = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize) else { return };
        let Some(json) = bytes.get(8..8usize.saturating_add(n)) else { return };
        (json, &bytes[8 + n..])
    } else {
        (&bytes[..], &[][..])
    };
    let Ok(mut v) = serde_json::from_slice::<Value>(json_bytes) else { return };
    edit(&mut v);
    let mut text = serde_json::to_vec(&v).unwrap();
    let out = if header {
        text.resize(text.len().div_ceil(8) * 8, b' ');
        [&(text.len() as u64).to_le_bytes()[..], &text, data].concat()
    } else {
        text
    };
    std::fs::write(path, out).unwrap();
}

fn apply(dir: &Path, m: &Mutation) {
    match m {
        Mutation::Replace { target, node, value } => edit_json(dir, *target, |v| {
            let mut ps = Vec::new();
            pointers(v, String::new(), &mut ps);
            if let Some(n) = v.pointer_mut(&ps[node % ps.len()]) {
                *n = value.clone();
            }
        }),
        Mutation::Rename { target, node, key } => edit_json(dir, *target, |v| {
            let mut ps = Vec::new();
            pointers(v, String::new(), &mut ps);
            ps.retain(|p| v.pointer(p).is_some_and(|n| n.as_object().is_some_and(|o| !o.is_empty())));
            if ps.is_empty() {
                return;
            }
            let obj = v.pointer_mut(&ps[node % ps.len()]).unwrap().as_object_mut().unwrap();
            let old = obj.keys().nth(node % obj.len()).unwrap().clone();
            let moved = obj.remove(&old).unwrap();
            obj.insert(key.clone(), moved);
        }),
        Mutation::Insert { target, key, value } => edit_json(dir, *target, |v| {
            if let Some(o) = v.as_object_mut() {
                o.insert(key.clone(), value.clone());
            }
            if let Some(o) = v.get_mut("text_config").and_then(Value::as_object_mut) {
                o.insert(key.clone(), value.clone());
            }
        }),
        Mutation::Byte { shard, at, value } => {
            let path = dir.join(SHARDS[*shard]);
            let mut bytes = std::fs::read(&path).unwrap();
            let n = bytes.len();
            bytes[at % n] = *value;
            std::fs::write(path, bytes).unwrap();
        }
        Mutation::Truncate { shard, keep } => {
            let path = dir.join(SHARDS[*shard]);
            let len = std::fs::metadata(&path).unwrap().len();
            std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len * u64::from(*keep) / 1000).unwrap();
        }
    }
}

fn options(input: &Path, output: PathBuf, dry_run: bool) -> ConvertOptions {
    ConvertOptions { card: false, threads: Some(1), dry_run, ..ConvertOptions::new(input.to_path_buf(), output) }
}

/// Runs inspect, a dry run and a conversion on `input`; `Err` names what went wrong with the tool.
fn exercise(input: &Path, scratch: &Path) -> Result<(), String> {
    let decoder = escha_convert::codec::simd::best_decoder();
    let _ = escha_convert::inspect::inspect(input);
    let _ = convert(&options(input, scratch.join("dry"), true), decoder);
    let out = scratch.join("out");
    match convert(&options(input, out.clone(), false), decoder) {
        Ok(_) if !out.join("config.json").is_file() => Err("a conversion that succeeded left no output".into()),
        Err(e) if out.exists() => Err(format!("a failed conversion left OUT behind: {e:#}")),
        _ => Ok(()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_catalogues_fail_cleanly(mutations in proptest::collection::vec(mutation(), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let input = tmp.path().join("in");
        checkpoint(&input);
        for m in &mutations {
            apply(&input, m);
        }
        let (tx, rx) = mpsc::channel();
        let scratch = tmp.path().to_path_buf();
        std::thread::spawn(move || {
            let outcome = std::panic::catch_unwind(|| exercise(&input, &scratch));
            let _ = tx.send(outcome.unwrap_or_else(|_| Err("panicked".into())));
        });
        let outcome = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| Err("no answer within 60 s".into()));
        prop_assert!(outcome.is_ok(), "{:?}: {}", mutations, outcome.unwrap_err());
    }
}

#[test]
fn the_unmutated_checkpoint_converts() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    checkpoint(&input);
    let out = tmp.path().join("out");
    convert(&options(&input, out.clone(), false), escha_convert::codec::simd::best_decoder()).unwrap();
    assert!(out.join("config.json").is_file());
}
