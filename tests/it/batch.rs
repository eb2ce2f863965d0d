//! Batch jobs: a conversion split into parts that merge into the one-machine output, checksums,
//! the model card, convert-and-prove, and the MTP head where clients look for it.

use crate::common::{escha_convert, fixture};
use crate::synth::read_safetensors;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

fn convert(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let o = escha_convert().arg(input).arg(out).arg("--quiet").args(extra).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// Every file of a directory (not recursive: outputs are flat), name → bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

/// Checks a SHA256SUMS file against the directory it lies in, as `sha256sum -c` does (and with
/// `sha256sum -c` itself where the machine has it).
fn check_sums(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let listed: Vec<&str> = text.lines().map(|l| l.split_once("  ").unwrap().1).collect();
    let mut on_disk: Vec<String> = files(dir).into_keys().filter(|f| f != "SHA256SUMS").collect();
    on_disk.sort();
    assert_eq!(listed, on_disk, "SHA256SUMS lists every file");
    if let Ok(o) =
        std::process::Command::new("sha256sum").arg("-c").arg("--quiet").arg("SHA256SUMS").current_dir(dir).output()
    {
        assert!(o.status.success(), "sha256sum -c: {}", String::from_utf8_lossy(&o.stdout));
    }
}

#[test]
fn parts_merge_into_the_one_machine_output_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    for model in ["dense", "moe"] {
        for format in ["bf16", "mlx"] {
            let args = ["--format", format, "--max-shard-size", "100KB", "--checksums"];
            let one = tmp.path().join(format!("{model}-{format}-one"));
            convert(&fixture(model), &one, &args);
            assert!(
                files(&one).keys().filter(|f| f.ends_with(".safetensors")).count() >= 4,
                "several shards ({model} {format})"
            );
            check_sums(&one);

            let merged = tmp.path().join(format!("{model}-{format}-merged"));
            std::fs::create_dir(&merged).unwrap();
            let mut sums = Vec::new();
            for i in 1..=3 {
                let part = tmp.path().join(format!("{model}-{format}-part{i}"));
                let o =
                    convert(&fixture(model), &part, &[&args[..], &["--part", &format!("{i}/3"), "--json"]].concat());
                let report: Value = serde_json::from_slice(&o.stdout).unwrap();
                assert_eq!(report["part"], format!("{i}/3"));
                let reported: Vec<&str> =
                    report["files"].as_array().unwrap().iter().map(|f| f["file"].as_str().unwrap()).collect();
                let mut written: Vec<String> = files(&part).into_keys().collect();
                written.sort();
                let mut reported_sorted: Vec<String> = reported.iter().map(|s| (*s).to_string()).collect();
                reported_sorted.sort();
                assert_eq!(reported_sorted, written, "a part reports exactly its files");
                for (name, bytes) in files(&part) {
                    if name.starts_with("SHA256SUMS.part-") {
                        sums.push(String::from_utf8(bytes).unwrap());
                    } else {
                        std::fs::write(merged.join(name), bytes).unwrap();
                    }
                }
            }
            // The merge step: the parts' sums, sorted by file name, each line once.
            let mut lines: Vec<String> = sums.iter().flat_map(|s| s.lines().map(String::from)).collect();
            lines.sort_by(|a, b| a.split_once("  ").unwrap().1.cmp(b.split_once("  ").unwrap().1));
            lines.dedup();
            std::fs::write(merged.join("SHA256SUMS"), lines.join("\n") + "\n").unwrap();
            check_sums(&merged);
            assert!(
                files(&one) == files(&merged),
                "{model} {format}: the merged parts differ from the one-machine run"
            );
        }
    }
}

#[test]
fn the_model_card_names_no_path_and_says_how_it_was_made() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    convert(&fixture("moe"), &out, &["--format", "mlx", "--bits", "3"]);
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    assert!(!card.contains(root) && !card.contains(&tmp.path().display().to_string()), "{card}");
    assert!(card.starts_with("---\nlibrary_name: mlx\n"), "{card}");
    for needle in [
        "`escha-convert moe OUT --format mlx --bits 3 --group-size 64 --int8 exact",
        "\"mlx\"",
        "3-bit",
        "mlx_lm import load",
    ] {
        assert!(card.contains(needle), "{needle}: {card}");
    }
    // --only globs are quoted so that the line runs as written in a POSIX shell.
    let out = tmp.path().join("only");
    convert(&fixture("moe"), &out, &["--only", "*", "--only", "it's*"]);
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(card.contains(r"--only '*' --only 'it'\''s*'"), "{card}");
    let out = tmp.path().join("none");
    convert(&fixture("moe"), &out, &["--no-card"]);
    assert!(!out.join("README.md").exists());
}

#[test]
fn convert_and_prove_in_one_step() {
    let tmp = tempfile::tempdir().unwrap();
    for (model, base) in [("dense", "dense-base-fp8"), ("moe", "moe-base")] {
        let out = tmp.path().join(model);
        let o = convert(&fixture(model), &out, &["--verify-base", fixture(base).to_str().unwrap(), "--json"]);
        let report: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(report["verify"]["passed"], true, "{model}");
        let card = std::fs::read_to_string(out.join("README.md")).unwrap();
        assert!(card.contains(&format!("| verified | PASS against `{base}`")), "{card}");
    }
    // A planted error: the dense fixture's down projections checked against the MoE base, whose
    // experts are not them; nothing is left behind.
    let bad = tmp.path().join("bad");
    let o = escha_convert()
        .arg(fixture("dense"))
        .arg(&bad)
        .args(["--quiet", "--verify-full", "--verify-base"])
        .arg(fixture("moe-base"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--verify-base: FAIL"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2, "no OUT, no staging");
}

#[test]
fn a_swapped_scale_vector_fails_the_proof() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir(&input).unwrap();
    for e in std::fs::read_dir(fixture("moe")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, input.join(p.file_name().unwrap())).unwrap();
    }
    // Reverse the bytes of one expert down-projection's rout: a decode that is wrong everywhere.
    let shard = input.join("model-00001-of-00001.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let name = "model.language_model.layers.2.mlp.experts.down_proj.escha_rout";
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let [a, b] = [0, 1].map(|i| header[name]["data_offsets"][i].as_u64().unwrap() as usize + 8 + header_len);
    bytes[a..b].reverse();
    std::fs::write(&shard, bytes).unwrap();
    let out = tmp.path().join("out");
    let o = escha_convert()
        .arg(&input)
        .arg(&out)
        .arg("--quiet")
        .arg("--verify-base")
        .arg(fixture("moe-base"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("layers.2.mlp.experts.down_proj"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!out.exists());
}

#[test]
fn the_mtp_head_goes_into_the_main_shards_when_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let config =
        |out: &Path| -> Value { serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap() };
    let tensors = |out: &Path| -> Vec<String> {
        let mut all = Vec::new();
        for (name, _) in files(out) {
            if name.ends_with(".safetensors") {
                all.extend(read_safetensors(&out.join(name)).into_keys());
            }
        }
        all
    };
    // The 27B-style head (a separate mtp/ directory) is complete: kept, inline.
    let dense = tmp.path().join("dense");
    convert(&fixture("dense"), &dense, &[]);
    assert!(!dense.join("mtp").exists());
    let mtp: Vec<String> = tensors(&dense).into_iter().filter(|n| n.starts_with("mtp.")).collect();
    assert_eq!(mtp.len(), 15, "{mtp:?}");
    assert!(mtp.contains(&"mtp.layers.0.self_attn.q_proj.weight".to_string()));
    assert_eq!(config(&dense)["text_config"]["mtp_num_hidden_layers"], 1);
    // --mtp drop: no head, and the config says so.
    let dropped = tmp.path().join("dropped");
    convert(&fixture("dense"), &dropped, &["--mtp", "drop"]);
    assert!(!tensors(&dropped).iter().any(|n| n.starts_with("mtp.")));
    assert_eq!(config(&dropped)["text_config"]["mtp_num_hidden_layers"], 0);
    // The 35B-style inline head has no routed experts: dropped by default, with a warning.
    let moe = tmp.path().join("moe");
    let o = escha_convert().arg(fixture("moe")).arg(&moe).arg("--json").output().unwrap();
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let warnings = report["warnings"].to_string();
    assert!(warnings.contains("dropped the MTP head") && warnings.contains("routed experts"), "{warnings}");
    assert!(!tensors(&moe).iter().any(|n| n.starts_with("mtp.")));
    assert_eq!(config(&moe)["text_config"]["mtp_num_hidden_layers"], 0);
    // --mtp keep writes it anyway, and says it is incomplete.
    let kept = tmp.path().join("kept");
    let o = escha_convert().arg(fixture("moe")).arg(&kept).args(["--mtp", "keep", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["warnings"].to_string().contains("kept an incomplete MTP head"));
    assert!(tensors(&kept).iter().any(|n| n == "mtp.layers.0.mlp.gate.weight"));
}
