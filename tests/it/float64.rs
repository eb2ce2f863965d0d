//! F64 tensors are floats like any other: read as the nearest f32 and written as an F32 tensor in
//! the same place is, in every format and every position (norms with their +1, the MTP head,
//! `A_log` and `dt_bias`, conv1d, the router gates, int8 scales, the coded linears' vectors and
//! `s_in`/`s_out`), so no output holds an F64 tensor that mlx-lm, exllamav3 or llama.cpp refuses,
//! and GGUF follows `--gguf-type` for them. A value beyond f32's range is refused, naming the
//! tensor.
//!
//! Each case converts a fixture twice: once with the tensors of a position widened to
//! F32, once to F64 (the same values): the weights written must be the same bytes.

use crate::common::{copy_tree, escha_convert, fixture, stderr};
use crate::synth::{f16s, f32s, read_safetensors, write_safetensors, T};
use half::{bf16, f16};
use std::path::{Path, PathBuf};

/// A position: its name and the test on a tensor name that picks its tensors.
type Position = (&'static str, fn(&str) -> bool);

/// The positions.
const POSITIONS: [Position; 9] = [
    ("norms", |n| !n.starts_with("mtp.") && n.ends_with("norm.weight")),
    ("MTP head", |n| n.starts_with("mtp.")),
    ("A_log and dt_bias", |n| n.ends_with(".A_log") || n.ends_with(".dt_bias")),
    ("conv1d", |n| n.contains(".conv1d.")),
    ("router gates", |n| n.ends_with(".mlp.gate.weight") || n.ends_with("shared_expert_gate.weight")),
    ("int8 scales", |n| n.ends_with(".weight_scale")),
    ("s_in and s_out", |n| n.ends_with(".escha_s_in") || n.ends_with(".escha_s_out")),
    ("rin and rout", |n| n.ends_with(".escha_rin") || n.ends_with(".escha_rout")),
    ("biases", |n| n.rsplit_once('.').is_some_and(|(_, leaf)| leaf == "bias")),
];

/// The values of a float tensor's bytes.
fn values(dtype: &str, data: &[u8]) -> Vec<f64> {
    match dtype {
        "F16" => data.chunks_exact(2).map(|b| f64::from(f16::from_le_bytes([b[0], b[1]]).to_f32())).collect(),
        "BF16" => data.chunks_exact(2).map(|b| f64::from(bf16::from_le_bytes([b[0], b[1]]).to_f32())).collect(),
        "F32" => data.chunks_exact(4).map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap()))).collect(),
        "F64" => data.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect(),
        other => panic!("not a float: {other}"),
    }
}

/// Fixture `name` copied to `dir` with every float tensor `chosen` picks (in every safetensors
/// file, the separate MTP head's included) stored as `dtype` (F32 or F64), its values unchanged,
/// or replaced by `value` where given; the names changed.
fn variant(
    name: &str,
    dir: &Path,
    chosen: fn(&str) -> bool,
    dtype: &'static str,
    value: Option<f64>,
) -> (PathBuf, Vec<String>) {
    copy_tree(&fixture(name), dir);
    let mut changed = Vec::new();
    let mut files = vec![];
    for sub in [dir.to_path_buf(), dir.join("mtp")] {
        let Ok(entries) = std::fs::read_dir(&sub) else { continue };
        files.extend(entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "safetensors")));
    }
    for file in files {
        let tensors: Vec<T> = read_safetensors(&file)
            .into_iter()
            .map(|(name, (stored, shape, data))| {
                if !chosen(&name) || !matches!(stored.as_str(), "F16" | "BF16" | "F32") {
                    return T::new(&name, Box::leak(stored.into_boxed_str()), &shape, data);
                }
                changed.push(name.clone());
                let v = values(&stored, &data).into_iter().map(|x| value.unwrap_or(x));
                let data = match dtype {
                    "F32" => v.flat_map(|x| (x as f32).to_le_bytes()).collect(),
                    _ => v.flat_map(f64::to_le_bytes).collect(),
                };
                T::new(&name, dtype, &shape, data)
            })
            .collect();
        write_safetensors(&file, &tensors);
    }
    (dir.to_path_buf(), changed)
}

/// The weight files of an output (shards and GGUF files), name → bytes.
fn weights(out: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors" || x == "gguf"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: no weights", out.display());
    files
}

fn convert(input: &Path, out: &Path, args: &[&str]) {
    let o = escha_convert().arg(input).arg(out).args(args).arg("--quiet").output().unwrap();
    assert!(o.status.success(), "{args:?} {}: {}", input.display(), stderr(&o));
}

const FORMATS: [&[&str]; 4] = [&[], &["--format", "mlx"], &["--format", "gguf"], &["--format", "exl3"]];

#[test]
fn f64_in_every_position_is_written_as_f32_would_be_in_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    // `dense` has the complete MTP head (kept), biases and s_in/s_out; `moe` the router gates.
    for (i, (position, chosen)) in POSITIONS.into_iter().enumerate() {
        let mut found = false;
        for model in ["dense", "moe"] {
            // One directory name for both: GGUF records it as the model's name.
            let (wide, changed) = variant(model, &tmp.path().join(format!("f32-{i}/{model}")), chosen, "F32", None);
            let (double, _) = variant(model, &tmp.path().join(format!("f64-{i}/{model}")), chosen, "F64", None);
            found |= !changed.is_empty();
            if changed.is_empty() {
                continue;
            }
            for (j, format) in FORMATS.into_iter().enumerate() {
                let (a, b) =
                    (tmp.path().join(format!("a-{i}-{j}-{model}")), tmp.path().join(format!("b-{i}-{j}-{model}")));
                convert(&wide, &a, format);
                convert(&double, &b, format);
                assert!(
                    weights(&b) == weights(&a),
                    "{model} {position} {format:?}: F64 is not written as F32 is ({changed:?})"
                );
                no_f64(&b, &format!("{model} {position} {format:?}"));
            }
        }
        assert!(found, "{position}: no fixture has such a tensor");
    }
}

/// Fails when a safetensors file of `out` holds an F64 tensor.
fn no_f64(out: &Path, what: &str) {
    for (name, bytes) in weights(out).iter().filter(|(n, _)| n.ends_with(".safetensors")) {
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = String::from_utf8_lossy(&bytes[8..8 + header_len]);
        assert!(!header.contains("\"F64\""), "{what}: {name} holds an F64 tensor");
    }
}

#[test]
fn the_mtp_head_in_f64_is_written_as_f32_in_the_hugging_face_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, changed) = variant("dense", &tmp.path().join("dense"), |n| n.starts_with("mtp."), "F64", None);
    assert_eq!(changed.len(), 15, "{changed:?}");
    let out = tmp.path().join("out");
    convert(&input, &out, &[]);
    let written: std::collections::BTreeMap<_, _> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .flat_map(|p| read_safetensors(&p))
        .collect();
    let original = read_safetensors(&fixture("dense/mtp/model.safetensors"));
    for name in &changed {
        // Kept F32, as an F32 tensor of IN is: the values of the input, exactly.
        let (dtype, _, bytes) = &written[name];
        assert_eq!(dtype, "F32", "{name}");
        assert_eq!(f32s(bytes), f16s(&original[name].2), "{name}");
    }
}

#[test]
fn gguf_follows_its_type_for_f64_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let all = |n: &str| POSITIONS.iter().any(|(_, chosen)| chosen(n));
    for model in ["dense", "moe"] {
        let (wide, _) = variant(model, &tmp.path().join(format!("f32/{model}")), all, "F32", None);
        let (double, _) = variant(model, &tmp.path().join(format!("f64/{model}")), all, "F64", None);
        for ty in ["f32", "f16", "bf16", "q8_0", "q4_k"] {
            let (a, b) = (tmp.path().join(format!("a-{ty}-{model}")), tmp.path().join(format!("b-{ty}-{model}")));
            convert(&wide, &a, &["--format", "gguf", "--gguf-type", ty]);
            convert(&double, &b, &["--format", "gguf", "--gguf-type", ty]);
            assert!(weights(&b) == weights(&a), "{model} --gguf-type {ty}: F64 is not written as F32 is");
        }
    }
}

#[test]
fn an_f64_value_beyond_f32_is_refused_naming_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, changed) = variant(
        "moe",
        &tmp.path().join("in"),
        |n| n == "model.language_model.layers.1.post_attention_layernorm.weight",
        "F64",
        Some(1e300),
    );
    assert_eq!(changed.len(), 1);
    for (j, format) in FORMATS.into_iter().enumerate() {
        let out = tmp.path().join(format!("out-{j}"));
        let o = escha_convert().arg(&input).arg(&out).args(format).arg("--quiet").output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{format:?}: {err}");
        // The output's name for it (GGUF's is `blk.1.post_attention_norm.weight`).
        assert!(err.contains(".1.post_attention_"), "{format:?}: names the tensor: {err}");
        assert!(!out.exists(), "{format:?}");
    }
}
