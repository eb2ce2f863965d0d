//! The readable verify report: one row per tensor, failures first, a summary line last. Columns
//! follow the published correlation/rel-err and norm-offset tables so figures compare line by line;
//! `columns.rs` defines them, for the page's tables too.

use super::base::BaseLayout;
use super::columns::{self, CodedLine, Column, Content, TextLayout};
use super::findings::{Finding, VerifyReport};
use crate::text::escape_controls;
use std::fmt::Write;

/// One table: its title, a header line, and a line per row; the report lists tensors, never the
/// experts of a stack.
fn table<R: Finding>(s: &mut String, title: &str, columns: &[Column<R>], rows: &[R]) {
    let shown: Vec<(&Column<R>, TextLayout)> =
        columns.iter().filter(|c| c.on_tensor_rows()).filter_map(|c| Some((c, c.text?))).collect();
    let _ = writeln!(s, "\n{title}");
    for &(c, layout) in &shown {
        pad(s, layout, c.head);
    }
    s.push('\n');
    for row in rows {
        for &(c, layout) in &shown {
            pad(s, layout, &cell(&c.content, row, layout.signed));
        }
        s.push('\n');
    }
}

fn pad(s: &mut String, layout: TextLayout, v: &str) {
    let TextLayout { gap, width, left, .. } = layout;
    let _ = if left { write!(s, "{:gap$}{v:<width$}", "") } else { write!(s, "{:gap$}{v:>width$}", "") };
}

fn cell<R: Finding>(content: &Content<R>, row: &R, signed: bool) -> String {
    match content {
        Content::Name(name) => escape_controls(name(row)).into_owned(),
        Content::Figure { digits, value } => match value(row) {
            Some(x) if signed => format!("{x:+.digits$}"),
            Some(x) => format!("{x:.digits$}"),
            None => "-".into(),
        },
        Content::Fraction(get) => {
            let f = get(row);
            format!("{}/{}", f.part, f.whole)
        }
        Content::Words(words) => escape_controls(&words(row)).into_owned(),
        Content::Verdict => verdict(row.failures()),
    }
}

/// "ok", or the failures of a row.
fn verdict(failures: &[String]) -> String {
    if failures.is_empty() {
        "ok".into()
    } else {
        format!("FAIL: {}", escape_controls(&failures.join("; ")))
    }
}

pub fn render(r: &VerifyReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "verify {} against {} ({} layout{}; decoder {}{})",
        crate::checkpoint::hub::described(&r.input, r.input_hub.as_ref()),
        crate::checkpoint::hub::described(&r.base, r.base_hub.as_ref()),
        match r.base_layout {
            BaseLayout::HuggingFace => "Hugging Face",
            BaseLayout::Mlx => "MLX",
        },
        if r.base_fp8 { ", fp8" } else { "" },
        r.decoder,
        r.sampled_blocks.map_or(String::new(), |n| format!("; {n} sampled blocks per tensor")),
    );
    if !r.coded.is_empty() {
        let lines: Vec<CodedLine> = r.coded.iter().map(CodedLine::tensor).collect();
        let title = "coded linears (figures over live channels; ratio = rel err / (2^-K·√(live/all)))";
        table(&mut s, title, &columns::coded(), &lines);
    }
    if !r.int8.is_empty() {
        table(&mut s, "int8 pairs", &columns::int8(), &r.int8);
    }
    if !r.norms.is_empty() {
        table(&mut s, "norm offsets", &columns::norms(), &r.norms);
    }
    if !r.missing_in_base.is_empty() {
        let _ = writeln!(
            s,
            "\nnot in the base model ({}): {}",
            r.missing_in_base.len(),
            escape_controls(&r.missing_in_base.join(", "))
        );
    }
    for p in &r.problems {
        let _ = writeln!(s, "\nFAIL: {}", escape_controls(p));
    }
    let _ = writeln!(
        s,
        "\n{}: {} checked, {} failed ({} coded, {} int8, {} norms)",
        if r.passed { "PASS" } else { "FAIL" },
        r.checked,
        r.failed,
        r.coded.len(),
        r.int8.len(),
        r.norms.len()
    );
    s
}
