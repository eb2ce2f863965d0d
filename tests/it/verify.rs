//! `verify` on the bundled fixtures and on deliberately broken copies of them.

use crate::common::{fixture, stderr};
use crate::synth::{read_safetensors, write_safetensors, T};
use escha_convert::codec::{Codebook, ScalarDecoder, TileDecoder};
use escha_convert::verify::VerifyOptions;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn verify(input: &Path, base: &Path) -> (Option<i32>, Value) {
    let o = crate::common::escha_convert()
        .args(["verify".as_ref(), input.as_os_str(), "--base".as_ref(), base.as_os_str(), "--json".as_ref()])
        .output()
        .unwrap();
    let report = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", stderr(&o)));
    (o.status.code(), report)
}

/// Every failure message of the report, prefixed by the tensor it belongs to.
fn failures(r: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for section in ["coded", "int8", "norms"] {
        for row in r[section].as_array().unwrap() {
            for f in row["failures"].as_array().unwrap() {
                out.push(format!("{}: {}", row["tensor"].as_str().unwrap(), f.as_str().unwrap()));
            }
        }
    }
    out
}

#[test]
fn fixtures_pass_against_their_bf16_and_fp8_bases() {
    for model in ["dense", "moe"] {
        for base in [format!("{model}-base"), format!("{model}-base-fp8")] {
            let (code, r) = verify(&fixture(model), &fixture(&base));
            assert_eq!(code, Some(0), "{model} vs {base}: {:?}", failures(&r));
            assert!(r["missing_in_base"].as_array().unwrap().is_empty(), "{model} vs {base}");
            for row in r["coded"].as_array().unwrap() {
                let ratio = row["ratio"].as_f64().unwrap();
                assert!((1.0..=1.3).contains(&ratio), "{model} vs {base}: {} ratio {ratio}", row["tensor"]);
                let corr = row["corr"].as_f64().unwrap();
                assert!(corr > 0.95, "{}: corr {corr}", row["tensor"]);
                assert_eq!(row["overlap_violations"], 0);
            }
            assert!(!r["norms"].as_array().unwrap().is_empty());
        }
    }
}

/// A one-file copy of a fixture checkpoint with `edit` applied to its tensors.
fn broken_copy(model: &str, edit: impl FnOnce(&mut Vec<T>)) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(model);
    std::fs::create_dir(&dir).unwrap();
    let mut tensors = Vec::new();
    for e in std::fs::read_dir(fixture(model)).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            for (name, (dtype, shape, data)) in read_safetensors(&p) {
                let dtype: &'static str = Box::leak(dtype.into_boxed_str());
                tensors.push(T { name, dtype, shape, data });
            }
        }
    }
    edit(&mut tensors);
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    std::fs::copy(fixture(model).join("config.json"), dir.join("config.json")).unwrap();
    (tmp, dir)
}

fn data<'a>(ts: &'a mut [T], name: &str) -> &'a mut Vec<u8> {
    &mut ts.iter_mut().find(|t| t.name == name).unwrap_or_else(|| panic!("{name}")).data
}

fn assert_fails_with(model: &str, base: &str, edit: impl FnOnce(&mut Vec<T>), tensor: &str, check: &str) {
    let (_tmp, dir) = broken_copy(model, edit);
    let (code, r) = verify(&dir, &fixture(base));
    assert_eq!(code, Some(1), "verify should fail");
    let f = failures(&r);
    assert!(f.iter().any(|l| l.starts_with(tensor) && l.contains(check)), "expected {tensor} to fail {check}: {f:#?}");
    // Only the broken tensor fails.
    assert!(f.iter().all(|l| l.starts_with(tensor)), "{f:#?}");
    // A stack's expert failures are listed on the tensor and on the expert itself, by index.
    for row in r["coded"].as_array().unwrap() {
        let on_row: Vec<&str> = row["failures"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        let mut on_experts = Vec::new();
        for e in row["per_expert"].as_array().unwrap() {
            for f in e["failures"].as_array().unwrap() {
                on_experts.push(format!("expert {}: {}", e["expert"], f.as_str().unwrap()));
            }
        }
        assert!(on_experts.iter().all(|f| on_row.contains(&f.as_str())), "{on_experts:#?} vs {on_row:#?}");
        assert_eq!(on_experts.len(), on_row.iter().filter(|f| f.starts_with("expert ")).count());
    }
}

#[test]
fn undoing_the_stored_word_pair_swap_fails_shannon_and_correlation() {
    // The states still overlap (any bit stream yields overlapping windows): the layout error shows
    // only against the base, as a ratio near √2/2^-K and no correlation.
    let p = "model.language_model.layers.0.mlp.gate_proj";
    let unswap = |ts: &mut Vec<T>| {
        for pair in data(ts, &format!("{p}.escha_code")).chunks_exact_mut(4) {
            pair.rotate_left(2);
        }
    };
    assert_fails_with("dense", "dense-base", unswap, p, "shannon: ratio 5.");
    assert_fails_with("dense", "dense-base", unswap, p, "corr");
}

/// A fast path whose state extraction is broken (two states of each tile exchanged).
struct BrokenStates;

impl TileDecoder for BrokenStates {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        ScalarDecoder.decode_tiles(bytes, k, cb, out);
    }
    fn states(&self, bytes: &[u8], k: u32, out: &mut [u16]) {
        ScalarDecoder.states(bytes, k, out);
        for tile in out.chunks_exact_mut(256) {
            tile.swap(10, 11);
        }
    }
}

#[test]
fn a_broken_state_extractor_fails_the_overlap_check() {
    let opts = VerifyOptions {
        only: vec!["*.mlp.down_proj.weight".into()],
        threads: Some(1),
        ..VerifyOptions::new(fixture("dense"), fixture("dense-base"))
    };
    let r = escha_convert::verify::verify(&opts, &BrokenStates).unwrap();
    assert!(!r.passed);
    assert_eq!(r.coded.len(), 4);
    for row in &r.coded {
        assert!(row.failures.iter().any(|f| f.starts_with("overlap")), "{:?}", row.failures);
        assert_eq!(row.figures.overlap_violations, row.figures.tiles_checked);
    }
}

#[test]
fn exchanging_rin_and_rout_fails_correlation() {
    let p = "model.language_model.layers.3.self_attn.o_proj";
    assert_fails_with(
        "dense",
        "dense-base",
        |ts| {
            let rin = std::mem::take(data(ts, &format!("{p}.escha_rin")));
            let rout = std::mem::replace(data(ts, &format!("{p}.escha_rout")), rin);
            *data(ts, &format!("{p}.escha_rin")) = rout;
        },
        p,
        "corr",
    );
}

#[test]
fn swapping_gate_and_up_halves_fails_correlation() {
    let p = "model.language_model.layers.1.mlp.experts.gate_up_proj";
    assert_fails_with(
        "moe",
        "moe-base",
        |ts| {
            // Code [E, IC/16, OC/16, 32]: swap the first and second half of the OC/16 tile columns,
            // and the halves of rout and s_out, so the decode puts up where gate belongs.
            let t = ts.iter().find(|t| t.name == format!("{p}.escha_code")).unwrap();
            let (ot, words) = (t.shape[2], t.shape[3]);
            let row = ot * words * 2;
            for chunk in data(ts, &format!("{p}.escha_code")).chunks_exact_mut(row) {
                let (a, b) = chunk.split_at_mut(row / 2);
                a.swap_with_slice(b);
            }
            for leaf in ["escha_rout", "escha_s_out"] {
                let t = ts.iter().find(|t| t.name == format!("{p}.{leaf}")).unwrap();
                let oc_bytes = t.data.len() / t.shape[0];
                for chunk in data(ts, &format!("{p}.{leaf}")).chunks_exact_mut(oc_bytes) {
                    let (a, b) = chunk.split_at_mut(oc_bytes / 2);
                    a.swap_with_slice(b);
                }
            }
        },
        p,
        "corr",
    );
}

/// Adds 1 to every element of the f16 tensor `name`.
fn shift_by_one(ts: &mut [T], name: &str) {
    for v in data(ts, name).chunks_exact_mut(2) {
        let x = half::f16::from_le_bytes([v[0], v[1]]).to_f32() + 1.0;
        v.copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
    }
}

#[test]
fn a_norm_shifted_by_one_fails_the_norm_offset_check() {
    let n = "model.language_model.layers.2.input_layernorm.weight";
    assert_fails_with("dense", "dense-base", |ts| shift_by_one(ts, n), n, "norm offset");
}

#[test]
fn convert_with_verify_base_names_a_failing_norm_and_writes_nothing() {
    let n = "model.language_model.layers.2.input_layernorm.weight";
    let (tmp, dir) = broken_copy("dense", |ts| shift_by_one(ts, n));
    let out = tmp.path().join("out");
    let o = crate::common::escha_convert()
        .arg(&dir)
        .arg(&out)
        .args(["--quiet", "--verify-base"])
        .arg(fixture("dense-base"))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("{n}: norm offset")), "{err}");
    assert!(!out.exists());
}

#[test]
fn comparing_the_decode_with_itself_fails_below_the_shannon_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let decoded = tmp.path().join("decoded");
    let o = crate::common::escha_convert().arg(fixture("dense")).arg(&decoded).arg("--quiet").output().unwrap();
    assert!(o.status.success());
    let (code, r) = verify(&fixture("dense"), &decoded);
    assert_eq!(code, Some(1));
    let f = failures(&r);
    let coded = r["coded"].as_array().unwrap().len();
    assert_eq!(f.iter().filter(|l| l.contains("shannon: ratio") && l.contains("< 1.0")).count(), coded, "{f:#?}");
}

#[test]
fn a_quantized_checkpoint_is_refused_as_base_with_exit_2() {
    let o = crate::common::escha_convert()
        .arg("verify")
        .arg(fixture("dense"))
        .arg("--base")
        .arg(fixture("dense"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("BASE is quantized (trellis codes"));
}

#[test]
fn sampling_checks_n_squares_per_tensor() {
    let o = crate::common::escha_convert()
        .args([
            "verify".as_ref(),
            fixture("moe").as_os_str(),
            "--base".as_ref(),
            fixture("moe-base-fp8").as_os_str(),
            "--sample".as_ref(),
            "3".as_ref(),
            "--json".as_ref(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["sampled_blocks"], 3);
    for row in r["coded"].as_array().unwrap() {
        // One 128×128 square holds 8×8 tiles.
        assert_eq!(row["tiles_checked"], 3 * 64, "{}", row["tensor"]);
        let ratio = row["ratio"].as_f64().unwrap();
        assert!((1.0..=1.3).contains(&ratio), "{} ratio {ratio}", row["tensor"]);
        // A stack lists the experts the samples reached, each by its index in the stack.
        if let Some(experts) = row["experts"].as_u64() {
            let reached: Vec<u64> =
                row["per_expert"].as_array().unwrap().iter().map(|e| e["expert"].as_u64().unwrap()).collect();
            assert!(!reached.is_empty() && reached.len() <= 3, "{reached:?}");
            assert!(reached.windows(2).all(|w| w[0] < w[1]) && reached.iter().all(|&e| e < experts), "{reached:?}");
            assert!(reached.iter().any(|&e| e > 0), "spread over the stack: {reached:?}");
        }
    }
}
