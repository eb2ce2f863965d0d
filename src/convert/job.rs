//! A conversion job: the checkpoint opened and classified, its output tensors laid out and
//! placed in shards, and the config text, all known before any weight is decoded.

use super::fit::{self, BudgetReport};
use super::memory::{self, MemoryBudget};
use super::options::ConvertOptions;
use super::probe::Probe;
use super::rows::Reader;
use crate::checkpoint::{architecture, catalog, Catalog, Checkpoint, Leaf};
use crate::codec::TileDecoder;
use crate::container::Container;
use crate::layout::{
    check_unique_names, tensors_only_note, BiasMode, FitTensor, Layout, OutputFormat, OutputTensor, RowSource,
    WidthChoice,
};
use crate::plan::Plan;
use crate::warning::{Warning, WarningCode};
use anyhow::{bail, Result};
use serde_json::Map;
use std::collections::BTreeSet;

pub struct Job {
    pub ck: Checkpoint,
    pub cat: Catalog,
    pub plan: Plan,
    /// The container of the output's files.
    pub container: Box<dyn Container>,
    /// The input's side files the output carries (name, resolved path): tokenizer, chat template,
    /// generation config; none for a format that holds them in its own files.
    pub side_files: Vec<(String, std::path::PathBuf)>,
    /// The output's config.json text (when the input has a config and the format keeps one).
    pub config: Option<String>,
    /// Whether the output holds an MTP head (counting tensors `--only` leaves to other runs).
    pub mtp_written: bool,
    /// The widths the format chose from the weights (`--bits auto`).
    pub widths: Vec<WidthChoice>,
    /// `--max-size`: the budget and what the chosen encodings add.
    pub budget: Option<BudgetReport>,
    /// `--imatrix`: the file and what it weighs.
    pub imatrix: Option<super::importance::ImatrixReport>,
    /// Further text files of the format (name, text), written beside config.json.
    pub extra_files: Vec<(String, String)>,
    /// The largest relative change of a channel scale the format stores in its own precision.
    pub fold_change: Option<f64>,
    /// `--bias` as resolved for this input ([`BiasMode::resolved`]).
    pub bias: BiasMode,
}

impl Job {
    /// Classifies `ck`, lays it out in `layout` (which may look at the decoded weights, or at
    /// `sample` blocks per tensor of them), applies `--only` and plans the shards. `ready` runs
    /// once the input is opened and checked, before any weight is decoded: where the caller checks
    /// its destinations, so that a refused one costs no decoding.
    pub fn new(
        ck: Checkpoint,
        opts: &ConvertOptions,
        layout: &dyn Layout,
        (decoder, sample): (&dyn TileDecoder, Option<usize>),
        warnings: &mut Vec<Warning>,
        ready: impl FnOnce(&Checkpoint) -> Result<()>,
    ) -> Result<Job> {
        let cat = catalog(&ck)?;
        cat.check_convertible(&ck, true)?;
        architecture::check(&ck, &cat)?;
        if ck.single_file {
            if let Some(why) = layout.needs_config() {
                bail!(
                    "{}: a single .safetensors file has no config.json, and {why}: put the file in a directory with the \
                     model's config.json and tokenizer files and pass that directory",
                    ck.root.display()
                );
            }
            warnings.push(Warning::new(
                WarningCode::TensorsOnly,
                format!("{}: {}", ck.root.display(), tensors_only_note(layout)),
            ));
        }
        warnings.extend(cat.notes());
        if !cat.vision.is_empty() {
            warnings.push(Warning::new(
                WarningCode::VisionDropped,
                format!("{}: dropped {} vision-tower tensors", ck.root.display(), cat.vision.len()),
            ));
        }
        let bias = opts.bias.resolved(&cat);
        // `--fit-memory`: SIZE is what the memory leaves beside the client's caches, their K and V
        // elements first taken as 2 bytes; a plan whose client computes wider is fitted again.
        let memory = opts
            .fit_memory
            .map(|ask| MemoryBudget::new(ck.config.as_ref(), ask, memory::KV_ELEMENT_BYTES))
            .transpose()?;
        let max_size = match &memory {
            Some(m) => Some(m.max_size()?),
            None => opts.max_size,
        };
        let mut all = layout.tensors(&ck, &cat, bias, warnings)?;
        check_unique_names(&all, &cat)?;
        ready(&ck)?;
        let reader = Reader { ck: &ck, cat: &cat, decoder };
        let max_shard_size = opts.max_shard_size.unwrap_or_else(|| layout.default_max_shard_size());
        let matrix = match opts.imatrix.as_deref() {
            Some(path) => Some(super::importance::read(path, &all, &layout.imatrix_keys(&ck, &all)?)?),
            None => None,
        };
        // The tensors whose storage the size budget chose with their errors weighed by the matrix.
        let mut steered = 0;
        let (widths, budget) = match max_size {
            Some(max_size) => {
                if let Some(m) = &matrix {
                    m.measure_with(&mut all);
                }
                let probe = Probe {
                    reader: &reader,
                    sample: Some(sample.unwrap_or(fit::SAMPLE_BLOCKS)),
                    measured_row_step: fit::MEASURED_ROW_STEP,
                };
                let mut menu = layout.fit_menu(&ck, &all, &cat, &probe)?;
                menu.retain(|t| !t.options.is_empty());
                let weighed = |t: &FitTensor| all[t.index].recipe.as_ref().is_some_and(|r| r.importance.is_some());
                steered = menu.iter().filter(|t| weighed(t)).count();
                let container = layout.container();
                // The model files exactly as the plan will lay them out (for the whole model,
                // whatever `--only` or `--part` leave to other runs).
                let model_bytes = |tensors: &[OutputTensor]| -> Result<u64> {
                    let metadata = layout.metadata(&ck, tensors, &mut Vec::new())?;
                    let plan = Plan::new(tensors.to_vec(), max_shard_size, container.as_ref(), &metadata, Map::new())?;
                    Ok(plan.shards.iter().map(|s| s.len).sum())
                };
                let apply = |tensors: &mut [OutputTensor], t: &FitTensor, i: usize| layout.fit_apply(tensors, t, i);
                let recipes = layout.fit_recipes(&ck, &all, &menu)?;
                let weighted = matrix.is_some();
                let mut fitted = fit::fit(&menu, &recipes, &mut all, max_size, weighted, apply, model_bytes);
                let mut memory = memory;
                if let (Some(m), Ok(_)) = (memory, &fitted) {
                    let wide = layout.cache_element_bytes(&all);
                    if wide > m.element_bytes {
                        let m = m.with_element_bytes(wide);
                        let max_size = m.max_size()?;
                        fitted = fit::fit(&menu, &recipes, &mut all, max_size, weighted, apply, model_bytes);
                        memory = Some(m);
                    }
                }
                // Too small a SIZE is said in the memory's terms.
                let (widths, mut budget) = fitted.map_err(|e| {
                    let smallest = e.downcast_ref::<fit::TooSmall>().map(|t| t.smallest);
                    match (&memory, smallest) {
                        (Some(m), Some(smallest)) => m.too_small(smallest),
                        _ => e,
                    }
                })?;
                budget.memory = memory;
                (widths, Some(budget))
            }
            None => (layout.refine(&mut all, &cat, &Probe { reader: &reader, sample, measured_row_step: 1 })?, None),
        };
        let needs = |t: &OutputTensor| match &opts.format {
            OutputFormat::Gguf(g) => g.ty.requires_imatrix(&t.name, t.storage),
            _ => false,
        };
        let imatrix = matrix.map(|m| m.attach(&mut all, &needs, steered)).transpose()?;
        let config = ck.config.as_ref().and_then(|c| layout.config(c, &all));
        let extra_files = match &ck.config {
            Some(c) => layout.extra_files(c, &all),
            None if ck.single_file => layout.tensors_only_files(&all),
            None => Vec::new(),
        };
        let fold_change = layout.fold_change(&ck, &cat)?;
        let metadata = layout.metadata(&ck, &all, warnings)?;
        let mtp_written = layout.writes_mtp(&all);
        let mut tensors = all;
        if !opts.only.is_empty() {
            layout.select(&mut tensors, &opts.only);
            if tensors.is_empty() {
                bail!("{}: nothing to convert (no tensor matches --only)", ck.root.display());
            }
        }
        bias_notes(&ck, &cat, &tensors, (bias, layout.applies_bias()), warnings)?;
        let index_metadata = layout.index_metadata(&tensors);
        let container = layout.container();
        let plan = Plan::new(tensors, max_shard_size, container.as_ref(), &metadata, index_metadata)?;
        let side_files = if layout.copies_side_files() { ck.copied_files.clone() } else { Vec::new() };
        Ok(Job {
            ck,
            cat,
            plan,
            container,
            side_files,
            config,
            mtp_written,
            widths,
            budget,
            imatrix,
            extra_files,
            fold_change,
            bias,
        })
    }

    /// The flags the marker fingerprints and the card records: `opts`' as this job resolved them.
    pub fn recorded_flags(&self, opts: &ConvertOptions) -> String {
        opts.recorded_flags(self.bias, self.budget.as_ref().and_then(|b| b.memory.as_ref()))
    }
}

/// Says what becomes of the biases of the coded linears being written, where the output differs
/// from what the source's own runtime computes or stock loaders expect: a non-zero bias left out
/// (by `--bias`, or for want of a slot in the format), or one kept that the source's runtime never
/// applies or the output's loaders have no slot for. A bias kept where both runtimes add it (EXL3
/// to EXL3) goes unsaid.
fn bias_notes(
    ck: &Checkpoint,
    cat: &Catalog,
    tensors: &[OutputTensor],
    (bias, applied): (BiasMode, bool),
    warnings: &mut Vec<Warning>,
) -> Result<()> {
    let root = ck.root.display();
    let sources = tensors.iter().filter_map(|t| t.recipe.as_ref()).map(|r| &r.source);
    let modules: BTreeSet<usize> = sources.clone().flat_map(RowSource::coded_modules).collect();
    let names: BTreeSet<&str> = sources.flat_map(|s| s.tensor_names()).collect();
    // Counted by whether the source's runtime applies the bias: [Escha, EXL3].
    let (mut kept, mut dropped, mut no_slot) = ([0usize; 2], [0usize; 2], 0usize);
    for (i, m) in cat.coded.iter().enumerate() {
        let Some(b) = m.tensor(Leaf::Bias) else { continue };
        let written = modules.contains(&i) || m.tensor(Leaf::Code).is_some_and(|c| names.contains(c));
        if !written {
            continue;
        }
        let by_source = usize::from(m.source_applies_bias());
        if names.contains(b) {
            kept[by_source] += 1;
        } else if m.has_nonzero_bias(ck)? {
            // Left out: by `--bias`, or by a format that has no slot for it.
            if bias.keeps(m) {
                no_slot += 1;
            } else {
                dropped[by_source] += 1;
            }
        }
    }
    // Kept biases worth a word: where the output's runtime adds them, those the source's runtime
    // never did; elsewhere every one (stock loaders have no slot for them).
    let kept_said = if applied { kept[0] } else { kept[0] + kept[1] };
    if kept_said > 0 && applied {
        warnings.push(Warning::new(WarningCode::BiasKept, format!(
            "{root}: kept {kept_said} bias tensors of coded linears, which the output's runtime adds after the matmul (the reference runtime never applies them)"
        )));
    } else if kept_said > 0 {
        warnings.push(Warning::new(WarningCode::BiasKept, format!(
            "{root}: kept {kept_said} bias tensors of coded linears: stock Qwen3.5 loaders have no slot for them (a strict load fails, others drop them); loading them needs a patched model"
        )));
    }
    if dropped[0] > 0 {
        warnings.push(Warning::new(WarningCode::BiasDropped, format!(
            "{root}: dropped {} non-zero bias tensors of coded linears (the reference runtime never applies them; --bias keep writes them)",
            dropped[0]
        )));
    }
    if dropped[1] > 0 {
        warnings.push(Warning::new(WarningCode::BiasDropped, format!(
            "{root}: dropped {} non-zero bias tensors of EXL3 linears, which exllamav3 adds after the matmul: the output computes without them (--bias auto or keep writes them)",
            dropped[1]
        )));
    }
    // A format that leaves out biases it has no slot for says so under its own code.
    let said = warnings.iter().any(|w| w.code == WarningCode::ExpertBiasesDropped);
    if no_slot > 0 && !said {
        warnings.push(Warning::new(
            WarningCode::BiasDropped,
            format!(
            "{root}: dropped {no_slot} non-zero bias tensors of coded linears: the output format has no slot for them"
        ),
        ));
    }
    Ok(())
}
