//! What the README, docs/USAGE.md and fixtures/README.md tell a newcomer holds: the virtual
//! environments they have one make are ignored by git, the fixture sizes are the ones the files
//! hold, the example output of `verify` is what the command prints, every flag `--help` lists is in
//! the reference, and the front page stays short with its two set-up commands near the top.

use crate::common::{escha_convert, fixture, stderr};
use crate::synth::read_safetensors;
use std::collections::BTreeMap;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap()
}

#[test]
fn every_virtual_environment_the_docs_make_is_ignored() {
    let ignored: Vec<String> = read(".gitignore").lines().map(|l| l.trim().trim_end_matches('/').to_string()).collect();
    let docs = read("README.md") + &read("docs/USAGE.md");
    let made: Vec<&str> = docs.split("-m venv ").skip(1).filter_map(|rest| rest.split_whitespace().next()).collect();
    assert!(!made.is_empty(), "the install instructions make a virtual environment");
    for venv in made {
        let venv = venv.trim_end_matches('/');
        assert!(ignored.iter().any(|i| i == venv), "{venv}/ (made by the docs) is not in .gitignore");
    }
}

/// Every tensor of a fixture checkpoint (its shards and its `mtp/`): name → (dtype, shape).
fn tensors(dir: &str) -> BTreeMap<String, (String, Vec<usize>)> {
    let mut out = BTreeMap::new();
    for sub in ["", "mtp"] {
        let Ok(entries) = std::fs::read_dir(fixture(dir).join(sub)) else { continue };
        for e in entries {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "safetensors") {
                for (name, (dtype, shape, _)) in read_safetensors(&p) {
                    out.insert(name, (dtype, shape));
                }
            }
        }
    }
    out
}

/// The section of fixtures/README.md whose heading starts with `heading`, its lines joined.
fn section(readme: &str, heading: &str) -> String {
    let text = readme.split("\n## ").find(|s| s.starts_with(heading)).unwrap_or_else(|| panic!("no {heading}"));
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `[4, 128]` as numbers; `None` for a symbolic shape (`[IC/16, OC/16, 16K]`).
fn dims(text: &str) -> Option<Vec<usize>> {
    text.split(',').map(|d| d.trim().parse().ok()).collect()
}

/// The names a README name stands for: `in_proj_a/b.weight` is two.
fn expand(name: &str) -> Vec<String> {
    match name.split_once("_a/b") {
        Some((head, tail)) => vec![format!("{head}_a{tail}"), format!("{head}_b{tail}")],
        None => vec![name.to_string()],
    }
}

/// Whether some tensor is `name` (a suffix of its full name, `.weight` optional).
fn matching<'a>(
    tensors: &'a BTreeMap<String, (String, Vec<usize>)>,
    name: &str,
) -> Vec<(&'a String, &'a (String, Vec<usize>))> {
    tensors
        .iter()
        .filter(|(t, _)| {
            let short = t.strip_suffix(".weight").unwrap_or(t);
            [t.as_str(), short].iter().any(|n| *n == name || n.ends_with(&format!(".{name}")))
        })
        .collect()
}

#[test]
fn the_fixture_readme_gives_the_sizes_the_files_hold() {
    let readme = read("fixtures/README.md");
    let mut wrong = Vec::new();
    for (heading, dir, base) in [("`dense/`", "dense", "dense-base"), ("`moe/`", "moe", "moe-base")] {
        let text = section(&readme, heading);
        let (stored, base) = (tensors(dir), tensors(base));
        // "`NAME` DTYPE `[d, …]`": some tensor of that name has that dtype and shape (a leaf such
        // as `escha_code` is described once per module kind).
        for piece in text.split('`').collect::<Vec<_>>().windows(4) {
            let [name, between, shape, _] = piece else { continue };
            let dtype = between.trim();
            let Some(shape) = shape.strip_prefix('[').and_then(|s| s.strip_suffix(']')).and_then(dims) else {
                continue;
            };
            if !["F16", "F32", "BF16", "I8", "I16", "I32"].contains(&dtype) || name.contains(' ') {
                continue;
            }
            for name in expand(name) {
                let found = matching(&stored, &name);
                if !found.iter().any(|(_, (d, s))| (d.as_str(), s) == (dtype, &shape)) {
                    let held: Vec<_> = found.iter().map(|(_, h)| h).collect();
                    wrong.push(format!("{dir}: `{name}` {dtype} {shape:?}, but the files hold {held:?}"));
                }
            }
        }
        // "`NAME` (IN→OUT": the base's weight of that name is [OUT, IN].
        for piece in text.split('`').collect::<Vec<_>>().windows(3) {
            let [name, after, _] = piece else { continue };
            let Some((ic, oc)) = after.trim().strip_prefix('(').and_then(|s| s.split_once('→')) else { continue };
            let oc: String = oc.chars().take_while(char::is_ascii_digit).collect();
            let (Ok(ic), Ok(oc)) = (ic.parse::<usize>(), oc.parse::<usize>()) else { continue };
            let found = matching(&base, name);
            if found.is_empty() {
                wrong.push(format!("{dir}: `{name}` ({ic}→{oc}): no such tensor in {heading}'s base"));
            }
            for (t, (_, shape)) in found {
                if shape[shape.len() - 2..] != [oc, ic] {
                    wrong.push(format!("{dir}: `{name}` ({ic}→{oc}), but {t} is {shape:?}"));
                }
            }
        }
    }
    // The shared GDN dimensions, against the config and the conv1d weight.
    let config: serde_json::Value = serde_json::from_str(&read("fixtures/dense/config.json")).unwrap();
    let c = &config["text_config"];
    let shared = section(&readme, "Shared dimensions");
    let gdn = shared.split("| GDN |").nth(1).and_then(|r| r.split('|').next()).unwrap_or_default();
    let conv = &tensors("dense")["model.language_model.layers.0.linear_attn.conv1d.weight"].1[0];
    for says in [
        format!("{} key heads ×{}", c["linear_num_key_heads"], c["linear_key_head_dim"]),
        format!("{} value heads ×{}", c["linear_num_value_heads"], c["linear_value_head_dim"]),
        format!("conv kernel {}", c["linear_conv_kernel_dim"]),
        format!("conv channels {conv}"),
    ] {
        if !gdn.contains(&says) {
            wrong.push(format!("the GDN row {gdn:?} does not say {says:?}"));
        }
    }
    assert!(wrong.is_empty(), "fixtures/README.md:\n{}", wrong.join("\n"));
}

#[test]
fn the_docs_show_what_verify_prints() {
    let docs = read("README.md") + &read("docs/USAGE.md");
    let command = "$ escha-convert verify fixtures/dense --base fixtures/dense-base-fp8";
    let shown: Vec<&str> = docs
        .split(&format!("    {command}\n"))
        .nth(1)
        .expect("the docs' verify example")
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| l.trim_start_matches("    "))
        .collect();
    let o = escha_convert()
        .args(["verify", "fixtures/dense", "--base", "fixtures/dense-base-fp8"])
        .current_dir(ROOT)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let printed = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = printed.lines().map(str::trim_end).collect();
    // Abridged with `…`; the decoder named in the first line is the machine's.
    let missing: Vec<&&str> = shown
        .iter()
        .filter(|l| !l.trim().is_empty() && l.trim() != "…" && !l.starts_with("verify "))
        .filter(|l| !lines.contains(&l.trim_end()))
        .collect();
    assert!(missing.is_empty(), "the docs show lines verify does not print:\n{missing:#?}\n\nit prints:\n{printed}");
}

/// The long flags a `--help` page lists as options (not those its prose mentions).
fn listed_flags(help: &str) -> Vec<String> {
    help.lines()
        // clap indents an option by two spaces (six without a short form), the text under it further.
        .filter(|l| l.len() - l.trim_start().len() <= 6)
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split([' ', ',', '=', '<']).find(|w| w.starts_with("--")).map(str::to_string))
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

#[test]
fn every_flag_the_help_lists_is_in_the_reference() {
    let usage = read("docs/USAGE.md");
    let mut missing = Vec::new();
    for command in ["convert", "verify", "inspect", "merge", "completions", "man"] {
        let o = escha_convert().args([command, "--help"]).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{command} --help");
        let flags = listed_flags(&String::from_utf8_lossy(&o.stdout));
        assert!(command != "convert" || flags.len() > 20, "convert --help lists its flags: {flags:?}");
        missing.extend(
            flags
                .into_iter()
                .filter(|f| !usage.contains(&format!("`{f}")) && !usage.contains(&format!(", {f}")))
                .map(|f| format!("{command} {f}")),
        );
    }
    assert!(missing.is_empty(), "docs/USAGE.md does not describe: {missing:?}");
}

#[test]
fn the_front_page_is_short_and_starts_with_the_two_commands() {
    let readme = read("README.md");
    let lines: Vec<&str> = readme.lines().collect();
    assert!(lines.len() <= 300, "README.md has {} lines; the reference belongs in docs/USAGE.md", lines.len());
    // Its prose read in five minutes, at about 250 words a minute (tables and commands are skimmed).
    let prose = lines.iter().filter(|l| !l.starts_with('|') && !l.starts_with("    "));
    let words: usize = prose.map(|l| l.split_whitespace().count()).sum();
    assert!(words <= 1250, "README.md has {words} words of prose; the reference belongs in docs/USAGE.md");
    for command in ["    cargo run --release -- fixtures/dense out/dense-bf16", "    bash scripts/test.sh"] {
        let at =
            lines.iter().position(|l| *l == command).unwrap_or_else(|| panic!("README.md runs `{}`", command.trim()));
        assert!(at < 60, "`{}` is on line {} of README.md, past the first 60", command.trim(), at + 1);
    }
    assert_eq!(read(".ci/run").matches("bash scripts/test.sh").count(), 1, ".ci/run calls the README's test command");
}
