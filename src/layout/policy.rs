//! The policy of one output format, as the engine sees it: which tensors a checkpoint becomes,
//! and what goes into the files around them.

use super::choice::WidthChoice;
use super::fit::{FitTensor, Yardsticks};
use super::flags::FlagWords;
use super::mtp::is_mtp;
use super::options::BiasMode;
use super::tensor::{Adjust, ImatrixKey, Importance, OutputTensor, RowSource};
use crate::checkpoint::{Catalog, Checkpoint};
use crate::container::{Container, MetaValue, Metadata, Safetensors};
use crate::quant::affine_error::WidthErrors;
use crate::quant::block_error::StorageErrors;
use crate::select::selected;
use crate::storage::Storage;
use anyhow::Result;
use safetensors::Dtype;
use serde_json::{Map, Value};

/// What the warning and the model card say of a single `.safetensors` file as IN, ending in
/// `layout`'s step to load OUT.
pub fn tensors_only_note(layout: &dyn Layout) -> String {
    format!(
        "the source is a single .safetensors file: its tensors are converted as they are, unchecked against any \
         config, and no config.json or tokenizer is written; to load OUT, {}",
        layout.tensors_only_step()
    )
}

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
    /// rows of `source` (after `adjust`, rounded to `scale_dtype`). With `importance`
    /// (`--imatrix`) each width is measured instead (quantized and dequantized as the output will
    /// be), each value's error and square weighed by its column's importance.
    fn affine_errors_at(
        &self,
        source: &RowSource,
        adjust: Adjust,
        group_sizes: &[usize],
        scale_dtype: Dtype,
        importance: Option<&Importance>,
    ) -> Result<Vec<WidthErrors>>;
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

    /// `--imatrix`: for each of `tensors` (the whole model), the entry of an importance matrix that
    /// weighs its columns, in llama.cpp's GGUF names, which the matrix uses; `None` for a tensor
    /// no entry can weigh. By default a tensor's own name (the format names tensors as llama.cpp).
    fn imatrix_keys(&self, _ck: &Checkpoint, tensors: &[OutputTensor]) -> Result<Vec<Option<ImatrixKey>>> {
        Ok(tensors.iter().map(|t| Some(ImatrixKey { name: t.name.clone(), cols: None })).collect())
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
    /// from `tensors`), and by name those that cannot be written as its options.
    fn fit_recipes(&self, _ck: &Checkpoint, _tensors: &[OutputTensor], _menu: &[FitTensor]) -> Result<Yardsticks> {
        Ok(Yardsticks::default())
    }

    /// `--fit-memory`: bytes of one K or V element of the cache the format's client keeps for
    /// `tensors` (llama.cpp's default cache is F16).
    fn cache_element_bytes(&self, _tensors: &[OutputTensor]) -> u64 {
        2
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

    /// Why the format cannot be written from a single `.safetensors` file (no config.json to write
    /// its own files from), or `None` when following [`Layout::tensors_only_step`] loads it.
    fn needs_config(&self) -> Option<&'static str> {
        None
    }

    /// A single `.safetensors` file as IN has no config.json to write from: the one step that
    /// makes OUT loadable, which the warning and the model card say. Where the step needs more
    /// than the model's own files, [`Layout::tensors_only_files`] writes it.
    fn tensors_only_step(&self) -> &'static str {
        "copy the model's own config.json and tokenizer files into OUT before loading it"
    }

    /// Further text files (name, text) the format writes, from `tensors`, when IN is a single
    /// `.safetensors` file: what [`Layout::tensors_only_step`] uses.
    fn tensors_only_files(&self, _tensors: &[OutputTensor]) -> Vec<(String, String)> {
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

    /// The model card's line on a rotary scaling config.json asks for: what the format's client
    /// does with it, where that is not simply what transformers does.
    fn rope_scaling_note(&self) -> Option<&'static str> {
        None
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
