//! Batch jobs: a conversion split into parts that merge into the one-machine output, checksums,
//! the model card, convert-and-prove, and the MTP head where clients look for it.

use crate::common::{copy_tree, escha_convert, fixture, stderr};
use crate::synth::read_safetensors;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

fn convert(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let o = escha_convert().arg(input).arg(out).arg("--quiet").args(extra).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
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
            for i in 1..=3 {
                let part = tmp.path().join(format!("{model}-{format}-part{i}"));
                let o =
                    convert(&fixture(model), &part, &[&args[..], &["--part", &format!("{i}/3"), "--json"]].concat());
                let report: Value = serde_json::from_slice(&o.stdout).unwrap();
                assert_eq!(report["part"], format!("{i}/3"));
                let mut reported: Vec<String> =
                    report["files"].as_array().unwrap().iter().map(|f| f["file"].as_str().unwrap().into()).collect();
                reported.sort();
                assert_eq!(reported, files(&part).into_keys().collect::<Vec<_>>(), "a part reports exactly its files");
                copy_into(&part, &merged);
            }
            // The README's merge step.
            let o = escha_convert().arg("merge").arg(&merged).output().unwrap();
            assert!(o.status.success(), "{}", stderr(&o));
            check_sums(&merged);
            assert!(
                files(&one) == files(&merged),
                "{model} {format}: the merged parts differ from the one-machine run"
            );
        }
    }
}

/// Copies every file of `from` into `to` (a plain copy, later files over earlier ones).
fn copy_into(from: &Path, to: &Path) {
    for (name, bytes) in files(from) {
        std::fs::write(to.join(name), bytes).unwrap();
    }
}

/// Runs `merge` on the parts `parts` (directories) copied into a fresh directory in this order;
/// returns its exit code and stderr.
fn merge(tmp: &Path, name: &str, parts: &[&std::path::PathBuf]) -> (Option<i32>, String) {
    let dir = tmp.join(name);
    std::fs::create_dir(&dir).unwrap();
    for part in parts {
        copy_into(part, &dir);
    }
    let o = escha_convert().arg("merge").arg(&dir).output().unwrap();
    (o.status.code(), stderr(&o))
}

#[test]
fn a_bad_merge_fails_whatever_the_copy_order() {
    let tmp = tempfile::tempdir().unwrap();
    let part = |input: &Path, dir: &str, i: usize, extra: &[&str]| {
        let out = tmp.path().join(dir);
        let part = format!("{i}/3");
        let args = [&["--max-shard-size", "100KB", "--checksums", "--part", &part][..], extra].concat();
        convert(input, &out, &args);
        out
    };
    let dense = fixture("dense");
    let [p1, p2, p3] = [1, 2, 3].map(|i| part(&dense, &format!("p{i}"), i, &[]));
    // A missing part.
    let (code, err) = merge(tmp.path(), "m13", &[&p1, &p3]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("part 2 of 3 is missing"), "{err}");
    // A part converted with other options.
    let f16 = part(&dense, "f16", 2, &["--format", "f16"]);
    for (name, order) in [("opt-a", [&p1, &f16, &p3]), ("opt-b", [&f16, &p1, &p3])] {
        let (code, err) = merge(tmp.path(), name, &order);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("different inputs or different options"), "{err}");
    }
    // A part of another input with the same directory name: its weights differ, nothing else.
    let other = tmp.path().join("other").join("dense");
    std::fs::create_dir_all(&other).unwrap();
    copy_tree(&dense, &other);
    let shard = other.join("model-00001-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let foreign = part(&other, "foreign", 3, &[]);
    for (name, order) in [("in-a", [&p1, &p2, &foreign]), ("in-b", [&foreign, &p1, &p2])] {
        let (code, err) = merge(tmp.path(), name, &order);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("different inputs or different options"), "{err}");
    }
    // The parts of one run merge, in any order.
    let (code, err) = merge(tmp.path(), "good", &[&p3, &p1, &p2]);
    assert_eq!(code, Some(0), "{err}");
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

/// `text` with its Markdown code spans removed (a run of n backticks to the next run of n; an
/// escaped backtick is text).
fn outside_code_spans(text: &str) -> String {
    let text = text.replace("\\`", "");
    let (mut out, mut rest) = (String::new(), text.as_str());
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let fence = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + fence..];
        let mut end = None;
        let mut i = 0;
        while let Some(j) = after[i..].find('`') {
            let run = after[i + j..].chars().take_while(|&c| c == '`').count();
            if run == fence {
                end = Some(i + j + run);
                break;
            }
            i += j + run;
        }
        rest = end.map_or("", |e| &after[e..]);
    }
    out + rest
}

#[test]
fn the_card_names_in_by_its_directory_and_escapes_what_it_quotes() {
    let tmp = tempfile::tempdir().unwrap();
    // IN spelled through mtp/.., from two places: the same card, naming the directory only.
    let cards: Vec<String> = ["a", "b"]
        .iter()
        .map(|place| {
            let input = tmp.path().join(place).join("dense");
            copy_tree(&fixture("dense"), &input);
            let out = tmp.path().join(place).join("out");
            convert(&input.join("mtp").join(".."), &out, &[]);
            std::fs::read_to_string(out.join("README.md")).unwrap()
        })
        .collect();
    assert_eq!(cards[0], cards[1]);
    assert!(cards[0].contains("| command | `escha-convert dense OUT --format bf16"), "{}", cards[0]);
    assert!(!cards[0].contains(&tmp.path().display().to_string()));
    // A hostile directory name stays text: no HTML, no broken code span, no extra table cell.
    let name = "x`y <img src=z onerror=alert(1)> |w";
    let input = tmp.path().join(name);
    copy_tree(&fixture("moe"), &input);
    let out = tmp.path().join("hostile-out");
    convert(&input, &out, &[]);
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    let body = card.split("---\n").nth(2).unwrap();
    assert!(!outside_code_spans(body).contains('<'), "{card}");
    assert!(card.contains("``x`y <img src=z onerror=alert(1)> |w``"), "{card}");
    // The command is one a shell runs as written: the name is a single quoted word.
    assert!(card.contains("| command | ``escha-convert 'x`y <img src=z onerror=alert(1)> \\|w' OUT"), "{card}");
    let name = "$(id) it's";
    let input = tmp.path().join(name);
    copy_tree(&fixture("dense"), &input);
    let out = tmp.path().join("shell-out");
    convert(&input, &out, &[]);
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(card.contains(r"| command | `escha-convert '$(id) it'\''s' OUT"), "{card}");
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
    assert!(stderr(&o).contains("--verify-base: FAIL"), "{}", stderr(&o));
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
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("layers.2.mlp.experts.down_proj"), "{}", stderr(&o));
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
    assert!(report["warnings"].as_array().unwrap().iter().any(|w| w["code"] == "mtp_dropped"), "{warnings}");
    assert!(!tensors(&moe).iter().any(|n| n.starts_with("mtp.")));
    assert_eq!(config(&moe)["text_config"]["mtp_num_hidden_layers"], 0);
    // --mtp keep writes it anyway, and says it is incomplete.
    let kept = tmp.path().join("kept");
    let o = escha_convert().arg(fixture("moe")).arg(&kept).args(["--mtp", "keep", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["warnings"].to_string().contains("kept an incomplete MTP head"));
    assert!(tensors(&kept).iter().any(|n| n == "mtp.layers.0.mlp.gate.weight"));
}

/// Runs `merge DIR` with a deadline: a merge that read a FIFO or hashed a huge file would not end.
fn merge_within(dir: &Path) -> (Option<i32>, String) {
    let mut cmd = escha_convert();
    cmd.arg("merge").arg(dir);
    let o = crate::common::output_within(&mut cmd, std::time::Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("merge {}: {e}", dir.display()));
    (o.status.code(), stderr(&o))
}

/// Edits the JSON file `dir/name`.
fn edit_json(dir: &Path, name: &str, edit: impl FnOnce(&mut Value)) {
    let path = dir.join(name);
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

#[test]
fn merge_and_force_follow_no_marker_name_out_of_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let part = tmp.path().join("part");
    convert(&fixture("dense"), &part, &["--max-shard-size", "100KB", "--checksums", "--part", "1/1"]);
    let sums = "SHA256SUMS.part-1-of-1";
    // Outside DIR: a sparse terabyte, which no merge could hash within the deadline, and a FIFO,
    // which blocks whoever opens it to read.
    let huge = tmp.path().join("outside");
    std::fs::File::create(&huge).unwrap().set_len(1 << 40).unwrap();
    let fifo = tmp.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let zeros = "0".repeat(64);
    let fresh = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        copy_into(&part, &dir);
        dir
    };
    let huge_abs = huge.to_str().unwrap().to_string();
    let fifo_abs = fifo.to_str().unwrap().to_string();
    let names: [(&str, Option<u64>); 7] = [
        ("/etc/passwd", Some(1)),
        ("../outside", None),
        (huge_abs.as_str(), None),
        ("../fifo", None),
        (fifo_abs.as_str(), Some(1)),
        ("sub/dir", None),
        ("..", None),
    ];
    // A line for `name` in the part's sums file.
    let record = |dir: &Path, name: &str| {
        let text = std::fs::read_to_string(dir.join(sums)).unwrap();
        std::fs::write(dir.join(sums), format!("{text}{zeros}  {name}\n")).unwrap();
    };
    for (i, (name, size)) in names.into_iter().enumerate() {
        // Named by the marker (and recorded by the part, as a merge would then hash it).
        let dir = fresh(&format!("marker-{i}"));
        edit_json(&dir, ".escha-convert.json", |m| m["files"][name] = size.map_or(Value::Null, Value::from));
        record(&dir, name);
        let (code, err) = merge_within(&dir);
        assert_eq!(code, Some(1), "{name}: {err}");
        assert!(err.contains(&format!("{name:?}")) && err.contains("not a file name"), "{name}: {err}");
        assert!(!err.contains("bytes"), "{name}: nothing outside is looked at: {err}");
        assert!(!dir.join("SHA256SUMS").exists() && dir.join(sums).exists(), "{name}: nothing merged");
        // Named by a part's sums file only.
        let dir = fresh(&format!("sums-{i}"));
        record(&dir, name);
        let (code, err) = merge_within(&dir);
        assert_eq!(code, Some(1), "{name}: {err}");
        assert!(err.contains(&format!("{name:?}")) && err.contains("not a file name"), "{name}: {err}");
    }
    // A part's sums file that is a FIFO, or a link out of DIR, is not read.
    let dir = fresh("sums-fifo");
    std::fs::remove_file(dir.join(sums)).unwrap();
    let c = std::ffi::CString::new(dir.join(sums).to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let (code, err) = merge_within(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(sums) && err.contains("FIFO"), "{err}");
    let dir = fresh("sums-link");
    std::fs::rename(dir.join(sums), tmp.path().join("sums-elsewhere")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("sums-elsewhere"), dir.join(sums)).unwrap();
    let (code, err) = merge_within(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(sums) && err.contains("link"), "{err}");
    // Where SHA256SUMS goes is checked before anything is hashed: a damaged shard is not what
    // this merge reports when a directory is in SHA256SUMS's way.
    let dir = fresh("sums-in-the-way");
    let shard = files(&dir).into_keys().find(|f| f.ends_with(".safetensors")).unwrap();
    std::fs::create_dir(dir.join("SHA256SUMS")).unwrap();
    let mut bytes = std::fs::read(dir.join(&shard)).unwrap();
    bytes[0] ^= 1;
    std::fs::write(dir.join(&shard), bytes).unwrap();
    let (code, err) = merge_within(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("SHA256SUMS: a directory is there"), "{err}");
    // --force replaces no directory whose marker names something outside it, and the stale-staging
    // cleanup removes none.
    let out = fresh("force");
    edit_json(&out, ".escha-convert.json", |m| m["files"]["../outside"] = Value::Null);
    let o = escha_convert().arg(fixture("dense")).arg(&out).args(["--quiet", "--force"]).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("\"../outside\"") && err.contains("not a file name"), "{err}");
    assert!(out.join(sums).exists(), "the old directory is in place");
    let stale = tmp.path().join(".fresh-out.partial-999999");
    std::fs::create_dir(&stale).unwrap();
    copy_into(&out, &stale);
    let o = escha_convert().arg(fixture("dense")).arg(tmp.path().join("fresh-out")).arg("--json").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let warnings = report["warnings"].to_string();
    assert!(warnings.contains("kept") && warnings.contains("../outside"), "{warnings}");
    assert!(stale.join(".escha-convert.json").exists());
    assert_eq!(std::fs::metadata(&huge).unwrap().len(), 1 << 40);
}
