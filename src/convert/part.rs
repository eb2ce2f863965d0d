//! One checkpoint part (the model, or its separate `mtp/` head) opened and planned.

use super::options::ConvertOptions;
use crate::checkpoint::{catalog, Catalog, Checkpoint};
use crate::container::Container;
use crate::layout::{check_unique_names, Layout};
use crate::plan::Plan;
use anyhow::{bail, Result};

/// A checkpoint part with everything needed to write it.
pub struct Part {
    pub ck: Checkpoint,
    pub cat: Catalog,
    pub plan: Plan,
    /// Sub-directory of the output ("" or "mtp").
    pub subdir: &'static str,
}

impl Part {
    /// Classifies `ck`, lays it out in `layout` and plans its shards.
    pub fn new(
        ck: Checkpoint,
        subdir: &'static str,
        opts: &ConvertOptions,
        layout: &dyn Layout,
        container: &dyn Container,
        warnings: &mut Vec<String>,
    ) -> Result<Part> {
        let path = ck.root.clone();
        let cat = catalog(&ck)?;
        if subdir.is_empty() {
            cat.require_coded(&ck)?;
        }
        if !cat.vision.is_empty() {
            warnings.push(format!("{}: dropped {} vision-tower tensors", path.display(), cat.vision.len()));
        }
        if !opts.keep_bias {
            let mut nonzero = 0;
            for m in &cat.coded {
                nonzero += m.has_nonzero_bias(&ck)? as usize;
            }
            if nonzero > 0 {
                warnings.push(format!(
                    "{}: dropped {nonzero} non-zero bias tensors of coded linears (the reference runtime never applies them; --bias keep writes them)",
                    path.display()
                ));
            }
        }
        let mut tensors = layout.tensors(&ck, &cat, opts.keep_bias, warnings)?;
        check_unique_names(&tensors, &cat)?;
        if !opts.only.is_empty() {
            layout.select(&mut tensors, &opts.only);
        }
        if tensors.is_empty() && subdir.is_empty() {
            let why = if opts.only.is_empty() { "" } else { " (no tensor matches --only)" };
            bail!("{}: nothing to convert{why}", path.display());
        }
        let max_shard_size = opts.max_shard_size.unwrap_or_else(|| layout.default_max_shard_size());
        let metadata = layout.index_metadata(&tensors);
        let plan = Plan::new(tensors, max_shard_size, container, layout.tag(), metadata)?;
        Ok(Part { ck, cat, plan, subdir })
    }
}
