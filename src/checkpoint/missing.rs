//! What a message says about an input path that is not there: that it is not, and the names
//! beside it that are close to the one asked for (a typo, another letter case), so that the first
//! words a user reads are true and the next ones point at what was meant.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

/// Close names offered, at most.
const MAX_CLOSE: usize = 3;
/// Entries of a directory looked at for close names, at most.
const MAX_ENTRIES: usize = 10_000;

/// `PATH: no such file or directory`, then `also` (more of the same sentence), then `; did you
/// mean A or B?` when the deepest directory of `path` that exists holds names close to the first
/// step that does not ([`close_paths`]).
pub fn no_such_path(path: &Path, also: &str) -> String {
    let close = close_paths(path);
    let shown: Vec<String> = close.iter().map(|p| p.display().to_string()).collect();
    let hint = match shown.as_slice() {
        [] => String::new(),
        [one] => format!("; did you mean {one}?"),
        [rest @ .., last] => format!("; did you mean {} or {last}?", rest.join(", ")),
    };
    format!("{}: no such file or directory{also}{hint}", path.display())
}

/// Whether the first step of `path` exists on its own (`fixtures` of `fixtures/dnse`): the path
/// then reads as a local path with a missing step, not as a Hub id.
pub fn first_step_exists(path: &Path) -> bool {
    let mut steps = path.components();
    match steps.next() {
        Some(Component::Normal(first)) if steps.next().is_some() => std::fs::symlink_metadata(first).is_ok(),
        _ => false,
    }
}

/// Paths like `path` with its first missing step replaced by a close name found beside it, the
/// closest first; each later step that is missing too is replaced by its closest name, or kept
/// as given when none is close.
pub fn close_paths(path: &Path) -> Vec<PathBuf> {
    let steps: Vec<Component> = path.components().collect();
    let mut at = PathBuf::new();
    for (i, step) in steps.iter().enumerate() {
        let next = at.join(step);
        if std::fs::symlink_metadata(&next).is_ok() {
            at = next;
            continue;
        }
        let Component::Normal(wanted) = step else { return Vec::new() };
        let rest = &steps[i + 1..];
        return close_names(&at, wanted).into_iter().map(|name| mended(at.join(name), rest)).collect();
    }
    Vec::new()
}

/// `at` followed by `rest`, each missing step replaced by its closest name where one is close.
fn mended(mut at: PathBuf, rest: &[Component]) -> PathBuf {
    for step in rest {
        let next = at.join(step);
        at = match step {
            Component::Normal(wanted) if std::fs::symlink_metadata(&next).is_err() => {
                close_names(&at, wanted).into_iter().next().map_or(next, |name| at.join(name))
            }
            _ => next,
        };
    }
    at
}

/// The names in `dir` close to `wanted`, the closest first (ties by name), at most [`MAX_CLOSE`].
fn close_names(dir: &Path, wanted: &OsStr) -> Vec<String> {
    let Some(wanted) = wanted.to_str() else { return Vec::new() };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<(usize, String)> = entries
        .take(MAX_ENTRIES)
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| !name.starts_with('.') || wanted.starts_with('.'))
        .filter_map(|name| closeness(wanted, &name).map(|d| (d, name)))
        .collect();
    found.sort();
    found.into_iter().take(MAX_CLOSE).map(|(_, name)| name).collect()
}

/// How far `name` is from `wanted` when it is close enough to be offered: the same letters in
/// another case (0), or a few edits (a letter added, dropped, changed, or two swapped), at most
/// one for every three letters of `wanted`.
pub fn closeness(wanted: &str, name: &str) -> Option<usize> {
    if wanted == name {
        return None;
    }
    if wanted.eq_ignore_ascii_case(name) {
        return Some(0);
    }
    let limit = (wanted.chars().count() / 3).max(1);
    let d = edits(&wanted.to_lowercase(), &name.to_lowercase());
    (d <= limit).then_some(d)
}

/// The optimal-string-alignment distance between `a` and `b`: insertions, deletions,
/// substitutions and swaps of two neighbours, each one edit.
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_means_a_few_edits_or_another_case() {
        assert_eq!(closeness("dnse", "dense"), Some(1));
        assert_eq!(closeness("Fixtures", "fixtures"), Some(0));
        assert_eq!(closeness("verfy", "verify"), Some(1));
        assert_eq!(closeness("dnse", "inspect"), None);
        assert_eq!(closeness("dense", "dense"), None);
        assert_eq!(closeness("ab", "xy"), None);
    }

    #[test]
    fn a_missing_path_names_close_names_beside_it() {
        let tmp = tempfile::tempdir().unwrap();
        for d in ["dense", "dense-base", "moe"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        let text = no_such_path(&tmp.path().join("dnse"), "");
        assert!(
            text.ends_with(&format!(
                "dnse: no such file or directory; did you mean {}?",
                tmp.path().join("dense").display()
            )),
            "{text}"
        );
        let text = no_such_path(&tmp.path().join("DENSE/x"), "");
        assert!(text.contains(&format!("did you mean {}?", tmp.path().join("dense/x").display())), "{text}");
        let text = no_such_path(&tmp.path().join("Dense-Bse/config.json"), "");
        assert!(
            text.ends_with(&format!("did you mean {}?", tmp.path().join("dense-base/config.json").display())),
            "{text}"
        );
        let text = no_such_path(&tmp.path().join("elsewhere"), ", nor that");
        assert!(text.ends_with("elsewhere: no such file or directory, nor that"), "{text}");
    }
}
