//! The page's sortable tables, one per kind of row, their columns as `verify::columns` defines
//! them. Every cell keeps its sort key in `data-v`; the script in `page.js` sorts by it.

use super::escape::Esc;
use crate::verify::columns::{self, CodedLine, Column, Content, Fraction};
use crate::verify::findings::{CodedRow, Finding, VerifyReport};
use std::fmt::Write;

/// Every table, after the heading that explains how to sort them.
pub fn all(s: &mut String, r: &VerifyReport, stacks: &[&CodedRow]) {
    s.push_str(
        "<h2 id=\"tables\">All figures</h2>\n<p class=\"note\">Click a column header (or focus it and press Enter) \
         to sort; again to reverse. Rows start failures first.</p>\n",
    );
    if !r.coded.is_empty() {
        let lines: Vec<CodedLine> = r.coded.iter().map(CodedLine::tensor).collect();
        let columns = columns::coded();
        let shown: Vec<_> = columns.iter().filter(|c| c.on_tensor_rows()).collect();
        table(s, "coded-table", "coded linears", &shown, &lines);
    }
    if !stacks.is_empty() {
        let n: usize = stacks.iter().map(|c| c.per_expert.len()).sum();
        let _ = writeln!(s, "<details><summary>Per-expert figures ({n} rows)</summary>");
        if !expert_table(s, stacks) {
            s.push_str("<p class=\"note\">Too many experts for one page; use --json for every figure.</p>\n");
        }
        s.push_str("</details>\n");
    }
    if !r.int8.is_empty() {
        table(s, "int8-table", "int8 pairs", &columns::int8().iter().collect::<Vec<_>>(), &r.int8);
    }
    if !r.norms.is_empty() {
        table(s, "norm-table", "norm offsets", &columns::norms().iter().collect::<Vec<_>>(), &r.norms);
    }
}

/// Per-expert rows: every expert of every stack, unless there are too many for one page.
fn expert_table(s: &mut String, stacks: &[&CodedRow]) -> bool {
    const MAX_ROWS: usize = 4000;
    if stacks.iter().map(|c| c.per_expert.len()).sum::<usize>() > MAX_ROWS {
        return false;
    }
    let lines: Vec<CodedLine> =
        stacks.iter().flat_map(|c| c.per_expert.iter().map(|e| CodedLine::expert(c, e))).collect();
    let columns = columns::coded();
    let shown: Vec<_> = columns.iter().filter(|c| c.on_expert_rows()).collect();
    table(s, "expert-table", "experts of the MoE stacks", &shown, &lines);
    true
}

fn table<R: Finding>(s: &mut String, id: &str, caption: &str, columns: &[&Column<R>], rows: &[R]) {
    let _ = write!(
        s,
        r#"<div class="tablewrap"><table class="sortable" id="{id}"><caption>{}</caption><thead><tr>"#,
        Esc(caption)
    );
    for c in columns {
        let class = match c.content {
            Content::Name(_) => r#" class="name""#,
            Content::Words(_) | Content::Verdict => r#" class="t""#,
            Content::Figure { .. } | Content::Fraction(_) => "",
        };
        let numeric = if class.is_empty() { " data-num" } else { "" };
        let _ = write!(s, r#"<th{class}{numeric} title="{}">{}</th>"#, Esc(c.hint), Esc(c.head));
    }
    s.push_str("</tr></thead><tbody>\n");
    for row in rows {
        s.push_str(if row.failures().is_empty() { "<tr>" } else { r#"<tr class="fail">"# });
        for c in columns {
            cell(s, &c.content, row);
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
}

fn cell<R: Finding>(s: &mut String, content: &Content<R>, row: &R) {
    match content {
        Content::Name(name) => name_cell(s, name(row)),
        Content::Figure { digits, value } => {
            let v = value(row);
            let key = v.filter(|x| x.is_finite()).map_or(String::new(), |x| x.to_string());
            let _ = write!(s, r#"<td data-v="{key}">{}</td>"#, figure(v, *digits));
        }
        Content::Fraction(get) => {
            let Fraction { part, whole, key } = get(row);
            let _ = write!(s, r#"<td data-v="{key}">{part}/{whole}</td>"#);
        }
        Content::Words(words) => {
            let _ = write!(s, r#"<td class="t">{}</td>"#, Esc(&words(row)));
        }
        Content::Verdict => match row.failures() {
            [] => s.push_str(r#"<td class="verdict">ok</td>"#),
            failures => {
                let _ = write!(s, r#"<td class="verdict failtext">FAIL: {}</td>"#, Esc(&failures.join("; ")));
            }
        },
    }
}

/// A figure as the page shows it: non-finite values as Rust writes them, none as a dash.
fn figure(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        Some(x) => format!("{x}"),
        None => "–".into(),
    }
}

/// A tensor name that wraps after its dots; `data-v` keeps the name for sorting.
fn name_cell(s: &mut String, name: &str) {
    let _ = write!(s, r#"<td class="name" data-v="{}">"#, Esc(name));
    for (i, part) in name.split('.').enumerate() {
        if i > 0 {
            s.push_str(".<wbr>");
        }
        let _ = write!(s, "{}", Esc(part));
    }
    s.push_str("</td>");
}
