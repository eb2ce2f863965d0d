//! The norm-offset table: mean |e − b| and |e + 1 − b| decide how each norm is stored, and the
//! base's layout decides what is expected.

use super::base::{Base, BaseLayout};
use super::findings::NormRow;
use super::options::NORM_MATCH;
use crate::checkpoint::tensor::scan_chunks;
use crate::checkpoint::{Catalog, Checkpoint};
use crate::layout::{norm_kind, NormKind};
use crate::select::selected;
use anyhow::Result;

/// What a norm of IN matches in BASE.
pub const AS_STORED: &str = "as stored";
pub const PLUS_ONE: &str = "+1";
pub const NEITHER: &str = "neither";

/// One row per norm of IN that `only` selects; norms BASE lacks (or holds at another length) go
/// to `missing`.
pub fn check_norms(
    ck: &Checkpoint,
    cat: &Catalog,
    base: &Base,
    only: &[String],
    missing: &mut Vec<String>,
) -> Result<Vec<NormRow>> {
    let mut rows = Vec::new();
    let (mut e, mut b) = (Vec::new(), Vec::new());
    for p in &cat.plain {
        let name = &p.name;
        let Some(kind) = norm_kind(name) else { continue };
        if !selected(name, only) || !base.may_hold(name) {
            continue;
        }
        let gated = kind == NormKind::Plain;
        let Some((b_name, b_len)) = base.vector(name) else {
            missing.push(name.clone());
            continue;
        };
        let len = ck.entry(name)?.numel();
        if b_len != len {
            missing.push(format!("{name} (length {len} vs {b_len})"));
            continue;
        }
        // Sums over both vectors a piece at a time: memory stays bounded whatever their length.
        let (mut e_sum, mut b_sum, mut diff, mut diff1) = (0f64, 0f64, 0f64, 0f64);
        for chunk in scan_chunks(len) {
            e.clear();
            b.clear();
            ck.elements_f32(name, chunk.clone(), &mut e)?;
            base.ck.elements_f32(&b_name, chunk, &mut b)?;
            for (&x, &y) in e.iter().zip(&b) {
                let (x, y) = (f64::from(x), f64::from(y));
                e_sum += x;
                b_sum += y;
                diff += (x - y).abs();
                diff1 += (x + 1.0 - y).abs();
            }
        }
        let n = len as f64;
        let (diff, diff1) = (diff / n, diff1 / n);
        let verdict = if diff < NORM_MATCH {
            AS_STORED
        } else if diff1 < NORM_MATCH {
            PLUS_ONE
        } else {
            NEITHER
        };
        let expected = match (base.layout, gated) {
            (BaseLayout::Mlx, false) => PLUS_ONE,
            _ => AS_STORED,
        };
        let mut failures = Vec::new();
        if verdict != expected {
            let layout = match base.layout {
                BaseLayout::HuggingFace => "Hugging Face",
                BaseLayout::Mlx => "MLX",
            };
            failures.push(format!("norm offset: base matches {verdict:?}, expected {expected:?} for a {layout} base"));
        }
        rows.push(NormRow {
            tensor: name.clone(),
            kind: if gated { "plain" } else { "zero-centred" },
            escha_mean: e_sum / n,
            base_mean: b_sum / n,
            diff,
            diff_plus_one: diff1,
            verdict,
            failures,
        });
    }
    Ok(rows)
}
