//! `--imatrix` refusals through the command line: a matrix of another model (a stray entry, an
//! entry of the wrong size), bad values, a truncated file, and the flag where it does not apply;
//! and a good matrix taken, recorded in `--json`. The low-bit `--gguf-type`s: refused without a
//! matrix (or without a needed tensor's entry) where llama-quantize refuses, and with one a file
//! llama.cpp's loader reads, of llama.cpp's file type, the same at every thread count. (Its bytes are held to llama-quantize's by
//! `tests/python/test_gguf_imatrix.py`, the encoders to ggml's C by `weighted_ref.rs`.)

use crate::common::{convert_json, escha_convert, exit_code, fixture, stderr};
use std::path::Path;

/// A GGUF importance matrix as llama-imatrix writes it: per entry `<name>.in_sum2` (`[cols, experts]`)
/// and `<name>.counts` (`[1, experts]`), and the three `imatrix.*` keys.
pub(crate) fn write_gguf(path: &Path, entries: &[(String, Vec<f32>, usize)]) {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((entries.len() as u64 * 2).to_le_bytes());
    b.extend(3u64.to_le_bytes());
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    string(&mut b, "imatrix.datasets");
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    string(&mut b, "calibration.txt");
    for (key, v) in [("imatrix.chunk_count", 3u32), ("imatrix.chunk_size", 64)] {
        string(&mut b, key);
        b.extend(4u32.to_le_bytes());
        b.extend(v.to_le_bytes());
    }
    let mut data = Vec::new();
    for (name, sums, experts) in entries {
        let counts = vec![10.0f32; *experts];
        for (suffix, values, ne) in
            [(".in_sum2", sums, [sums.len() / experts, *experts]), (".counts", &counts, [1, *experts])]
        {
            string(&mut b, &format!("{name}{suffix}"));
            b.extend(2u32.to_le_bytes());
            for d in ne {
                b.extend((d as u64).to_le_bytes());
            }
            b.extend(0u32.to_le_bytes());
            b.extend((data.len() as u64).to_le_bytes());
            data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            data.resize(data.len().div_ceil(32) * 32, 0);
        }
    }
    b.resize(b.len().div_ceil(32) * 32, 0);
    b.extend(data);
    std::fs::write(path, b).unwrap();
}

/// One entry per quantized matrix of the dense fixture's `q4_k_m` GGUF: (name, sums, experts).
fn entries(dir: &Path) -> Vec<(String, Vec<f32>, usize)> {
    entries_of(dir, "dense", &[])
}

/// One entry per quantized matrix of `name`'s `q4_k_m` GGUF made with `extra` flags.
pub(crate) fn entries_of(dir: &Path, name: &str, extra: &[&str]) -> Vec<(String, Vec<f32>, usize)> {
    let mut args = vec!["--format", "gguf", "--gguf-type", "q4_k_m", "--dry-run"];
    args.extend(extra);
    let plan = convert_json(&fixture(name), &dir.join(format!("plan-{name}")), &args);
    let mut out = Vec::new();
    for t in plan["tensors"].as_array().unwrap() {
        let shape: Vec<usize> = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        let name = t["name"].as_str().unwrap();
        if shape.len() < 2 || name == "token_embd.weight" || t["dtype"] == "F32" {
            continue;
        }
        let cols = shape[shape.len() - 1];
        let experts: usize = shape.iter().rev().skip(2).product();
        let sums = (0..cols * experts).map(|i| 10.0 * (1.0 + (i % 7) as f32).powi(3)).collect();
        out.push((name.to_string(), sums, experts));
    }
    assert!(out.len() > 5, "the fixture has quantized matrices");
    out
}

fn refusal(dir: &Path, matrix: &Path, extra: &[&str]) -> (i32, String) {
    let o = escha_convert()
        .arg(fixture("dense"))
        .arg(dir.join("out"))
        .args(["--format", "gguf", "--gguf-type", "q4_k_m", "--quiet"])
        .args(extra)
        .arg("--imatrix")
        .arg(matrix)
        .output()
        .unwrap();
    assert!(!o.status.success(), "{extra:?} {}: accepted", matrix.display());
    assert!(!dir.join("out").exists(), "nothing written");
    (exit_code(&o), stderr(&o))
}

#[test]
fn a_matrix_of_this_model_is_taken_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("good.imatrix.gguf");
    write_gguf(&matrix, &entries(dir.path()));
    let r = convert_json(
        &fixture("dense"),
        &dir.path().join("out"),
        &["--format", "gguf", "--gguf-type", "q4_k_m", "--imatrix", matrix.to_str().unwrap()],
    );
    let m = &r["imatrix"];
    assert_eq!(
        (m["file"].as_str(), m["format"].as_str(), m["chunk_count"].as_u64()),
        (Some("good.imatrix.gguf"), Some("gguf"), Some(3))
    );
    assert_eq!(m["datasets"][0], "calibration.txt");
    assert!(m["weighted_tensors"].as_u64().unwrap() > 5, "{m}");
    assert_eq!(m["steered_tensors"], 0, "a fixed type: nothing chosen by the matrix");
}

#[test]
fn a_matrix_of_another_model_bad_values_and_a_cut_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = entries(dir.path());
    let path = dir.path().join("m.gguf");

    let mut stray = good.clone();
    stray.push(("blk.99.attn_q.weight".into(), vec![1.0; 128], 1));
    write_gguf(&path, &stray);
    let (code, e) = refusal(dir.path(), &path, &[]);
    assert!(code == 1 && e.contains("blk.99.attn_q.weight") && e.contains("another model"), "{e}");

    let mut short = good.clone();
    let name = short[2].0.clone();
    let keep = short[2].1.len() - 16;
    short[2].1.truncate(keep);
    write_gguf(&path, &short);
    let (_, e) = refusal(dir.path(), &path, &[]);
    assert!(e.contains(&name) && e.contains("another model"), "{e}");

    for bad in [f32::NAN, -1.0, f32::INFINITY] {
        let mut nan = good.clone();
        nan[1].1[3] = bad;
        write_gguf(&path, &nan);
        let (_, e) = refusal(dir.path(), &path, &[]);
        assert!(e.contains(&nan[1].0) && e.contains("value 3"), "{bad}: {e}");
    }

    write_gguf(&path, &good);
    let bytes = std::fs::read(&path).unwrap();
    // The last 32 bytes are the last counts (one f32) and their padding.
    for cut in [10, 100, bytes.len() / 2, bytes.len() - 29] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let (code, e) = refusal(dir.path(), &path, &[]);
        assert!(code == 1 && e.contains("--imatrix"), "cut at {cut}: {e}");
    }
}

#[test]
fn the_flag_applies_to_the_types_llama_quantize_weighs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write_gguf(&path, &[("output.weight".into(), vec![1.0; 128], 1)]);
    for args in [&["--gguf-type", "bf16"][..], &["--gguf-type", "q8_0"], &["--gguf-type", "auto"]] {
        let o = escha_convert()
            .arg(fixture("dense"))
            .arg(dir.path().join("out"))
            .args(["--format", "gguf"])
            .args(args)
            .arg("--imatrix")
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: a usage error");
    }
    let o = escha_convert()
        .arg(fixture("dense"))
        .arg(dir.path().join("out"))
        .args(["--format", "mlx", "--imatrix"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "--format mlx without a size budget: a usage error");
}

#[test]
fn a_size_budget_weighs_its_errors_by_the_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("heavy.imatrix.gguf");
    // Heavy-tailed: a few columns of each entry carry almost all the importance.
    let heavy: Vec<_> = entries(dir.path())
        .into_iter()
        .map(|(name, sums, experts)| {
            let sums = (0..sums.len()).map(|i| if i % 16 == 3 { 1e6 } else { 1e-3 }).collect();
            (name, sums, experts)
        })
        .collect();
    write_gguf(&matrix, &heavy);
    let fit = |extra: &[&str], out: &str| {
        let mut args = vec!["--format", "gguf", "--max-size", "720000", "--dry-run"];
        args.extend(extra);
        convert_json(&fixture("dense"), &dir.path().join(out), &args)
    };
    let plain = fit(&[], "plain");
    let weighted = fit(&["--imatrix", matrix.to_str().unwrap()], "weighted");
    assert_eq!(plain["budget"]["weighted_by_imatrix"], false);
    assert_eq!(weighted["budget"]["weighted_by_imatrix"], true);
    assert!(weighted["budget"]["bytes"].as_u64().unwrap() <= 720_000);
    assert!(weighted["imatrix"]["weighted_tensors"].as_u64().unwrap() > 5, "{}", weighted["imatrix"]);
    assert!(weighted["imatrix"]["steered_tensors"].as_u64().unwrap() > 5, "{}", weighted["imatrix"]);
    // The ratios reported are the weighted ones: not those of the plain run.
    let ratios = |r: &serde_json::Value| -> Vec<f64> {
        r["width_choices"].as_array().unwrap().iter().map(|c| c["ratio"].as_f64().unwrap()).collect()
    };
    assert_ne!(ratios(&plain), ratios(&weighted));
}

#[test]
fn the_low_bit_types_need_a_matrix_where_llama_quantize_does() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let convert = |ty: &str, matrix: Option<&Path>| {
        let mut c = escha_convert();
        c.arg(fixture("dense")).arg(&out).args(["--format", "gguf", "--gguf-type", ty, "--quiet", "--dry-run"]);
        if let Some(m) = matrix {
            c.arg("--imatrix").arg(m);
        }
        let o = c.output().unwrap();
        (o.status.code(), stderr(&o))
    };
    // llama-quantize refuses these without a matrix (a tensor of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
    // or Q2_K in a Q2_K_S file): so do we, before anything is written, saying how to make one.
    for ty in ["iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq3_xxs", "q2_k_s"] {
        let (code, e) = convert(ty, None);
        assert_eq!(code, Some(1), "{ty}: {e}");
        assert!(e.contains("tensor blk.") && e.contains("--imatrix") && e.contains("llama-imatrix"), "{ty}: {e}");
        assert!(!out.exists(), "{ty}: nothing written");
    }
    // It writes these without one (IQ3_S and its mixtures need none on this model).
    for ty in ["iq3_xs", "iq3_s", "iq3_m"] {
        let (code, e) = convert(ty, None);
        assert_eq!(code, Some(0), "{ty}: {e}");
    }
    // A matrix without the entry of a tensor whose type needs one: refused naming the tensor, as
    // llama-quantize aborts there; the same matrix is fine where the type needs none.
    let mut partial = entries(dir.path());
    let gone = partial.iter().position(|(n, _, _)| n.ends_with("ffn_down.weight")).expect("an ffn_down");
    let name = partial.remove(gone).0;
    let matrix = dir.path().join("partial.imatrix.gguf");
    write_gguf(&matrix, &partial);
    let (code, e) = convert("iq2_xxs", Some(&matrix));
    assert_eq!(code, Some(1), "{e}");
    assert!(e.contains(&format!("no entry for tensor {name}")), "{e}");
    let (code, e) = convert("iq3_s", Some(&matrix));
    assert_eq!(code, Some(0), "{e}");
    let (code, e) = convert("iq2_xxs", Some(&dir.path().join("missing.gguf")));
    assert_eq!(code, Some(1), "a missing file: {e}");
}

/// `--gguf-type`, `general.file_type` (llama.h's `LLAMA_FTYPE_MOSTLY_*`), the dense fixture's
/// 256-wide `blk.0.ssm_out` as llama-quantize types it with a matrix.
const LOW_BIT: [(&str, i128, &str); 9] = [
    ("iq2_xxs", 19, "IQ2_XXS"),
    ("iq2_xs", 20, "IQ2_XS"),
    ("iq2_s", 28, "IQ2_XS"),
    ("iq2_m", 29, "IQ2_S"),
    ("iq3_xxs", 23, "IQ3_XXS"),
    ("iq3_xs", 22, "IQ3_S"),
    ("iq3_s", 26, "IQ3_S"),
    ("iq3_m", 27, "IQ3_S"),
    ("q2_k_s", 21, "Q2_K"),
];

#[test]
fn the_low_bit_types_write_loadable_files_of_their_file_type() {
    use crate::gguf::convert;
    use crate::gguf_reader::{check_layout, Val};
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("m.imatrix.gguf");
    write_gguf(&matrix, &entries(dir.path()));
    let m = matrix.to_str().unwrap();
    for (ty, file_type, main) in LOW_BIT {
        let out = dir.path().join(ty);
        convert(&fixture("dense"), &out, &["--gguf-type", ty, "--int8", "requant", "--imatrix", m, "-j2"]);
        let f = check_layout(&out.join("model.gguf"));
        assert_eq!(f.get("general.file_type"), Some(&Val::Int(4, file_type)), "{ty}");
        let ssm_out = f.tensors.iter().find(|t| t.name == "blk.0.ssm_out.weight").expect("ssm_out");
        assert_eq!((ssm_out.dims[0], ssm_out.type_name()), (256, main), "{ty}: blk.0.ssm_out.weight");
        let again = dir.path().join(format!("{ty}-j1"));
        convert(&fixture("dense"), &again, &["--gguf-type", ty, "--int8", "requant", "--imatrix", m, "-j1"]);
        let (a, b) = (std::fs::read(out.join("model.gguf")).unwrap(), std::fs::read(again.join("model.gguf")).unwrap());
        assert!(a == b, "{ty}: -j1 and -j2 differ");
    }
}
