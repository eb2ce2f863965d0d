//! The floors of `docs/ARCHITECTURE.md` hold: every `crate::` path in `src/` names a module on its
//! own floor or below, every module of `src/` stands on exactly one floor, no two files of one
//! folder import each other, and no file is over 700 lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Module → floor, from the table under `## Floors` (`| 3 | `layout`, `container` |`).
fn floors() -> BTreeMap<String, usize> {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/ARCHITECTURE.md")).unwrap();
    let section = doc.split("\n## Floors").nth(1).expect("docs/ARCHITECTURE.md has a Floors section");
    let mut out = BTreeMap::new();
    for line in section.lines().take_while(|l| !l.starts_with("## ")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(floor) = cells.get(1).and_then(|c| c.parse::<usize>().ok()) else { continue };
        for m in cells[2].split(',').map(|m| m.trim().trim_matches('`')).filter(|m| !m.is_empty()) {
            assert!(out.insert(m.to_string(), floor).is_none(), "{m} stands on two floors");
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src/` belongs to (None for the crate roots).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).unwrap().components().next()?.as_os_str().to_str()?.to_string();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (!matches!(name.as_str(), "lib" | "main")).then_some(name)
}

/// The modules a file's code names as `crate::<module>` (comments left out).
fn imports(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for rest in line.split("crate::").skip(1) {
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn no_module_imports_one_on_a_higher_floor() {
    let floors = floors();
    let src = Path::new(ROOT).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else { continue };
        let Some(&floor) = floors.get(&module) else {
            wrong.push(format!("{module} ({}) stands on no floor", file.display()));
            continue;
        };
        for target in imports(&std::fs::read_to_string(file).unwrap()) {
            match floors.get(&target) {
                Some(&f) if f > floor => wrong.push(format!(
                    "{} imports {target} (floor {f}) from floor {floor}",
                    file.strip_prefix(ROOT).unwrap().display()
                )),
                None => wrong.push(format!("{}: crate::{target} stands on no floor", file.display())),
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The files of `src/<dir>`, with their text.
fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(&Path::new(ROOT).join("src").join(dir), &mut files);
    assert!(!files.is_empty(), "src/{dir} has Rust files");
    files.into_iter().map(|f| (f.clone(), std::fs::read_to_string(&f).unwrap())).collect()
}

#[test]
fn the_lanes_import_nothing_of_the_crate() {
    let mut wrong = Vec::new();
    for (file, text) in sources("simd") {
        for target in imports(&text).into_iter().filter(|t| t != "simd") {
            wrong.push(format!("{} imports crate::{target}", file.strip_prefix(ROOT).unwrap().display()));
        }
    }
    assert!(wrong.is_empty(), "src/simd stands below every other module:\n{}", wrong.join("\n"));
}

#[test]
fn the_engine_names_no_format() {
    // A format's name as a string in the engine means the engine decides something per format;
    // each format's layout spells its own words (`Layout::shaping_flags`, `Layout::name`).
    let mut wrong = Vec::new();
    for (file, text) in sources("convert") {
        let lower = text.to_lowercase();
        for name in ["\"mlx\"", "\"gguf\"", "\"exl3\""] {
            if lower.contains(name) {
                wrong.push(format!("{} names {name}", file.strip_prefix(ROOT).unwrap().display()));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The module path of a file of `src/`: `src/layout/gguf/types.rs` → `[layout, gguf, types]`, a
/// folder's `mod.rs` the folder's own path.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let mut path: Vec<String> =
        file.strip_prefix(src).unwrap().with_extension("").iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if path.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
        path.pop();
    }
    path
}

/// Every path a file names from `crate::` or `super::`, made absolute (`use super::{a::X, b}` names
/// `a::X` and `b`), comments left out.
fn named_paths(text: &str, at: &[String]) -> Vec<Vec<String>> {
    let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts_word =
            i == 0 || !(chars[i - 1].is_ascii_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':');
        let rest: String = chars[i..chars.len().min(i + 7)].iter().collect();
        if starts_word && (rest.starts_with("crate::") || rest.starts_with("super::")) {
            let mut base: Vec<String> = Vec::new();
            let mut j = i;
            if rest.starts_with("crate::") {
                j += 7;
            } else {
                // Each `super::` is one step up from the file's own module.
                base = at.to_vec();
                while chars[j..].iter().take(7).collect::<String>() == "super::" {
                    base.pop();
                    j += 7;
                }
            }
            let (paths, end) = use_tree(&chars, j, base);
            out.extend(paths);
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The paths of one use tree starting at `i` under `prefix`, and where it ends.
fn use_tree(chars: &[char], mut i: usize, mut prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    loop {
        if chars.get(i) == Some(&'{') {
            let mut out = Vec::new();
            i += 1;
            loop {
                while chars.get(i).is_some_and(|c| c.is_whitespace() || *c == ',') {
                    i += 1;
                }
                match chars.get(i) {
                    None => return (out, i),
                    Some('}') => return (out, i + 1),
                    _ => {}
                }
                let (inner, end) = use_tree(chars, i, prefix.clone());
                out.extend(inner);
                i = end;
                // Skip an `as name` or anything else up to the next item.
                while chars.get(i).is_some_and(|c| *c != ',' && *c != '}') {
                    i += 1;
                }
            }
        }
        let word: String = chars[i..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == '_').collect();
        if word.is_empty() {
            return (vec![prefix], i);
        }
        i += word.len();
        if word != "self" {
            prefix.push(word);
        }
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}

#[test]
fn no_two_files_of_one_folder_import_each_other() {
    let src = Path::new(ROOT).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // A unit of a folder is one of its files or subfolders (its mod.rs is the folder itself).
    let is_unit = |folder: &[String], name: &str| {
        let dir = folder.iter().fold(src.clone(), |d, s| d.join(s));
        dir.join(format!("{name}.rs")).is_file() || dir.join(name).is_dir()
    };
    let mut edges = std::collections::BTreeSet::new();
    for file in &files {
        let at = module_path(&src, file);
        for target in named_paths(&std::fs::read_to_string(file).unwrap(), &at) {
            let common = at.iter().zip(&target).take_while(|(a, b)| a == b).count();
            let (Some(from), Some(to)) = (at.get(common), target.get(common)) else { continue };
            let folder = &at[..common];
            if is_unit(folder, from) && is_unit(folder, to) {
                edges.insert((folder.join("/"), from.clone(), to.clone()));
            }
        }
    }
    let cycles: Vec<String> = edges
        .iter()
        .filter(|(d, a, b)| a < b && edges.contains(&(d.clone(), b.clone(), a.clone())))
        .map(|(d, a, b)| format!("src/{d}: {a} ↔ {b}"))
        .collect();
    assert!(edges.len() > 50, "the import graph was read ({} edges)", edges.len());
    assert!(
        cycles.is_empty(),
        "files of one folder import each other (move what both need to the lower one):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn no_room_is_over_700_lines() {
    let src = Path::new(ROOT).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .map(|f| (f, std::fs::read_to_string(f).unwrap().lines().count()))
        .filter(|(_, n)| *n > 700)
        .map(|(f, n)| format!("{} ({n} lines)", f.strip_prefix(ROOT).unwrap().display()))
        .collect();
    assert!(long.is_empty(), "split these by concern:\n{}", long.join("\n"));
}
