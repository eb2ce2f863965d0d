//! The page's charts: the Shannon ratio and the correlation by layer, the spread of the experts
//! of every `MoE` stack, and the norm offsets, each with the heading and note that explain it.

use super::escape::Esc;
use super::svg::{f1, line, marker, range_of, svg_open, text, ticks, x_axis, y_axis, RefLine, Scale};
use super::svg::{FAIL, INK, MUTED, PALETTE, SHAPES};
use crate::layout::mtp::is_mtp;
use crate::verify::findings::{CodedFigures, CodedRow, VerifyReport};
use crate::verify::names::{kind_of, kind_rank, layer_of, short_label};
use crate::verify::options::NORM_MATCH;
use std::collections::BTreeSet;
use std::fmt::Write;

/// The ratio and correlation charts by layer, one series per projection kind. The MTP head's
/// layer 0 is not the model's layer 0, so its tensors are left to the table.
pub fn layer_charts(s: &mut String, r: &VerifyReport) {
    let charted: Vec<&CodedRow> =
        r.coded.iter().filter(|c| layer_of(&c.tensor).is_some() && !is_mtp(&c.tensor)).collect();
    if charted.is_empty() {
        return;
    }
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
    layer_chart(s, "Shannon ratio by layer", "rel err / Shannon bound", &series, &ratio_pts, &refs, (lo.max(0.0), hi));

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
    layer_chart(s, "element-wise correlation by layer", "correlation", &series, &corr_pts, &refs, (lo, hi.min(1.0)));
}

/// The per-expert spread of the `MoE` `stacks`.
pub fn expert_section(s: &mut String, r: &VerifyReport, stacks: &[&CodedRow]) {
    s.push_str("<h2 id=\"experts\">Per-expert spread of the MoE stacks</h2>\n");
    s.push_str(
        "<p class=\"note\">For each stack: a whisker from the lowest to the highest expert, a box between the \
         quartiles, a tick at the median, a dot per expert (failing experts in vermillion) and a diamond for \
         all experts pooled. The scales are zoomed on the experts; a threshold outside them is marked with an \
         arrow.</p>\n",
    );
    expert_chart(s, r, stacks);
}

/// The norm offsets as dot panels.
pub fn norm_section(s: &mut String, r: &VerifyReport) {
    s.push_str("<h2 id=\"norms\">Norm offsets</h2>\n");
    let _ = writeln!(
        s,
        "<p class=\"note\">Mean of each stored norm (escha) and of the base, and the two candidate differences: \
         as stored (|e − b|) and with +1 folded in (|e + 1 − b|). A candidate matches below {NORM_MATCH}; a \
         Hugging Face base must match as stored, an MLX base +1 (except linear_attn.norm).</p>"
    );
    norm_chart(s, r);
}

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
