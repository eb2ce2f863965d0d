//! Honest outcomes at the edges: what is read from IN, what is refused, what happens to the
//! user's files, inputs that change underneath, and the command line's manners.

use crate::common::{fixture, stderr};
use crate::synth::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    crate::common::escha_convert()
}

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    bin().args(args.iter().map(AsRef::as_ref)).output().unwrap()
}

/// A small valid checkpoint in `dir` after `edit`.
fn checkpoint(dir: &Path, edit: impl FnOnce(&mut Vec<T>)) -> PathBuf {
    let mut tensors = small_checkpoint(31);
    edit(&mut tensors);
    write_checkpoint(dir, &tensors)
}

/// Converts `input` into a fresh OUT under `parent` and checks that it failed with exit 1, one
/// line naming every string of `expect`, and left nothing behind; returns stderr.
fn refused(input: &Path, extra: &[&str], expect: &[&str]) -> String {
    let parent = tempfile::tempdir().unwrap();
    let out = parent.path().join("out");
    let o = bin().arg(input).arg(&out).arg("--quiet").args(extra).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for e in expect {
        assert!(err.contains(e), "should mention {e:?}: {err}");
    }
    assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0, "nothing left behind: {err}");
    err
}

// ---- the input boundary ------------------------------------------------------------------------

#[test]
fn side_files_linked_out_of_in_are_refused_naming_the_link_and_its_target() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("credentials");
    std::fs::write(&secret, "HF_TOKEN=hf_secret").unwrap();
    for (name, target) in [
        ("tokenizer_config.json", secret.clone()),
        ("chat_template.jinja", secret.clone()),
        ("tokenizer.json", PathBuf::from("/proc/self/environ")),
        ("config.json", secret.clone()),
    ] {
        let input = checkpoint(&tmp.path().join(format!("in-{name}")), |_| {});
        let _ = std::fs::remove_file(input.join(name));
        std::os::unix::fs::symlink(&target, input.join(name)).unwrap();
        let err = refused(&input, &[], &[name, "outside the checkpoint"]);
        // The target as resolved (/proc/self is the converter's own process).
        let shown = target.canonicalize().unwrap_or(target).display().to_string();
        assert!(err.contains(&shown) || shown.starts_with("/proc/") && err.contains("/proc/"), "{err}");
    }
}

#[test]
fn an_mtp_directory_linked_out_of_in_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = checkpoint(&tmp.path().join("elsewhere"), |_| {});
    let input = checkpoint(&tmp.path().join("in"), |_| {});
    std::os::unix::fs::symlink(&elsewhere, input.join("mtp")).unwrap();
    refused(&input, &[], &["mtp", "outside the checkpoint"]);
}

#[test]
fn a_fifo_is_refused_without_hanging() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"), |_| {});
    let fifo = std::ffi::CString::new(input.join("tokenizer.json").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    refused(&input, &[], &["tokenizer.json", "FIFO"]);
}

#[test]
fn a_hugging_face_cache_snapshot_converts_through_its_blob_links() {
    let tmp = tempfile::tempdir().unwrap();
    let staged = checkpoint(&tmp.path().join("staged"), |_| {});
    let repo = tmp.path().join("models--org--name");
    let (blobs, snapshot) = (repo.join("blobs"), repo.join("snapshots").join("0123abcd"));
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    for (i, e) in std::fs::read_dir(&staged).unwrap().enumerate() {
        let p = e.unwrap().path();
        let blob = blobs.join(format!("{i:040x}"));
        std::fs::rename(&p, &blob).unwrap();
        let link = PathBuf::from("../../blobs").join(blob.file_name().unwrap());
        std::os::unix::fs::symlink(link, snapshot.join(p.file_name().unwrap())).unwrap();
    }
    let out = tmp.path().join("out");
    let o = run(&[&snapshot, &out, &"--quiet", &"--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let copied: Vec<&str> = report["copied_files"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(copied.contains(&"tokenizer_config.json"), "{copied:?}");
    assert_eq!(std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap(), "{\"model_max_length\": 4096}\n");
    assert!(!std::fs::symlink_metadata(out.join("tokenizer_config.json")).unwrap().file_type().is_symlink());
}

// ---- only Escha in, only valid models out --------------------------------------------------------

#[test]
fn inputs_that_are_not_escha_are_refused_saying_what_they_look_like() {
    refused(&fixture("dense-base-fp8"), &[], &["not an Escha-W2 checkpoint", "fp8"]);
    refused(&fixture("dense-base"), &[], &["not an Escha-W2 checkpoint", "dense bf16"]);
    let tmp = tempfile::tempdir().unwrap();
    for (format, looks) in [("bf16", "dense bf16"), ("mlx", "MLX-quantized")] {
        let ours = tmp.path().join(format);
        assert!(run(&[&fixture("moe"), &ours, &"--quiet", &"--format", &format]).status.success());
        refused(&ours, &[], &["not an Escha-W2 checkpoint", looks]);
    }
}

#[test]
fn quantized_and_sub_byte_tensors_never_pass_through() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (dtype, shape, bytes)) in [("F8_E4M3", vec![4, 4], 16), ("F4", vec![8], 4)].into_iter().enumerate() {
        let input = checkpoint(&tmp.path().join(format!("in{i}")), |t| {
            t.push(T::new("model.language_model.layers.0.mlp.gate_proj.weight", dtype, &shape, vec![0x11; bytes]));
        });
        refused(&input, &[], &["model.language_model.layers.0.mlp.gate_proj.weight", dtype]);
    }
}

#[test]
fn two_inputs_for_one_output_name_are_refused_naming_both() {
    let tmp = tempfile::tempdir().unwrap();
    let up = "model.language_model.layers.0.mlp.shared_expert.up_proj";
    let input = checkpoint(&tmp.path().join("a"), |t| t.push(T::f16(&format!("{up}.weight"), &[2], &[0.0, 0.0])));
    refused(&input, &[], &[&format!("{up}.weight"), "coded module", "tensor"]);
    let embed = "model.language_model.embed_tokens";
    let input = checkpoint(&tmp.path().join("b"), |t| t.push(T::f16(&format!("{embed}.weight"), &[2], &[0.0, 0.0])));
    refused(&input, &[], &[&format!("{embed}.weight"), "int8 pair", "tensor"]);
    // In the MLX layout a quantized module writes `.scales`: a plain tensor of that name collides.
    let scales = "language_model.model.layers.0.mlp.shared_expert.up_proj.scales";
    let input = checkpoint(&tmp.path().join("c"), |t| t.push(T::f16(scales, &[2], &[0.0, 0.0])));
    refused(&input, &["--format", "mlx"], &[scales]);
}

// ---- finite or refused ------------------------------------------------------------------------

#[test]
fn values_that_are_not_finite_in_the_output_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let up = "model.language_model.layers.0.mlp.shared_expert.up_proj";
    // rin·s_in overflows f32.
    let input = checkpoint(&tmp.path().join("fold"), |t| {
        let rin = t.iter_mut().find(|t| t.name == format!("{up}.escha_rin")).unwrap();
        rin.data[..2].copy_from_slice(&half::f16::from_f32(60000.0).to_le_bytes());
        let s_in = t.iter_mut().find(|t| t.name == format!("{up}.escha_s_in")).unwrap();
        s_in.data[..4].copy_from_slice(&1e36f32.to_le_bytes());
    });
    refused(&input, &[], &[&format!("{up}.escha_s_in"), "rin·s_in", "6e4 × 1e36"]);
    // A NaN norm.
    let norm = "model.language_model.layers.0.input_layernorm.weight";
    let input = checkpoint(&tmp.path().join("nan"), |t| {
        let n = t.iter_mut().find(|t| t.name == norm).unwrap();
        n.data[..2].copy_from_slice(&half::f16::NAN.to_le_bytes());
    });
    refused(&input, &[], &[norm, "NaN"]);
    let o = run(&[&"inspect", &input]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("non-finite") && text.contains("unknown"), "{text}");
    // A bf16 value beyond float16's range: f16 refuses and points at bf16; bf16 holds it.
    let conv = "model.language_model.layers.0.linear_attn.conv1d.weight";
    let input = checkpoint(&tmp.path().join("big"), |t| {
        let c = t.iter_mut().find(|t| t.name == conv).unwrap();
        c.data[..2].copy_from_slice(&half::bf16::from_f32(70000.0).to_le_bytes());
    });
    refused(&input, &["--format", "f16"], &[conv, "--format bf16"]);
    assert!(run(&[&input, &tmp.path().join("bf16"), &"--quiet"]).status.success());
}

// ---- the user's files ---------------------------------------------------------------------------

#[test]
fn nothing_is_created_inside_in() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"), |_| {});
    let o = run(&[&input, &input.join("newdir").join("out")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("overlaps the input"), "{}", stderr(&o));
    assert!(!input.join("newdir").exists());
}

#[test]
fn a_second_run_into_the_same_out_fails_at_once() {
    use std::os::fd::AsRawFd;
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"), |_| {});
    let lock = std::fs::File::create(tmp.path().join(".out.lock")).unwrap();
    // SAFETY: flock on a descriptor we own, as a first run holds it.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    let o = run(&[&input, &tmp.path().join("out")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("another escha-convert run"), "{}", stderr(&o));
    drop(lock);
    assert!(run(&[&input, &tmp.path().join("out"), &"--quiet"]).status.success());
    assert!(!tmp.path().join(".out.lock").exists(), "the lock file is removed at the end");
}

#[test]
fn staging_left_by_a_killed_run_is_removed_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"), |_| {});
    // A killed run's staging holds its marker, written first, and what it wrote after it.
    let stale = tmp.path().join(".out.partial-999999");
    std::fs::create_dir(&stale).unwrap();
    let marker = r#"{"tool": "escha-convert", "version": "0.1.0", "input": "", "options": "",
        "files": {".escha-convert.json": null, "model-00001-of-00001.safetensors": 1000}}"#;
    std::fs::write(stale.join(".escha-convert.json"), marker).unwrap();
    std::fs::write(stale.join("model-00001-of-00001.safetensors"), vec![0u8; 1000]).unwrap();
    // A directory of the same shape with something else in it is not ours to delete.
    let foreign = tmp.path().join(".other.partial-999999");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let o = run(&[&input, &tmp.path().join("out")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stale.exists());
    assert!(stderr(&o).contains("left by an earlier run"), "{}", stderr(&o));
    assert!(foreign.join("notes.txt").is_file());
    assert!(stderr(&o).contains(&format!("kept {}", foreign.display())) && stderr(&o).contains("notes.txt"));
    assert!(!tmp.path().join(".other.lock").exists(), "the lock taken to look is removed again");
}

#[test]
fn a_long_valid_out_name_works() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"), |_| {});
    let out = tmp.path().join("o".repeat(250));
    let o = run(&[&input, &out, &"--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join("model.safetensors.index.json").is_file());
}

/// A checkpoint that takes a second or two to convert with `SLOW` (scalar decoder, one thread).
pub(crate) fn slow_checkpoint(dir: &Path) -> PathBuf {
    crate::synth::slow_checkpoint(dir, 77)
}

const SLOW: &[&str] = &["--backend", "scalar", "-j", "1", "--format", "mlx", "--bits", "2", "--quiet"];

/// Starts a slow conversion and returns once its staging directory exists.
fn start_slow(input: &Path, out: &Path) -> std::process::Child {
    start_slow_with(input, out, &[])
}

/// [`start_slow`] with `extra` arguments, stdout captured too.
pub(crate) fn start_slow_with(input: &Path, out: &Path, extra: &[&str]) -> std::process::Child {
    let mut cmd = bin();
    cmd.arg(input).arg(out).args(SLOW).args(extra).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let parent = out.parent().unwrap();
    let t0 = Instant::now();
    while !std::fs::read_dir(parent).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().contains(".partial-")) {
        assert!(t0.elapsed() < Duration::from_secs(60), "no staging directory appeared");
        std::thread::sleep(Duration::from_millis(2));
    }
    child
}

#[test]
fn something_that_appears_at_out_during_the_run_is_not_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let input = slow_checkpoint(&tmp.path().join("in"));
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let out = work.join("out");
    let child = start_slow(&input, &out);
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("precious.txt"), "mine").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("written there during the run"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(out.join("precious.txt")).unwrap(), "mine");
    let left: Vec<_> = std::fs::read_dir(&work).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec!["out"], "staging removed");
}

#[test]
fn a_shard_truncated_mid_run_ends_with_exit_1_naming_it_and_no_staging() {
    let tmp = tempfile::tempdir().unwrap();
    let input = slow_checkpoint(&tmp.path().join("in"));
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let out = work.join("out");
    let shard = input.join("model.safetensors");
    let child = start_slow(&input, &out);
    let f = std::fs::OpenOptions::new().write(true).open(&shard).unwrap();
    f.set_len(f.metadata().unwrap().len() / 3).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("model.safetensors") && err.contains("changed during conversion"), "{err}");
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "no output and no staging: {err}");
}

// ---- no panics ----------------------------------------------------------------------------------

#[test]
fn a_zero_width_int8_pair_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"), |t| {
        t.retain(|t| !t.name.starts_with("model.language_model.embed_tokens"));
        t.push(T::new("model.language_model.embed_tokens.weight_int8", "I8", &[4, 0], vec![]));
        t.push(T::f16("model.language_model.embed_tokens.weight_scale", &[4], &[0.1; 4]));
    });
    refused(&input, &[], &["embed_tokens.weight_int8", "non-empty"]);
    refused(&input, &["--format", "mlx"], &["embed_tokens.weight_int8"]);
}

#[test]
fn too_many_threads_are_capped_and_said() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"), |_| {});
    let o = run(&[&input, &tmp.path().join("out"), &"-j", &"100000"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("-j 100000 is more than"), "{}", stderr(&o));
}

#[test]
fn a_closed_stdout_ends_quietly() {
    for args in [vec!["inspect", "--json"], vec!["verify", "--json", "--base"]] {
        for _ in 0..5 {
            let mut cmd = bin();
            cmd.args(&args[..1]).arg(fixture("dense")).args(&args[1..]);
            if args[0] == "verify" {
                cmd.arg(fixture("dense-base"));
            }
            let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
            drop(child.stdout.take());
            let o = child.wait_with_output().unwrap();
            assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
            assert_ne!(o.status.code(), Some(101));
        }
    }
}

#[test]
fn control_characters_in_names_are_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"), |t| {
        t.push(T::f16("model.x\n\u{1b}[2Jforged.escha_zz", &[2], &[0.0, 0.0]));
    });
    let err = refused(&input, &[], &["\\n", "\\u{1b}"]);
    assert!(!err.contains('\u{1b}'));
}

// ---- verify proves or fails --------------------------------------------------------------------

fn verify(input: &Path, base: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let o = bin().arg("verify").arg(input).arg("--base").arg(base).args(extra).output().unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), stderr(&o))
}

#[test]
fn verify_fails_when_nothing_coded_was_proved() {
    let tmp = tempfile::tempdir().unwrap();
    // A base holding one norm.
    let base = tmp.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let norm = "model.language_model.layers.2.input_layernorm.weight";
    let all = read_safetensors(&fixture("dense-base/model.safetensors"));
    let (dtype, shape, data) = all[norm].clone();
    write_safetensors(
        &base.join("model.safetensors"),
        &[T::new(norm, Box::leak(dtype.into_boxed_str()), &shape, data)],
    );
    let (code, out, _) = verify(&fixture("dense"), &base, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("no coded tensor was checked") && out.contains("not in BASE"), "{out}");
    // --allow-missing forgives the gaps, not a run that proved nothing.
    let (code, out, _) = verify(&fixture("dense"), &base, &["--allow-missing"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("no coded tensor was checked") && !out.contains("not in BASE"), "{out}");
}

#[test]
fn verify_fails_when_coded_tensors_are_missing_from_base() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let all = read_safetensors(&fixture("dense-base/model.safetensors"));
    let kept: Vec<T> = all
        .into_iter()
        .filter(|(n, _)| !n.contains("layers.3."))
        .map(|(n, (d, s, data))| T::new(&n, Box::leak(d.into_boxed_str()), &s, data))
        .collect();
    write_safetensors(&base.join("model.safetensors"), &kept);
    let (code, out, _) = verify(&fixture("dense"), &base, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("coded) are not in BASE") && out.contains("--allow-missing"), "{out}");
    assert_eq!(verify(&fixture("dense"), &base, &["--allow-missing"]).0, Some(0));
}

#[test]
fn verify_usage_and_quantized_bases_exit_2_with_a_clear_message() {
    for bad in ["nan", "inf", "0.5"] {
        let (code, _, err) = verify(&fixture("dense"), &fixture("dense-base"), &["--max-ratio", bad]);
        assert_eq!(code, Some(2), "{bad}: {err}");
    }
    assert_eq!(verify(&fixture("dense"), &fixture("dense-base"), &["--min-corr", "1.5"]).0, Some(2));
    let (code, _, err) = verify(&fixture("dense"), &fixture("dense-base"), &["--only", "nothing.*"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("matches no tensor"), "{err}");
    let tmp = tempfile::tempdir().unwrap();
    let mlx = tmp.path().join("mlx");
    assert!(run(&[&fixture("dense"), &mlx, &"--quiet", &"--format", &"mlx"]).status.success());
    let (code, _, err) = verify(&fixture("dense"), &mlx, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("BASE is quantized (MLX affine") && !err.contains("None"), "{err}");
}

#[test]
fn verify_names_a_wrongly_sized_fp8_scale() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let mut tensors: Vec<T> = read_safetensors(&fixture("dense-base-fp8/model.safetensors"))
        .into_iter()
        .map(|(n, (d, s, data))| T::new(&n, Box::leak(d.into_boxed_str()), &s, data))
        .collect();
    let scale = tensors.iter_mut().find(|t| t.name.ends_with("up_proj.weight_scale_inv")).unwrap();
    let name = scale.name.clone();
    scale.shape = vec![1];
    scale.data.truncate(4);
    write_safetensors(&base.join("model.safetensors"), &tensors);
    let (code, _, err) = verify(&fixture("dense"), &base, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&name) && err.contains("block scales"), "{err}");
}

// ---- the command line -------------------------------------------------------------------------

#[test]
fn usage_errors_exit_2_and_typos_get_a_suggestion() {
    let o = run(&[&fixture("dense"), &"/tmp/never-written", &"--bits", &"4"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--format mlx"), "{}", stderr(&o));
    let o = run(&[&"inpsect", &fixture("dense")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("inspect"), "{}", stderr(&o));
    let o = run(&[&"some-org/some-model", &"/tmp/never-written"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("download it first"), "{}", stderr(&o));
    let o = run(&[&fixture("dense"), &"/tmp/never-written", &"--max-shard-size", &"5Q"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("GiB"), "{}", stderr(&o));
}

#[test]
fn f16_output_says_float16_in_its_config() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert!(run(&[&fixture("moe"), &out, &"--format", &"f16", &"--quiet"]).status.success());
    let config: Value = serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["text_config"]["dtype"], "float16");
}

#[test]
fn a_dry_run_says_when_the_real_run_would_refuse() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let o = run(&[&fixture("dense"), &out, &"--dry-run"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("the real run would refuse"), "{}", stderr(&o));
}

#[test]
fn one_shard_of_several_is_refused_with_the_directory_to_pass() {
    let o = run(&[&"inspect", &fixture("dense/model-00001-of-00002.safetensors")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("one shard of 2 shards; pass the directory"), "{}", stderr(&o));
}

#[test]
fn progress_in_a_log_is_plain_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&[&fixture("dense"), &tmp.path().join("out")]);
    assert!(o.status.success());
    let err = stderr(&o);
    assert!(err.contains("% written (") && err.contains("100% written"), "{err}");
}

#[test]
fn a_long_row_is_converted_in_bounded_pieces() {
    use std::os::unix::process::CommandExt;
    if cfg!(escha_cross) {
        eprintln!("skipped: an emulator's own address space does not obey RLIMIT_DATA like the target");
        return;
    }
    // One row of 2^25 F32 values (128 MiB in and out) under a 96 MiB limit on the heap: the
    // run fits only when the row goes through in pieces.
    let len = 1usize << 25;
    // A tensor of an MTP head the config announces no layer of: the model has no shape for it,
    // and `--mtp keep` writes it as it is.
    let name = "mtp.fc.weight";
    let tmp = tempfile::tempdir().unwrap();
    let input = checkpoint(&tmp.path().join("in"), |ts| ts.push(T::new(name, "F32", &[len], vec![0u8; len * 4])));
    let dry = run(&[&input, &tmp.path().join("dry"), &"--dry-run", &"--json", &"--mtp", &"keep"]);
    let report: Value = serde_json::from_slice(&dry.stdout).unwrap();
    let estimate = report["peak_memory_estimate"].as_u64().unwrap();
    assert!(estimate < 96 << 20, "the estimate counts pieces, not rows: {estimate}");

    let out = tmp.path().join("out");
    let limit = 96u64 << 20;
    let mut cmd = bin();
    cmd.arg(&input).arg(&out).args(["--quiet", "--mtp", "keep"]);
    // SAFETY: setrlimit in the child before exec; no allocation or lock is involved.
    unsafe {
        cmd.pre_exec(move || {
            let l = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            if libc::setrlimit(libc::RLIMIT_DATA, &raw const l) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let meta = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|p| {
            let data = std::fs::read(p).unwrap();
            let header = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
            serde_json::from_slice::<Value>(&data[8..8 + header]).unwrap()
        })
        .find(|m| m.get(name).is_some())
        .expect("the long tensor is written");
    assert_eq!(meta[name]["dtype"], "F32", "plain F32 stays F32");
    assert_eq!(meta[name]["shape"][0], len);
}
