//! The widths of an MLX output chosen from its weights: `--bits auto` (each coded linear at the
//! narrowest width within its error budget) and `--max-size` (the menu of widths and group sizes
//! each quantized tensor offers, the uniform recipes as choices on it, and one option applied).

use super::config::is_moe;
use super::options::{MlxOptions, INT8_SCALE_DTYPE};
use super::tensors::{is_router, model_dtype};
use crate::checkpoint::{Catalog, Checkpoint};
use crate::layout::choice::{Chosen, WidthChoice};
use crate::layout::fit::{FitOption, FitTensor, Yardsticks};
use crate::layout::policy::WeightProbe;
use crate::layout::tensor::{Encoding, OutputTensor, Recipe};
use crate::quant::affine::{AffineSpec, BITS, GROUP_SIZES};
use crate::quant::budget::budget;
use crate::storage::Storage;
use anyhow::Result;
use safetensors::Dtype;
use std::collections::HashMap;

/// `--bits auto`: the width of every coded linear, from its decoded rows.
pub(super) fn refine(
    opts: MlxOptions,
    tensors: &mut [OutputTensor],
    cat: &Catalog,
    probe: &dyn WeightProbe,
) -> Result<Vec<WidthChoice>> {
    let Some(auto) = opts.auto else { return Ok(Vec::new()) };
    // The scales' dtype is the dtype of the values quantized.
    let scale_dtypes: HashMap<String, Dtype> = tensors
        .iter()
        .filter(|t| t.recipe.is_none())
        .filter_map(|t| Some((t.name.clone(), t.storage.element()?)))
        .collect();
    let mut choices = Vec::new();
    for t in tensors {
        let Some(Recipe { source, adjust, encoding: Encoding::Affine { spec, params }, .. }) = &mut t.recipe else {
            continue;
        };
        let Some(&module) = source.coded_modules().first() else { continue };
        let k = cat.coded[module].k;
        let budget = budget(auto.max_added_error, k);
        let cols = t.shape.last().copied().unwrap_or(0) * 32 / spec.bits as usize;
        let scale_dtype = scale_dtypes[&params.scales];
        let (estimate, exact) = probe.affine_errors(source, *adjust, spec.group_size, scale_dtype, auto.exact)?;
        let estimate_bits = estimate.narrowest_within(budget);
        let bits = exact.as_ref().map_or(estimate_bits, |e| e.narrowest_within(budget));
        spec.bits = bits;
        *t.shape.last_mut().expect("a packed weight has a shape") = spec.packed_cols(cols);
        choices.push(WidthChoice {
            tensor: t.name.clone(),
            k,
            chosen: Chosen::Bits(bits),
            bits_per_weight: spec.bits_per_weight(scale_dtype),
            budget,
            predicted: estimate.relative(bits),
            actual: exact.map(|e| e.relative(bits)),
            estimate: exact.map(|_| Chosen::Bits(estimate_bits)),
            group_size: None,
            bytes: None,
            ratio: None,
        });
    }
    Ok(choices)
}

/// `--max-size`: every affine tensor but the routers (mlx-lm fixes theirs) at each width and
/// group size MLX offers; an exactly repacked int8 table also as that repack, which adds nothing.
pub(super) fn fit_menu(
    ck: &Checkpoint,
    tensors: &[OutputTensor],
    cat: &Catalog,
    probe: &dyn WeightProbe,
) -> Result<Vec<FitTensor>> {
    let dtype = model_dtype(ck.config.as_ref());
    let moe = is_moe(tensors);
    let scale_bytes = dtype.bitsize() as u64 / 8;
    let mut menu = Vec::new();
    for (index, t) in tensors.iter().enumerate() {
        let Some(recipe) = &t.recipe else { continue };
        let repack = match &recipe.encoding {
            Encoding::Affine { .. } => None,
            Encoding::Int8Affine { group_size, .. } => Some(*group_size),
            _ => continue,
        };
        let (cols, last) = (t.columns(), t.shape.last().copied().unwrap_or(0));
        if cols == 0 || (moe && t.name.strip_suffix(".weight").is_some_and(is_router)) {
            continue;
        }
        let rows = (t.numel() / last) as u64;
        let mut options = Vec::new();
        if let Some(gs) = repack {
            let scales = 2 * (cols / gs) as u64 * INT8_SCALE_DTYPE.bitsize() as u64 / 8;
            options.push(FitOption {
                chosen: Chosen::Bits(8),
                group_size: Some(gs),
                storage: Storage::Element(INT8_SCALE_DTYPE),
                lossless: true,
                bytes: rows * (cols as u64 + scales),
                error: 0.0,
            });
        }
        let sizes: Vec<usize> = GROUP_SIZES.iter().copied().filter(|g| cols % g == 0).collect();
        let errors =
            probe.affine_errors_at(&recipe.source, recipe.adjust, &sizes, dtype, recipe.importance.as_ref())?;
        for (e, &group_size) in errors.iter().zip(&sizes) {
            for bits in BITS {
                let spec = AffineSpec { bits, group_size };
                let per_row = spec.packed_cols(cols) as u64 * 4 + 2 * spec.groups(cols) as u64 * scale_bytes;
                options.push(FitOption {
                    chosen: Chosen::Bits(bits),
                    group_size: Some(group_size),
                    storage: Storage::Element(dtype),
                    lossless: false,
                    bytes: rows * per_row,
                    error: e.relative(bits),
                });
            }
        }
        let k = recipe.source.coded_modules().first().map(|&m| cat.coded[m].k);
        menu.push(FitTensor { index, name: t.name.clone(), k, weights: t.weights(), options });
    }
    Ok(menu)
}

/// A uniform `--bits B --group-size G` run: every menu tensor at that setting, an exactly
/// repacked int8 table kept exact (as this run's `--int8` keeps it).
pub(super) fn fit_recipes(menu: &[FitTensor]) -> Yardsticks {
    let mut recipes = Yardsticks::default();
    for group_size in GROUP_SIZES {
        for bits in BITS {
            let name = format!("--bits {bits} --group-size {group_size}");
            let at = |o: &FitOption| !o.lossless && o.chosen == Chosen::Bits(bits) && o.group_size == Some(group_size);
            let pick =
                |t: &FitTensor| t.options.iter().position(|o| o.lossless).or_else(|| t.options.iter().position(at));
            recipes.add(name, menu, pick);
        }
    }
    recipes
}

/// Gives `tensors[fit.index]` (and its scales and biases) option `option` of `fit`.
pub(super) fn fit_apply(tensors: &mut [OutputTensor], fit: &FitTensor, option: usize) {
    let o = &fit.options[option];
    let (Chosen::Bits(bits), Some(group_size)) = (&o.chosen, o.group_size) else { return };
    let t = &mut tensors[fit.index];
    let cols = t.columns();
    let Some(recipe) = t.recipe.as_mut() else { return };
    let params = match &recipe.encoding {
        Encoding::Affine { params, .. } | Encoding::Int8Affine { params, .. } => params.clone(),
        _ => return,
    };
    let spec = AffineSpec { bits: *bits, group_size };
    let (encoding, packed) = if o.lossless {
        (Encoding::Int8Affine { group_size, params: params.clone() }, cols / 4)
    } else {
        (Encoding::Affine { spec, params: params.clone() }, spec.packed_cols(cols))
    };
    recipe.encoding = encoding;
    *t.shape.last_mut().expect("a packed weight has a shape") = packed;
    for c in tensors.iter_mut().filter(|c| c.name == params.scales || c.name == params.biases) {
        c.storage = o.storage;
        *c.shape.last_mut().expect("scales have a shape") = cols / group_size;
    }
}
