//! The readable verify report: one row per tensor, failures first, a summary line last. Columns
//! follow the published correlation/rel-err and norm-offset tables so figures compare line by line.

use super::base::BaseLayout;
use super::findings::VerifyReport;
use crate::text::escape_controls;
use std::fmt::Write;

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
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
        let _ = writeln!(s, "\ncoded linears (figures over live channels; ratio = rel err / (2^-K·√(live/all)))");
        let _ = writeln!(
            s,
            "{:<62} {:>2} {:>8} {:>8} {:>8} {:>6} {:>9} {:>7} {:>7} {:>7}  verdict",
            "tensor", "K", "corr", "cosine", "rel err", "ratio", "overlap", "pruned", "|rout|~", "inner σ"
        );
        for c in &r.coded {
            let f = &c.figures;
            let pruned = format!("{}/{}", f.pruned_channels, f.pruned_channels + f.live_channels);
            let rout_corr = match (&c.experts, f.corr_rout_row_norm) {
                (Some(_), _) => {
                    let v: Vec<f64> = c.per_expert.iter().filter_map(|e| e.figures.corr_rout_row_norm).collect();
                    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
                }
                (None, v) => v,
            };
            let _ = writeln!(
                s,
                "{:<62} {:>2} {:>+8.4} {:>8} {:>8} {:>6} {:>9} {:>7} {:>7} {:>7}  {}",
                escape_controls(&c.tensor),
                c.k,
                f.corr.unwrap_or(f64::NAN),
                num(f.cosine, 4),
                num(f.rel_err, 4),
                num(f.ratio, 3),
                format!("{}/{}", f.tiles_checked - f.overlap_violations, f.tiles_checked),
                pruned,
                num(rout_corr, 4),
                num(f.inner_std, 4),
                verdict(&c.failures)
            );
        }
    }
    if !r.int8.is_empty() {
        let _ = writeln!(s, "\nint8 pairs");
        let _ = writeln!(s, "{:<62} {:>8} {:>8}  verdict", "tensor", "corr", "rel err");
        for c in &r.int8 {
            let _ = writeln!(
                s,
                "{:<62} {:>8} {:>8}  {}",
                escape_controls(&c.tensor),
                num(c.corr, 4),
                num(c.rel_err, 4),
                verdict(&c.failures)
            );
        }
    }
    if !r.norms.is_empty() {
        let _ = writeln!(s, "\nnorm offsets");
        let _ = writeln!(
            s,
            "{:<62} {:>7} {:>7} {:>8} {:>10}  {:<10} verdict",
            "tensor", "escha", "base", "|e−b|", "|e+1−b|", "matches"
        );
        for n in &r.norms {
            let _ = writeln!(
                s,
                "{:<62} {:>7.3} {:>7.3} {:>8.3} {:>10.3}  {:<10} {}",
                escape_controls(&n.tensor),
                n.escha_mean,
                n.base_mean,
                n.diff,
                n.diff_plus_one,
                n.verdict,
                verdict(&n.failures)
            );
        }
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
