//! The policy of one output format, as the engine sees it: which tensors a checkpoint becomes,
//! and what goes into the files around them.

use super::fit::{FitRecipe, FitTensor};
use super::flags::FlagWords;
use super::mtp::is_mtp;
use super::options::BiasMode;
use super::tensor::{Adjust, Importance, OutputTensor, RowSource};
use crate::checkpoint::{Catalog, Checkpoint};
use crate::container::{Container, MetaValue, Metadata, Safetensors};
use crate::quant::affine_error::WidthErrors;
use crate::quant::block_error::StorageErrors;
use crate::select::selected;
use crate::storage::Storage;
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

    /// The errors storing the rows of `source` (after `adjust`) as each of `candidates` would add:
    /// the estimate, and with `exact` the measured errors. With `importance` (`--imatrix`) the
    /// estimate weighs each column's error and square by it, every block type encoded with it
    /// (as the output will be) on a thinned set of rows; the `exact` errors stay unweighted.
    fn storage_errors(
        &self,
        source: &RowSource,
        adjust: Adjust,
        candidates: &[Storage],
        exact: bool,
        importance: Option<&Importance>,
    ) -> Result<(StorageErrors, Option<StorageErrors>)>;

    /// The estimated errors of affine quantization at each of `group_sizes`, from one read of the
    /// rows of `source` (after `adjust`, rounded to `scale_dtype`).
    fn affine_errors_at(
        &self,
        source: &RowSource,
        adjust: Adjust,
        group_sizes: &[usize],
        scale_dtype: Dtype,
    ) -> Result<Vec<WidthErrors>>;
}

/// An encoding a format chose for one tensor from its weights: an MLX affine width, or a GGUF
/// storage type. In JSON `"bits": 4` or `"gguf_type": "Q5_K"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Chosen {
    Bits(u32),
    GgufType(String),
}

impl std::fmt::Display for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Chosen::Bits(b) => write!(f, "{b} bits"),
            Chosen::GgufType(t) => f.write_str(t),
        }
    }
}

/// What a format chose for one tensor from its weights (`--bits auto`, `--gguf-type auto`).
#[derive(Clone, Debug, Serialize)]
pub struct WidthChoice {
    pub tensor: String,
    /// The trellis bits per weight of the coded source.
    pub k: u32,
    #[serde(flatten)]
    pub chosen: Chosen,
    /// Bits per weight of the chosen encoding, its scales included.
    pub bits_per_weight: f64,
    /// The largest added relative error allowed: `R · 2^-K`.
    pub budget: f64,
    /// The estimated added error of the choice.
    pub predicted: f64,
    /// The measured added error of the choice (`--measure-error`).
    pub actual: Option<f64>,
    /// What the estimate alone would have chosen (`--measure-error`).
    pub estimate: Option<Chosen>,
    /// `--max-size`: the MLX group size chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_size: Option<usize>,
    /// `--max-size`: bytes of the tensor, its scales and biases included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// `--max-size`: the predicted added error over `2^-K` (`2^-8` for a table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
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

    /// The flags that ask for this format and its own options (`--format NAME` first), every
    /// default spelled out: the marker fingerprints them and the model card records them, so the
    /// words of an option set never change.
    fn shaping_flags(&self, flags: &mut FlagWords);

    /// The output tensors of a checkpoint, in output order, the biases of coded linears as `bias`
    /// says. What the format leaves out is said in `warnings`.
    fn tensors(
        &self,
        ck: &Checkpoint,
        cat: &Catalog,
        bias: BiasMode,
        warnings: &mut Vec<crate::warning::Warning>,
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

    /// `--max-size`: every tensor whose encoding the size budget chooses, with the options the
    /// format offers it, their bytes and their errors measured through `probe`.
    fn fit_menu(
        &self,
        _ck: &Checkpoint,
        _tensors: &[OutputTensor],
        _cat: &Catalog,
        _probe: &dyn WeightProbe,
    ) -> Result<Vec<FitTensor>> {
        Ok(Vec::new())
    }

    /// Gives `tensors[fit.index]` (and its scales and biases) option `option` of `fit`.
    fn fit_apply(&self, _tensors: &mut [OutputTensor], _fit: &FitTensor, _option: usize) {}

    /// `--max-size`: the format's fixed recipes as choices on `menu` (made by [`Layout::fit_menu`]
    /// from `tensors`), those that can be written as its options.
    fn fit_recipes(&self, _ck: &Checkpoint, _tensors: &[OutputTensor], _menu: &[FitTensor]) -> Result<Vec<FitRecipe>> {
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

    /// Further text files the format writes beside config.json (name, text), from the same input
    /// config and tensors.
    fn extra_files(&self, _input: &Value, _tensors: &[OutputTensor]) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Whether the format's runtime adds a coded linear's `bias` (when `--bias` writes it) after
    /// the matmul; stock Qwen3.5 loaders have no slot for it.
    fn applies_bias(&self) -> bool {
        false
    }

    /// The largest relative change the format makes to a channel scale it stores in its own
    /// precision (EXL3's `suh`/`svh` in f16), when it makes one.
    fn fold_change(&self, _ck: &Checkpoint, _cat: &Catalog) -> Result<Option<f64>> {
        Ok(None)
    }

    /// The container the format's files are, and the metadata each file records (from the input
    /// and every tensor of the whole conversion, like `config`).
    fn container(&self) -> Box<dyn Container> {
        Box::new(Safetensors)
    }

    /// The metadata of `container`'s files; what it leaves out of the input goes to `warnings`.
    fn metadata(
        &self,
        _ck: &Checkpoint,
        _tensors: &[OutputTensor],
        _warnings: &mut Vec<crate::warning::Warning>,
    ) -> Result<Metadata> {
        // What every safetensors writer records: the tensors are PyTorch's.
        Ok(vec![("format".into(), MetaValue::Str("pt".into()))])
    }

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

    /// Whether `tensors` (every tensor of the whole conversion) hold an MTP head.
    fn writes_mtp(&self, tensors: &[OutputTensor]) -> bool {
        tensors.iter().any(|t| is_mtp(&t.name))
    }

    /// The model card's line on the MTP head of a source that has one: kept (`written`) or not.
    fn mtp_note(&self, written: bool) -> &'static str {
        if written {
            "kept: `mtp.*` tensors in the main shards"
        } else {
            "not written (incomplete, dropped on request, or the format has none); mtp_num_hidden_layers is 0"
        }
    }
}
