//! Malformed inputs: each gets exit code 1, one error line naming the file, tensor and problem,
//! and leaves no output (finished or partial) behind.

use crate::common::stderr;
use crate::synth::*;
use std::path::{Path, PathBuf};

const CODED: &str = "model.language_model.layers.0.mlp.shared_expert.up_proj";

/// Converts `input` into a fresh OUT and checks the failure contract; returns stderr.
fn fails(input: &Path, expect: &[&str]) -> String {
    let parent = tempfile::tempdir().unwrap();
    let out = parent.path().join("out");
    let before = snapshot(input);
    let o = crate::common::escha_convert().arg(input).arg(&out).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "exit code; stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one error line: {err}");
    assert!(err.starts_with("escha-convert: error: "), "{err}");
    for e in expect {
        assert!(err.contains(e), "error should mention {e:?}: {err}");
    }
    assert!(!out.exists(), "no output left behind");
    assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0, "no staging directory left behind");
    assert_eq!(snapshot(input), before, "input untouched");
    err
}

fn snapshot(p: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    if p.is_file() {
        return vec![(p.to_path_buf(), std::fs::read(p).unwrap())];
    }
    let Ok(rd) = std::fs::read_dir(p) else { return vec![] };
    let mut v: Vec<_> =
        rd.map(|e| e.unwrap().path()).filter(|p| p.is_file()).map(|p| (p.clone(), std::fs::read(p).unwrap())).collect();
    v.sort();
    v
}

/// A checkpoint directory from `small_checkpoint` after `edit`.
fn with(edit: impl FnOnce(&mut Vec<T>)) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let mut tensors = small_checkpoint(21);
    edit(&mut tensors);
    let dir = write_checkpoint(&tmp.path().join("ck"), &tensors);
    (tmp, dir)
}

fn tensor<'a>(ts: &'a mut [T], name: &str) -> &'a mut T {
    ts.iter_mut().find(|t| t.name == name).unwrap()
}

#[test]
fn missing_path() {
    fails(Path::new("/nonexistent/escha/checkpoint"), &["/nonexistent/escha/checkpoint: no such file or directory"]);
}

#[test]
fn empty_directory() {
    let tmp = tempfile::tempdir().unwrap();
    fails(tmp.path(), &["no .safetensors files"]);
}

#[test]
fn truncated_file() {
    let (_t, dir) = with(|_| {});
    let f = dir.join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
    fails(&dir, &["model.safetensors", "truncated"]);
}

#[test]
fn header_length_past_end_of_file() {
    let (_t, dir) = with(|_| {});
    let f = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    let len = bytes.len() as u64;
    bytes[..8].copy_from_slice(&len.to_le_bytes());
    std::fs::write(&f, &bytes).unwrap();
    fails(&dir, &["model.safetensors", "header length runs past the end"]);
}

#[test]
fn invalid_header_json() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("model.safetensors");
    let text = b"{\"a\": {\"dtype\": \"F16\", ";
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text);
    std::fs::write(&f, bytes).unwrap();
    fails(&f, &["model.safetensors", "not valid safetensors JSON"]);
}

#[test]
fn data_offsets_out_of_range() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("model.safetensors");
    let text = br#"{"x.weight":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},"y.weight":{"dtype":"F16","shape":[4],"data_offsets":[16,24]}}"#;
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text);
    bytes.extend_from_slice(&[0u8; 24]);
    std::fs::write(&f, bytes).unwrap();
    fails(&f, &["model.safetensors", "y.weight", "offsets"]);
}

#[test]
fn wrong_dtype_for_a_leaf() {
    let (_t, dir) = with(|ts| {
        let t = tensor(ts, &format!("{CODED}.escha_rin"));
        t.dtype = "I16";
    });
    fails(&dir, &["model.safetensors", &format!("{CODED}.escha_rin"), "float"]);
    let (_t, dir) = with(|ts| tensor(ts, &format!("{CODED}.escha_code")).dtype = "F16");
    fails(&dir, &[&format!("{CODED}.escha_code"), "I16"]);
}

#[test]
fn code_last_dimension_not_16k_or_k_out_of_range() {
    let (_t, dir) = with(|ts| {
        let t = tensor(ts, &format!("{CODED}.escha_code"));
        t.shape = vec![16, 48, 24]; // same bytes, 24 words per tile
    });
    fails(&dir, &[&format!("{CODED}.escha_code"), "16·K"]);
    let (_t, dir) = with(|ts| {
        let t = tensor(ts, &format!("{CODED}.escha_code"));
        t.shape = vec![16, 8, 144]; // K = 9 (same bytes: 16·8·144 = 16·24·48)
    });
    fails(&dir, &[&format!("{CODED}.escha_code"), "K in 1..8"]);
}

#[test]
fn escha_config_disagreeing_with_shapes() {
    let (_t, dir) = with(|ts| {
        *tensor(ts, &format!("{CODED}.escha_config")) =
            T::i32(&format!("{CODED}.escha_config"), &[16, 2, 2, 1, 256, 384]);
    });
    fails(&dir, &[&format!("{CODED}.escha_config"), "K=2", "K=3"]);
    let (_t, dir) = with(|ts| {
        *tensor(ts, &format!("{CODED}.escha_config")) =
            T::i32(&format!("{CODED}.escha_config"), &[16, 3, 2, 1, 256, 256]);
    });
    fails(&dir, &[&format!("{CODED}.escha_config"), "disagree"]);
    let (_t, dir) = with(|ts| {
        *tensor(ts, &format!("{CODED}.escha_config")) =
            T::i32(&format!("{CODED}.escha_config"), &[16, 3, 2, 7, 256, 384]);
    });
    fails(&dir, &[&format!("{CODED}.escha_config"), "codebook id 7"]);
}

#[test]
fn dims_not_multiples_of_128_without_padding_info() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(3);
    let mut ts = coded_linear(&mut rng, "m.lin", None, 64, 128, 2, false, false);
    ts.retain(|t| !t.name.ends_with("escha_config"));
    let dir = write_checkpoint(&tmp.path().join("ck"), &ts);
    fails(&dir, &["m.lin.escha_code", "not multiples of 128"]);
}

#[test]
fn missing_required_leaves() {
    for leaf in ["escha_rin", "escha_rout", "escha_code"] {
        let (_t, dir) = with(|ts| ts.retain(|t| t.name != format!("{CODED}.{leaf}")));
        fails(&dir, &[CODED, &format!("no {leaf} tensor")]);
    }
}

#[test]
fn unknown_escha_leaf() {
    let (_t, dir) = with(|ts| ts.push(T::f32(&format!("{CODED}.escha_rotation_theta"), &[4], &[0.0; 4])));
    fails(&dir, &[&format!("{CODED}.escha_rotation_theta"), "unknown Escha leaf"]);
}

#[test]
fn a_damaged_leaf_name_of_a_coded_linear_is_refused() {
    // One flipped bit each: `e` → `E` (case), `e` → `a`; both would leave the linear without its
    // output scale and pass the scale through as a stray tensor.
    for damaged in ["escHa_s_out", "ascha_s_out"] {
        let (_t, dir) = with(|ts| tensor(ts, &format!("{CODED}.escha_s_out")).name = format!("{CODED}.{damaged}"));
        fails(&dir, &[&format!("{CODED}.{damaged}")]);
    }
}

#[test]
fn f64_values_that_are_not_finite_are_refused_like_f32_ones() {
    let name = "model.language_model.layers.0.linear_attn.dt_bias";
    let values = [f64::NAN];
    let (_t, dir) =
        with(|ts| *tensor(ts, name) = T::new(name, "F64", &[1], values.iter().flat_map(|v| v.to_le_bytes()).collect()));
    fails(&dir, &[name, "index 0", "non-finite"]);
}

#[test]
fn a_codebook_no_release_uses_is_decoded_with_a_warning() {
    let (tmp, dir) = with(|ts| {
        let config = tensor(ts, &format!("{CODED}.escha_config"));
        config.data[12..16].copy_from_slice(&0i32.to_le_bytes());
    });
    let out = tmp.path().join("out");
    let o = crate::common::escha_convert().arg(&dir).arg(&out).output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!("{CODED}: escha_config names codebook 3INST (0), which no Escha release uses")),
        "{err}"
    );
    let o = crate::common::escha_convert().arg("inspect").arg(&dir).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("which no Escha release uses"));
}

#[test]
fn non_finite_scales() {
    for (leaf, bad) in [("escha_rin", f32::NAN), ("escha_s_out", f32::INFINITY)] {
        let (_t, dir) = with(|ts| {
            let t = tensor(ts, &format!("{CODED}.{leaf}"));
            let width = if t.dtype == "F32" { 4 } else { 2 };
            let bytes: Vec<u8> =
                if width == 4 { bad.to_le_bytes().to_vec() } else { half::f16::from_f32(bad).to_le_bytes().to_vec() };
            t.data[5 * width..6 * width].copy_from_slice(&bytes);
        });
        fails(&dir, &[&format!("{CODED}.{leaf}"), "non-finite scale", "index 5"]);
    }
    let (_t, dir) = with(|ts| {
        let t = tensor(ts, "model.language_model.embed_tokens.weight_scale");
        t.data[0..2].copy_from_slice(&half::f16::NAN.to_le_bytes());
    });
    fails(&dir, &["embed_tokens.weight_scale", "non-finite"]);
}

/// A two-shard checkpoint with an index, for the index cases.
fn sharded(edit_index: impl FnOnce(&mut serde_json::Value)) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    let tensors = small_checkpoint(22);
    write_checkpoint(&dir, &[]);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let (a, b): (Vec<T>, Vec<T>) = tensors.into_iter().partition(|t| !t.name.ends_with("escha_code"));
    write_safetensors(&dir.join("model-00001-of-00002.safetensors"), &a);
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), &b);
    let mut map = serde_json::Map::new();
    for t in &a {
        map.insert(t.name.clone(), "model-00001-of-00002.safetensors".into());
    }
    for t in &b {
        map.insert(t.name.clone(), "model-00002-of-00002.safetensors".into());
    }
    let mut index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    edit_index(&mut index);
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    (tmp, dir)
}

#[test]
fn sharded_checkpoint_with_modules_straddling_shards_converts() {
    let (tmp, dir) = sharded(|_| {});
    let out = tmp.path().join("out");
    let o = crate::common::escha_convert().arg(&dir).arg(&out).arg("--quiet").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn index_naming_a_missing_shard() {
    let (_t, dir) = sharded(|_| {});
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    fails(&dir, &["model.safetensors.index.json", "model-00002-of-00002.safetensors", "does not exist"]);
}

#[test]
fn tensor_listed_in_the_index_but_absent_from_its_shard() {
    let (_t, dir) = sharded(|index| {
        index["weight_map"]["model.language_model.phantom.weight"] = "model-00001-of-00002.safetensors".into();
    });
    fails(&dir, &["model-00001-of-00002.safetensors", "model.language_model.phantom.weight", "absent"]);
}

#[test]
fn a_shape_its_bytes_do_not_hold_is_refused_naming_the_tensor() {
    let leaf = format!("{CODED}.escha_rin");
    let (_t, dir) = with(|ts| tensor(ts, &leaf).shape = vec![1 << 31, 1 << 31]);
    fails(&dir, &["model.safetensors", &leaf, "2147483648×2147483648", "overflows"]);
    let (_t, dir) = with(|ts| tensor(ts, &leaf).shape = vec![3]);
    fails(&dir, &["model.safetensors", &leaf, "shape 3 of", "but its data offsets hold"]);
}
