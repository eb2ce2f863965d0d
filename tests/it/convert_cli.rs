//! End-to-end conversion through the binary: values, layout, determinism, data safety.

use crate::common::stderr;
use crate::synth::*;
use escha_convert::codec::Codebook;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    crate::common::escha_convert()
}

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    bin().args(args.iter().map(std::convert::AsRef::as_ref)).output().unwrap()
}

/// Every file of a directory tree, relative path → bytes.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn output_tensors(dir: &Path) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let mut all = std::collections::BTreeMap::new();
    for (rel, _) in tree(dir) {
        if rel.extension().is_some_and(|e| e == "safetensors") && rel.parent() == Some(Path::new("")) {
            all.extend(read_safetensors(&dir.join(rel)));
        }
    }
    all
}

#[test]
fn converted_values_are_the_f64_reconstruction_rounded_once_to_bf16() {
    let tmp = tempfile::tempdir().unwrap();
    let tensors = small_checkpoint(7);
    let input = write_checkpoint(&tmp.path().join("in"), &tensors);
    let out = tmp.path().join("out");
    let o = run(&[&"convert", &input, &out, &"--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = output_tensors(&out);
    let find = |name: &str| tensors.iter().find(|t| t.name == name).unwrap();

    // Dense coded linear with s_in/s_out.
    let p = "model.language_model.layers.0.mlp.shared_expert.up_proj";
    let fold = |r: &str, s: &str| -> Vec<f64> {
        let r = f16s(&find(r).data);
        let s = f32s(&find(s).data);
        r.iter().zip(&s).map(|(&a, &b)| (a * b) as f64).collect()
    };
    let su = fold(&format!("{p}.escha_rin"), &format!("{p}.escha_s_in"));
    let sv = fold(&format!("{p}.escha_rout"), &format!("{p}.escha_s_out"));
    let want = reference_linear(&find(&format!("{p}.escha_code")).data, 256, 384, 3, &su, &sv);
    let (dtype, shape, bytes) = &got[&format!("{p}.weight")];
    assert_eq!((dtype.as_str(), shape.as_slice()), ("BF16", &[384usize, 256][..]));
    assert_bf16_rounding_of(&bf16s(bytes), &want, p);

    // Stacked experts: [E, OC, IC], each expert from its own slice of every vector.
    let p = "model.language_model.layers.0.mlp.experts.gate_up_proj";
    let (dtype, shape, bytes) = &got[p];
    assert_eq!((dtype.as_str(), shape.as_slice()), ("BF16", &[3usize, 256, 256][..]));
    let values = bf16s(bytes);
    let code = &find(&format!("{p}.escha_code")).data;
    let (rin, rout) = (f16s(&find(&format!("{p}.escha_rin")).data), f16s(&find(&format!("{p}.escha_rout")).data));
    let (s_in, s_out) = (f32s(&find(&format!("{p}.escha_s_in")).data), f32s(&find(&format!("{p}.escha_s_out")).data));
    for e in 0..3 {
        let su: Vec<f64> = (0..256).map(|i| (rin[e * 256 + i] * s_in[e * 256 + i]) as f64).collect();
        let sv: Vec<f64> = (0..256).map(|o| (rout[e * 256 + o] * s_out[e * 256 + o]) as f64).collect();
        let per = code.len() / 3;
        let want = reference_linear(&code[e * per..(e + 1) * per], 256, 256, 2, &su, &sv);
        assert_bf16_rounding_of(&values[e * 256 * 256..(e + 1) * 256 * 256], &want, &format!("{p}[{e}]"));
    }

    // int8: exact product, one rounding.
    let w8 = &find("model.language_model.embed_tokens.weight_int8").data;
    let scale = f16s(&find("model.language_model.embed_tokens.weight_scale").data);
    let want: Vec<f64> = w8.iter().enumerate().map(|(n, &q)| q as i8 as f64 * scale[n / 256] as f64).collect();
    let (dtype, _, bytes) = &got["model.language_model.embed_tokens.weight"];
    assert_eq!(dtype, "BF16");
    assert_eq!(bf16s(bytes), want.iter().map(|&w| half::bf16::from_f64(w).to_f32()).collect::<Vec<_>>());

    // Norms kept as stored (zero-centred stays zero-centred), F32 kept F32, bf16 copied bit for bit.
    let norm = "model.language_model.layers.0.input_layernorm.weight";
    let want: Vec<f32> = f16s(&find(norm).data).iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
    assert_eq!(bf16s(&got[norm].2), want);
    let a_log = "model.language_model.layers.0.linear_attn.A_log";
    assert_eq!(got[a_log].0, "F32");
    assert_eq!(got[a_log].2, find(a_log).data);
    let conv = "model.language_model.layers.0.linear_attn.conv1d.weight";
    assert_eq!((&got[conv].1, &got[conv].2), (&vec![256usize, 1, 4], &find(conv).data));
}

#[test]
fn layout_index_config_and_side_files() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write_checkpoint(&tmp.path().join("in"), &small_checkpoint(8));
    let out = tmp.path().join("out");
    let o = run(&[&input, &out, &"--max-shard-size", &"300KB", &"--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let names: Vec<String> = output_tensors(&out).into_keys().collect();
    // Every tensor of the model, by its Hugging Face name.
    let mut want: Vec<String> = Model::small().tensors().into_iter().map(|(name, _)| name).collect();
    want.sort();
    assert_eq!(names, want, "bias dropped by default, no escha_* leaves left");

    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap()).unwrap();
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(map.keys().cloned().collect::<Vec<_>>(), want, "weight_map sorted, complete");
    let files: std::collections::BTreeSet<&str> = map.values().map(|v| v.as_str().unwrap()).collect();
    assert!(files.len() >= 2, "300KB shards split the output: {files:?}");
    let n = files.len();
    for (i, f) in files.iter().enumerate() {
        assert_eq!(*f, format!("model-{:05}-of-{:05}.safetensors", i + 1, n));
        let bytes = std::fs::read(out.join(f)).unwrap();
        let hlen = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + hlen) % 8, 0, "header padded to 8 bytes");
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + hlen]).unwrap();
        assert_eq!(header["__metadata__"], serde_json::json!({"format": "pt"}));
    }
    let total: u64 = output_tensors(&out).values().map(|t| t.2.len() as u64).sum();
    assert_eq!(index["metadata"]["total_size"], total);

    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let mut expected = config_json();
    expected.as_object_mut().unwrap().shift_remove("quantization_config");
    assert_eq!(config, expected, "only quantization_config removed");
    assert!(out.join("tokenizer_config.json").is_file());
    assert!(!out.join("quantize_config.json").exists(), "Escha's quantize_config.json is not copied");
}

#[test]
fn bias_keep_writes_the_stored_bias() {
    let tmp = tempfile::tempdir().unwrap();
    let tensors = small_checkpoint(9);
    let input = write_checkpoint(&tmp.path().join("in"), &tensors);
    let out = tmp.path().join("out");
    let o = run(&[&input, &out, &"--bias", &"keep", &"--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = "model.language_model.layers.0.mlp.shared_expert.up_proj.bias";
    let stored = &tensors.iter().find(|t| t.name == p).unwrap().data;
    let want: Vec<f32> = f16s(stored).iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
    assert_eq!(bf16s(&output_tensors(&out)[p].2), want);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["counts"]["bias"], 1);
    // Kept, with a word on who can load it.
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0]["code"], "bias_kept", "{warnings:?}");
    assert!(warnings[0]["message"].as_str().unwrap().contains("stock Qwen3.5 loaders"), "{warnings:?}");

    // Dropping a non-zero bias is reported once, on stderr and in the JSON warnings.
    let out2 = tmp.path().join("out2");
    let o = run(&[&input, &out2, &"--json"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0]["code"], "bias_dropped", "{warnings:?}");
    assert!(warnings[0]["message"].as_str().unwrap().contains("dropped 1 non-zero bias"));
    assert_eq!(stderr(&o).matches("non-zero bias").count(), 1);
}

#[test]
fn output_is_byte_identical_across_runs_and_thread_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write_checkpoint(&tmp.path().join("in"), &small_checkpoint(10));
    let outs: Vec<PathBuf> = (0..3).map(|i| tmp.path().join(format!("out{i}"))).collect();
    for (out, j) in outs.iter().zip(["1", "2", "2"]) {
        let o = run(&[&input, out, &"-j", &j, &"--quiet"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert_eq!(tree(&outs[0]), tree(&outs[1]));
    assert_eq!(tree(&outs[1]), tree(&outs[2]));
    // The scalar reference decoder gives the same bytes as the fast one.
    let scalar = tmp.path().join("scalar");
    let o = run(&[&input, &scalar, &"--decoder", &"scalar", &"--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(tree(&outs[0]), tree(&scalar));
}

#[test]
fn existing_output_is_refused_without_force_and_replaced_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write_checkpoint(&tmp.path().join("in"), &small_checkpoint(11));
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "precious").unwrap();
    let o = run(&[&input, &out]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(out.join("keep.txt")).unwrap(), "precious");

    // --force replaces only an earlier output: a foreign file is named and kept.
    let o = run(&[&input, &out, &"--force", &"--quiet"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("keep.txt"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(out.join("keep.txt")).unwrap(), "precious");
    std::fs::remove_file(out.join("keep.txt")).unwrap();
    assert!(run(&[&input, &out, &"--quiet"]).status.success());
    let first = std::fs::read(out.join("model.safetensors.index.json")).unwrap();
    let o = run(&[&input, &out, &"--force", &"--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(out.join("model.safetensors.index.json")).unwrap(), first);

    // An empty directory is fine without --force.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(run(&[&input, &empty, &"--quiet"]).status.success());

    // The input itself is never a valid output, even with --force.
    let o = run(&[&input, &input, &"--force"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(tmp.path().join("in/model.safetensors").is_file());
}

#[test]
fn dry_run_plans_without_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write_checkpoint(&tmp.path().join("in"), &small_checkpoint(12));
    let out = tmp.path().join("out");
    let o = run(&[&input, &out, &"--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("model.language_model.layers.0.mlp.shared_expert.up_proj.weight"));
    assert!(text.contains("384×256"));
    assert!(text.contains("peak memory estimate"));
    assert!(!out.exists());
}

#[test]
fn only_selects_a_subset() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write_checkpoint(&tmp.path().join("in"), &small_checkpoint(13));
    let out = tmp.path().join("out");
    let o = run(&[&input, &out, &"--only", &"*.mlp.experts.*", &"--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let names: Vec<String> = output_tensors(&out).into_keys().collect();
    assert_eq!(
        names,
        [
            "model.language_model.layers.0.mlp.experts.down_proj",
            "model.language_model.layers.0.mlp.experts.gate_up_proj"
        ]
    );
    let o = run(&[&input, &tmp.path().join("none"), &"--only", &"nothing.*"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--only"));
}

#[test]
fn single_safetensors_file_input() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write_checkpoint(&tmp.path().join("in"), &small_checkpoint(14)).join("model.safetensors");
    let out = tmp.path().join("out");
    let o = run(&[&input, &out, &"--quiet", &"--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(output_tensors(&out).len(), Model::small().tensors().len());
    assert!(!out.join("config.json").exists());
    // The documented tensors-only case, said in the report and on the card.
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let codes: Vec<&str> = report["warnings"].as_array().unwrap().iter().filter_map(|w| w["code"].as_str()).collect();
    assert!(codes.contains(&"tensors_only"), "{codes:?}");
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(card.contains("| tensors only |") && card.contains("no config.json"), "{card}");
}

/// A format written from config.json (GGUF's model keys, EXL3's flattened config) refuses a single
/// file before any work, saying what to pass instead; none leaves an output behind.
#[test]
fn single_file_input_is_refused_where_the_format_needs_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write_checkpoint(&tmp.path().join("in"), &small_checkpoint(14)).join("model.safetensors");
    for format in ["gguf", "exl3"] {
        let out = tmp.path().join(format);
        let o = run(&[&input, &out, &"--quiet", &"--format", &format]);
        assert_eq!(o.status.code(), Some(1), "{format}: {}", stderr(&o));
        assert!(stderr(&o).contains("put the file in a directory with the model's config.json"), "{}", stderr(&o));
        assert!(!out.exists(), "{format}");
    }
}

#[test]
fn interrupted_conversion_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(15);
    let mut tensors = Vec::new();
    for l in 0..12 {
        let path = format!("model.language_model.layers.{l}.mlp.down_proj");
        tensors.extend(coded_linear(&mut rng, &path, None, 1024, 1024, 8, false, false));
    }
    let input = write_model(&tmp.path().join("in"), &tensors, &Model::dense(1024, 12));
    let out = tmp.path().join("out");
    let mut child = bin()
        .args([input.as_os_str(), out.as_os_str()])
        .args(["--decoder", "scalar", "-j", "1", "--quiet"])
        .spawn()
        .unwrap();
    // Wait for the staging directory to appear, then interrupt.
    let staging_exists = || {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().starts_with(".out.partial"))
    };
    let started = std::time::Instant::now();
    while !staging_exists() && started.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(staging_exists(), "staging directory never appeared");
    unsafe { libc_kill(child.id() as i32, 15) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "exit code after SIGTERM");
    assert!(!out.exists());
    assert!(!staging_exists(), "staging directory removed");
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

#[test]
fn native_exl3_checkpoints_convert_through_the_same_path() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(16);
    // A text-only model (names under `model.`): hidden 128, MLP width 256.
    let model = Model { hidden: 128, intermediate: 256, prefix: "model.", ..Model::dense(128, 1) };
    let k = 4;
    let code = rng.bytes(256 * 128 * k / 8);
    let (s256, s128) = (rng.vec(256, -0.03, 0.03), rng.vec(128, -1.0, 1.0));
    let modules = [
        ("model.layers.0.mlp.down_proj", Some("mul1"), Codebook::Mul1, 256, 128),
        ("model.layers.0.mlp.up_proj", Some("mcg"), Codebook::Mcg, 128, 256),
        ("model.layers.0.mlp.gate_proj", None, Codebook::ThreeInst, 128, 256),
    ];
    let vector = |n: usize| if n == 256 { s256.clone() } else { s128.clone() };
    let mut tensors = Vec::new();
    for (p, marker, _, ic, oc) in modules {
        tensors.push(T::new(&format!("{p}.trellis"), "I16", &[ic / 16, oc / 16, 16 * k], code.clone()));
        tensors.push(T::f16(&format!("{p}.suh"), &[ic], &vector(ic)));
        tensors.push(T::f16(&format!("{p}.svh"), &[oc], &vector(oc)));
        if let Some(m) = marker {
            tensors.push(T::new(&format!("{p}.{m}"), "I32", &[], vec![0; 4]));
        }
    }
    let input = write_model(&tmp.path().join("in"), &tensors, &model);
    let out = tmp.path().join("out");
    let o = run(&[&input, &out, &"--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = output_tensors(&out);
    assert_eq!(got.len(), model.tensors().len(), "markers are consumed, one weight per module");
    let f64s = |v: &[f32]| -> Vec<f64> { f16s(&T::f16("", &[v.len()], v).data).iter().map(|&x| x as f64).collect() };
    for (p, _, cb, ic, oc) in modules {
        let want = reference_linear_with(cb, &code, ic, oc, k as u32, &f64s(&vector(ic)), &f64s(&vector(oc)));
        assert_bf16_rounding_of(&bf16s(&got[&format!("{p}.weight")].2), &want, p);
    }
}

/// Mounts a tiny tmpfs for the test and unmounts it on drop; `None` where mounting is not
/// permitted (not root), in which case the test says so and checks nothing.
struct TinyDisk(PathBuf);

impl TinyDisk {
    fn mount(dir: &Path, size: &str) -> Option<TinyDisk> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| TinyDisk(dir.to_path_buf()))
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_is_a_clear_error_before_any_weight_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write_checkpoint(&tmp.path().join("in"), &small_checkpoint(17));
    let Some(disk) = TinyDisk::mount(&tmp.path().join("disk"), "64k") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let out = disk.0.join("out");
    let o = run(&[&input, &out]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("not enough disk space") && err.contains("cannot write the output"), "{err}");
    assert_eq!(std::fs::read_dir(&disk.0).unwrap().count(), 0, "nothing left on the full disk");
}
