//! `verify --html FILE`: the report as one self-contained page. Charts are inline SVG drawn here,
//! styles are inline, and the only script sorts the tables; a Content-Security-Policy that names the
//! style and script by their SHA-256 forbids everything else (no network, no injected script even if
//! a hostile tensor name got past the escaping). Every string from the checkpoints (tensor names,
//! messages, paths) is escaped.

use super::findings::{CodedFigures, CodedRow, VerifyReport};
use super::options::NORM_MATCH;
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::fmt::{self, Display, Write};
use std::path::Path;

/// Okabe–Ito: distinguishable with every common colour-vision deficiency.
const PALETTE: [&str; 8] = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442"];
const SHAPES: usize = 5;
const FAIL: &str = "#D55E00";
const INK: &str = "#1a1a1a";
const GRID: &str = "#e3e3e3";
const MUTED: &str = "#666666";

/// Writes the page to `path` (checked by `output::file::check_destination` before the checks
/// ran) atomically: a temporary file in the same directory, renamed over `path` once complete.
pub fn write_html(report: &VerifyReport, path: &Path) -> Result<()> {
    crate::output::file::write_whole(path, render_html(report).as_bytes())
        .with_context(|| format!("writing the HTML report {}", path.display()))
}

/// HTML-escapes a string for text and attribute values.
struct Esc<'a>(&'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '&' => f.write_str("&amp;")?,
                '<' => f.write_str("&lt;")?,
                '>' => f.write_str("&gt;")?,
                '"' => f.write_str("&quot;")?,
                '\'' => f.write_str("&#39;")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        Some(x) => format!("{x}"),
        None => "–".into(),
    }
}

/// The layer index of `…layers.N.…`.
fn layer_of(name: &str) -> Option<usize> {
    let mut rest = name;
    while let Some(i) = rest.find("layers.") {
        let boundary = i == 0 || rest.as_bytes()[i - 1] == b'.';
        let tail = &rest[i + 7..];
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        if boundary && digits > 0 && matches!(tail.as_bytes().get(digits), None | Some(b'.')) {
            return tail[..digits].parse().ok();
        }
        rest = &rest[i + 7..];
    }
    None
}

/// The projection kind: what follows `layers.N.<block>.` without `.weight` (`q_proj`,
/// `experts.gate_up_proj`, `shared_expert.up_proj`, …); the whole name when there is no layer.
fn kind_of(name: &str) -> String {
    let name = name.strip_suffix(".weight").unwrap_or(name);
    let Some(layer) = layer_of(name) else { return name.to_string() };
    let marker = format!("layers.{layer}.");
    let rest = name.find(&marker).map_or(name, |i| &name[i + marker.len()..]);
    match rest.split_once('.') {
        Some((_, inner)) => inner.to_string(),
        None => rest.to_string(),
    }
}

/// A short row label: `L3 self_attn.q_norm` for layer tensors (`MTP L0 input_layernorm` for the
/// MTP head's, which are not the model's layer 0), the name without `.weight` otherwise.
fn short_label(name: &str) -> String {
    let trimmed = name.strip_suffix(".weight").unwrap_or(name);
    let head = if crate::layout::mtp::is_mtp(trimmed) { "MTP " } else { "" };
    let label = match layer_of(trimmed) {
        Some(l) => {
            let marker = format!("layers.{l}.");
            match trimmed.find(&marker) {
                Some(i) => format!("{head}L{l} {}", &trimmed[i + marker.len()..]),
                None => trimmed.to_string(),
            }
        }
        None => trimmed.to_string(),
    };
    if label.chars().count() > 44 {
        let head: String = label.chars().take(43).collect();
        format!("{head}…")
    } else {
        label
    }
}

const KIND_ORDER: [&str; 18] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_b",
    "in_proj_a",
    "out_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "experts.gate_up_proj",
    "experts.down_proj",
    "shared_expert.gate_proj",
    "shared_expert.up_proj",
    "shared_expert.down_proj",
    "shared_expert_gate",
];

fn kind_rank(kind: &str) -> (usize, String) {
    (KIND_ORDER.iter().position(|k| *k == kind).unwrap_or(KIND_ORDER.len()), kind.to_string())
}

// ---------------------------------------------------------------------------------------------
// SVG helpers

fn f1(v: f64) -> String {
    format!("{v:.1}")
}

/// Roughly `target` round tick values (1, 2 or 5 × 10^k apart) inside [lo, hi], and their decimals.
fn ticks(lo: f64, hi: f64, target: usize) -> (Vec<f64>, usize) {
    let span = (hi - lo).max(1e-12);
    let raw = span / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let digits = (-step.log10().floor()).max(0.0) as usize;
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    ((first..=last).map(|i| i as f64 * step).collect(), digits)
}

/// A value range with a margin, over `values` and the `always` references.
fn range_of(values: impl IntoIterator<Item = f64>, always: &[f64]) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.into_iter().chain(always.iter().copied()).filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.06).max(1e-3);
    (lo - pad, hi + pad)
}

#[derive(Clone, Copy)]
struct Scale {
    lo: f64,
    hi: f64,
    p0: f64,
    p1: f64,
}

impl Scale {
    fn at(&self, v: f64) -> f64 {
        let t = ((v - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0);
        self.p0 + t * (self.p1 - self.p0)
    }
    fn contains(&self, v: f64) -> bool {
        v >= self.lo && v <= self.hi
    }
}

/// One marker; `shape` 0 circle, 1 square, 2 triangle, 3 diamond, 4 inverted triangle.
#[allow(clippy::too_many_arguments)]
fn marker(s: &mut String, shape: usize, x: f64, y: f64, r: f64, fill: &str, stroke: &str, sw: f64, title: &str) {
    let paint = format!(r#"fill="{fill}" stroke="{stroke}" stroke-width="{sw}""#);
    let _ = match shape % SHAPES {
        0 => write!(s, r#"<circle cx="{}" cy="{}" r="{r:.1}" {paint}>"#, f1(x), f1(y)),
        1 => {
            let h = r * 0.9;
            write!(
                s,
                r#"<rect x="{}" y="{}" width="{}" height="{}" {paint}>"#,
                f1(x - h),
                f1(y - h),
                f1(2.0 * h),
                f1(2.0 * h)
            )
        }
        2 => write!(
            s,
            r#"<path d="M{} {}L{} {}L{} {}Z" {paint}>"#,
            f1(x),
            f1(y - 1.2 * r),
            f1(x + 1.1 * r),
            f1(y + 0.8 * r),
            f1(x - 1.1 * r),
            f1(y + 0.8 * r)
        ),
        3 => write!(
            s,
            r#"<path d="M{} {}L{} {}L{} {}L{} {}Z" {paint}>"#,
            f1(x),
            f1(y - 1.25 * r),
            f1(x + 1.25 * r),
            f1(y),
            f1(x),
            f1(y + 1.25 * r),
            f1(x - 1.25 * r),
            f1(y)
        ),
        _ => write!(
            s,
            r#"<path d="M{} {}L{} {}L{} {}Z" {paint}>"#,
            f1(x),
            f1(y + 1.2 * r),
            f1(x + 1.1 * r),
            f1(y - 0.8 * r),
            f1(x - 1.1 * r),
            f1(y - 0.8 * r)
        ),
    };
    let tag = match shape % SHAPES {
        0 => "circle",
        1 => "rect",
        _ => "path",
    };
    let _ = write!(s, "<title>{}</title></{tag}>", Esc(title));
}

#[allow(clippy::too_many_arguments)]
fn line(s: &mut String, x0: f64, y0: f64, x1: f64, y1: f64, stroke: &str, width: f64, dash: &str) {
    let dash = if dash.is_empty() { String::new() } else { format!(r#" stroke-dasharray="{dash}""#) };
    let _ = write!(
        s,
        r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{stroke}" stroke-width="{width}"{dash}/>"#,
        f1(x0),
        f1(y0),
        f1(x1),
        f1(y1)
    );
}

fn text(s: &mut String, x: f64, y: f64, anchor: &str, class: &str, content: &str) {
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="{anchor}" class="{class}">{}</text>"#,
        f1(x),
        f1(y),
        Esc(content)
    );
}

fn svg_open(s: &mut String, w: f64, h: f64, label: &str) {
    let _ = write!(s, r#"<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{}">"#, Esc(label));
}

/// A horizontal reference line on a value axis.
struct RefLine {
    value: f64,
    label: String,
    colour: &'static str,
    dash: &'static str,
}

/// Value-axis grid, ticks and labels along y.
fn y_axis(s: &mut String, y: Scale, x0: f64, x1: f64, label: &str) {
    let (ts, digits) = ticks(y.lo, y.hi, 6);
    for t in ts {
        let py = y.at(t);
        line(s, x0, py, x1, py, GRID, 1.0, "");
        text(s, x0 - 6.0, py + 4.0, "end", "tick", &format!("{t:.digits$}"));
    }
    let mid = f64::midpoint(y.p0, y.p1);
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" class="axis" transform="rotate(-90 {} {})">{}</text>"#,
        f1(x0 - 50.0),
        f1(mid),
        f1(x0 - 50.0),
        f1(mid),
        Esc(label)
    );
}

/// Value-axis grid, ticks and labels along x (for the row charts).
fn x_axis(s: &mut String, x: Scale, y0: f64, y1: f64, label: &str) {
    let (ts, digits) = ticks(x.lo, x.hi, 5);
    for t in ts {
        let px = x.at(t);
        line(s, px, y0, px, y1, GRID, 1.0, "");
        text(s, px, y1 + 14.0, "middle", "tick", &format!("{t:.digits$}"));
    }
    line(s, x.p0, y1, x.p1, y1, MUTED, 1.0, "");
    text(s, f64::midpoint(x.p0, x.p1), y1 + 32.0, "middle", "axis", label);
}

// ---------------------------------------------------------------------------------------------
// Charts

struct Series {
    kind: String,
    colour: &'static str,
    shape: usize,
}

fn series_for(rows: &[&CodedRow]) -> Vec<Series> {
    let kinds: BTreeSet<(usize, String)> = rows.iter().map(|r| kind_rank(&kind_of(&r.tensor))).collect();
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, (_, kind))| Series { kind, colour: PALETTE[i % PALETTE.len()], shape: i % SHAPES })
        .collect()
}

struct LayerPoint<'a> {
    series: usize,
    layer: usize,
    value: f64,
    tensor: &'a str,
    fail: bool,
}

/// A value per layer, one series per projection kind, dodged within each layer's band.
fn layer_chart(
    s: &mut String,
    label: &str,
    y_label: &str,
    series: &[Series],
    pts: &[LayerPoint],
    refs: &[RefLine],
    (lo, hi): (f64, f64),
) {
    const W: f64 = 1100.0;
    let (left, right, top) = (72.0, 840.0, 16.0);
    let legend_rows = series.len() + refs.len();
    let h = (top + 24.0 + 19.0 * legend_rows as f64).max(380.0);
    let bottom = h - 50.0;
    svg_open(s, W, h, label);
    let layers = pts.iter().map(|p| p.layer).max().map_or(1, |m| m + 1);
    let band = (right - left) / layers as f64;
    let y = Scale { lo, hi, p0: bottom, p1: top };
    // Alternate layer bands, then the grid.
    for l in (1..layers).step_by(2) {
        let _ = write!(
            s,
            r##"<rect x="{}" y="{top}" width="{}" height="{}" fill="#f6f6f6"/>"##,
            f1(left + l as f64 * band),
            f1(band),
            f1(bottom - top)
        );
    }
    y_axis(s, y, left, right, y_label);
    let every = ticks(0.0, layers as f64, 16).0.get(1).map_or(1, |t| (*t as usize).max(1));
    for l in (0..layers).step_by(every) {
        text(s, left + (l as f64 + 0.5) * band, bottom + 16.0, "middle", "tick", &l.to_string());
    }
    line(s, left, bottom, right, bottom, MUTED, 1.0, "");
    line(s, left, top, left, bottom, MUTED, 1.0, "");
    text(s, f64::midpoint(left, right), bottom + 38.0, "middle", "axis", "layer index (layers.N)");
    for r in refs {
        if y.contains(r.value) {
            let py = y.at(r.value);
            line(s, left, py, right, py, r.colour, 1.6, r.dash);
        }
    }
    // Series: a thin line through the layers, then the markers.
    let used: Vec<usize> = (0..series.len()).filter(|i| pts.iter().any(|p| p.series == *i)).collect();
    let slot = |i: usize| used.iter().position(|u| *u == i).unwrap_or(0) as f64;
    let step = (band * 0.7 / used.len().max(1) as f64).min(9.0);
    let x_of = |p: &LayerPoint| {
        left + (p.layer as f64 + 0.5) * band + (slot(p.series) - (used.len() as f64 - 1.0) / 2.0) * step
    };
    for &i in &used {
        let mut mine: Vec<&LayerPoint> = pts.iter().filter(|p| p.series == i).collect();
        mine.sort_by_key(|p| p.layer);
        if mine.len() > 1 {
            let d: Vec<String> = mine.iter().map(|p| format!("{},{}", f1(x_of(p)), f1(y.at(p.value)))).collect();
            let _ = write!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.3" stroke-opacity="0.55"/>"#,
                d.join(" "),
                series[i].colour
            );
        }
    }
    for p in pts {
        let se = &series[p.series];
        let (px, py) = (x_of(p), y.at(p.value));
        let off = if y.contains(p.value) { "" } else { " (off the scale)" };
        let verdict = if p.fail { " — FAIL" } else { "" };
        let title = format!("{}\n{} = {:.4}{off}{verdict}", p.tensor, y_label, p.value);
        if p.fail {
            let _ = write!(
                s,
                r#"<circle cx="{}" cy="{}" r="9" fill="none" stroke="{FAIL}" stroke-width="2.5"/>"#,
                f1(px),
                f1(py)
            );
        }
        marker(s, se.shape, px, py, 5.0, se.colour, "#333333", 0.7, &title);
    }
    // Legend.
    let lx = right + 22.0;
    let mut ly = top + 10.0;
    for &i in &used {
        let se = &series[i];
        marker(s, se.shape, lx + 8.0, ly, 5.0, se.colour, "#333333", 0.7, &se.kind);
        text(s, lx + 22.0, ly + 4.0, "start", "legend", &se.kind);
        ly += 19.0;
    }
    for r in refs {
        line(s, lx, ly, lx + 16.0, ly, r.colour, 1.6, r.dash);
        text(s, lx + 22.0, ly + 4.0, "start", "legend", &r.label);
        ly += 19.0;
    }
    s.push_str("</svg>\n");
}

/// Five-number summary with the experts at the ends.
struct Spread {
    min: (f64, usize),
    q1: f64,
    median: f64,
    q3: f64,
    max: (f64, usize),
}

fn spread(values: &[(usize, f64)]) -> Option<Spread> {
    let mut v: Vec<(usize, f64)> = values.iter().copied().filter(|(_, x)| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.1.total_cmp(&b.1));
    let q = |p: f64| {
        let at = p * (v.len() - 1) as f64;
        let (i, t) = (at.floor() as usize, at.fract());
        v[i].1 + t * (v[(i + 1).min(v.len() - 1)].1 - v[i].1)
    };
    Some(Spread {
        min: (v[0].1, v[0].0),
        q1: q(0.25),
        median: q(0.5),
        q3: q(0.75),
        max: (v[v.len() - 1].1, v[v.len() - 1].0),
    })
}

/// Per-expert ratio and correlation of every `MoE` stack: whisker min–max, box between the
/// quartiles, median tick, a dot per expert, the pooled figure as a diamond.
fn expert_chart(s: &mut String, r: &VerifyReport, stacks: &[&CodedRow]) {
    const W: f64 = 1100.0;
    const ROW: f64 = 22.0;
    let (label_w, top) = (300.0, 44.0);
    let h = top + ROW * stacks.len() as f64 + 56.0;
    let bottom = top + ROW * stacks.len() as f64;
    let dots = stacks.iter().map(|c| c.per_expert.len()).sum::<usize>() <= 6000;
    let cap = r.max_ratio.max(1.0) * 4.0;
    let ratios =
        stacks.iter().flat_map(|c| c.per_expert.iter().map(|e| &e.figures).chain([&c.figures]).filter_map(|f| f.ratio));
    let (rlo, rhi) = range_of(ratios.map(|v| v.min(cap)), &[1.0]);
    let floors: BTreeSet<u64> = stacks.iter().map(|c| r.min_corr_for(c.k).to_bits()).collect();
    let floors: Vec<f64> = floors.into_iter().map(f64::from_bits).collect();
    let corrs =
        stacks.iter().flat_map(|c| c.per_expert.iter().map(|e| &e.figures).chain([&c.figures]).filter_map(|f| f.corr));
    let (clo, chi) = range_of(corrs, &[]);
    let panels = [
        (
            "Shannon ratio",
            Scale { lo: rlo.max(0.0), hi: rhi, p0: label_w + 10.0, p1: label_w + 380.0 },
            (|f: &CodedFigures| f.ratio) as fn(&CodedFigures) -> Option<f64>,
        ),
        (
            "element-wise correlation",
            Scale { lo: clo, hi: chi.min(1.0), p0: label_w + 420.0, p1: W - 20.0 },
            |f: &CodedFigures| f.corr,
        ),
    ];
    svg_open(s, W, h, "per-expert spread of the Shannon ratio and correlation for each MoE stack");
    for (i, c) in stacks.iter().enumerate() {
        let cy = top + ROW * (i as f64 + 0.5);
        if i % 2 == 1 {
            let _ =
                write!(s, r##"<rect x="0" y="{}" width="{W}" height="{ROW}" fill="#f6f6f6"/>"##, f1(cy - ROW / 2.0));
        }
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end" class="{}">{}<title>{}</title></text>"#,
            f1(label_w - 6.0),
            f1(cy + 4.0),
            if c.failures.is_empty() { "rowlabel" } else { "rowlabel failtext" },
            Esc(&short_label(&c.tensor)),
            Esc(&c.tensor)
        );
    }
    for (name, x, get) in panels {
        text(s, f64::midpoint(x.p0, x.p1), top - 24.0, "middle", "paneltitle", &format!("{name} per expert"));
        x_axis(s, x, top, bottom, name);
        let refs: Vec<(f64, &str, &str)> = if name.starts_with("Shannon") {
            vec![(1.0, "#444444", "5 3"), (r.max_ratio, FAIL, "8 4")]
        } else {
            floors.iter().map(|f| (*f, FAIL, "8 4")).collect()
        };
        let (mut below, mut above) = (Vec::new(), Vec::new());
        for (v, colour, dash) in refs {
            if x.contains(v) {
                line(s, x.at(v), top - 6.0, x.at(v), bottom, colour, 1.5, dash);
                text(s, x.at(v), top - 9.0, "middle", "reflabel", &format!("{v:?}"));
            } else if v < x.lo {
                below.push(format!("{v:?}"));
            } else {
                above.push(format!("{v:?}"));
            }
        }
        // Thresholds off the zoomed scale: say where they are.
        if !below.is_empty() {
            text(s, x.p0, top - 9.0, "start", "reflabel", &format!("← {}", below.join(", ")));
        }
        if !above.is_empty() {
            text(s, x.p1, top - 9.0, "end", "reflabel", &format!("{} →", above.join(", ")));
        }
        for (i, c) in stacks.iter().enumerate() {
            let cy = top + ROW * (i as f64 + 0.5);
            let bad: BTreeSet<usize> =
                c.per_expert.iter().filter(|e| !e.failures.is_empty()).map(|e| e.expert).collect();
            let values: Vec<(usize, f64)> =
                c.per_expert.iter().filter_map(|e| Some((e.expert, get(&e.figures)?))).collect();
            let Some(sp) = spread(&values) else { continue };
            let _ = write!(s, "<g><title>{}", Esc(&c.tensor));
            let _ = write!(
                s,
                "\n{name}: min {:.4} (expert {}), median {:.4}, max {:.4} (expert {}) over {} experts</title>",
                sp.min.0,
                sp.min.1,
                sp.median,
                sp.max.0,
                sp.max.1,
                values.len()
            );
            line(s, x.at(sp.min.0), cy, x.at(sp.max.0), cy, "#555555", 1.2, "");
            let _ = write!(
                s,
                r##"<rect x="{}" y="{}" width="{}" height="12" fill="#56B4E9" fill-opacity="0.35" stroke="#0072B2"/>"##,
                f1(x.at(sp.q1)),
                f1(cy - 6.0),
                f1((x.at(sp.q3) - x.at(sp.q1)).max(1.0))
            );
            line(s, x.at(sp.median), cy - 8.0, x.at(sp.median), cy + 8.0, INK, 2.0, "");
            s.push_str("</g>");
            for &(e, v) in &values {
                let failing = bad.contains(&e);
                if dots || failing {
                    let (r, fill) = if failing { (4.0, FAIL) } else { (2.2, "#0072B2") };
                    let title =
                        format!("{}\nexpert {e}: {name} {v:.4}{}", c.tensor, if failing { " — FAIL" } else { "" });
                    marker(s, 0, x.at(v), cy, r, fill, "none", 0.0, &title);
                }
            }
            if let Some(v) = get(&c.figures) {
                let title = format!("{}\nall experts pooled: {name} {v:.4}", c.tensor);
                marker(s, 3, x.at(v), cy, 4.5, "#ffffff", INK, 1.4, &title);
            }
        }
    }
    s.push_str("</svg>\n");
}

/// The norm-offset table as two dot panels: the means side by side, and |e − b| against
/// |e + 1 − b| with the match threshold.
fn norm_chart(s: &mut String, r: &VerifyReport) {
    const W: f64 = 1100.0;
    const ROW: f64 = 20.0;
    let (label_w, top) = (330.0, 44.0);
    let mut rows: Vec<_> = r.norms.iter().collect();
    rows.sort_by_key(|n| (n.failures.is_empty(), layer_of(&n.tensor).unwrap_or(usize::MAX), n.tensor.clone()));
    let bottom = top + ROW * rows.len() as f64;
    let h = bottom + 56.0;
    let (mlo, mhi) = range_of(rows.iter().flat_map(|n| [n.escha_mean, n.base_mean]), &[]);
    let (mlo, mhi) =
        if mhi - mlo < 0.2 { (f64::midpoint(mlo, mhi) - 0.1, f64::midpoint(mlo, mhi) + 0.1) } else { (mlo, mhi) };
    let (_, dhi) = range_of(rows.iter().flat_map(|n| [n.diff, n.diff_plus_one]), &[0.0, 1.0]);
    let means = Scale { lo: mlo, hi: mhi, p0: label_w + 10.0, p1: label_w + 300.0 };
    let diffs = Scale { lo: 0.0, hi: dhi, p0: label_w + 340.0, p1: label_w + 640.0 };
    let verdict_x = label_w + 660.0;
    svg_open(s, W, h, "norm offsets: escha and base means, |e − b| and |e + 1 − b| per norm");
    for (i, n) in rows.iter().enumerate() {
        let cy = top + ROW * (i as f64 + 0.5);
        let fail = !n.failures.is_empty();
        if fail || i % 2 == 1 {
            let fill = if fail { "#fbe3d6" } else { "#f6f6f6" };
            let _ = write!(s, r#"<rect x="0" y="{}" width="{W}" height="{ROW}" fill="{fill}"/>"#, f1(cy - ROW / 2.0));
        }
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end" class="{}">{}<title>{}</title></text>"#,
            f1(label_w - 6.0),
            f1(cy + 4.0),
            if fail { "rowlabel failtext" } else { "rowlabel" },
            Esc(&short_label(&n.tensor)),
            Esc(&n.tensor)
        );
        let v = if fail { format!("{} — FAIL", n.verdict) } else { n.verdict.to_string() };
        text(s, verdict_x, cy + 4.0, "start", if fail { "rowlabel failtext" } else { "rowlabel" }, &v);
    }
    text(s, f64::midpoint(means.p0, means.p1), top - 24.0, "middle", "paneltitle", "mean value");
    x_axis(s, means, top, bottom, "mean (escha ● / base ○)");
    text(s, f64::midpoint(diffs.p0, diffs.p1), top - 24.0, "middle", "paneltitle", "mean absolute difference");
    x_axis(s, diffs, top, bottom, "|e − b| ● / |e + 1 − b| ■");
    line(s, diffs.at(NORM_MATCH), top - 6.0, diffs.at(NORM_MATCH), bottom, "#444444", 1.4, "4 3");
    text(s, diffs.at(NORM_MATCH) + 3.0, top - 9.0, "start", "reflabel", &format!("match < {NORM_MATCH}"));
    text(s, verdict_x, top - 24.0, "start", "paneltitle", "matches");
    for (i, n) in rows.iter().enumerate() {
        let cy = top + ROW * (i as f64 + 0.5);
        let name = &n.tensor;
        marker(
            s,
            0,
            means.at(n.base_mean),
            cy,
            6.5,
            "none",
            "#E69F00",
            2.0,
            &format!("{name}\nbase mean {:.4}", n.base_mean),
        );
        marker(
            s,
            0,
            means.at(n.escha_mean),
            cy,
            3.5,
            "#0072B2",
            "none",
            0.0,
            &format!("{name}\nescha mean {:.4}", n.escha_mean),
        );
        marker(
            s,
            1,
            diffs.at(n.diff_plus_one),
            cy,
            4.5,
            "#E69F00",
            "#333333",
            0.6,
            &format!("{name}\n|e + 1 − b| {:.4}", n.diff_plus_one),
        );
        marker(s, 0, diffs.at(n.diff), cy, 4.0, "#0072B2", "#333333", 0.6, &format!("{name}\n|e − b| {:.4}", n.diff));
    }
    s.push_str("</svg>\n");
}

// ---------------------------------------------------------------------------------------------
// Tables

fn table_head(s: &mut String, id: &str, caption: &str, cols: &[(&str, bool, &str)]) {
    let _ = write!(
        s,
        r#"<div class="tablewrap"><table class="sortable" id="{id}"><caption>{}</caption><thead><tr>"#,
        Esc(caption)
    );
    for (head, numeric, hint) in cols {
        let class = match (*head, *numeric) {
            ("tensor", _) => r#" class="name""#,
            (_, false) => r#" class="t""#,
            _ => "",
        };
        let numeric = if *numeric { " data-num" } else { "" };
        let _ = write!(s, r#"<th{class}{numeric} title="{}">{}</th>"#, Esc(hint), Esc(head));
    }
    s.push_str("</tr></thead><tbody>\n");
}

fn td_num(s: &mut String, v: Option<f64>, digits: usize) {
    match v {
        Some(x) if x.is_finite() => {
            let _ = write!(s, r#"<td data-v="{x}">{}</td>"#, num(v, digits));
        }
        _ => {
            let _ = write!(s, r#"<td data-v="">{}</td>"#, num(v, digits));
        }
    }
}

fn td_int(s: &mut String, v: impl Display) {
    let _ = write!(s, r#"<td data-v="{v}">{v}</td>"#);
}

/// The overlap (sorted by violations) and pruned-channel cells.
fn td_counts(s: &mut String, f: &CodedFigures) {
    let ok = f.tiles_checked - f.overlap_violations.min(f.tiles_checked);
    let all = f.live_channels + f.pruned_channels;
    let _ = write!(s, r#"<td data-v="{}">{ok}/{}</td>"#, f.overlap_violations, f.tiles_checked);
    let _ = write!(s, r#"<td data-v="{}">{}/{all}</td>"#, f.pruned_channels, f.pruned_channels);
}

/// A tensor name that wraps after its dots; `data-v` keeps the name for sorting.
fn td_name(s: &mut String, name: &str) {
    let _ = write!(s, r#"<td class="name" data-v="{}">"#, Esc(name));
    for (i, part) in name.split('.').enumerate() {
        if i > 0 {
            s.push_str(".<wbr>");
        }
        let _ = write!(s, "{}", Esc(part));
    }
    s.push_str("</td>");
}

fn td_verdict(s: &mut String, failures: &[String]) {
    if failures.is_empty() {
        s.push_str(r#"<td class="verdict">ok</td>"#);
    } else {
        let _ = write!(s, r#"<td class="verdict failtext">FAIL: {}</td>"#, Esc(&failures.join("; ")));
    }
}

fn tr_open(s: &mut String, fail: bool) {
    s.push_str(if fail { r#"<tr class="fail">"# } else { "<tr>" });
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| sum / n as f64)
}

const CODED_COLS: [(&str, bool, &str); 15] = [
    ("tensor", false, "output tensor name"),
    ("layer", true, "layer index"),
    ("kind", false, "projection kind"),
    ("K", true, "bits per weight of the trellis code"),
    ("experts", true, "experts in the stack"),
    ("corr", true, "element-wise correlation with the base over live channels"),
    ("cosine", true, "cosine similarity with the base"),
    ("rel err", true, "relative Frobenius error over live channels"),
    ("bound", true, "Shannon bound 2^-K·√(live/all)"),
    ("ratio", true, "rel err / bound"),
    ("overlap", true, "tiles that keep the trellis overlap rule / tiles checked (sorts by violations)"),
    ("pruned", true, "pruned / all output channels"),
    ("|rout|~", true, "correlation of |rout| with the base row norms (mean over experts for stacks)"),
    ("|rin|~", true, "correlation of |rin| with the base column norms (mean over experts for stacks)"),
    ("inner σ", true, "RMS of the base in the inner domain (codebook RMS 1.2437 for 3INST/MCG)"),
];

fn coded_table(s: &mut String, r: &VerifyReport) {
    let mut cols = CODED_COLS.to_vec();
    cols.push(("verdict", false, "failures, if any"));
    table_head(s, "coded-table", "coded linears", &cols);
    for c in &r.coded {
        let f = &c.figures;
        let stacked = |get: fn(&CodedFigures) -> Option<f64>| match c.experts {
            Some(_) => mean(c.per_expert.iter().filter_map(|e| get(&e.figures))),
            None => get(f),
        };
        tr_open(s, !c.failures.is_empty());
        td_name(s, &c.tensor);
        td_num(s, layer_of(&c.tensor).map(|l| l as f64), 0);
        let _ = write!(s, r#"<td class="t">{}</td>"#, Esc(&kind_of(&c.tensor)));
        td_int(s, c.k);
        td_num(s, c.experts.map(|e| e as f64), 0);
        td_num(s, f.corr, 4);
        td_num(s, f.cosine, 4);
        td_num(s, f.rel_err, 4);
        td_num(s, Some(f.shannon_bound), 4);
        td_num(s, f.ratio, 3);
        td_counts(s, f);
        td_num(s, stacked(|e| e.corr_rout_row_norm), 4);
        td_num(s, stacked(|e| e.corr_rin_col_norm), 4);
        td_num(s, f.inner_std, 4);
        td_verdict(s, &c.failures);
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
}

/// Per-expert rows: every expert of every stack, unless there are too many for one page.
fn expert_table(s: &mut String, stacks: &[&CodedRow]) -> bool {
    const MAX_ROWS: usize = 4000;
    if stacks.iter().map(|c| c.per_expert.len()).sum::<usize>() > MAX_ROWS {
        return false;
    }
    let mut cols = vec![("tensor", false, "output tensor name"), ("expert", true, "expert index")];
    cols.extend(CODED_COLS[5..].iter().copied().filter(|c| c.0 != "inner σ"));
    cols.push(("verdict", false, "failures of this expert, if any"));
    table_head(s, "expert-table", "experts of the MoE stacks", &cols);
    for c in stacks {
        for e in &c.per_expert {
            let f = &e.figures;
            tr_open(s, !e.failures.is_empty());
            td_name(s, &c.tensor);
            td_num(s, Some(e.expert as f64), 0);
            td_num(s, f.corr, 4);
            td_num(s, f.cosine, 4);
            td_num(s, f.rel_err, 4);
            td_num(s, Some(f.shannon_bound), 4);
            td_num(s, f.ratio, 3);
            td_counts(s, f);
            td_num(s, f.corr_rout_row_norm, 4);
            td_num(s, f.corr_rin_col_norm, 4);
            td_verdict(s, &e.failures);
            s.push_str("</tr>\n");
        }
    }
    s.push_str("</tbody></table></div>\n");
    true
}

fn int8_table(s: &mut String, r: &VerifyReport) {
    let cols = [
        ("tensor", false, "output tensor name"),
        ("corr", true, "element-wise correlation with the base"),
        ("rel err", true, "relative Frobenius error"),
        ("verdict", false, "failures, if any"),
    ];
    table_head(s, "int8-table", "int8 pairs", &cols);
    for c in &r.int8 {
        tr_open(s, !c.failures.is_empty());
        td_name(s, &c.tensor);
        td_num(s, c.corr, 4);
        td_num(s, c.rel_err, 4);
        td_verdict(s, &c.failures);
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
}

fn norm_table(s: &mut String, r: &VerifyReport) {
    let cols = [
        ("tensor", false, "output tensor name"),
        ("kind", false, "norm convention"),
        ("escha", true, "mean of the stored norm"),
        ("base", true, "mean of the base norm"),
        ("|e−b|", true, "mean |escha − base|"),
        ("|e+1−b|", true, "mean |escha + 1 − base|"),
        ("matches", false, "which candidate matches"),
        ("verdict", false, "failures, if any"),
    ];
    table_head(s, "norm-table", "norm offsets", &cols);
    for n in &r.norms {
        tr_open(s, !n.failures.is_empty());
        td_name(s, &n.tensor);
        let _ = write!(s, r#"<td class="t">{}</td>"#, Esc(n.kind));
        td_num(s, Some(n.escha_mean), 3);
        td_num(s, Some(n.base_mean), 3);
        td_num(s, Some(n.diff), 3);
        td_num(s, Some(n.diff_plus_one), 3);
        let _ = write!(s, r#"<td class="t">{}</td>"#, Esc(n.verdict));
        td_verdict(s, &n.failures);
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
}

// ---------------------------------------------------------------------------------------------
// The page

const STYLE: &str = r#"
:root { color-scheme: light; }
body { margin: 0; background: #fff; color: #1a1a1a;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 18px 24px 60px; }
h1 { font-size: 20px; margin: 0 0 10px; }
h2 { font-size: 17px; margin: 30px 0 6px; padding-bottom: 3px; border-bottom: 1px solid #ddd; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; font-size: 12.5px; }
.verdict-box { display: flex; gap: 22px; align-items: center; border: 2px solid; border-radius: 6px; padding: 12px 18px; }
.verdict-box.pass { border-color: #0072B2; background: #eef5fb; }
.verdict-box.fail { border-color: #D55E00; background: #fdf0e9; }
.badge { font-size: 30px; font-weight: 700; letter-spacing: .05em; }
.pass .badge { color: #0072B2; }
.fail .badge { color: #B34700; }
.counts { display: flex; flex-wrap: wrap; gap: 4px 20px; }
.counts b { font-variant-numeric: tabular-nums; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 12px 0 0; }
dl.meta dt { color: #555; }
dl.meta dd { margin: 0; word-break: break-all; }
ul.failures { margin: 6px 0; padding-left: 20px; }
ul.failures li { margin: 3px 0; }
.failtext { color: #A33D00; font-weight: 600; }
p.note { color: #555; margin: 4px 0 8px; max-width: 900px; }
details > summary { cursor: pointer; font-weight: 600; margin: 6px 0; }
svg { display: block; width: 100%; height: auto; max-width: 1100px; font-family: inherit; }
svg .tick { font-size: 12px; fill: #444; }
svg .axis { font-size: 13px; fill: #222; }
svg .legend { font-size: 13px; fill: #222; }
svg .rowlabel { font-size: 12px; fill: #222; }
svg .rowlabel.failtext { fill: #A33D00; }
svg .paneltitle { font-size: 13px; font-weight: 600; fill: #222; }
svg .reflabel { font-size: 11px; fill: #444; }
.tablewrap { overflow: auto; max-height: 85vh; border: 1px solid #ddd; margin: 8px 0 18px; }
table { border-collapse: collapse; font-size: 12px; font-variant-numeric: tabular-nums; width: 100%; }
caption { text-align: left; font-weight: 600; padding: 6px 8px; }
th, td { padding: 3px 6px; border-bottom: 1px solid #e6e6e6; text-align: right; white-space: nowrap; }
th { position: sticky; top: 0; background: #f1f1f1; cursor: pointer; user-select: none; }
th:hover, th:focus { background: #e2ecf5; }
th[aria-sort=ascending]::after { content: " \25B2"; }
th[aria-sort=descending]::after { content: " \25BC"; }
th.name, td.name { text-align: left; white-space: normal; min-width: 250px; }
tbody tr:nth-child(even) td { background: #f8f8f8; }
th.t, td.t { text-align: left; }
td.verdict { text-align: left; white-space: normal; min-width: 60px; }
tbody tr.fail td { background: #fdf0e9; }
"#;

const SCRIPT: &str = r"
(function () {
  function key(row, i, numeric) {
    var c = row.cells[i];
    var v = c.hasAttribute('data-v') ? c.getAttribute('data-v') : c.textContent;
    return numeric ? (v === '' ? NaN : parseFloat(v)) : v;
  }
  function sortBy(table, i, th) {
    var numeric = th.hasAttribute('data-num');
    var asc = th.getAttribute('aria-sort') !== 'ascending';
    var heads = table.tHead.rows[0].cells;
    for (var j = 0; j < heads.length; j++) heads[j].removeAttribute('aria-sort');
    th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
    var body = table.tBodies[0];
    var rows = Array.prototype.map.call(body.rows, function (r, n) { return { r: r, k: key(r, i, numeric), n: n }; });
    rows.sort(function (a, b) {
      var d;
      if (numeric) {
        var an = isNaN(a.k), bn = isNaN(b.k);
        if (an || bn) return an === bn ? a.n - b.n : (an ? 1 : -1);
        d = a.k - b.k;
      } else {
        d = a.k.localeCompare(b.k, undefined, { numeric: true });
      }
      return d !== 0 ? (asc ? d : -d) : a.n - b.n;
    });
    var frag = document.createDocumentFragment();
    rows.forEach(function (x) { frag.appendChild(x.r); });
    body.appendChild(frag);
  }
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable'), function (t) {
    Array.prototype.forEach.call(t.tHead.rows[0].cells, function (th, i) {
      th.tabIndex = 0;
      th.addEventListener('click', function () { sortBy(t, i, th); });
      th.addEventListener('keydown', function (e) {
        if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); sortBy(t, i, th); }
      });
    });
  });
})();
";

/// The report as one self-contained HTML page.
pub fn render_html(r: &VerifyReport) -> String {
    let mut s = String::with_capacity(64 << 10);
    let verdict = if r.passed { "PASS" } else { "FAIL" };
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'sha256-{}'; \
         script-src 'sha256-{}'; img-src 'none'; base-uri 'none'; form-action 'none'\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{verdict}: escha-convert verify {}</title>\n<style>{STYLE}</style></head>\n<body><main>\n",
        base64(&sha256(STYLE.as_bytes())),
        base64(&sha256(SCRIPT.as_bytes())),
        Esc(&r.input)
    );

    // Verdict and counts.
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
        super::BaseLayout::HuggingFace => "Hugging Face",
        super::BaseLayout::Mlx => "MLX",
    };
    let mut meta = vec![
        ("input", r.input.clone()),
        ("base", format!("{} ({layout} layout{})", r.base, if r.base_fp8 { ", fp8" } else { "" })),
        ("decoder", r.decoder.to_string()),
        (
            "coverage",
            r.sampled_blocks.map_or("whole tensors".into(), |n| format!("{n} sampled 128×128 blocks per tensor")),
        ),
        ("--max-ratio", format!("{}", r.max_ratio)),
    ];
    meta.push(("version", format!("escha-convert {}", env!("CARGO_PKG_VERSION"))));
    for (k, v) in meta {
        let _ = write!(s, "<dt>{}</dt><dd>{}</dd>", Esc(k), Esc(&v));
    }
    s.push_str("</dl>\n");

    // Failures first: the run's own, then the tensors'.
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

    // Charts by layer: the model's layers; the MTP head's layer 0 is not the model's layer 0.
    let charted: Vec<&CodedRow> =
        r.coded.iter().filter(|c| layer_of(&c.tensor).is_some() && !crate::layout::mtp::is_mtp(&c.tensor)).collect();
    if !charted.is_empty() {
        let series = series_for(&charted);
        let index = |c: &CodedRow| {
            let k = kind_of(&c.tensor);
            series.iter().position(|se| se.kind == k).unwrap_or(0)
        };
        let points = |get: fn(&CodedFigures) -> Option<f64>| -> Vec<LayerPoint> {
            charted
                .iter()
                .filter_map(|c| {
                    Some(LayerPoint {
                        series: index(c),
                        layer: layer_of(&c.tensor)?,
                        value: get(&c.figures)?,
                        tensor: &c.tensor,
                        fail: !c.failures.is_empty(),
                    })
                })
                .collect()
        };
        let unlayered = r.coded.len() - charted.len();
        let note = if unlayered > 0 {
            format!(" {unlayered} coded tensors without a layer index, or of the MTP head, are in the table only.")
        } else {
            String::new()
        };

        s.push_str("<h2 id=\"ratio\">Shannon ratio by layer</h2>\n");
        let _ = writeln!(
            s,
            "<p class=\"note\">Relative error over live channels divided by the bound 2<sup>−K</sup>·√(live/all), \
             one series per projection kind. Below 1.0 is impossible for an honest decode against an independent \
             base; above --max-ratio ({}) fails. Failing tensors are ringed; hover a point for its tensor.{}</p>",
            r.max_ratio,
            Esc(&note)
        );
        let ratio_pts = points(|f| f.ratio);
        let cap = r.max_ratio.max(1.0) * 4.0;
        let (lo, hi) = range_of(ratio_pts.iter().map(|p| p.value.min(cap)), &[1.0, r.max_ratio]);
        let refs = [
            RefLine { value: 1.0, label: "1.0 floor (the bound)".into(), colour: "#444444", dash: "5 3" },
            RefLine { value: r.max_ratio, label: format!("--max-ratio {}", r.max_ratio), colour: FAIL, dash: "8 4" },
        ];
        layer_chart(
            &mut s,
            "Shannon ratio by layer",
            "rel err / Shannon bound",
            &series,
            &ratio_pts,
            &refs,
            (lo.max(0.0), hi),
        );

        s.push_str("<h2 id=\"corr\">Element-wise correlation by layer</h2>\n");
        let ks: BTreeSet<u32> = charted.iter().map(|c| c.k.clamp(2, 3)).collect();
        let refs: Vec<RefLine> = ks
            .iter()
            .map(|&k| RefLine {
                value: r.min_corr_for(k),
                label: format!("floor, K {} {}", if k <= 2 { "≤" } else { "≥" }, k),
                colour: FAIL,
                dash: if k <= 2 { "8 4" } else { "2 3" },
            })
            .collect();
        let _ = writeln!(
            s,
            "<p class=\"note\">Correlation of the decode with the base over live channels (never sorted values). \
             Dashed: the floors a linear must reach (--min-corr, or 0.8 for K ≤ 2 and 0.9 for K ≥ 3).{}</p>",
            Esc(&note)
        );
        let corr_pts = points(|f| f.corr);
        let floors: Vec<f64> = refs.iter().map(|r| r.value).collect();
        let (lo, hi) = range_of(corr_pts.iter().map(|p| p.value), &floors);
        layer_chart(
            &mut s,
            "element-wise correlation by layer",
            "correlation",
            &series,
            &corr_pts,
            &refs,
            (lo, hi.min(1.0)),
        );
    }

    // MoE stacks.
    let mut stacks: Vec<&CodedRow> =
        r.coded.iter().filter(|c| c.experts.is_some() && !c.per_expert.is_empty()).collect();
    stacks.sort_by_key(|c| (layer_of(&c.tensor).unwrap_or(usize::MAX), kind_rank(&kind_of(&c.tensor))));
    if !stacks.is_empty() {
        s.push_str("<h2 id=\"experts\">Per-expert spread of the MoE stacks</h2>\n");
        s.push_str(
            "<p class=\"note\">For each stack: a whisker from the lowest to the highest expert, a box between the \
             quartiles, a tick at the median, a dot per expert (failing experts in vermillion) and a diamond for \
             all experts pooled. The scales are zoomed on the experts; a threshold outside them is marked with an \
             arrow.</p>\n",
        );
        expert_chart(&mut s, r, &stacks);
    }

    if !r.norms.is_empty() {
        s.push_str("<h2 id=\"norms\">Norm offsets</h2>\n");
        let _ = writeln!(
            s,
            "<p class=\"note\">Mean of each stored norm (escha) and of the base, and the two candidate differences: \
             as stored (|e − b|) and with +1 folded in (|e + 1 − b|). A candidate matches below {NORM_MATCH}; a \
             Hugging Face base must match as stored, an MLX base +1 (except linear_attn.norm).</p>"
        );
        norm_chart(&mut s, r);
    }

    // Tables.
    s.push_str(
        "<h2 id=\"tables\">All figures</h2>\n<p class=\"note\">Click a column header (or focus it and press Enter) \
         to sort; again to reverse. Rows start failures first.</p>\n",
    );
    if !r.coded.is_empty() {
        coded_table(&mut s, r);
    }
    if !stacks.is_empty() {
        let n: usize = stacks.iter().map(|c| c.per_expert.len()).sum();
        let _ = writeln!(s, "<details><summary>Per-expert figures ({n} rows)</summary>");
        if !expert_table(&mut s, &stacks) {
            s.push_str("<p class=\"note\">Too many experts for one page; use --json for every figure.</p>\n");
        }
        s.push_str("</details>\n");
    }
    if !r.int8.is_empty() {
        int8_table(&mut s, r);
    }
    if !r.norms.is_empty() {
        norm_table(&mut s, r);
    }
    let _ = write!(s, "</main>\n<script>{SCRIPT}</script>\n</body></html>\n");
    s
}

// ---------------------------------------------------------------------------------------------
// SHA-256 (FIPS 180-4) and base64 for the Content-Security-Policy hashes.

fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn layer_and_kind_come_from_the_name() {
        let n = "model.language_model.layers.12.self_attn.q_proj.weight";
        assert_eq!(layer_of(n), Some(12));
        assert_eq!(kind_of(n), "q_proj");
        assert_eq!(kind_of("model.language_model.layers.0.mlp.experts.gate_up_proj"), "experts.gate_up_proj");
        assert_eq!(kind_of("model.layers.3.mlp.shared_expert.down_proj.weight"), "shared_expert.down_proj");
        assert_eq!(layer_of("model.sublayers.3.x"), None);
        assert_eq!(layer_of("layers.7x.a"), None);
        assert_eq!(layer_of("lm_head.weight"), None);
        assert_eq!(kind_of("lm_head.weight"), "lm_head");
        assert_eq!(short_label("model.layers.3.self_attn.q_norm.weight"), "L3 self_attn.q_norm");
        // The MTP head's layer is not the model's layer 0.
        let l0 = "model.language_model.layers.0.input_layernorm.weight";
        assert_eq!(short_label(l0), "L0 input_layernorm");
        assert_eq!(short_label("mtp.layers.0.input_layernorm.weight"), "MTP L0 input_layernorm");
        assert_eq!(short_label("mtp.norm.weight"), "mtp.norm");
    }

    /// The dense fixture's report with a name that closes the style and script elements.
    fn crafted() -> VerifyReport {
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

    #[test]
    fn the_policy_hashes_the_inline_style_and_script() {
        let page = render_html(&crafted());
        for (open, close) in [("<style>", "</style>"), ("<script>", "</script>")] {
            let at = page.find(open).unwrap() + open.len();
            let body = &page[at..at + page[at..].find(close).unwrap()];
            let hash = format!("'sha256-{}'", base64(&sha256(body.as_bytes())));
            assert!(page.contains(&hash), "{open} hash {hash} missing from the policy");
        }
        assert!(!page.contains("http://") && !page.contains("https://"));
        assert!(!page.contains(" style=\""), "style attributes would need 'unsafe-inline'");
    }
}
