//! What is read from IN when links are involved: every step of a link must stay inside IN or go
//! directly into a Hub snapshot's real `blobs/`, and a single file given as IN or BASE follows the
//! same rule (a Hub snapshot's files are all links). Also the config's claims that once drove
//! loops.

use crate::common::{escha_convert, fixture, stderr};
use crate::synth::*;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    escha_convert().args(args.iter().map(AsRef::as_ref)).output().unwrap()
}

/// A Hub cache repository `models--org--name` in `root` whose snapshot `rev` links every file of
/// `staged` to a blob; returns (repository, snapshot).
fn hub_snapshot(root: &Path, staged: &Path) -> (PathBuf, PathBuf) {
    let repo = root.join("models--org--name");
    let (blobs, snapshot) = (repo.join("blobs"), repo.join("snapshots").join("rev"));
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    for (i, e) in std::fs::read_dir(staged).unwrap().enumerate() {
        let p = e.unwrap().path();
        let blob = blobs.join(format!("{i:040x}"));
        std::fs::copy(&p, &blob).unwrap();
        let link = PathBuf::from("../../blobs").join(blob.file_name().unwrap());
        std::os::unix::fs::symlink(link, snapshot.join(p.file_name().unwrap())).unwrap();
    }
    (repo, snapshot)
}

#[test]
fn a_snapshot_whose_blobs_is_a_link_cannot_reach_the_rest_of_the_machine() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("models--e--m");
    let snapshot = repo.join("snapshots").join("r");
    write_checkpoint(&snapshot, &small_checkpoint(3));
    std::os::unix::fs::symlink("/", repo.join("blobs")).unwrap();
    std::os::unix::fs::symlink("../../blobs/etc/passwd", snapshot.join("tokenizer.json")).unwrap();
    let out = tmp.path().join("out");
    let o = run(&[&snapshot, &out, &"--quiet"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("tokenizer.json") && err.contains("blobs is a link"), "{err}");
    assert!(!out.exists());
}

#[test]
fn every_step_of_a_link_must_stay_inside() {
    let tmp = tempfile::tempdir().unwrap();
    let staged = write_checkpoint(&tmp.path().join("staged"), &small_checkpoint(4));
    std::fs::write(staged.join("tokenizer.json"), "{}").unwrap();
    let (repo, snapshot) = hub_snapshot(tmp.path(), &staged);
    // A blob reached through a directory below blobs/ is not a blob.
    std::fs::create_dir(repo.join("blobs").join("sub")).unwrap();
    std::fs::write(repo.join("blobs/sub/secret"), "not a blob").unwrap();
    std::fs::remove_file(snapshot.join("tokenizer.json")).unwrap();
    std::os::unix::fs::symlink("../../blobs/sub/secret", snapshot.join("tokenizer.json")).unwrap();
    let o = run(&[&snapshot, &tmp.path().join("out1"), &"--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("outside the checkpoint"), "{}", stderr(&o));
    // A link that leaves IN and comes back is refused at the step that leaves.
    let input = write_checkpoint(&tmp.path().join("in"), &small_checkpoint(4));
    std::fs::write(input.join("real.json"), "{}").unwrap();
    let hop = tmp.path().join("hop.json");
    std::os::unix::fs::symlink(input.join("real.json"), &hop).unwrap();
    std::os::unix::fs::symlink(&hop, input.join("tokenizer.json")).unwrap();
    let o = run(&[&input, &tmp.path().join("out2"), &"--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains(&hop.display().to_string()), "{}", stderr(&o));
}

#[test]
fn a_single_file_in_or_base_that_is_a_snapshot_link_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let staged = write_checkpoint(&tmp.path().join("staged"), &small_checkpoint(5));
    let (_, snapshot) = hub_snapshot(&tmp.path().join("cache"), &staged);
    let file = snapshot.join("model.safetensors");
    assert!(std::fs::symlink_metadata(&file).unwrap().file_type().is_symlink());
    let out = tmp.path().join("out");
    let o = run(&[&file, &out, &"--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join("model-00001-of-00001.safetensors").is_file());

    let base_dir = tmp.path().join("base-staged");
    std::fs::create_dir(&base_dir).unwrap();
    std::fs::copy(fixture("dense-base/model.safetensors"), base_dir.join("model.safetensors")).unwrap();
    let (_, base_snapshot) = hub_snapshot(&tmp.path().join("base-cache"), &base_dir);
    let base = base_snapshot.join("model.safetensors");
    let o = escha_convert().arg("verify").arg(fixture("dense")).arg("--base").arg(&base).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // A single file elsewhere is read only through links that stay in its own directory.
    let outside = tmp.path().join("elsewhere.safetensors");
    std::fs::copy(staged.join("model.safetensors"), &outside).unwrap();
    let dir = tmp.path().join("single");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("model.safetensors")).unwrap();
    let o = run(&[&dir.join("model.safetensors"), &tmp.path().join("out3"), &"--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("outside the checkpoint"), "{}", stderr(&o));
}

/// Runs `cmd` and fails the test if it has not finished within a minute (a hang, not a timing).
fn finishes(mut cmd: std::process::Command) -> Output {
    let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("still running after a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_huge_mtp_layer_count_is_a_claim_not_a_loop_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let mut tensors = small_checkpoint(6);
    tensors.push(T::f16("mtp.fc.weight", &[256, 512], &vec![0.0; 256 * 512]));
    let input = write_checkpoint(&tmp.path().join("in"), &tensors);
    let mut config = config_json();
    config["text_config"]["mtp_num_hidden_layers"] = serde_json::json!(1_000_000_000_000_000u64);
    std::fs::write(input.join("config.json"), config.to_string()).unwrap();
    for args in [
        vec!["convert", "--mtp", "drop", "--quiet"],
        vec!["convert", "--dry-run"],
        vec!["convert", "--quiet"],
        vec!["inspect"],
    ] {
        let mut cmd = escha_convert();
        cmd.arg(args[0]).arg(&input);
        if args[0] == "convert" {
            cmd.arg(tmp.path().join(format!("out-{}", args.len())));
        }
        let o = finishes({
            cmd.args(&args[1..]);
            cmd
        });
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    }
    let o = run(&[&input, &tmp.path().join("warned"), &"--mtp", &"keep", &"--json"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["warnings"][0]["code"], "mtp_incomplete_kept", "{report}");
    assert!(report["warnings"][0]["message"].as_str().unwrap().contains("kept an incomplete MTP head"), "{report}");
}
