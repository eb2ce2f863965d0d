//! Channel scales far from 1: what no output precision can hold is refused naming the tensor
//! (exit 1), never written as a few bits or zeros with exit 0. EXL3 stores `rout·s_out` as an f16
//! `svh` within 2^-11 or not at all; a dense f16 or GGUF block output holds no weights below f16's
//! normal range; bf16 holds them.

use crate::common::{copy_tree, escha_convert, fixture, stderr};
use crate::synth::{bf16s, edit_tensors, f32s, read_safetensors};
use std::path::{Path, PathBuf};

const DOWN: &str = "model.language_model.layers.1.mlp.down_proj";

/// The dense fixture with `DOWN`'s `s_out` times `factor`.
fn scaled_s_out(dir: &Path, factor: f32) -> PathBuf {
    copy_tree(&fixture("dense"), dir);
    edit_tensors(dir, |name, t| {
        if name == format!("{DOWN}.escha_s_out") {
            t.data = f32s(&t.data).iter().flat_map(|&s| (s * factor).to_le_bytes()).collect();
        }
        true
    });
    dir.to_path_buf()
}

/// Runs a conversion of `input` to `out` with `args`: exit code and stderr.
fn run(input: &Path, out: &Path, args: &[&str]) -> (Option<i32>, String) {
    let o = escha_convert().arg(input).arg(out).args(args).arg("--quiet").output().unwrap();
    (o.status.code(), stderr(&o))
}

#[test]
fn an_exl3_fold_beyond_f16_is_refused_naming_the_scale() {
    let tmp = tempfile::tempdir().unwrap();
    for (factor, why) in
        [(1e-6, "below float16's normal range"), (1e-9, "below float16's normal range"), (1e6, "65504")]
    {
        let input = scaled_s_out(&tmp.path().join(format!("in-{factor}")), factor);
        let out = tmp.path().join(format!("out-{factor}"));
        let (code, err) = run(&input, &out, &["--format", "exl3"]);
        assert_eq!(code, Some(1), "s_out × {factor}: {err}");
        for needle in [format!("{DOWN}.escha_s_out"), format!("{DOWN}.svh"), "2^-11".into(), why.into()] {
            assert!(err.contains(&needle), "s_out × {factor}: {needle:?} in {err}");
        }
        assert!(!out.exists(), "nothing written");
    }
}

#[test]
fn weights_below_f16s_normal_range_are_refused_where_f16_holds_them_and_kept_in_bf16() {
    let tmp = tempfile::tempdir().unwrap();
    for factor in [1e-6, 1e-9] {
        let input = scaled_s_out(&tmp.path().join(format!("in-{factor}")), factor);
        for (args, tensor) in [
            (&["--format", "f16"][..], format!("{DOWN}.weight")),
            (&["--format", "gguf", "--gguf-type", "q8_0"], "blk.1.ffn_down.weight".to_string()),
            (&["--format", "gguf", "--gguf-type", "q4_k_m"], "blk.1.ffn_down.weight".to_string()),
        ] {
            let out = tmp.path().join(format!("{factor}-{}", args.join("")));
            let (code, err) = run(&input, &out, args);
            assert_eq!(code, Some(1), "s_out × {factor} {args:?}: {err}");
            for needle in [tensor.as_str(), "below F16's normal range", "--format bf16"] {
                assert!(err.contains(needle), "s_out × {factor} {args:?}: {needle:?} in {err}");
            }
        }
        // bf16 has f32's range: the weights are written, none of them flushed to zero.
        let out = tmp.path().join(format!("{factor}-bf16"));
        let (code, err) = run(&input, &out, &["--format", "bf16"]);
        assert_eq!(code, Some(0), "{err}");
        let weights = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .find_map(|p| read_safetensors(&p).remove(&format!("{DOWN}.weight")))
            .map(|t| bf16s(&t.2))
            .expect("the down projection is written");
        let largest = weights.iter().fold(0.0f32, |m, w| m.max(w.abs()));
        assert!(largest > 0.0 && largest < 1e3 * factor, "s_out × {factor}: largest weight {largest}");
        assert!(weights.iter().filter(|w| **w == 0.0).count() < weights.len() / 100, "s_out × {factor}");
    }
}
