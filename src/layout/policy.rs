//! The policy of one output format, as the engine sees it: which tensors a checkpoint becomes,
//! and what goes into the files around them.

use super::tensor::OutputTensor;
use crate::checkpoint::{Catalog, Checkpoint};
use crate::select::selected;
use anyhow::Result;
use serde_json::{Map, Value};

/// What the model card says about a format.
#[derive(Clone, Debug)]
pub struct FormatCard {
    /// The card's `library_name`.
    pub library: &'static str,
    /// Tags beside the common ones.
    pub tags: Vec<String>,
    /// One line: the format and its settings.
    pub description: String,
    /// Markdown: how to load the output (the model is at `path/to/model`).
    pub how_to_load: String,
}

pub trait Layout: Sync {
    /// The format's name in reports: "bf16", "f16", "mlx".
    fn name(&self) -> &'static str;

    /// The output tensors of a checkpoint, in output order. What the format leaves out is said in
    /// `warnings`.
    fn tensors(
        &self,
        ck: &Checkpoint,
        cat: &Catalog,
        keep_bias: bool,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<OutputTensor>>;

    /// Keeps the tensors `--only` selects, and whatever they cannot be written without.
    fn select(&self, tensors: &mut Vec<OutputTensor>, only: &[String]) {
        tensors.retain(|t| selected(&t.name, only));
    }

    /// The output's `config.json` text, from the input's config and every tensor the whole
    /// conversion writes (before `--only`, so that every part of a split job writes the same).
    fn config(&self, input: &Value, tensors: &[OutputTensor]) -> String;

    /// The tag the container records (safetensors `__metadata__.format`).
    fn tag(&self) -> &'static str;

    /// Extra metadata for the index file.
    fn index_metadata(&self, _tensors: &[OutputTensor]) -> Map<String, Value> {
        Map::new()
    }

    /// The largest shard when the user sets none, in tensor bytes.
    fn default_max_shard_size(&self) -> u64;

    /// How the model card describes the output; `mtp`: whether it holds an MTP head.
    fn card(&self, mtp: bool) -> FormatCard;
}
