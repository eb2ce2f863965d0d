//! The drawing kit of the page's charts: colours, scales, ticks, axes, lines, text and markers
//! as inline SVG, each marker carrying its own tooltip.

use super::escape::Esc;
use std::fmt::Write;

/// Okabe–Ito: distinguishable with every common colour-vision deficiency.
pub const PALETTE: [&str; 8] = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442"];
/// Marker shapes, see `marker`.
pub const SHAPES: usize = 5;
pub const FAIL: &str = "#D55E00";
pub const INK: &str = "#1a1a1a";
pub const GRID: &str = "#e3e3e3";
pub const MUTED: &str = "#666666";

/// A coordinate to one decimal.
pub fn f1(v: f64) -> String {
    format!("{v:.1}")
}

/// Roughly `target` round tick values (1, 2 or 5 × 10^k apart) inside [lo, hi], and their decimals.
pub fn ticks(lo: f64, hi: f64, target: usize) -> (Vec<f64>, usize) {
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
pub fn range_of(values: impl IntoIterator<Item = f64>, always: &[f64]) -> (f64, f64) {
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
/// Values `lo..=hi` onto pixels `p0..=p1` (either way round); values outside sit at the ends.
pub struct Scale {
    pub lo: f64,
    pub hi: f64,
    pub p0: f64,
    pub p1: f64,
}

impl Scale {
    pub fn at(&self, v: f64) -> f64 {
        let t = ((v - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0);
        self.p0 + t * (self.p1 - self.p0)
    }
    pub fn contains(&self, v: f64) -> bool {
        v >= self.lo && v <= self.hi
    }
}

/// One marker; `shape` 0 circle, 1 square, 2 triangle, 3 diamond, 4 inverted triangle.
#[allow(clippy::too_many_arguments)]
pub fn marker(s: &mut String, shape: usize, x: f64, y: f64, r: f64, fill: &str, stroke: &str, sw: f64, title: &str) {
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
pub fn line(s: &mut String, x0: f64, y0: f64, x1: f64, y1: f64, stroke: &str, width: f64, dash: &str) {
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

pub fn text(s: &mut String, x: f64, y: f64, anchor: &str, class: &str, content: &str) {
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="{anchor}" class="{class}">{}</text>"#,
        f1(x),
        f1(y),
        Esc(content)
    );
}

pub fn svg_open(s: &mut String, w: f64, h: f64, label: &str) {
    let _ = write!(s, r#"<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{}">"#, Esc(label));
}

/// A horizontal reference line on a value axis.
pub struct RefLine {
    pub value: f64,
    pub label: String,
    pub colour: &'static str,
    pub dash: &'static str,
}

/// Value-axis grid, ticks and labels along y.
pub fn y_axis(s: &mut String, y: Scale, x0: f64, x1: f64, label: &str) {
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
pub fn x_axis(s: &mut String, x: Scale, y0: f64, y1: f64, label: &str) {
    let (ts, digits) = ticks(x.lo, x.hi, 5);
    for t in ts {
        let px = x.at(t);
        line(s, px, y0, px, y1, GRID, 1.0, "");
        text(s, px, y1 + 14.0, "middle", "tick", &format!("{t:.digits$}"));
    }
    line(s, x.p0, y1, x.p1, y1, MUTED, 1.0, "");
    text(s, f64::midpoint(x.p0, x.p1), y1 + 32.0, "middle", "axis", label);
}
