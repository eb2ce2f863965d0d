//! The norm-offset table: mean |e − b| and |e + 1 − b| decide how each norm is stored, and the
//! base's layout decides what is expected.

use super::base::{Base, BaseLayout};
use super::findings::NormRow;
use super::options::NORM_MATCH;
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
    let mut e = Vec::new();
    for p in &cat.plain {
        let name = &p.name;
        let Some(kind) = norm_kind(name) else { continue };
        if !selected(name, only) || !base.may_hold(name) {
            continue;
        }
        let gated = kind == NormKind::Plain;
        let Some(b) = base.vector(name)? else {
            missing.push(name.clone());
            continue;
        };
        e.clear();
        ck.elements_f32(name, 0..ck.entry(name)?.numel(), &mut e)?;
        if b.len() != e.len() {
            missing.push(format!("{name} (length {} vs {})", e.len(), b.len()));
            continue;
        }
        let n = e.len() as f64;
        let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let diff = e.iter().zip(&b).map(|(&x, &y)| (x as f64 - y as f64).abs()).sum::<f64>() / n;
        let diff1 = e.iter().zip(&b).map(|(&x, &y)| (x as f64 + 1.0 - y as f64).abs()).sum::<f64>() / n;
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
            escha_mean: mean(&e),
            base_mean: mean(&b),
            diff,
            diff_plus_one: diff1,
            verdict,
            failures,
        });
    }
    Ok(rows)
}
