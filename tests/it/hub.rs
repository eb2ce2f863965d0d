//! Hub ids (`org/name`, `org/name@REVISION`) read from a local Hugging Face cache, offline: a
//! cache built here with `huggingface_hub`'s layout (blobs named by their hash, snapshot files as
//! relative links into `../../blobs/`, refs naming commits), found through `HF_HUB_CACHE`,
//! `HF_HOME` or the home directory set on the child process only.

use crate::common::{escha_convert, fixture, snapshot, stderr};
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
    assert!(
        stderr(&o).contains("org/name/: no such file or directory") && !stderr(&o).contains("hf download"),
        "{}",
        stderr(&o)
    );
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

/// What every refused case must print: a secret kept in files outside the cache.
const SECRET: &str = "SECRET-OUTSIDE-THE-CACHE";

/// Runs `arg` as IN of convert (with `--json`), as IN of `inspect --json`, as BASE of `verify
/// --json` and of convert's `--verify-base`: each is refused with the class `input_refused`, a
/// message holding `says`, exit 1 (verify: 2, a run that could check nothing), nothing written, no
/// byte of the secret and no line longer than a short quote.
fn assert_refused(cache: &Path, arg: &str, says: &str, tmp: &Path) {
    let out = tmp.join("out");
    let runs: [(&str, Vec<std::ffi::OsString>, i32); 4] = [
        ("convert", vec![arg.into(), out.clone().into(), "--json".into()], 1),
        ("inspect", vec!["inspect".into(), arg.into(), "--json".into()], 1),
        (
            "verify --base",
            vec!["verify".into(), fixture("dense").into(), "--base".into(), arg.into(), "--json".into()],
            2,
        ),
        (
            "--verify-base",
            vec![fixture("dense").into(), out.clone().into(), "--verify-base".into(), arg.into(), "--json".into()],
            1,
        ),
    ];
    for (what, args, code) in runs {
        let o = cmd(&[("HF_HUB_CACHE", cache)]).args(&args).output().unwrap();
        let (err, stdout) = (stderr(&o), String::from_utf8_lossy(&o.stdout).into_owned());
        assert_eq!(o.status.code(), Some(code), "{what} {arg}: {err}");
        assert!(err.contains(says), "{what} {arg}: {err}");
        assert!(!err.contains(SECRET) && !stdout.contains(SECRET), "{what} {arg} printed the outside file: {err}");
        assert!(err.lines().all(|l| l.len() < 2000), "{what} {arg}: a line of {} bytes", err.len());
        let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{what} {arg}: {e}: {stdout}"));
        assert_eq!(doc["error"]["code"], "input_refused", "{what} {arg}: {doc}");
        assert_eq!(doc["error"]["exit_status"], code, "{what} {arg}: {doc}");
        assert!(!out.exists(), "{what} {arg} wrote OUT");
    }
}

/// A directory outside the cache holding a file `passwd` of the secret (and `main`, naming C1).
fn outside_dir(tmp: &Path) -> PathBuf {
    let dir = tmp.join("outside");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("passwd"), format!("root:x:0:0:{SECRET}:/root:/bin/sh\n")).unwrap();
    std::fs::write(dir.join("main"), C1).unwrap();
    dir
}

#[test]
fn links_in_refs_never_lead_out_of_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    let outside = outside_dir(tmp.path());
    let refs = cache.join("models--org--name/refs");
    // A ref that is a directory link: a revision with a `/` reads a file in it.
    std::os::unix::fs::symlink(&outside, refs.join("x")).unwrap();
    assert_refused(&cache, "org/name@x/passwd", "refs/x: a link", tmp.path());
    assert_refused(&cache, "org/name@x/main", "refs/x: a link", tmp.path());
    // A ref that is a link to a file outside, whatever that file holds.
    std::os::unix::fs::symlink(outside.join("passwd"), refs.join("secret")).unwrap();
    assert_refused(&cache, "org/name@secret", "refs/secret: a link", tmp.path());
    std::os::unix::fs::symlink(outside.join("main"), refs.join("commit")).unwrap();
    assert_refused(&cache, "org/name@commit", "refs/commit: a link", tmp.path());
    // A link to another ref of the same repository is not how huggingface_hub writes refs either.
    std::os::unix::fs::symlink("main", refs.join("alias")).unwrap();
    assert_refused(&cache, "org/name@alias", "refs/alias: a link", tmp.path());
    // A directory on the way to a ref that is a link.
    std::fs::create_dir_all(refs.join("refs")).unwrap();
    std::os::unix::fs::symlink(&outside, refs.join("refs/pr")).unwrap();
    assert_refused(&cache, "org/name@refs/pr/main", "refs/refs/pr: a link", tmp.path());
}

#[test]
fn a_ref_of_junk_is_quoted_by_a_short_escaped_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    let refs = cache.join("models--org--name/refs");
    std::fs::write(refs.join("huge"), "junk-of-a-ref\n".repeat(300_000)).unwrap();
    assert_refused(&cache, "org/name@huge", "more than 256 bytes, not a ref", tmp.path());
    std::fs::write(refs.join("junk"), "not a commit\n\u{1b}[2J FORGED LINE, and then text past the quote").unwrap();
    assert_refused(&cache, "org/name@junk", "names no commit", tmp.path());
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).arg("org/name@junk").arg(tmp.path().join("out")).output().unwrap();
    let err = stderr(&o);
    assert!(
        err.contains(r#": "not a commit\n\u{1b}[2J FORGED LINE, and then text pas"…"#) && err.lines().count() == 1,
        "{err}"
    );
    // A ref is never opened as anything but a regular file.
    std::fs::create_dir(refs.join("dir")).unwrap();
    assert_refused(&cache, "org/name@dir", "refs/dir: a directory is not a regular file", tmp.path());
}

#[test]
fn a_revision_with_dot_dot_an_absolute_path_or_an_empty_step_is_refused_as_a_revision() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    let outside = outside_dir(tmp.path());
    let absolute = format!("org/name@{}", outside.join("passwd").display());
    let climbing = format!("org/name@../../../{}", outside.file_name().unwrap().to_str().unwrap());
    for arg in [absolute.as_str(), &climbing, "org/name@main/../main", "org/name@a..b", "org/name@a//b", "org/name@"] {
        assert_refused(&cache, arg, "is not a revision a Hub id can name", tmp.path());
    }
    let long = format!("org/name@{}", "a".repeat(300));
    assert_refused(&cache, &long, "is not a revision a Hub id can name", tmp.path());
}

#[test]
fn a_linked_snapshot_is_refused_not_converted_under_the_ids_name() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    let snaps = cache.join("models--org--name/snapshots");
    // A snapshot that is a link to a checkpoint outside the cache.
    crate::common::copy_tree(&fixture("dense"), &tmp.path().join("elsewhere"));
    std::os::unix::fs::symlink(tmp.path().join("elsewhere"), snaps.join(C2)).unwrap();
    set_ref(&cache, "org/name", "dev", C2);
    assert_refused(&cache, "org/name@dev", &format!("snapshots/{C2}: a link"), tmp.path());
    assert_refused(&cache, &format!("org/name@{C2}"), &format!("snapshots/{C2}: a link"), tmp.path());
    // A snapshot that is a link to another repository's snapshot.
    add_snapshot(&cache, "org/other", C3, &fixture("dense"));
    std::os::unix::fs::symlink(format!("../../models--org--other/snapshots/{C3}"), snaps.join(C3)).unwrap();
    assert_refused(&cache, &format!("org/name@{C3}"), &format!("snapshots/{C3}: a link"), tmp.path());
    // The same snapshots given by their paths.
    for commit in [C2, C3] {
        let path = snaps.join(commit);
        assert_refused(&cache, path.to_str().unwrap(), &format!("snapshots/{commit}: a link"), tmp.path());
        let o = cmd(&[])
            .current_dir(cache.join("models--org--name"))
            .args(["convert", &format!("snapshots/{commit}"), "--dry-run"])
            .arg(tmp.path().join("out"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(&format!("snapshots/{commit}: a link")), "{}", stderr(&o));
    }
    // The real snapshot beside them still converts, by id and by path.
    json(&dry_run(&mut cmd(&[("HF_HUB_CACHE", &cache)]), "org/name", tmp.path()));
    json(&dry_run(&mut cmd(&[]), snaps.join(C1).to_str().unwrap(), tmp.path()));
}

#[test]
fn linked_refs_snapshots_and_repository_directories_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    let repo = cache.join("models--org--name");
    let moved = tmp.path().join("moved");
    std::fs::create_dir(&moved).unwrap();
    let relink = |name: &str| {
        std::fs::rename(repo.join(name), moved.join(name)).unwrap();
        std::os::unix::fs::symlink(moved.join(name), repo.join(name)).unwrap();
    };
    let restore = |name: &str| {
        std::fs::remove_file(repo.join(name)).unwrap();
        std::fs::rename(moved.join(name), repo.join(name)).unwrap();
    };
    for dir in ["refs", "snapshots"] {
        relink(dir);
        assert_refused(&cache, "org/name", &format!("models--org--name/{dir}: a link"), tmp.path());
        if dir == "snapshots" {
            assert_refused(&cache, &format!("org/name@{C1}"), "snapshots: a link", tmp.path());
            let path = repo.join("snapshots").join(C1);
            assert_refused(&cache, path.to_str().unwrap(), "snapshots: a link", tmp.path());
        }
        restore(dir);
    }
    // The repository directory itself.
    std::fs::rename(&repo, tmp.path().join("repo-elsewhere")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("repo-elsewhere"), &repo).unwrap();
    assert_refused(&cache, "org/name", "models--org--name: a link", tmp.path());
    let path = repo.join("snapshots").join(C1);
    assert_refused(&cache, path.to_str().unwrap(), "models--org--name: a link", tmp.path());
    std::fs::remove_file(&repo).unwrap();
    std::fs::rename(tmp.path().join("repo-elsewhere"), &repo).unwrap();
    json(&dry_run(&mut cmd(&[("HF_HUB_CACHE", &cache)]), "org/name", tmp.path()));
}

#[test]
fn a_cache_that_is_itself_a_link_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("disk/cache");
    dense_cache(&cache);
    let link = tmp.path().join("hub-cache");
    std::os::unix::fs::symlink(&cache, &link).unwrap();
    let r = json(&dry_run(&mut cmd(&[("HF_HUB_CACHE", &link)]), "org/name", tmp.path()));
    assert_eq!(r["hub"]["commit"], C1);
    // Through a linked HF_HOME too, and by a path that passes through the link.
    std::fs::create_dir(tmp.path().join("hf-home")).unwrap();
    std::os::unix::fs::symlink(&cache, tmp.path().join("hf-home/hub")).unwrap();
    let r = json(&dry_run(&mut cmd(&[("HF_HOME", &tmp.path().join("hf-home"))]), "org/name", tmp.path()));
    assert_eq!(r["hub"]["commit"], C1);
    let by_path = link.join("models--org--name/snapshots").join(C1);
    json(&dry_run(&mut cmd(&[]), by_path.to_str().unwrap(), tmp.path()));
}

#[test]
fn in_and_out_the_wrong_way_round_are_called_swapped() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    let model = tmp.path().join("dense");
    crate::common::copy_tree(&fixture("dense"), &model);
    let before = snapshot(&model);
    for new in ["out/new-x", "./out/new-x"] {
        let o =
            cmd(&[("HF_HUB_CACHE", &cache)]).current_dir(tmp.path()).args([new, "dense", "--json"]).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{new}: {err}");
        assert!(err.contains("look swapped") && err.contains(&format!("escha-convert dense {new}")), "{new}: {err}");
        assert!(!err.contains("hf download"), "{new}: {err}");
        let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(doc["error"]["code"], "input_refused");
    }
    assert!(snapshot(&model) == before && !tmp.path().join("out").exists());
    // An earlier output of this tool as OUT, or a missing OUT, is no sign of a swap.
    let converted = tmp.path().join("converted");
    let o = cmd(&[]).arg(&model).arg(&converted).arg("--quiet").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).current_dir(tmp.path()).args(["out/new-x", "converted"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(!stderr(&o).contains("swapped") && stderr(&o).contains("hf download out/new-x"), "{}", stderr(&o));
    // A Hub id the cache holds is an IN that exists.
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).current_dir(tmp.path()).args(["org/name", "dense", "--dry-run"]).output();
    let o = o.unwrap();
    assert!(!stderr(&o).contains("swapped"), "{}", stderr(&o));
}

#[test]
fn an_id_in_the_wrong_case_is_told_the_cached_one() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    add_snapshot(&cache, "EschaTest/Dense-W2", C1, &fixture("dense"));
    set_ref(&cache, "EschaTest/Dense-W2", "main", C1);
    for (arg, pass) in
        [("eschatest/dense-w2", "pass EschaTest/Dense-W2)"), ("ESCHATEST/dense-W2@v1", "pass EschaTest/Dense-W2@v1)")]
    {
        let o = cmd(&[("HF_HUB_CACHE", &cache)]).arg(arg).arg(tmp.path().join("out")).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{arg}: {err}");
        assert!(err.contains("it holds EschaTest/Dense-W2") && err.contains(pass), "{arg}: {err}");
        let o = cmd(&[("HF_HUB_CACHE", &cache)]).args(["inspect", arg]).output().unwrap();
        assert!(stderr(&o).contains(pass), "{arg}: {}", stderr(&o));
    }
    // The id as cached reads it; another id gets no hint.
    json(&dry_run(&mut cmd(&[("HF_HUB_CACHE", &cache)]), "EschaTest/Dense-W2", tmp.path()));
    let o = cmd(&[("HF_HUB_CACHE", &cache)]).arg("eschatest/other").arg(tmp.path().join("out")).output().unwrap();
    assert!(!stderr(&o).contains("it holds"), "{}", stderr(&o));
}

/// Runs the short form `escha-convert ARGS… out` in `dir` with the cache `cache`: exit 1, its
/// stderr.
fn refused_in(dir: &Path, cache: &Path, args: &[&str]) -> String {
    let o = cmd(&[("HF_HUB_CACHE", cache)]).current_dir(dir).args(args).arg("out").output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert!(!dir.join("out").exists(), "{args:?}");
    err
}

#[test]
fn a_missing_in_is_said_to_be_missing_first_and_a_download_offered_only_for_a_hub_id() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    dense_cache(&cache);
    add_snapshot(&cache, "Escha/Escha-W2-27B", C2, &fixture("dense"));
    let work = tmp.path().join("work");
    crate::common::copy_tree(&fixture("dense"), &work.join("fixtures/dense"));
    let never = ["unrecognized subcommand", "unexpected argument", "inspect", "hf download"];
    // A bare word (the README's forms, with and without flags), a typo of a local directory, a
    // missing step under a local directory: no such file, the close names, no download.
    for (args, says) in [
        (
            &["Escha-W2-27B"][..],
            "Escha-W2-27B: no such file or directory; the Hugging Face cache holds Escha/Escha-W2-27B",
        ),
        (
            &["-q", "Escha-W2-27B"],
            "Escha-W2-27B: no such file or directory; the Hugging Face cache holds Escha/Escha-W2-27B",
        ),
        (&["fixtures/dnse"], "fixtures/dnse: no such file or directory; did you mean fixtures/dense?"),
        (&["Fixtures/Dense"], "Fixtures/Dense: no such file or directory, nor a Hub id the Hugging Face cache"),
        (&["fixtures/dense/x"], "fixtures/dense/x: no such file or directory"),
    ] {
        let err = refused_in(&work, &cache, args);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(never.iter().all(|w| !err.contains(w)), "{args:?}: {err}");
    }
    let err = refused_in(&work, &cache, &["Fixtures/Dense"]);
    assert!(err.ends_with("did you mean fixtures/dense?\n"), "{err}");
    let err = refused_in(&work.join("fixtures"), &cache, &["dnse"]);
    assert!(err.contains("dnse: no such file or directory; did you mean dense?"), "{err}");
    assert!(never.iter().all(|w| !err.contains(w)), "{err}");
    // A Hub id in the wrong letter case: the id the cache holds, never a download.
    let err = refused_in(&work, &cache, &["ORG/Name"]);
    assert!(err.starts_with("escha-convert: error: ORG/Name: no such file or directory"), "{err}");
    assert!(
        err.contains("it holds org/name, the same id in other letter case") && err.contains("pass org/name"),
        "{err}"
    );
    assert!(!err.contains("download"), "{err}");
    // An id neither on disk nor in the cache, in any case: the download.
    let err = refused_in(&work, &cache, &["org/absent"]);
    assert!(err.contains("org/absent: no such file or directory, and the Hugging Face cache"), "{err}");
    assert!(err.contains("`hf download org/absent`"), "{err}");
    // A typo of a subcommand is still that: clap suggests it.
    let o = cmd(&[]).current_dir(&work).args(["verfy", "x"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("'verify'"), "{}", stderr(&o));
}
