//! `verify --html FILE`: the report as one self-contained page. Charts are inline SVG drawn here,
//! styles are inline, and the only script sorts the tables; a Content-Security-Policy that names the
//! style and script by their SHA-256 forbids everything else (no network, no injected script even if
//! a hostile tensor name got past the escaping). Every string from the checkpoints (tensor names,
//! messages, paths) is escaped.
//!
//! This module lays out the page: the verdict, the run's facts and its failures, then the charts
//! (`charts.rs`, drawn with `svg.rs`) and the tables (`tables.rs`).

mod charts;
mod csp;
mod escape;
mod svg;
mod tables;

use super::findings::{CodedRow, VerifyReport};
use super::names::{kind_of, kind_rank, layer_of};
use super::BaseLayout;
use anyhow::{Context, Result};
use escape::Esc;
use std::fmt::Write;
use std::path::Path;

/// Writes the page to `path` (checked by `output::file::check_destination` before the checks
/// ran) atomically: a temporary file in the same directory, renamed over `path` once complete.
pub fn write_html(report: &VerifyReport, path: &Path) -> Result<()> {
    crate::output::file::write_whole(path, render_html(report).as_bytes())
        .with_context(|| format!("writing the HTML report {}", path.display()))
}

/// The report as one self-contained HTML page.
pub fn render_html(r: &VerifyReport) -> String {
    let mut s = String::with_capacity(64 << 10);
    let verdict = if r.passed { "PASS" } else { "FAIL" };
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{}\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{verdict}: escha-convert verify {}</title>\n<style>{}</style></head>\n<body><main>\n",
        csp::policy(),
        Esc(&r.input),
        csp::STYLE
    );
    summary(&mut s, r);
    failures(&mut s, r);

    charts::layer_charts(&mut s, r);
    let stacks = moe_stacks(r);
    if !stacks.is_empty() {
        charts::expert_section(&mut s, r, &stacks);
    }
    if !r.norms.is_empty() {
        charts::norm_section(&mut s, r);
    }
    tables::all(&mut s, r, &stacks);
    let _ = write!(s, "</main>\n<script>{}</script>\n</body></html>\n", csp::SCRIPT);
    s
}

/// The verdict with the counts and the worst figures, then what was compared with what.
fn summary(s: &mut String, r: &VerifyReport) {
    let verdict = if r.passed { "PASS" } else { "FAIL" };
    let worst = r.coded.iter().filter_map(|c| Some((c.figures.ratio?, &c.tensor))).max_by(|a, b| a.0.total_cmp(&b.0));
    let lowest = r.coded.iter().filter_map(|c| Some((c.figures.corr?, &c.tensor))).min_by(|a, b| a.0.total_cmp(&b.0));
    let _ = write!(
        s,
        "<h1>escha-convert verify</h1>\n<section class=\"verdict-box {}\" id=\"verdict\"><div class=\"badge\">{verdict}</div>\
         <div><div class=\"counts\"><span><b>{}</b> checked</span><span><b>{}</b> failed</span>\
         <span><b>{}</b> coded</span><span><b>{}</b> int8</span><span><b>{}</b> norms</span>\
         <span><b>{}</b> not in the base</span></div>",
        if r.passed { "pass" } else { "fail" },
        r.checked,
        r.failed,
        r.coded.len(),
        r.int8.len(),
        r.norms.len(),
        r.missing_in_base.len()
    );
    if let Some((v, t)) = worst {
        let _ = write!(s, "<div>highest Shannon ratio <b>{v:.3}</b> (<code>{}</code>)</div>", Esc(t));
    }
    if let Some((v, t)) = lowest {
        let _ = write!(s, "<div>lowest correlation <b>{v:.4}</b> (<code>{}</code>)</div>", Esc(t));
    }
    s.push_str("</div></section>\n<dl class=\"meta\">");
    let layout = match r.base_layout {
        BaseLayout::HuggingFace => "Hugging Face",
        BaseLayout::Mlx => "MLX",
    };
    let meta = [
        ("input", r.input.clone()),
        ("base", format!("{} ({layout} layout{})", r.base, if r.base_fp8 { ", fp8" } else { "" })),
        ("decoder", r.decoder.to_string()),
        (
            "coverage",
            r.sampled_blocks.map_or("whole tensors".into(), |n| format!("{n} sampled 128×128 blocks per tensor")),
        ),
        ("--max-ratio", format!("{}", r.max_ratio)),
        ("version", format!("escha-convert {}", env!("CARGO_PKG_VERSION"))),
    ];
    for (k, v) in meta {
        let _ = write!(s, "<dt>{}</dt><dd>{}</dd>", Esc(k), Esc(&v));
    }
    s.push_str("</dl>\n");
}

/// Failures first: the run's own, then the tensors', then what the base lacks.
fn failures(s: &mut String, r: &VerifyReport) {
    if !r.problems.is_empty() {
        s.push_str("<ul class=\"failures\">\n");
        for p in &r.problems {
            let _ = writeln!(s, "<li class=\"failtext\">{}</li>", Esc(p));
        }
        s.push_str("</ul>\n");
    }
    let mut failing: Vec<(&str, &str, &[String])> = Vec::new();
    failing.extend(
        r.coded.iter().filter(|c| !c.failures.is_empty()).map(|c| ("coded", c.tensor.as_str(), &c.failures[..])),
    );
    failing
        .extend(r.int8.iter().filter(|c| !c.failures.is_empty()).map(|c| ("int8", c.tensor.as_str(), &c.failures[..])));
    failing.extend(
        r.norms.iter().filter(|c| !c.failures.is_empty()).map(|c| ("norm", c.tensor.as_str(), &c.failures[..])),
    );
    let _ = writeln!(s, "<h2 id=\"failures\">Failing tensors ({})</h2>", failing.len());
    if failing.is_empty() {
        s.push_str("<p>None: every checked tensor agrees with the base.</p>\n");
    } else {
        // A stack can fail once per expert; the tables below hold the rest.
        const SHOWN: usize = 8;
        s.push_str("<ul class=\"failures\">\n");
        for (what, name, msgs) in failing {
            let _ = write!(s, "<li><code>{}</code> <span class=\"note\">({what})</span><ul>", Esc(name));
            for m in msgs.iter().take(SHOWN) {
                let _ = write!(s, "<li class=\"failtext\">{}</li>", Esc(m));
            }
            if msgs.len() > SHOWN {
                let _ = write!(s, "<li>… and {} more (in the tables below)</li>", msgs.len() - SHOWN);
            }
            s.push_str("</ul></li>\n");
        }
        s.push_str("</ul>\n");
    }
    if !r.missing_in_base.is_empty() {
        let _ = write!(s, "<h2 id=\"missing\">Not in the base model ({})</h2>\n<ul>", r.missing_in_base.len());
        for m in &r.missing_in_base {
            let _ = write!(s, "<li><code>{}</code></li>", Esc(m));
        }
        s.push_str("</ul>\n");
    }
}

/// The `MoE` stacks with experts checked, by layer, then by kind.
fn moe_stacks(r: &VerifyReport) -> Vec<&CodedRow> {
    let mut stacks: Vec<&CodedRow> =
        r.coded.iter().filter(|c| c.experts.is_some() && !c.per_expert.is_empty()).collect();
    stacks.sort_by_key(|c| (layer_of(&c.tensor).unwrap_or(usize::MAX), kind_rank(&kind_of(&c.tensor))));
    stacks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dense fixture's report with a name that closes the style and script elements.
    pub fn crafted() -> VerifyReport {
        let fixture = |name: &str| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name);
        let opts = crate::verify::VerifyOptions {
            only: vec!["*.layers.0.*".into()],
            sample: Some(1),
            threads: Some(1),
            ..crate::verify::VerifyOptions::new(fixture("dense"), fixture("dense-base"))
        };
        let mut r = crate::verify::verify(&opts, crate::codec::best_decoder()).unwrap();
        let hostile = "model.layers.1.mlp.</style></script><script>alert(1)</script>.weight";
        r.coded[0].tensor = hostile.into();
        r.coded[0].failures.push(hostile.into());
        r
    }

    #[test]
    fn the_mtp_head_is_not_charted_as_layer_0() {
        let mut r = crafted();
        let page = render_html(&r);
        assert!(!page.contains("of the MTP head, are in the table only"));
        r.coded[1].tensor = "mtp.layers.0.mlp.down_proj.weight".into();
        let page = render_html(&r);
        assert!(page.contains("1 coded tensors without a layer index, or of the MTP head, are in the table only"));
    }
}
