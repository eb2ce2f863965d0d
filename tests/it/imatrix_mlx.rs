//! `--imatrix` with `--format mlx`: the matrix, in llama.cpp's names, steers the widths `--max-size`
//! chooses (each option's estimated error weighted by its columns' importance); a matrix of another
//! model is refused naming the entry; without a size budget it is a usage error. (mlx-lm loading
//! the output and the weighted error measured with `mx.dequantize`: `tests/python/test_mlx_imatrix.py`.)

use crate::common::{convert_json, escha_convert, fixture, stderr};
use crate::imatrix::{entries_of, write_gguf};
use serde_json::Value;
use std::path::Path;

/// A heavy-tailed matrix for `name` (the entries of its GGUF without the MTP layers, which the MLX
/// layout drops and llama-imatrix never records): a few columns carry almost all the importance.
fn heavy(dir: &Path, name: &str) -> Vec<(String, Vec<f32>, usize)> {
    entries_of(dir, name, &["--mtp", "drop"])
        .into_iter()
        .map(|(n, sums, experts)| {
            let sums = (0..sums.len()).map(|i| if i % 16 == 3 { 1e6 } else { 1e-3 }).collect();
            (n, sums, experts)
        })
        .collect()
}

/// Each chosen tensor's (name, width, group size).
fn widths(r: &Value) -> Vec<(String, u64, u64)> {
    let c = r["width_choices"].as_array().unwrap();
    c.iter()
        .map(|c| (c["tensor"].as_str().unwrap().into(), c["bits"].as_u64().unwrap(), c["group_size"].as_u64().unwrap()))
        .collect()
}

#[test]
fn a_matrix_steers_the_widths_of_an_mlx_size_budget() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["dense", "moe"] {
        let matrix = dir.path().join(format!("{name}.imatrix.gguf"));
        let entries = heavy(dir.path(), name);
        write_gguf(&matrix, &entries);
        let fit = |extra: &[&str], out: &str| {
            let mut args = vec!["--format", "mlx", "--max-size", "700000"];
            args.extend(extra);
            convert_json(&fixture(name), &dir.path().join(format!("{name}-{out}")), &args)
        };
        let plain = fit(&["--dry-run"], "plain");
        let weighted = fit(&["--imatrix", matrix.to_str().unwrap()], "weighted");
        assert_eq!(plain["budget"]["weighted_by_imatrix"], false, "{name}");
        assert_eq!(weighted["budget"]["weighted_by_imatrix"], true, "{name}");
        assert!(weighted["budget"]["bytes"].as_u64().unwrap() <= 700_000, "{name}");
        let m = &weighted["imatrix"];
        // Every entry weighs a tensor the budget chose for (the routers' width is mlx-lm's own);
        // none encodes bytes: MLX's quantization takes no matrix.
        let routers = entries.iter().filter(|(n, _, _)| n.contains("ffn_gate_inp")).count() as u64;
        assert_eq!(m["steered_tensors"].as_u64(), Some(entries.len() as u64 - routers), "{name}: {m}");
        assert_eq!(m["weighted_tensors"], 0, "{name}: {m}");
        // On a heavy-tailed matrix the weighted plan is another plan.
        assert_ne!(widths(&plain), widths(&weighted), "{name}");
        // --fit-memory is a size budget too.
        let memory = convert_json(
            &fixture(name),
            &dir.path().join(format!("{name}-memory")),
            &[
                "--format",
                "mlx",
                "--fit-memory",
                "3000000",
                "--context",
                "16",
                "--reserve",
                "0",
                "--dry-run",
                "--imatrix",
                matrix.to_str().unwrap(),
            ],
        );
        assert_eq!(memory["budget"]["weighted_by_imatrix"], true, "{name}");
        assert_eq!(memory["imatrix"]["steered_tensors"], m["steered_tensors"], "{name}");
        let card = std::fs::read_to_string(dir.path().join(format!("{name}-weighted")).join("README.md")).unwrap();
        assert!(card.contains("weighted by the importance matrix") && card.contains("no tensor is encoded with it"));
    }
}

#[test]
fn an_mlx_run_refuses_a_matrix_of_another_model() {
    let dir = tempfile::tempdir().unwrap();
    let good = heavy(dir.path(), "moe");
    let path = dir.path().join("m.gguf");
    let refusal = |entries: &[(String, Vec<f32>, usize)]| {
        write_gguf(&path, entries);
        let out = dir.path().join("out");
        let o = escha_convert()
            .arg(fixture("moe"))
            .arg(&out)
            .args(["--format", "mlx", "--max-size", "700000", "--quiet", "--imatrix"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.exists(), "nothing written");
        (o.status.code(), stderr(&o))
    };
    let mut stray = good.clone();
    stray.push(("blk.99.attn_q.weight".into(), vec![1.0; 128], 1));
    let (code, e) = refusal(&stray);
    assert!(code == Some(1) && e.contains("blk.99.attn_q.weight") && e.contains("another model"), "{e}");
    // A wrong size: an expert entry one expert short, a dense one a few columns short.
    for leaf in ["ffn_up_exps.weight", "ssm_out.weight"] {
        let mut short = good.clone();
        let i = short.iter().position(|(n, _, _)| n.ends_with(leaf)).unwrap_or_else(|| panic!("an {leaf}"));
        let (name, experts) = (short[i].0.clone(), short[i].2);
        let keep = if experts > 1 { short[i].1.len() / experts * (experts - 1) } else { short[i].1.len() - 16 };
        short[i].1.truncate(keep);
        short[i].2 = experts.saturating_sub(1).max(1);
        let (code, e) = refusal(&short);
        assert!(code == Some(1) && e.contains(&name) && e.contains("another model"), "{leaf}: {e}");
        assert!(e.contains("(tensor language_model.model.layers."), "the MLX tensor named too: {e}");
    }
    // Without a size budget, and in a format that takes none, the matrix has nothing to steer.
    for args in [&["--format", "mlx"][..], &["--format", "mlx", "--bits", "auto"], &["--format", "bf16"]] {
        let o = escha_convert()
            .arg(fixture("moe"))
            .arg(dir.path().join("x"))
            .args(args)
            .arg("--imatrix")
            .arg(&path)
            .output();
        let o = o.unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: a usage error");
        let e = stderr(&o);
        assert!(e.contains("--imatrix"), "{args:?}: {e}");
    }
}
