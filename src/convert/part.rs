//! One checkpoint part (the model, or its separate `mtp/` head) opened and planned.

use super::options::ConvertOptions;
use crate::checkpoint::{catalog, Catalog, Checkpoint};
use crate::container::Container;
use crate::layout::{check_unique_names, Kind, Layout, OutputTensor};
use crate::plan::Plan;
use anyhow::{bail, Result};
use std::collections::BTreeSet;

/// A checkpoint part with everything needed to write it.
pub struct Part {
    pub ck: Checkpoint,
    pub cat: Catalog,
    pub plan: Plan,
    /// Sub-directory of the output ("" or "mtp").
    pub subdir: &'static str,
}

impl Part {
    /// Classifies `ck`, lays it out in `layout` and plans its shards; `None` for a part (the MTP
    /// head) that `--only` leaves empty.
    pub fn new(
        ck: Checkpoint,
        subdir: &'static str,
        opts: &ConvertOptions,
        layout: &dyn Layout,
        container: &dyn Container,
        warnings: &mut Vec<String>,
    ) -> Result<Option<Part>> {
        let path = ck.root.clone();
        let cat = catalog(&ck)?;
        cat.check_convertible(&ck, subdir.is_empty())?;
        if !cat.vision.is_empty() {
            warnings.push(format!("{}: dropped {} vision-tower tensors", path.display(), cat.vision.len()));
        }
        let mut tensors = layout.tensors(&ck, &cat, opts.keep_bias, warnings)?;
        check_unique_names(&tensors, &cat)?;
        if !opts.only.is_empty() {
            layout.select(&mut tensors, &opts.only);
        }
        if tensors.is_empty() && !subdir.is_empty() {
            return Ok(None);
        }
        if tensors.is_empty() {
            let why = if opts.only.is_empty() { "" } else { " (no tensor matches --only)" };
            bail!("{}: nothing to convert{why}", path.display());
        }
        bias_notes(&ck, &cat, &tensors, opts.keep_bias, warnings)?;
        let max_shard_size = opts.max_shard_size.unwrap_or_else(|| layout.default_max_shard_size());
        let metadata = layout.index_metadata(&tensors);
        let plan = Plan::new(tensors, max_shard_size, container, layout.tag(), metadata)?;
        Ok(Some(Part { ck, cat, plan, subdir }))
    }
}

/// Says what happens to the biases of the coded linears being written: dropped (the default, when
/// any is non-zero), or kept where stock loaders have no slot for them.
fn bias_notes(
    ck: &Checkpoint,
    cat: &Catalog,
    tensors: &[OutputTensor],
    keep_bias: bool,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let root = ck.root.display();
    if keep_bias {
        let kept = tensors.iter().filter(|t| t.kind == Kind::Bias).count();
        if kept > 0 {
            warnings.push(format!(
                "{root}: kept {kept} bias tensors of coded linears: stock transformers and mlx-lm Qwen3.5 models have no slot for them (a strict load fails, others drop them); loading them needs a patched model"
            ));
        }
        return Ok(());
    }
    let modules: BTreeSet<usize> =
        tensors.iter().filter_map(|t| t.recipe.as_ref()).flat_map(|r| r.source.coded_modules()).collect();
    let mut nonzero = 0;
    for m in modules {
        nonzero += usize::from(cat.coded[m].has_nonzero_bias(ck)?);
    }
    if nonzero > 0 {
        warnings.push(format!(
            "{root}: dropped {nonzero} non-zero bias tensors of coded linears (the reference runtime never applies them; --bias keep writes them)"
        ));
    }
    Ok(())
}
