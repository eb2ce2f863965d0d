//! Hub ids (`org/name`, `org/name@REVISION`) read from a local Hugging Face cache, offline: a
//! cache built here with `huggingface_hub`'s layout (blobs named by their hash, snapshot files as
//! relative links into `../../blobs/`, refs naming commits), found through `HF_HUB_CACHE`,
//! `HF_HOME` or the home directory set on the child process only.

use crate::common::{escha_convert, fixture, snapshot};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const C1: &str = "1111111111111111111111111111111111111111";
const C2: &str = "2222222222222222222222222222222222222222";
const C3: &str = "3333333333333333333333333333333333333333";

/// Environment variables set on a child process.
type Vars<'a> = &'a [(&'a str, &'a Path)];

/// Which cache a child process finds: every variable `huggingface_hub` reads is cleared, then
/// `vars` set.
fn cmd(vars: Vars) -> Command {
    let mut c = escha_convert();
    for k in ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"] {
        c.env_remove(k);
    }
    c.env("HOME", "/nonexistent-home");
    for (k, v) in vars {
        c.env(k, v);
    }
    c
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// Puts the files of `from` (subdirectories included) into the cache `cache` as snapshot `commit`
/// of `repo`: each file a blob named by its SHA-256, linked relatively from the snapshot. Returns
/// the snapshot.
fn add_snapshot(cache: &Path, repo: &str, commit: &str, from: &Path) -> PathBuf {
    let repo_dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snapshot = repo_dir.join("snapshots").join(commit);
    std::fs::create_dir_all(repo_dir.join("blobs")).unwrap();
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    link_tree(&repo_dir.join("blobs"), from, &snapshot, 0);
    snapshot
}

fn link_tree(blobs: &Path, from: &Path, to: &Path, depth: usize) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap();
        if p.is_dir() {
            link_tree(blobs, &p, &to.join(name), depth + 1);
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let blob = Sha256::digest(&bytes).iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
        std::fs::write(blobs.join(&blob), bytes).unwrap();
        // snapshots/<commit>/[sub/…]name → ../../[../…]blobs/<sha>
        let up = "../".repeat(depth + 2);
        std::os::unix::fs::symlink(format!("{up}blobs/{blob}"), to.join(name)).unwrap();
    }
}

/// Points `refs/<name>` of `repo` at `commit`.
fn set_ref(cache: &Path, repo: &str, name: &str, commit: &str) {
    let refs = cache.join(format!("models--{}", repo.replace('/', "--"))).join("refs");
    let path = refs.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, commit).unwrap();
}

/// A cache holding the dense fixture as `org/name`, commit C1 on `main`.
fn dense_cache(cache: &Path) -> PathBuf {
    let snap = add_snapshot(cache, "org/name", C1, &fixture("dense"));
    set_ref(cache, "org/name", "main", C1);
    snap
}

/// A dry run of `arg` (no decode, nothing written): its JSON report.
fn dry_run(c: &mut Command, arg: &str, tmp: &Path) -> Output {
    c.args(["convert", arg]).arg(tmp.join("never-written")).args(["--dry-run", "--json"]).output().unwrap()
}

#[test]
fn hub_ids_are_found_in_each_cache_location_in_huggingface_hubs_order() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let hf_home = tmp.path().join("hf-home");
    let hub_cache = tmp.path().join("hub-cache");
    for (cache, commit) in
        [(home.join(".cache/huggingface/hub"), C1), (hf_home.join("hub"), C2), (hub_cache.clone(), C3)]
    {
        add_snapshot(&cache, "org/name", commit, &fixture("dense"));
        set_ref(&cache, "org/name", "main", commit);
    }
    let cases: [(Vars, &str, PathBuf); 3] = [
        (&[("HOME", &home)], C1, home.join(".cache/huggingface/hub")),
        (&[("HOME", &home), ("HF_HOME", &hf_home)], C2, hf_home.join("hub")),
        (&[("HOME", &home), ("HF_HOME", &hf_home), ("HF_HUB_CACHE", &hub_cache)], C3, hub_cache.clone()),
    ];
    for (vars, commit, cache) in cases {
        let r = json(&dry_run(&mut cmd(vars), "org/name", tmp.path()));
        assert_eq!(r["hub"], serde_json::json!({"id": "org/name", "revision": null, "commit": commit}), "{vars:?}");
        let snap = cache.join("models--org--name/snapshots").join(commit);
        assert_eq!(r["input"], snap.display().to_string(), "{vars:?}");
        assert_eq!(r["tensors"].as_array().unwrap().len(), dry_run_of_path(tmp.path()), "{vars:?}");
    }
    // inspect finds it too, and says which id and commit it read.
    let o = cmd(&[("HF_HUB_CACHE", &hub_cache)]).args(["inspect", "org/name", "--json"]).output().unwrap();
    let r = json(&o);
    assert_eq!((r["hub"]["id"].as_str(), r["hub"]["commit"].as_str()), (Some("org/name"), Some(C3)));
    let o = cmd(&[("HF_HUB_CACHE", &hub_cache)]).args(["inspect", "org/name"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).starts_with(&format!("org/name@{C3} (")), "{}", stderr(&o));
}

/// The number of output tensors a dry run of the dense fixture by its path plans.
fn dry_run_of_path(tmp: &Path) -> usize {
    let o = dry_run(&mut cmd(&[]), fixture("dense").to_str().unwrap(), tmp);
    json(&o)["tensors"].as_array().unwrap().len()
}

#[test]
fn a_revision_is_a_branch_a_tag_or_a_full_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    add_snapshot(&cache, "org/name", C2, &fixture("dense"));
    set_ref(&cache, "org/name", "dev", C2);
    set_ref(&cache, "org/name", "refs/pr/1", C2);
    let snaps = cache.join("models--org--name/snapshots");
    for (arg, revision, commit) in [
        ("org/name".to_string(), Value::Null, C1),
        ("org/name@main".to_string(), "main".into(), C1),
        ("org/name@dev".to_string(), "dev".into(), C2),
        ("org/name@refs/pr/1".to_string(), "refs/pr/1".into(), C2),
        (format!("org/name@{C2}"), C2.into(), C2),
        (format!("org/name@{C1}"), C1.into(), C1),
    ] {
        let r = json(&dry_run(&mut cmd(&[("HF_HUB_CACHE", &cache)]), &arg, tmp.path()));
        assert_eq!(r["hub"], serde_json::json!({"id": "org/name", "revision": revision, "commit": commit}), "{arg}");
        assert_eq!(r["input"], snaps.join(commit).display().to_string(), "{arg}");
    }
}

#[test]
fn what_the_cache_does_not_hold_exits_1_with_the_hf_download_command() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    let out = tmp.path().join("out");
    let gone = "ffffffffffffffffffffffffffffffffffffffff";
    set_ref(&cache, "org/name", "stale", gone);
    for (arg, says) in [
        ("org/other".to_string(), "`hf download org/other`".to_string()),
        ("org/other@v1".to_string(), "`hf download org/other --revision v1`".to_string()),
        ("org/name@v9".to_string(), "`hf download org/name --revision v9`".to_string()),
        ("org/name@stale".to_string(), "`hf download org/name --revision stale`".to_string()),
        (format!("org/name@{C2}"), format!("`hf download org/name --revision {C2}`")),
    ] {
        let o = cmd(&[("HF_HUB_CACHE", &cache)]).arg(&arg).arg(&out).arg("--quiet").output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{arg}: {err}");
        assert!(err.contains(&says) && err.contains("nothing is downloaded"), "{arg}: {err}");
        assert!(err.contains(&cache.display().to_string()) && !err.contains("huggingface-cli"), "{arg}: {err}");
        assert!(!out.exists(), "{arg}");
    }
    // A missing main branch is the default revision missing.
    std::fs::remove_file(cache.join("models--org--name/refs/main")).unwrap();
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).arg("org/name").arg(&out).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no refs/main") && stderr(&o).contains("`hf download org/name`"), "{}", stderr(&o));
    // inspect and --verify-base say the same and exit 1; verify could check nothing: 2.
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).args(["inspect", "org/other"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("`hf download org/other`"), "{}", stderr(&o));
    let o = cmd(&[("HF_HUB_CACHE", &cache)])
        .arg(fixture("dense"))
        .arg(&out)
        .args(["--verify-base", "org/base"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("`hf download org/base`"), "{}", stderr(&o));
    for args in [["verify", "org/other", "--base"].as_slice(), ["verify", "--base", "org/other"].as_slice()] {
        let o = cmd(&[("HF_HUB_CACHE", &cache)]).args(args).arg(fixture("dense-base")).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("`hf download org/other`"), "{}", stderr(&o));
    }
    // No cache to look in at all.
    let o = cmd(&[]).env_remove("HOME").arg("org/name").arg(&out).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("HF_HUB_CACHE") && stderr(&o).contains("`hf download org/name`"), "{}", stderr(&o));
    assert!(!out.exists());
}

#[test]
fn an_existing_local_path_wins_over_a_hub_id() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    crate::common::copy_tree(&fixture("dense"), &tmp.path().join("org/name"));
    let o = cmd(&[("HF_HUB_CACHE", &cache)])
        .current_dir(tmp.path())
        .args(["convert", "org/name", "out", "--dry-run", "--json"])
        .output()
        .unwrap();
    let r = json(&o);
    assert_eq!((r["input"].as_str(), &r["hub"]), (Some("org/name"), &Value::Null));
    // A string that is not of the id grammar is a path, reported as one.
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).args(["org/name/", "out"]).current_dir(&cache).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot read input") && !stderr(&o).contains("hf download"), "{}", stderr(&o));
}

#[test]
fn a_snapshot_that_links_outside_its_blobs_is_still_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let snap = dense_cache(&cache);
    std::fs::write(tmp.path().join("outside.json"), "{}").unwrap();
    std::fs::remove_file(snap.join("tokenizer.json")).unwrap();
    std::os::unix::fs::symlink("../../../../outside.json", snap.join("tokenizer.json")).unwrap();
    let out = tmp.path().join("out");
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).args(["org/name"]).arg(&out).arg("--quiet").output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("tokenizer.json") && stderr(&o).contains("outside the checkpoint"), "{}", stderr(&o));
    assert!(!out.exists());
    // A blobs/ that is a link is never trusted, through an id as through a path.
    let repo = cache.join("models--org--name");
    std::fs::rename(repo.join("blobs"), tmp.path().join("real-blobs")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("real-blobs"), repo.join("blobs")).unwrap();
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).args(["org/name"]).arg(&out).arg("--quiet").output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("blobs is a link"), "{}", stderr(&o));
}

#[test]
fn a_snapshot_without_config_json_is_refused_by_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let snap = dense_cache(&cache);
    std::fs::remove_file(snap.join("config.json")).unwrap();
    for format in ["bf16", "mlx", "gguf", "exl3"] {
        let out = tmp.path().join(format!("out-{format}"));
        let o =
            cmd(&[("HF_HUB_CACHE", &cache)]).args(["org/name"]).arg(&out).args(["--format", format]).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{format}: {}", stderr(&o));
        assert!(stderr(&o).contains("config.json") && stderr(&o).contains("missing"), "{format}: {}", stderr(&o));
        assert!(!out.exists(), "{format}");
    }
}

/// The model card's command, as written in its table row.
fn card_command(card: &str) -> String {
    let row = card.lines().find(|l| l.starts_with("| command |")).unwrap();
    row.split('`').nth(1).unwrap().to_string()
}

#[test]
fn a_conversion_by_id_writes_the_bytes_of_one_by_path_and_names_the_id_and_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    let (by_id, by_path, again) = (tmp.path().join("by-id"), tmp.path().join("by-path"), tmp.path().join("again"));
    let r = json(&cmd(&[("HF_HUB_CACHE", &cache)]).arg("org/name").arg(&by_id).arg("--json").output().unwrap());
    assert_eq!(r["hub"], serde_json::json!({"id": "org/name", "revision": null, "commit": C1}));
    let o = cmd(&[]).arg(fixture("dense")).arg(&by_path).arg("--quiet").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let files = |dir: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        snapshot(dir)
            .into_iter()
            .filter(|(p, _)| p.file_name().unwrap() != "README.md")
            .map(|(p, b)| (p.strip_prefix(dir).unwrap().to_path_buf(), b))
            .collect()
    };
    let tensors = files(&by_id);
    assert!(tensors.iter().any(|(p, _)| p.to_string_lossy().ends_with(".safetensors")));
    assert!(tensors == files(&by_path), "a conversion by id differs from one by path");

    let card = std::fs::read_to_string(by_id.join("README.md")).unwrap();
    assert!(card.contains("# org/name (") && card.contains(&format!("`org/name` at revision `{C1}`")), "{card}");
    let command = card_command(&card);
    assert!(command.starts_with(&format!("escha-convert org/name@{C1} OUT ")), "{command}");
    assert!(!command.contains("snapshots") && !card.contains(&cache.display().to_string()), "{card}");
    // The card's command runs, and makes the same output again.
    let words: Vec<String> = command.split_whitespace().skip(1).map(String::from).collect();
    let mut c = cmd(&[("HF_HUB_CACHE", &cache)]);
    for w in &words {
        if w == "OUT" {
            c.arg(&again);
        } else {
            c.arg(w);
        }
    }
    let o = c.arg("--quiet").output().unwrap();
    assert!(o.status.success(), "{command}: {}", stderr(&o));
    assert!(snapshot(&again).into_iter().map(|(_, b)| b).eq(snapshot(&by_id).into_iter().map(|(_, b)| b)));
}

#[test]
fn verify_and_verify_base_take_hub_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    add_snapshot(&cache, "org/base", C2, &fixture("dense-base"));
    set_ref(&cache, "org/base", "main", C2);
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).args(["verify", "org/name", "--base", "org/base", "--json"]).output();
    let r = json(&o.unwrap());
    assert_eq!(r["passed"], true);
    assert_eq!((r["input_hub"]["commit"].as_str(), r["base_hub"]["id"].as_str()), (Some(C1), Some("org/base")));
    assert_eq!(r["base_hub"]["commit"].as_str(), Some(C2));

    let out = tmp.path().join("out");
    let o = cmd(&[("HF_HUB_CACHE", &cache)])
        .args(["org/name@main"])
        .arg(&out)
        .args(["--verify-base", "org/base", "--verify-sample", "1", "--json"])
        .output()
        .unwrap();
    let r = json(&o);
    assert_eq!(r["hub"]["revision"], "main");
    assert_eq!(r["verify"]["hub"], serde_json::json!({"id": "org/base", "revision": null, "commit": C2}));
    assert_eq!(r["verify"]["base"], "org/base");
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    let command = card_command(&card);
    assert!(command.starts_with(&format!("escha-convert org/name@{C1} OUT ")), "{command}");
    assert!(command.contains(&format!("--verify-base org/base@{C2} --verify-sample 1")), "{command}");
}
