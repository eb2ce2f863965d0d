//! The policy of one output format, as the engine sees it: which tensors a checkpoint becomes,
//! and what goes into the files around them.

use super::tensor::{Adjust, OutputTensor, RowSource};
use crate::checkpoint::{Catalog, Checkpoint};
use crate::container::{Container, Metadata, Safetensors};
use crate::quant::affine_error::WidthErrors;
use crate::select::selected;
use anyhow::Result;
use safetensors::Dtype;
use serde::Serialize;
use serde_json::{Map, Value};

/// What a format may learn about the decoded weights before it fixes its plan.
pub trait WeightProbe {
    /// The errors affine quantization at `group_size` would add to the rows of `source` (after
    /// `adjust`, rounded to `scale_dtype`): the estimate, and with `exact` the measured errors.
    fn affine_errors(
        &self,
        source: &RowSource,
        adjust: Adjust,
        group_size: usize,
        scale_dtype: Dtype,
        exact: bool,
    ) -> Result<(WidthErrors, Option<WidthErrors>)>;
}

/// A width a format chose for one tensor from its weights (`--bits auto`).
#[derive(Clone, Debug, Serialize)]
pub struct WidthChoice {
    pub tensor: String,
    /// The trellis bits per weight of the coded source.
    pub k: u32,
    pub bits: u32,
    /// The largest added relative error allowed: `R · 2^-K`.
    pub budget: f64,
    /// The estimated added error at the chosen width.
    pub predicted: f64,
    /// The measured added error at the chosen width (`--measure-error`).
    pub actual: Option<f64>,
    /// What the estimate alone would have chosen (`--measure-error`).
    pub estimate_bits: Option<u32>,
}

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

    /// Settles what depends on the weights themselves (the widths of `--bits auto`), looking at
    /// them through `probe`; says what it chose.
    fn refine(
        &self,
        _tensors: &mut [OutputTensor],
        _cat: &Catalog,
        _probe: &dyn WeightProbe,
    ) -> Result<Vec<WidthChoice>> {
        Ok(Vec::new())
    }

    /// Keeps the tensors `--only` selects, and whatever they cannot be written without.
    fn select(&self, tensors: &mut Vec<OutputTensor>, only: &[String]) {
        tensors.retain(|t| selected(&t.name, only));
    }

    /// The output's `config.json` text, from the input's config and every tensor the whole
    /// conversion writes (before `--only`, so that every part of a split job writes the same);
    /// `None` when the format keeps no config file.
    fn config(&self, input: &Value, tensors: &[OutputTensor]) -> Option<String>;

    /// The container the format's files are, and the metadata each file records (from the input
    /// and every tensor of the whole conversion, like `config`).
    fn container(&self) -> Box<dyn Container> {
        Box::new(Safetensors)
    }

    fn metadata(&self, ck: &Checkpoint, tensors: &[OutputTensor]) -> Result<Metadata>;

    /// Whether the input's tokenizer, chat template and generation files are copied beside the
    /// shards (a format that carries them inside its files does not).
    fn copies_side_files(&self) -> bool {
        true
    }

    /// Extra metadata for the index file.
    fn index_metadata(&self, _tensors: &[OutputTensor]) -> Map<String, Value> {
        Map::new()
    }

    /// The largest shard when the user sets none, in tensor bytes.
    fn default_max_shard_size(&self) -> u64;

    /// How the model card describes the output; `mtp`: whether it holds an MTP head.
    fn card(&self, mtp: bool) -> FormatCard;
}
