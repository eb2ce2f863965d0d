//! Hugging Face Hub ids read from the local cache, offline. An argument (IN, BASE) that is not an
//! existing local path but reads as `org/name` or `org/name@REVISION` is looked up where
//! `huggingface_hub` keeps its downloads (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`), laid out as it lays them out:
//!
//! ```text
//! models--org--name/refs/main             the commit a branch or tag names
//! models--org--name/snapshots/<commit>/…  the files, relative links into ../../blobs/
//! models--org--name/blobs/<sha>           the contents
//! ```
//!
//! Nothing is downloaded: a repository or revision the cache does not hold is an error giving
//! the `hf download` command that puts it there. The snapshot found is then read like any input
//! directory, within its boundary (`boundary.rs`).

use super::missing::{close_paths, closeness, first_step_exists, no_such_path};
use super::regular::{kind, open_regular};
use crate::text::excerpt;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::ffi::OsString;
use std::fs::Metadata;
use std::path::{Component, Path, PathBuf};

/// A Hub repository id as given on the command line: `org/name`, and the revision after `@`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubId {
    pub repo: String,
    /// A branch, a tag or a full commit hash; `None`: the default branch (`main`).
    pub revision: Option<String>,
}

/// A Hub id found in the cache: what was asked for and the commit it names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HubSource {
    /// `org/name`.
    pub id: String,
    /// The revision asked for (branch, tag or commit); `None` when none was (the default branch).
    pub revision: Option<String>,
    /// The 40-hex commit of the snapshot read.
    pub commit: String,
}

impl HubSource {
    /// `org/name@<commit>`: the argument that reads this very snapshot again.
    pub fn pinned(&self) -> String {
        format!("{}@{}", self.id, self.commit)
    }
}

/// `path` for a report, preceded by the Hub id it was found as (`org/name@<commit> (path)`).
pub fn described(path: &str, hub: Option<&HubSource>) -> String {
    match hub {
        Some(h) => format!("{} ({path})", h.pinned()),
        None => path.to_string(),
    }
}

/// An input argument once located: the directory or file to read, and the Hub id it was given as.
#[derive(Clone, Debug)]
pub struct Located {
    pub path: PathBuf,
    pub hub: Option<HubSource>,
}

/// An input's name and revision by its path: `org/name` and the snapshot for a Hugging Face cache
/// (`…/models--org--name/snapshots/<rev>`), else the directory's own name.
pub fn source_name(input: &Path) -> (String, Option<String>) {
    let path = input.canonicalize().unwrap_or_else(|_| input.to_path_buf());
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let snapshots = path.parent().filter(|p| p.file_name().is_some_and(|n| n == "snapshots"));
    if let Some(repo) =
        snapshots.and_then(Path::parent).and_then(name).and_then(|n| n.strip_prefix("models--").map(String::from))
    {
        return (repo.replacen("--", "/", 1), name(&path));
    }
    (name(&path).unwrap_or_else(|| "checkpoint".into()), None)
}

/// The revision the cache is asked for when none is given.
const DEFAULT_REVISION: &str = "main";

/// Where the argument `arg` (IN or BASE) is. An existing local path (a link, even a dangling one,
/// counts) is that path; otherwise an argument of Hub id grammar is looked up in the cache, and
/// must be there. Anything else is an error that says first that no such file or directory
/// exists, with the close names beside it; a download is offered only for an `org/name` whose
/// `org` is not a local path and whose id the cache holds in no other letter case.
pub fn locate(arg: &Path) -> Result<Located> {
    let local = Located { path: arg.to_path_buf(), hub: None };
    if std::fs::symlink_metadata(arg).is_ok() {
        return Ok(local);
    }
    let missing = no_such_path(arg, "");
    let cache = cache_dir(|k| std::env::var_os(k));
    let Some(id) = arg.to_str().and_then(HubId::parse) else {
        if let Some((repo, revision)) = arg.to_str().and_then(|t| t.split_once('@')).filter(|(r, _)| is_repo_id(r)) {
            bail!(
                "{missing}; as a Hub id {repo}@…, {} is not a revision a Hub id can name: a branch or tag \
                 (letters, digits, `.`, `_`, `-`, and `/` between non-empty steps, no `..`, at most {MAX_REVISION} \
                 characters) or a 40-hexadecimal-digit commit",
                excerpt(revision, QUOTED_REF_CHARS)
            );
        }
        let held = cache.as_deref().map(|c| cached_named_like(arg, c)).unwrap_or_default();
        if held.is_empty() {
            bail!("{missing}");
        }
        bail!("{missing}; the Hugging Face cache holds {} (pass the Hub id as org/name)", held.join(", "));
    };
    // `org` on disk: a local path with a missing step, unless the cache holds the id itself.
    let in_cache = cache.as_deref().filter(|c| std::fs::symlink_metadata(c.join(id.folder())).is_ok());
    if let Some(cache) = in_cache {
        return resolve(&id, cache);
    }
    if first_step_exists(arg) {
        bail!("{missing}");
    }
    let Some(cache) = cache else {
        bail!(
            "{missing}, and there is no Hugging Face cache to look in for the Hub id {} (set HF_HUB_CACHE, \
             HF_HOME or HOME); nothing is downloaded: download it first ({}) and run this again",
            id.text(),
            id.download_command()
        );
    };
    if !close_paths(arg).is_empty() {
        // A local name close to it: a typo of a path, never a reason to download.
        bail!("{}", no_such_path(arg, &format!(", nor a Hub id the Hugging Face cache {} holds", cache.display())));
    }
    bail!("{missing}, and {}", not_held(&id, &cache))
}

/// What the cache lacks when it holds no repository `id`: the same id in another letter case
/// when it holds one (never a download of what is already there), else the download command.
fn not_held(id: &HubId, cache: &Path) -> String {
    let start = format!("the Hugging Face cache {} does not hold {} (no {})", cache.display(), id.repo, id.folder());
    match other_case(id, cache) {
        Some(held) => format!(
            "{start}; it holds {held}, the same id in other letter case (ids are matched as written: pass {})",
            HubId { repo: held.clone(), revision: id.revision.clone() }.text()
        ),
        None => {
            format!("{start}; nothing is downloaded: download it first ({}) and run this again", id.download_command())
        }
    }
}

/// The repositories in the cache whose name (after `org/`) is `word` or close to it, for a bare
/// word given where `org/name` was meant.
fn cached_named_like(word: &Path, cache: &Path) -> Vec<String> {
    /// Entries of the cache looked at, at most.
    const MAX_ENTRIES: usize = 100_000;
    let Some(word) = word.to_str().filter(|w| !w.contains('/')) else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(cache) else { return Vec::new() };
    let mut held: Vec<String> = entries
        .take(MAX_ENTRIES)
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|folder| Some(folder.strip_prefix("models--")?.replacen("--", "/", 1)))
        .filter(|repo| {
            repo.split_once('/').is_some_and(|(_, name)| name == word || closeness(word, name).is_some())
                && is_repo_id(repo)
        })
        .collect();
    held.sort();
    held.truncate(3);
    held
}

/// The Hub cache directory as `huggingface_hub` finds it, from the environment `var`:
/// `HF_HUB_CACHE` (or its older name `HUGGINGFACE_HUB_CACHE`), else `HF_HOME/hub`, else
/// `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`. A leading `~` is the home
/// directory; an empty variable counts as unset.
pub fn cache_dir(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let get = |k: &str| var(k).filter(|v| !v.is_empty());
    let home = get("HOME").map(PathBuf::from);
    let expand = |v: OsString| -> Option<PathBuf> {
        let text = v.to_string_lossy();
        match text.strip_prefix('~') {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                Some(home.clone()?.join(rest.trim_start_matches('/')))
            }
            _ => Some(PathBuf::from(v)),
        }
    };
    if let Some(v) = get("HF_HUB_CACHE").or_else(|| get("HUGGINGFACE_HUB_CACHE")) {
        return expand(v);
    }
    if let Some(v) = get("HF_HOME") {
        return Some(expand(v)?.join("hub"));
    }
    let cache = match get("XDG_CACHE_HOME") {
        Some(v) => expand(v)?,
        None => home.clone()?.join(".cache"),
    };
    Some(cache.join("huggingface").join("hub"))
}

/// Finds `id` in the cache `cache`: its repository, the commit its revision names (a branch or
/// tag through `refs/`, a full commit hash as it is) and that commit's snapshot. The cache itself
/// may be reached through links (a cache on another disk); nothing below it is: the repository
/// directory, `refs/` and every directory and file on the way to a ref, `snapshots/` and the
/// snapshot must each be itself, so that what is read as `org/name` is that repository's own.
pub fn resolve(id: &HubId, cache: &Path) -> Result<Located> {
    let repo = cache.join(id.folder());
    match std::fs::symlink_metadata(&repo) {
        Ok(m) if m.file_type().is_symlink() => return Err(linked_entry(&repo)),
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("{}: not a directory, where the repository belongs; refusing to read it", repo.display()),
        Err(_) => bail!("{}: {}", id.text(), not_held(id, cache)),
    }
    let requested = id.revision.as_deref().unwrap_or(DEFAULT_REVISION);
    let missing = |what: String| {
        anyhow::anyhow!(
            "{}: the Hugging Face cache {} holds {} but not its revision {requested} ({what}); nothing is \
             downloaded: download it first ({}) and run this again",
            id.text(),
            cache.display(),
            id.repo,
            id.download_command()
        )
    };
    let commit = if is_commit(requested) {
        requested.to_string()
    } else {
        let Some((reference, meta)) = entry_without_links(&repo, &Path::new("refs").join(requested))? else {
            return Err(missing(format!("no refs/{requested}")));
        };
        if !meta.is_file() {
            bail!("{}: {} is not a regular file; refusing to read it", reference.display(), kind(&meta));
        }
        read_ref(&reference, &meta)?
    };
    let snapshot = match entry_without_links(&repo, &Path::new("snapshots").join(&commit))? {
        Some((path, meta)) if meta.is_dir() => path,
        Some((path, meta)) => bail!("{}: {} where a snapshot directory belongs", path.display(), kind(&meta)),
        None if commit == requested => return Err(missing(format!("no snapshots/{commit}"))),
        None => return Err(missing(format!("refs/{requested} names {commit}, and there is no snapshots/{commit}"))),
    };
    let hub = HubSource { id: id.repo.clone(), revision: id.revision.clone(), commit };
    Ok(Located { path: snapshot, hub: Some(hub) })
}

/// The most bytes a ref file may hold: one commit hash (40 hexadecimal digits) and some space.
const MAX_REF_BYTES: u64 = 256;

/// The characters of a ref file's content quoted in an error, at most.
const QUOTED_REF_CHARS: usize = 48;

/// The commit the ref file `reference` (found as `found`) names, read without following a final
/// link and never more than [`MAX_REF_BYTES`] (a file of junk is quoted by a short, escaped
/// prefix). The file opened must be the one found, so a directory on the way swapped for a link
/// in between is caught.
fn read_ref(reference: &Path, found: &Metadata) -> Result<String> {
    use std::io::Read;
    let file = open_regular(reference)?;
    let opened = file.metadata().with_context(|| format!("{}: cannot read", reference.display()))?;
    if !same_file(&opened, found) {
        bail!("{}: changed while being read; refusing to read it", reference.display());
    }
    let mut bytes = Vec::new();
    file.take(MAX_REF_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("{}: cannot read", reference.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    if bytes.len() as u64 > MAX_REF_BYTES {
        bail!(
            "{}: more than {MAX_REF_BYTES} bytes, not a ref (a ref holds one 40-hexadecimal-digit commit); it begins {}",
            reference.display(),
            excerpt(&text, QUOTED_REF_CHARS)
        );
    }
    let commit = text.trim();
    if !is_commit(commit) {
        bail!(
            "{}: names no commit (expected 40 hexadecimal digits): {}",
            reference.display(),
            excerpt(commit, QUOTED_REF_CHARS)
        );
    }
    Ok(commit.to_string())
}

/// `relative` (plain names) below the directory `dir`, reached without following a link: every
/// step after `dir` must be itself, and each but the last a directory. `None`: a step is not there. A step
/// that is a link is refused, naming it: a link here could lead anywhere on the machine, and what
/// it reaches would be read and named as this repository.
fn entry_without_links(dir: &Path, relative: &Path) -> Result<Option<(PathBuf, Metadata)>> {
    let mut path = dir.to_path_buf();
    // `dir` itself may be reached through links (the cache on another disk).
    let mut meta = std::fs::metadata(dir).with_context(|| format!("{}: cannot read", dir.display()))?;
    for step in relative.components() {
        let Component::Normal(name) = step else {
            bail!("{}: {} is not a plain name below {}", relative.display(), step.as_os_str().display(), dir.display())
        };
        if !meta.is_dir() {
            // `refs/main/x` when `refs/main` is a file: no such ref.
            return Ok(None);
        }
        path.push(name);
        meta = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => return Err(linked_entry(&path)),
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(anyhow::Error::new(e).context(format!("{}: cannot read", path.display()))),
        };
    }
    Ok(Some((path, meta)))
}

/// The refusal of a link inside a cache repository, naming where it points.
fn linked_entry(path: &Path) -> anyhow::Error {
    let target = std::fs::read_link(path).map_or_else(|_| "?".into(), |t| t.display().to_string());
    anyhow::anyhow!(
        "{}: a link (to {}), which is never followed: in a Hugging Face cache the repository directory, refs/, \
         snapshots/ and each snapshot are real directories, and only a snapshot's files link (into its blobs/); \
         refusing to read it",
        path.display(),
        excerpt(&target, MAX_QUOTED_PATH)
    )
}

/// Whether two metadata describe one file (device and inode; on other systems, trusted).
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        true
    }
}

/// The characters of a link's target quoted in an error, at most.
const MAX_QUOTED_PATH: usize = 256;

/// Where a directory given as IN by its path in a Hugging Face cache
/// (`…/models--org--name/snapshots/<commit>`) physically is; `None` for a directory not named so.
/// Refused when the repository directory, `snapshots/` or the snapshot is a link: the same rule
/// as for a Hub id, so that a path that names a repository reads that repository. The directories
/// above the repository (the cache) may be links.
pub fn snapshot_by_path(dir: &Path) -> Result<Option<PathBuf>> {
    // A relative path is taken from the working directory, so that `snapshots/<rev>` given from
    // inside a repository is checked too.
    let absolute;
    let dir = if dir.is_absolute() {
        dir
    } else {
        absolute = std::env::current_dir().context("cannot read the current directory")?.join(dir);
        &absolute
    };
    let name = |p: Option<&Path>| p.and_then(Path::file_name).map(ToOwned::to_owned);
    let Some(commit) = name(Some(dir)) else { return Ok(None) };
    let snapshots = dir.parent().filter(|p| p.file_name().is_some_and(|n| n == "snapshots"));
    let Some(repo) = snapshots
        .and_then(Path::parent)
        .filter(|r| r.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("models--")))
    else {
        return Ok(None);
    };
    let folder = name(Some(repo)).unwrap_or_default();
    let relative: PathBuf = [folder.as_os_str(), "snapshots".as_ref(), commit.as_os_str()].iter().collect();
    let cache = crate::paths::parent_dir(repo);
    entry_without_links(cache, &relative)?;
    let cache = cache.canonicalize().with_context(|| format!("{}: cannot resolve", cache.display()))?;
    Ok(Some(cache.join(relative)))
}

/// A repository the cache holds whose id differs from `id` only in case (`Org/Name` for
/// `org/name`): ids are matched exactly, as `huggingface_hub` names its folders.
fn other_case(id: &HubId, cache: &Path) -> Option<String> {
    /// Entries of the cache looked at, at most.
    const MAX_ENTRIES: usize = 100_000;
    let wanted = id.folder();
    std::fs::read_dir(cache).ok()?.take(MAX_ENTRIES).filter_map(Result::ok).find_map(|e| {
        let folder = e.file_name().into_string().ok()?;
        let repo = folder.strip_prefix("models--")?.replacen("--", "/", 1);
        (folder != wanted && folder.eq_ignore_ascii_case(&wanted) && is_repo_id(&repo)).then_some(repo)
    })
}

impl HubId {
    /// `org/name` or `org/name@REVISION`, as the Hub allows them: one `/` between two names of
    /// ASCII letters, digits, `.`, `_` and `-`, each beginning and ending with a letter, digit or
    /// `_`, with no `--` or `..` (the name at most 96 characters, not ending in `.git`); a revision
    /// of the same characters and `/`, with no empty or `.` step and no `..`. Anything else is a path.
    pub fn parse(s: &str) -> Option<HubId> {
        let (repo, revision) = match s.split_once('@') {
            Some((repo, rev)) => (repo, Some(rev)),
            None => (s, None),
        };
        if !is_repo_id(repo) || !revision.is_none_or(is_revision) {
            return None;
        }
        Some(HubId { repo: repo.to_string(), revision: revision.map(String::from) })
    }

    /// The cache's directory of the repository: `models--org--name`.
    pub fn folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }

    /// The id as given.
    pub fn text(&self) -> String {
        match &self.revision {
            Some(rev) => format!("{}@{rev}", self.repo),
            None => self.repo.clone(),
        }
    }

    /// The command that puts this repository (at this revision) into the cache.
    pub fn download_command(&self) -> String {
        match &self.revision {
            Some(rev) => format!("`hf download {} --revision {rev}`", self.repo),
            None => format!("`hf download {}`", self.repo),
        }
    }
}

/// `org/name` as the Hub allows it (see [`HubId::parse`]), and nothing that could be a path.
pub fn is_repo_id(s: &str) -> bool {
    let Some((org, name)) = s.split_once('/') else { return false };
    let part = |p: &str| {
        let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        p.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            && edge(p.chars().next())
            && edge(p.chars().last())
    };
    part(org)
        && part(name)
        && name.len() <= 96
        && !s.contains("--")
        && !s.contains("..")
        && name.rsplit_once('.').is_none_or(|(_, ext)| ext != "git")
}

/// The longest revision taken (git allows longer names; no Hub branch or tag needs one).
const MAX_REVISION: usize = 255;

/// A branch, tag or commit name: ASCII letters, digits, `.`, `_`, `-` and `/`, every step between
/// slashes non-empty and not `.`, no `..` anywhere (as git refuses), at most [`MAX_REVISION`]
/// characters.
fn is_revision(s: &str) -> bool {
    s.len() <= MAX_REVISION
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
        && !s.contains("..")
        && s.split('/').all(|step| !step.is_empty() && step != ".")
}

/// A full commit hash as the cache names snapshots: 40 lowercase hexadecimal digits.
fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const C1: &str = "0123456789abcdef0123456789abcdef01234567";
    const C2: &str = "89abcdef0123456789abcdef0123456789abcdef";

    fn id(s: &str) -> HubId {
        HubId::parse(s).unwrap_or_else(|| panic!("{s} should be an id"))
    }

    #[test]
    fn the_id_grammar_leaves_paths_alone() {
        assert_eq!(id("Qwen/Qwen3.5-27B"), HubId { repo: "Qwen/Qwen3.5-27B".into(), revision: None });
        assert_eq!(id("org/name@v1.0").revision.as_deref(), Some("v1.0"));
        assert_eq!(id("org/name@refs/pr/3").revision.as_deref(), Some("refs/pr/3"));
        assert_eq!(id(&format!("org/name@{C1}")).revision.as_deref(), Some(C1));
        for path in [
            "name",
            "/abs/name",
            "./org/name",
            "../org/name",
            "org/name/",
            "org/name/x",
            "a/b/c",
            ".hidden/name",
            "org/.name",
            "org/name.",
            "-org/name",
            "org/na--me",
            "org/na..me",
            "org/name.git",
            "org /name",
            "org/näme",
            "org/name@",
            "org/name@a/../b",
            "org/name@/main",
            "org/name@main/",
            "org/name@ma in",
            "org/name@a@b",
            "org/name@a..b",
            "org/name@..",
            "",
        ] {
            assert_eq!(HubId::parse(path), None, "{path} is not an id");
        }
        assert!(!is_repo_id(&format!("org/{}", "n".repeat(97))) && is_repo_id(&format!("org/{}", "n".repeat(96))));
        assert!(HubId::parse(&format!("o/n@{}", "r".repeat(255))).is_some());
        assert_eq!(HubId::parse(&format!("o/n@{}", "r".repeat(256))), None);
    }

    #[test]
    fn names_and_commands() {
        let plain = id("org/name");
        assert_eq!(plain.folder(), "models--org--name");
        assert_eq!(plain.download_command(), "`hf download org/name`");
        assert_eq!(id("org/name@v2").download_command(), "`hf download org/name --revision v2`");
        assert_eq!(id("org/name@v2").text(), "org/name@v2");
        let source = HubSource { id: "org/name".into(), revision: Some("main".into()), commit: C1.into() };
        assert_eq!(source.pinned(), format!("org/name@{C1}"));
        assert!(is_commit(C1) && !is_commit(&C1.to_uppercase()) && !is_commit(&C1[..39]));
    }

    #[test]
    fn the_cache_is_found_where_huggingface_hub_puts_it() {
        let env = |pairs: &[(&str, &str)]| {
            let map: HashMap<String, OsString> =
                pairs.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
            cache_dir(move |k| map.get(k).cloned())
        };
        let home = [("HOME", "/h")];
        assert_eq!(env(&home), Some(PathBuf::from("/h/.cache/huggingface/hub")));
        assert_eq!(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]), Some(PathBuf::from("/x/huggingface/hub")));
        assert_eq!(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x"), ("HF_HOME", "/f")]), Some(PathBuf::from("/f/hub")));
        assert_eq!(env(&[("HF_HOME", "/f"), ("HUGGINGFACE_HUB_CACHE", "/old")]), Some(PathBuf::from("/old")));
        assert_eq!(
            env(&[("HF_HOME", "/f"), ("HUGGINGFACE_HUB_CACHE", "/old"), ("HF_HUB_CACHE", "/c")]),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(env(&[("HOME", "/h"), ("HF_HOME", "~/hf")]), Some(PathBuf::from("/h/hf/hub")));
        assert_eq!(env(&[("HOME", "/h"), ("HF_HOME", "")]), Some(PathBuf::from("/h/.cache/huggingface/hub")));
        assert_eq!(env(&[]), None);
        assert_eq!(env(&[("HF_HUB_CACHE", "~/c")]), None);
    }

    /// A cache holding `org/name` with snapshots C1 (main) and C2 (tag v2, branch dev).
    fn cache() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("models--org--name");
        for c in [C1, C2] {
            std::fs::create_dir_all(repo.join("snapshots").join(c)).unwrap();
        }
        // `huggingface_hub` keeps the ref of revision R at refs/R: `refs/pr/1` at refs/refs/pr/1.
        std::fs::create_dir_all(repo.join("refs/refs/pr")).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("refs/main"), C1).unwrap();
        std::fs::write(repo.join("refs/v2"), format!("{C2}\n")).unwrap();
        std::fs::write(repo.join("refs/refs/pr/1"), C2).unwrap();
        std::fs::write(repo.join("refs/gone"), "ffffffffffffffffffffffffffffffffffffffff").unwrap();
        std::fs::write(repo.join("refs/junk"), "not a commit").unwrap();
        tmp
    }

    fn resolved(cache: &Path, s: &str) -> Result<(PathBuf, HubSource)> {
        let l = resolve(&id(s), cache)?;
        Ok((l.path, l.hub.unwrap()))
    }

    #[test]
    fn revisions_resolve_through_refs_or_as_commits() {
        let tmp = cache();
        let snaps = tmp.path().join("models--org--name/snapshots");
        let (path, hub) = resolved(tmp.path(), "org/name").unwrap();
        assert_eq!((path, hub.revision, hub.commit.as_str()), (snaps.join(C1), None, C1));
        let (path, hub) = resolved(tmp.path(), "org/name@v2").unwrap();
        assert_eq!((path, hub.revision.as_deref(), hub.commit.as_str()), (snaps.join(C2), Some("v2"), C2));
        assert_eq!(resolved(tmp.path(), "org/name@refs/pr/1").unwrap().1.commit, C2);
        let (path, hub) = resolved(tmp.path(), &format!("org/name@{C2}")).unwrap();
        assert_eq!((path, hub.commit.as_str()), (snaps.join(C2), C2));
    }

    #[test]
    fn what_the_cache_lacks_is_an_error_with_the_download_command() {
        let tmp = cache();
        let err = |s: &str| format!("{:#}", resolve(&id(s), tmp.path()).unwrap_err());
        let e = err("org/other");
        assert!(e.contains("`hf download org/other`") && e.contains("models--org--other"), "{e}");
        let e = err("org/other@v1");
        assert!(e.contains("`hf download org/other --revision v1`"), "{e}");
        let e = err("org/name@v3");
        assert!(e.contains("no refs/v3") && e.contains("`hf download org/name --revision v3`"), "{e}");
        let e = err("org/name@gone");
        assert!(e.contains("no snapshots/ffff") && e.contains("--revision gone"), "{e}");
        let e = err("org/name@fedcba9876543210fedcba9876543210fedcba98");
        assert!(e.contains("no snapshots/fedcba") && e.contains("--revision fedcba"), "{e}");
        let e = err("org/name@junk");
        assert!(e.contains("names no commit"), "{e}");
        std::fs::remove_file(tmp.path().join("models--org--name/refs/main")).unwrap();
        let e = err("org/name");
        assert!(e.contains("no refs/main") && e.contains("`hf download org/name`"), "{e}");
    }

    #[test]
    fn an_existing_path_wins_over_an_id() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("org/name");
        std::fs::create_dir_all(&dir).unwrap();
        let l = locate(&dir).unwrap();
        assert_eq!((l.path, l.hub), (dir, None));
        // Not an id and not there: said to be missing.
        let e = locate(Path::new("./surely/not-here")).unwrap_err().to_string();
        assert_eq!(e, "./surely/not-here: no such file or directory");
    }
}
