//! The one check of config.json against the tensors, for every output format, before anything is
//! decoded or written: the keys the architecture needs, typed and bounded; every tensor the config
//! declares present with the shape it implies (a coded linear by its logical features, an int8
//! table by its rows and columns), floats where floats are due; no tensor the model has no place
//! for (a stray layer index, a layer of the other kind, a misspelt name); plain float values
//! finite. The formats copy the config beside the weights, so a contradiction here is a model
//! that transformers, mlx-lm, exllamav3 or llama.cpp refuse to load.
//!
//! Shapes follow transformers' `Qwen3_5*` / `Qwen3_5Moe*` text models (`modeling_qwen3_5*.py`):
//! names under `model.language_model.` (the `…ForConditionalGeneration` layout) or `model.` (the
//! text-only `…ForCausalLM` one), `lm_head` at the top, the MTP head under `mtp.`.

mod client_keys;
mod expected;
mod family;
mod finite;
mod generation_config;
mod keys;
mod model;
mod rope;
mod tensors;
#[cfg(test)]
mod tests;

pub use family::Family;
pub use model::{Experts, LayerType, TextModel};

use super::input::Checkpoint;
use super::modules::Catalog;
use anyhow::{bail, Context, Result};

/// Checks config.json against the tensors of `ck` (classified as `cat`). A directory without
/// config.json is refused; a single `.safetensors` file is the tensors-only case, unchecked.
pub fn check(ck: &Checkpoint, cat: &Catalog) -> Result<()> {
    let Some(config) = &ck.config else {
        if ck.single_file {
            return Ok(());
        }
        bail!(
            "{}: no such file: the model's config.json is missing (transformers, mlx-lm, exllamav3 and llama.cpp \
             all need it, and its keys are what the tensors are checked against)",
            ck.root.join("config.json").display()
        );
    };
    let model = TextModel::from_config(config)?;
    if let Some((_, path)) = ck.copied_files.iter().find(|(name, _)| name == "generation_config.json") {
        generation_config::check_generation_config(&super::regular::read_text(path)?, model.vocab)
            .with_context(|| format!("{}", path.display()))?;
    }
    tensors::check_tensors(ck, cat, &model)?;
    finite::check_finite_plain(ck, cat)
}
