//! The model card: `README.md` in OUT, in Hugging Face model-card form. YAML front matter for the
//! Hub (library, tags, base model and license when the input names them), then where the weights
//! come from and how they were made, and how to load them. It names the source by its directory
//! (or Hub repository) name, never by a path on the machine that ran the job.

use crate::checkpoint::{source_name, Checkpoint, HubSource};
use crate::layout::FormatCard;
use crate::text::escape_controls;
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

/// Everything the card says.
pub struct Card {
    /// The source's name: its Hub repository (from a cache snapshot) or directory name.
    pub source: String,
    /// The Hub revision (the snapshot's commit), when the input is a Hub id or a cache snapshot.
    pub revision: Option<String>,
    pub base_model: Option<String>,
    pub license: Option<String>,
    /// The command that made the output, paths reduced to their last component.
    pub command: String,
    pub format: FormatCard,
    /// One line each: what happened to biases, int8 layers and the MTP head.
    pub notes: Vec<(&'static str, String)>,
    /// The verify summary (Markdown), when the conversion was proved against a base model.
    pub verified: Option<String>,
}

/// The name and revision of a source given as `input`: the Hub id and the commit it resolved to
/// when it was given as an id, else [`source_name`] of its path.
pub fn source(input: &Path, hub: Option<&HubSource>) -> (String, Option<String>) {
    match hub {
        Some(h) => (h.id.clone(), Some(h.commit.clone())),
        None => source_name(input),
    }
}

/// The command-line argument that names the source again: `org/name@<commit>` for a Hub id or a
/// cache snapshot (what reads that very snapshot from the cache), else the directory's name.
pub fn source_arg(input: &Path, hub: Option<&HubSource>) -> String {
    match source(input, hub) {
        (name, Some(rev)) => format!("{name}@{rev}"),
        (name, None) => name,
    }
}

/// The base model the input names, if it names one as a Hub id (`org/name`): in its card's front
/// matter, `config.json` or `quantize_config.json`.
pub fn base_model(ck: &Checkpoint) -> Option<String> {
    let from_card = ck.card_front_matter.as_deref().and_then(|fm| front_matter_value(fm, "base_model"));
    let keys = ["base_model", "base_model_name_or_path", "model_name_or_path", "_name_or_path"];
    let configs = [
        ck.config.as_ref(),
        ck.config.as_ref().and_then(|c| c.get("quantization_config")),
        ck.quantize_config.as_ref(),
    ];
    let from_config = configs
        .into_iter()
        .flatten()
        .flat_map(|c| keys.iter().filter_map(|k| c.get(*k).and_then(Value::as_str)))
        .map(String::from);
    from_card.into_iter().chain(from_config).find(|id| is_hub_id(id))
}

/// The input's license, from its card's front matter.
pub fn license(ck: &Checkpoint) -> Option<String> {
    ck.card_front_matter.as_deref().and_then(|fm| front_matter_value(fm, "license"))
}

/// `org/name`, and nothing that could be a local path.
fn is_hub_id(s: &str) -> bool {
    crate::checkpoint::hub::is_repo_id(s)
}

/// A scalar `key: value` of YAML front matter (or the first item of a list under `key`).
fn front_matter_value(fm: &str, key: &str) -> Option<String> {
    let mut lines = fm.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix(key).and_then(|r| r.strip_prefix(':')) else { continue };
        let value = match rest.trim() {
            "" => lines.next()?.trim().strip_prefix("- ")?.trim(),
            v => v,
        };
        return Some(value.trim_matches(['"', '\'']).to_string()).filter(|v| !v.is_empty());
    }
    None
}

/// `s` as Markdown text: what Markdown or HTML would act on is escaped, control characters are
/// written as escapes, so a directory name cannot add markup, links or HTML to the card.
fn md_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in escape_controls(s).chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '~' | '#' | '!' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// `s` as a Markdown code span that no backtick inside it can end (its fence is longer than any
/// run of backticks in it); in a table cell a `|` is escaped, which the table removes again.
pub fn md_code(s: &str, in_table: bool) -> String {
    let mut text = escape_controls(s).into_owned();
    if in_table {
        text = text.replace('|', "\\|");
    }
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if text.starts_with('`') || text.ends_with('`') { " " } else { "" };
    format!("{fence}{pad}{text}{pad}{fence}")
}

/// A YAML scalar, quoted.
fn yaml(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

impl Card {
    pub fn render(&self) -> String {
        let mut s = String::from("---\n");
        let _ = writeln!(s, "library_name: {}", self.format.library);
        if let Some(b) = &self.base_model {
            let _ = writeln!(s, "base_model: {}", yaml(b));
        }
        if let Some(l) = &self.license {
            let _ = writeln!(s, "license: {}", yaml(l));
        }
        s.push_str("tags:\n");
        for t in
            ["escha", "exl3", "escha-convert"].iter().map(|t| (*t).to_string()).chain(self.format.tags.iter().cloned())
        {
            let _ = writeln!(s, "- {}", yaml(&t));
        }
        s.push_str("---\n\n");
        let _ = writeln!(s, "# {} ({})\n", md_text(&self.source), self.format.tags.join(", "));
        let revision = self.revision.as_ref().map_or(String::new(), |r| format!(" at revision {}", md_code(r, false)));
        let _ = writeln!(
            s,
            "Converted from the Escha-W2 (EXL3 trellis) checkpoint {}{revision} by escha-convert {}: every \
             trellis tile decoded exactly, channel scales folded in, each weight rounded once.\n",
            md_code(&self.source, false),
            env!("CARGO_PKG_VERSION")
        );
        s.push_str("| | |\n|---|---|\n");
        let _ = writeln!(s, "| command | {} |", md_code(&self.command, true));
        let _ = writeln!(s, "| format | {} |", self.format.description);
        for (what, note) in &self.notes {
            let _ = writeln!(s, "| {what} | {note} |");
        }
        if let Some(v) = &self.verified {
            let _ = writeln!(s, "| verified | {v} |");
        }
        let _ = write!(s, "\n## How to load\n\n{}", self.format.how_to_load);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_and_front_matter() {
        assert!(is_hub_id("Qwen/Qwen3.5-27B"));
        assert!(!is_hub_id("/home/me/models/qwen") && !is_hub_id("./qwen/x") && !is_hub_id("qwen"));
        let fm = "license: apache-2.0\nbase_model:\n- Qwen/Qwen3.5-27B\ntags:\n- x";
        assert_eq!(front_matter_value(fm, "license").as_deref(), Some("apache-2.0"));
        assert_eq!(front_matter_value(fm, "base_model").as_deref(), Some("Qwen/Qwen3.5-27B"));
    }

    #[test]
    fn names_cannot_add_markup() {
        assert_eq!(md_code("a`b", false), "``a`b``");
        assert_eq!(md_code("`x", false), "`` `x ``");
        assert_eq!(md_code("a|b", true), "`a\\|b`");
        assert_eq!(md_text("<img src=x onerror=alert(1)>"), "&lt;img src=x onerror=alert(1)&gt;");
        assert_eq!(md_text("[x](y)\n"), "\\[x\\](y)\\\\n");
    }

    #[test]
    fn hub_cache_snapshots_are_named_by_repository() {
        let tmp = tempfile::tempdir().unwrap();
        let snap = tmp.path().join("models--EschaLabs--Escha-W2-27B/snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        assert_eq!(source_name(&snap), ("EschaLabs/Escha-W2-27B".into(), Some("abc123".into())));
        assert_eq!(source_name(tmp.path()).1, None);
        assert_eq!(source_arg(&snap, None), "EschaLabs/Escha-W2-27B@abc123");
        let hub = HubSource { id: "o/n".into(), revision: None, commit: "c".repeat(40) };
        assert_eq!(source(tmp.path(), Some(&hub)), ("o/n".into(), Some("c".repeat(40))));
        assert_eq!(source_arg(tmp.path(), Some(&hub)), format!("o/n@{}", "c".repeat(40)));
    }
}
