//! `--format exl3`: the trellis words written as stored (expert slices and gate/up halves
//! included), the channel scales folded once into f16, and the way back: an EXL3 output converted
//! to bf16 (its per-expert linears stacked back into the fused expert tensors) equals the direct bf16 conversion, byte for byte where `s_in` = `s_out` = 1 and within the
//! fold's reported change otherwise.

use crate::common::{convert_json as convert, copy_tree, escha_convert, fixture, stderr};
use crate::synth::{
    bf16s, f16s, f32s, read_dir_safetensors as tensors, read_safetensors, write_safetensors, Tensors, T,
};
use half::f16;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `f16(r·s)`, the one rounding of the exact product (to nearest, ties to even), found among the
/// neighbours of a candidate: `half`'s own conversion from f64 may round twice.
fn folded(r: &[f32], s: Option<&[f32]>) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &r) in r.iter().enumerate() {
        let x = f64::from(r) * s.map_or(1.0, |s| f64::from(s[i]));
        let guess = f16::from_f64(x).to_bits();
        let best = [guess.wrapping_sub(1), guess, guess.wrapping_add(1)]
            .into_iter()
            .map(f16::from_bits)
            .filter(|c| c.is_finite())
            .min_by(|a, b| {
                let (da, db) = ((a.to_f64() - x).abs(), (b.to_f64() - x).abs());
                da.total_cmp(&db).then((a.to_bits() & 1).cmp(&(b.to_bits() & 1)))
            })
            .unwrap();
        out.extend(best.to_le_bytes());
    }
    out
}

/// Rows `rows` of every lead of a `[leads, height, width]` byte array (`elem` bytes a value).
fn rows_of(bytes: &[u8], height: usize, width: usize, elem: usize, rows: std::ops::Range<usize>) -> Vec<u8> {
    let row = width * elem;
    bytes.chunks_exact(height * row).flat_map(|lead| lead[rows.start * row..rows.end * row].to_vec()).collect()
}

/// The EXL3 linears (module path, expert, output-channel range) a coded module of IN becomes.
fn exl3_modules(path: &str, experts: Option<usize>, oc: usize) -> Vec<(String, usize, std::ops::Range<usize>)> {
    let Some(e) = experts else { return vec![(path.to_string(), 0, 0..oc)] };
    let (parent, leaf) = path.rsplit_once('.').unwrap();
    (0..e)
        .flat_map(|e| match leaf {
            "gate_up_proj" => vec![
                (format!("{parent}.{e}.gate_proj"), e, 0..oc / 2),
                (format!("{parent}.{e}.up_proj"), e, oc / 2..oc),
            ],
            _ => vec![(format!("{parent}.{e}.{leaf}"), e, 0..oc)],
        })
        .collect()
}

#[test]
fn trellis_words_are_the_escha_codes_and_scales_fold_once() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["dense", "moe"] {
        let input = tensors(&fixture(name));
        let out = tmp.path().join(name);
        convert(&fixture(name), &out, &["--format", "exl3"]);
        let got = tensors(&out);
        let mut coded = 0;
        for (code_name, (dtype, shape, code)) in input.iter().filter(|(n, _)| n.ends_with(".escha_code")) {
            assert_eq!(dtype, "I16");
            let path = code_name.strip_suffix(".escha_code").unwrap();
            let leaf = |l: &str| input.get(&format!("{path}.escha_{l}")).map(|t| t.2.as_slice());
            let experts = (shape.len() == 4).then(|| shape[0]);
            let (tiles_in, tiles_out, words) = (shape[shape.len() - 3], shape[shape.len() - 2], shape[shape.len() - 1]);
            let (ic, oc) = (16 * tiles_in, 16 * tiles_out);
            let per_expert = code.len() / experts.unwrap_or(1);
            for (module, e, cols) in exl3_modules(path, experts, oc) {
                let (dtype, tshape, trellis) = &got[&format!("{module}.trellis")];
                let tiles = cols.start / 16..cols.end / 16;
                assert_eq!((dtype.as_str(), tshape.clone()), ("I16", vec![tiles_in, tiles.len(), words]), "{module}");
                let expert = &code[e * per_expert..(e + 1) * per_expert];
                assert!(*trellis == rows_of(expert, tiles_out, words, 2, tiles), "{module}.trellis");
                // suh = f16(rin·s_in), svh = f16(rout·s_out): this expert's slice, these channels.
                let vector = |l: &str, len: usize| leaf(l).map(|b| f16s_or_f32s(l, b)[e * len..(e + 1) * len].to_vec());
                let (rin, sin) = (vector("rin", ic).unwrap(), vector("s_in", ic));
                let (rout, sout) = (vector("rout", oc).unwrap(), vector("s_out", oc));
                assert_eq!(got[&format!("{module}.suh")].2, folded(&rin, sin.as_deref()), "{module}.suh");
                let sout = sout.map(|s| s[cols.clone()].to_vec());
                assert_eq!(
                    got[&format!("{module}.svh")].2,
                    folded(&rout[cols.clone()], sout.as_deref()),
                    "{module}.svh"
                );
                let (dtype, mshape, mcg) = &got[&format!("{module}.mcg")];
                assert_eq!((dtype.as_str(), mshape.len()), ("I32", 0));
                assert_eq!(u32::from_le_bytes(mcg[..].try_into().unwrap()), 0xCBAC_1FED, "exllamav3's MCG multiplier");
                coded += 1;
            }
        }
        assert!(coded >= 25, "{name}: {coded} EXL3 linears");
        assert_eq!(got.keys().filter(|n| n.ends_with(".trellis")).count(), coded, "{name}: no other trellis");
        assert!(
            !got.keys().any(|n| n.contains("escha_") || n.ends_with("gate_up_proj")),
            "{name}: nothing fused or Escha-named"
        );
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["quantization_config"]["quant_method"], "exl3");
        assert!(out.join("quantization_config.json").is_file());
    }
}

/// A vector leaf as f32 (`rin`/`rout` are F16, `s_in`/`s_out` F32).
fn f16s_or_f32s(leaf: &str, bytes: &[u8]) -> Vec<f32> {
    if leaf.starts_with("s_") {
        f32s(bytes)
    } else {
        f16s(bytes)
    }
}

/// A copy of fixture `name` whose `s_in` and `s_out` are all ones.
fn with_unit_scales(name: &str, dir: &Path) -> PathBuf {
    copy_tree(&fixture(name), dir);
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let ts: Vec<T> = read_safetensors(&p)
            .into_iter()
            .map(|(n, (dtype, shape, data))| {
                let data = if n.ends_with(".escha_s_in") || n.ends_with(".escha_s_out") {
                    assert_eq!(dtype, "F32");
                    data.chunks_exact(4).flat_map(|_| 1.0f32.to_le_bytes()).collect()
                } else {
                    data
                };
                let dtype: &'static str = Box::leak(dtype.into_boxed_str());
                T::new(&n, dtype, &shape, data)
            })
            .collect();
        write_safetensors(&p, &ts);
    }
    dir.to_path_buf()
}

/// IN → bf16, and IN → exl3 → bf16: the tensors of both, and the fold's reported change.
fn both_ways(input: &Path, tmp: &Path) -> (Tensors, Tensors, f64) {
    convert(input, &tmp.join("direct"), &["--format", "bf16"]);
    let report = convert(input, &tmp.join("exl3"), &["--format", "exl3"]);
    convert(&tmp.join("exl3"), &tmp.join("back"), &["--format", "bf16"]);
    let change = report["scale_fold_change"].as_f64().expect("the report says the fold's change");
    (tensors(&tmp.join("direct")), tensors(&tmp.join("back")), change)
}

#[test]
fn exl3_back_to_bf16_is_the_direct_conversion_where_s_is_one() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["dense", "moe"] {
        let dir = tmp.path().join(name);
        let input = with_unit_scales(name, &dir.join("in"));
        let (direct, back, change) = both_ways(&input, &dir);
        assert_eq!(change, 0.0, "{name}: s = 1 folds exactly");
        // The per-expert EXL3 linears are stacked back into the fused expert tensors.
        assert!(back.keys().eq(direct.keys()), "{name}: the same tensors");
        for (n, t) in &back {
            assert!(*t == direct[n], "{name}: {n} differs from the direct conversion");
        }
    }
}

#[test]
fn exl3_back_to_bf16_is_within_the_fold_bound_otherwise() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dense");
    let (direct, back, change) = both_ways(&fixture("dense"), &dir);
    assert!(change > 0.0 && change <= 1.0 / 2048.0, "one f16 rounding: {change}");
    let mut moved = 0;
    for (n, t) in &back {
        let want = &direct[n].2;
        if t.2 == *want {
            continue;
        }
        moved += 1;
        assert_eq!(t.0, "BF16", "{n}: only coded weights move");
        for (a, b) in bf16s(&t.2).into_iter().zip(bf16s(want)) {
            // Two scales change by at most `change` each; both sides round once to bf16.
            let bound = a.abs().max(b.abs()) * (2.01 * change as f32 + 1.0 / 128.0) + f32::MIN_POSITIVE;
            assert!((a - b).abs() <= bound, "{n}: {a} against {b}");
        }
    }
    assert!(moved > 0, "s ≠ 1 on the dense fixture moves some bf16 values");
}

/// The tool's own EXL3 output is an input of every other format: to MLX (config.json naming the
/// module mlx-lm builds, not exllamav3's text-only class) with the direct conversion's tensors byte
/// for byte where `s` = 1 (int8 tables requantized), and to GGUF and bf16 as before.
#[test]
fn exl3_output_converts_to_every_other_format() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, model_type) in [("dense", "qwen3_5"), ("moe", "qwen3_5_moe")] {
        let dir = tmp.path().join(name);
        let input = with_unit_scales(name, &dir.join("in"));
        convert(&input, &dir.join("exl3"), &["--format", "exl3"]);
        // EXL3 keeps int8 tables as bf16 weights, which MLX quantizes as `--int8 requant` does.
        convert(&input, &dir.join("direct"), &["--format", "mlx", "--int8", "requant"]);
        convert(&dir.join("exl3"), &dir.join("mlx"), &["--format", "mlx"]);
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("mlx/config.json")).unwrap()).unwrap();
        assert_eq!(config["model_type"], model_type, "{name}");
        let (direct, back) = (tensors(&dir.join("direct")), tensors(&dir.join("mlx")));
        assert!(back.keys().eq(direct.keys()), "{name}: the same tensors");
        for (n, t) in &back {
            // The direct conversion zeroes the dead channels of a fused gate_up's down_proj; EXL3
            // keeps its experts' projections apart, so those columns (multiplied by zero) may differ.
            if n.contains(".switch_mlp.down_proj.") {
                assert_eq!((&t.0, &t.1), (&direct[n].0, &direct[n].1), "{name}: {n}");
                continue;
            }
            assert!(*t == direct[n], "{name}: {n} differs from the direct conversion");
        }
        convert(&dir.join("exl3"), &dir.join("gguf"), &["--format", "gguf"]);
        assert!(dir.join("gguf/model.gguf").is_file(), "{name}");
        convert(&dir.join("exl3"), &dir.join("bf16"), &["--format", "bf16"]);
    }
}

/// Escha tensors of codebook `codebook` (its `escha_config` id).
fn with_codebook(mut ts: Vec<T>, codebook: i32) -> Vec<T> {
    for t in ts.iter_mut().filter(|t| t.name.ends_with(".escha_config")) {
        t.data[12..16].copy_from_slice(&codebook.to_le_bytes());
    }
    ts
}

#[test]
fn every_k_and_codebook_goes_to_exl3_and_back_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = crate::synth::Rng::new(11);
    let mut input = Vec::new();
    // One layer per K × codebook: a dense linear and a stack of two experts (gate_up split in EXL3).
    let mut layer = 0;
    for k in 1..=8 {
        for codebook in 0..3 {
            let p = format!("model.language_model.layers.{layer}.mlp");
            let mut linear = |leaf: &str, experts, ic, oc| {
                crate::synth::coded_linear(&mut rng, &format!("{p}.{leaf}"), experts, ic, oc, k, false, false)
            };
            let mut ts = linear("shared_expert.down_proj", None, 128, 256);
            ts.extend(linear("experts.gate_up_proj", Some(2), 256, 256));
            ts.extend(linear("experts.down_proj", Some(2), 128, 256));
            input.extend(with_codebook(ts, codebook));
            layer += 1;
        }
    }
    // A Qwen3.5-MoE of hidden 256 with two experts of width 128, one layer each.
    let model = crate::synth::Model {
        layer_types: vec!["linear_attention"; layer],
        experts: Some((2, 128, 128)),
        ..crate::synth::Model::small()
    };
    let dir = crate::synth::write_model(&tmp.path().join("in"), &input, &model);

    let (direct, back, change) = both_ways(&dir, tmp.path());
    assert_eq!(change, 0.0);
    assert!(back.keys().eq(direct.keys()), "the same tensors");
    for (n, t) in &back {
        assert!(*t == direct[n], "{n} differs from the direct conversion");
    }
    let exl3 = tensors(&tmp.path().join("exl3"));
    let stored: BTreeMap<&str, &T> = input.iter().map(|t| (t.name.as_str(), t)).collect();
    for l in 0..layer {
        let p = format!("model.language_model.layers.{l}.mlp");
        let down = format!("{p}.shared_expert.down_proj");
        assert_eq!(exl3[&format!("{down}.trellis")].2, stored[format!("{down}.escha_code").as_str()].data, "{down}");
        // exllamav3's codebook markers: none for 3INST (id 0), `.mcg` (1), `.mul1` (2).
        let markers: Vec<_> =
            ["mcg", "mul1"].into_iter().filter(|m| exl3.contains_key(&format!("{down}.{m}"))).collect();
        assert_eq!(markers, [&[][..], &["mcg"], &["mul1"]][l % 3], "{down}");
        let gate_up = &stored[format!("{p}.experts.gate_up_proj.escha_code").as_str()];
        let (ic_tiles, oc_tiles, words) = (gate_up.shape[1], gate_up.shape[2], gate_up.shape[3]);
        for (e, expert) in gate_up.data.chunks_exact(ic_tiles * oc_tiles * words * 2).enumerate() {
            let gate = format!("{p}.experts.{e}.gate_proj.trellis");
            assert_eq!(exl3[&gate].2, rows_of(expert, oc_tiles, words, 2, 0..oc_tiles / 2), "{gate}");
        }
    }
}

/// `verify OUT --base` on an EXL3 output, as JSON, with its exit code.
fn verify(out: &Path, base: &str) -> (Option<i32>, serde_json::Value) {
    let o = escha_convert().arg("verify").arg(out).arg("--base").arg(fixture(base)).arg("--json").output().unwrap();
    let report = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", stderr(&o)));
    (o.status.code(), report)
}

/// The coded rows of a verify report, by tensor name.
fn coded_rows(report: &serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    let rows = report["coded"].as_array().unwrap();
    rows.iter().map(|r| (r["tensor"].as_str().unwrap().to_string(), r.clone())).collect()
}

#[test]
fn verify_checks_the_exl3_linears_against_the_stacked_base_experts() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["dense", "moe"] {
        let out = tmp.path().join(name);
        convert(&fixture(name), &out, &["--format", "exl3"]);
        for base in [format!("{name}-base"), format!("{name}-base-fp8")] {
            let (code, on_out) = verify(&out, &base);
            assert_eq!(code, Some(0), "{name} against {base}: {on_out}");
            assert!(on_out["missing_in_base"].as_array().unwrap().is_empty());
            let (_, on_in) = verify(&fixture(name), &base);
            let (out_rows, in_rows) = (coded_rows(&on_out), coded_rows(&on_in));
            let figures = ["corr", "rel_err", "ratio", "compared", "live_channels", "tiles_checked"];
            for (t, row) in &out_rows {
                let weight = t.strip_suffix(".weight").unwrap();
                // A per-expert down_proj is its expert of IN's stack, every figure equal; gate and
                // up are halves of IN's fused gate_up, so only pass/fail compares.
                let same = match hf_expert(weight) {
                    Some((stack, e, "down_proj")) => {
                        Some(in_rows[&format!("{stack}.down_proj")]["per_expert"][e].clone())
                    }
                    Some(_) => None,
                    None => Some(in_rows[t].clone()),
                };
                assert_eq!(row["failures"], serde_json::json!([]), "{t}");
                let Some(want) = same else { continue };
                for f in figures {
                    let (a, b) = (row[f].as_f64().unwrap(), want[f].as_f64().unwrap());
                    // The dense fixture's s ≠ 1 folds with one f16 rounding per channel.
                    assert!((a - b).abs() <= 1e-3 * b.abs(), "{name} {base}: {t} {f}: {a} against {b}");
                }
            }
        }
    }

    // Expert 1's gate and up trellises exchanged: both fail against the base's halves, by name.
    let out = tmp.path().join("moe");
    let shard = out.join("model-00001-of-00001.safetensors");
    let mut ts = read_safetensors(&shard);
    let [gate, up] =
        ["gate_proj", "up_proj"].map(|p| format!("model.language_model.layers.1.mlp.experts.1.{p}.trellis"));
    let g = ts.remove(&gate).unwrap();
    let u = ts.insert(up.clone(), g).unwrap();
    ts.insert(gate.clone(), u);
    let ts: Vec<T> = ts.into_iter().map(|(n, (d, s, b))| T::new(&n, Box::leak(d.into_boxed_str()), &s, b)).collect();
    write_safetensors(&shard, &ts);
    let (code, r) = verify(&out, "moe-base");
    assert_eq!(code, Some(1), "{r}");
    let failed: Vec<_> = coded_rows(&r)
        .into_iter()
        .filter(|(_, row)| row["failures"] != serde_json::json!([]))
        .map(|(t, _)| t)
        .collect();
    assert_eq!(failed, [gate.replace(".trellis", ".weight"), up.replace(".trellis", ".weight")]);
}

/// `(…experts, e, proj)` of a per-expert linear `….experts.{e}.{proj}`.
fn hf_expert(weight: &str) -> Option<(&str, usize, &str)> {
    let (head, proj) = weight.rsplit_once('.')?;
    let (stack, e) = head.rsplit_once('.')?;
    Some((stack, e.parse().ok()?, proj)).filter(|_| stack.ends_with(".experts"))
}

#[test]
fn card_summary_and_warnings_speak_of_exllamav3_and_the_fold() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o =
        escha_convert().arg(fixture("dense")).arg(&out).args(["--format", "exl3", "--bias", "keep"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // The summary and the warnings go to stderr.
    let stderr = stderr(&o);
    assert!(stderr.contains("one rounding per channel; largest relative change"), "{stderr}");
    assert!(stderr.contains("quantization_config.json"), "{stderr}");
    assert!(stderr.contains("which the output's runtime adds after the matmul"), "{stderr}");
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    for needle in
        ["library_name: exllamav3", "Config.from_directory", "TabbyAPI", "largest relative change", "--format exl3"]
    {
        assert!(card.contains(needle), "the card lacks {needle:?}:\n{card}");
    }
    // The marker lists quantization_config.json, so --force replaces it.
    let marker = std::fs::read_to_string(out.join(".escha-convert.json")).unwrap();
    assert!(marker.contains("quantization_config.json"));
    let dry = escha_convert()
        .arg(fixture("moe"))
        .arg(tmp.path().join("dry"))
        .args(["--format", "exl3", "--dry-run"])
        .output()
        .unwrap();
    assert!(dry.status.success());
    assert!(String::from_utf8_lossy(&dry.stdout).contains("mlp.experts.3.up_proj.trellis"));
    assert!(!tmp.path().join("dry").exists());
}

#[test]
fn padded_linears_are_refused_naming_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    copy_tree(&fixture("moe"), &input);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(input.join("config.json")).unwrap()).unwrap();
    config["text_config"]["moe_intermediate_size"] = 112.into();
    std::fs::write(input.join("config.json"), config.to_string()).unwrap();
    let shard = input.join("model-00001-of-00001.safetensors");
    let ts: Vec<T> = read_safetensors(&shard)
        .into_iter()
        .map(|(n, (dtype, shape, mut data))| {
            // [16, K, 2, 1, E, IC, OC, IC_p, OC_p]: every layer's experts 16 channels narrower than
            // stored (down_proj's inputs, each half of gate_up's outputs), as config.json says.
            let field = if n.ends_with("experts.down_proj.escha_config") {
                Some((20, 16))
            } else if n.ends_with("experts.gate_up_proj.escha_config") {
                Some((24, 32))
            } else {
                None
            };
            if let Some((at, fewer)) = field {
                let width = i32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                data[at..at + 4].copy_from_slice(&(width - fewer).to_le_bytes());
            }
            T::new(&n, Box::leak(dtype.into_boxed_str()), &shape, data)
        })
        .collect();
    write_safetensors(&shard, &ts);
    let o = escha_convert().arg(&input).arg(tmp.path().join("out")).args(["--format", "exl3"]).output().unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("layers.0.mlp.experts.down_proj.escha_code") && err.contains("padded"), "{err}");
}

#[test]
fn per_expert_exl3_linears_stack_into_llama_cpps_expert_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let exl3 = tmp.path().join("exl3");
    convert(&fixture("moe"), &exl3, &["--format", "exl3"]);
    let report = convert(&exl3, &tmp.path().join("gguf"), &["--format", "gguf", "--dry-run"]);
    let names: Vec<&str> = report["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    for n in ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("experts")), "{names:?}");
}

#[test]
fn native_exl3_input_keeps_its_vectors_and_gets_exllamav3s_markers() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = crate::synth::Rng::new(31);
    let (ic, oc, k) = (256, 128, 4);
    let mut input = Vec::new();
    let modules = [
        ("model.language_model.layers.0.mlp.down_proj", Some("mul1"), Some(0x83DC_D12D_u32)),
        ("model.language_model.layers.0.mlp.up_proj", Some("mcg"), Some(0xCBAC_1FED)),
        ("model.language_model.layers.0.mlp.gate_proj", None, None),
    ];
    for (p, marker, _) in modules {
        // A dense model of hidden 128 and MLP width 256: down_proj 256 → 128, the others 128 → 256.
        let (ic, oc) = if p.ends_with("down_proj") { (ic, oc) } else { (oc, ic) };
        input.push(T::new(&format!("{p}.trellis"), "I16", &[ic / 16, oc / 16, 16 * k], rng.bytes(ic * oc * k / 8)));
        input.push(T::f16(&format!("{p}.suh"), &[ic], &rng.vec(ic, -0.03, 0.03)));
        input.push(T::f16(&format!("{p}.svh"), &[oc], &rng.vec(oc, -1.0, 1.0)));
        if let Some(m) = marker {
            // Markers from exllamav3's experimental window held other values; the output holds its constants.
            input.push(T::new(&format!("{p}.{m}"), "I32", &[], vec![0; 4]));
        }
    }
    let model = crate::synth::Model { hidden: 128, intermediate: 256, ..crate::synth::Model::dense(128, 1) };
    let dir = crate::synth::write_model(&tmp.path().join("in"), &input, &model);
    let out = tmp.path().join("out");
    convert(&dir, &out, &["--format", "exl3"]);
    let got = tensors(&out);
    let stored: BTreeMap<&str, &T> = input.iter().map(|t| (t.name.as_str(), t)).collect();
    for (p, marker, value) in modules {
        for leaf in ["trellis", "suh", "svh"] {
            let name = format!("{p}.{leaf}");
            assert_eq!(got[&name].2, stored[name.as_str()].data, "{name} as stored");
        }
        for m in ["mcg", "mul1"] {
            let name = format!("{p}.{m}");
            match (marker, value) {
                (Some(want), Some(v)) if want == m => {
                    assert_eq!(u32::from_le_bytes(got[&name].2[..].try_into().unwrap()), v, "{name}");
                }
                _ => assert!(!got.contains_key(&name), "{name}: no such marker"),
            }
        }
    }
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let q = &config["quantization_config"];
    assert_eq!((q["bits"].as_f64(), q["head_bits"].as_u64()), (Some(4.0), Some(16)));
    assert!(q.get("codebook").is_none(), "three codebooks: no single one to name");
    assert_eq!(config["architectures"][0], "Qwen3_5ForCausalLM");
}

#[test]
fn parts_merge_into_the_one_run_output_and_only_selects_expert_modules() {
    let tmp = tempfile::tempdir().unwrap();
    let shaping = ["--format", "exl3", "--max-shard-size", "400000", "--checksums"];
    let whole = tmp.path().join("whole");
    convert(&fixture("moe"), &whole, &shaping);
    let merged = tmp.path().join("merged");
    std::fs::create_dir(&merged).unwrap();
    for part in ["1/2", "2/2"] {
        let dir = tmp.path().join(part.replace('/', "-"));
        convert(&fixture("moe"), &dir, &[&shaping[..], &["--part", part]].concat());
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let to = merged.join(p.file_name().unwrap());
            if !to.exists() {
                std::fs::copy(&p, to).unwrap();
            }
        }
    }
    let o = escha_convert().arg("merge").arg(&merged).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    for file in ["config.json", "quantization_config.json", "SHA256SUMS", "model.safetensors.index.json"] {
        assert_eq!(std::fs::read(whole.join(file)).unwrap(), std::fs::read(merged.join(file)).unwrap(), "{file}");
    }
    assert_eq!(tensors(&whole), tensors(&merged));

    let only = tmp.path().join("only");
    convert(&fixture("moe"), &only, &["--format", "exl3", "--only", "*.experts.1.*"]);
    let got = tensors(&only);
    assert!(!got.is_empty() && got.keys().all(|n| n.contains(".experts.1.")), "{:?}", got.keys());
    // Like every part of a split job, an --only run writes the config of the whole output.
    assert_eq!(
        std::fs::read(whole.join("quantization_config.json")).unwrap(),
        std::fs::read(only.join("quantization_config.json")).unwrap()
    );
}

#[test]
fn a_fractional_bitrate_is_refused_as_not_read_yet() {
    // exllamav3 1.6 writes K = 2.5 (alternating 2- and 3-bit steps, mul1 codebook) as 40 words a tile.
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = crate::synth::Rng::new(41);
    let (ic, oc, words) = (128, 128, 40);
    let p = "model.language_model.layers.0.mlp.down_proj";
    let input = [
        T::new(&format!("{p}.trellis"), "I16", &[ic / 16, oc / 16, words], rng.bytes(ic * oc / 256 * words * 2)),
        T::f16(&format!("{p}.suh"), &[ic], &rng.vec(ic, -0.03, 0.03)),
        T::f16(&format!("{p}.svh"), &[oc], &rng.vec(oc, -1.0, 1.0)),
        T::new(&format!("{p}.mul1"), "I32", &[], 0x83DC_D12D_u32.to_le_bytes().to_vec()),
    ];
    let dir = crate::synth::write_checkpoint(&tmp.path().join("in"), &input);
    for format in ["exl3", "bf16"] {
        let o = escha_convert().arg(&dir).arg(tmp.path().join(format)).args(["--format", format]).output().unwrap();
        assert_eq!(o.status.code(), Some(1));
        let err = stderr(&o);
        for needle in [&format!("{p}.trellis"), "K = 2.5", "fractional", "not read yet"] {
            assert!(err.contains(needle), "{needle:?} in {err}");
        }
    }
}
