//! GGUF, the file llama.cpp loads, in its `qwen35` / `qwen35moe` architectures: the tensors under
//! llama.cpp's names with every transform its converter applies (norm offsets folded in, `A_log`
//! as `−exp`, conv1d squeezed, fused experts split into gate and up), 1-D tensors, norms, routers
//! and conv1d in F32, everything else in the chosen type; int8 pairs whose row scale is an f16
//! become `Q8_0` exactly. The model metadata (`hparams.rs`) and the tokenizer (`vocab.rs`) go into
//! the file's header; no config or tokenizer file is written beside it.

mod heads;
mod hparams;
mod loader;
mod mixture;
mod names;
mod types;

pub use types::GgufType;
use types::{choose_by_budget, quantize_as_llama_does};
mod vocab;

use super::choice::WidthChoice;
use super::fit::{FitTensor, Yardsticks};
use super::flags::FlagWords;
use super::hf::{self, DenseDtype};
use super::mtp::{self, MtpMode};
use super::options::{AutoBits, BiasMode, Int8Mode};
use super::policy::{FormatCard, Layout, WeightProbe};
use super::tensor::{ImatrixKey, OutputTensor, RowSource};
use crate::checkpoint::{Catalog, Checkpoint};
use crate::container::{Container, Gguf, MetaValue, Metadata};
use anyhow::{bail, Context, Result};
use heads::{LinearHeads, Reorder};
use hparams::Hparams;
use serde_json::Value;
use std::collections::BTreeSet;

/// Options of a GGUF conversion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GgufOptions {
    pub ty: GgufType,
    pub int8: Int8Mode,
    /// Write the tokenizer (`--gguf-vocab auto`); without it the file holds tensors and model keys.
    pub vocab: bool,
    pub mtp: MtpMode,
    /// The budget of `--gguf-type auto`.
    pub auto: Option<AutoBits>,
    /// `--max-size`: every quantized tensor at the type the size budget chose.
    pub fitted: bool,
    /// `--imatrix`: llama-quantize's type choices with an importance matrix.
    pub imatrix: bool,
}

impl GgufOptions {
    pub const DEFAULT: GgufOptions = GgufOptions {
        ty: GgufType::Bf16,
        int8: Int8Mode::Exact,
        vocab: true,
        mtp: MtpMode::Auto,
        auto: None,
        fitted: false,
        imatrix: false,
    };
}

/// What every tensor's conversion needs to know of the model.
struct Model<'a> {
    ck: &'a Checkpoint,
    cat: &'a Catalog,
    /// Transformer blocks before the MTP layers.
    layers: u64,
    /// Linear-attention heads when V heads move (more V heads than key heads).
    heads: Option<LinearHeads>,
}

/// The GGUF layout.
#[derive(Clone, Copy, Debug)]
pub struct GgufLayout {
    pub opts: GgufOptions,
}

impl GgufLayout {
    /// One GGUF tensor from HF tensor `t`, named as HF name `hf_name`.
    fn convert(self, t: &OutputTensor, hf_name: &str, model: &Model) -> Result<OutputTensor> {
        let (ck, cat) = (model.ck, model.cat);
        let mapped = names::map(hf_name, model.layers)
            .with_context(|| format!("tensor {hf_name}: llama.cpp's GGUF layout has no place for it"))?;
        if let Some(b) = block(&mapped.name).filter(|&b| b >= model.layers && !mtp::is_mtp(hf_name)) {
            bail!(
                "tensor {hf_name}: block {b}, but config.json's num_hidden_layers is {}; llama.cpp has no place for it",
                model.layers
            );
        }
        let mut shape = t.shape.clone();
        if mapped.name.contains(".ssm_conv1d.") {
            shape.retain(|&d| d != 1);
        }
        let (storage, encoding) = types::converter_choice(self.opts, &mapped.name, &shape, t, (ck, cat));
        let mut source = t.recipe.as_ref().expect("HF-layout tensors have recipes").source.clone();
        let leaf = hf_name.split_once("layers.").and_then(|(_, rest)| rest.split_once('.')).map(|(_, leaf)| leaf);
        if let Some(reorder) = model.heads.zip(leaf).and_then(|(heads, leaf)| heads.reorder(leaf)) {
            let (rows, cols) = match reorder {
                Reorder::Rows(order) => (Some(order), None),
                Reorder::Cols(order) => (None, Some(order)),
            };
            // conv1d's [C, 1, K] reads as C leads of one row: its global rows are its channels.
            let conv = mapped.name.contains(".ssm_conv1d.");
            let height = if conv { t.shape[0] } else { t.shape.iter().rev().nth(1).copied().unwrap_or(1) };
            let width = t.shape.last().copied().unwrap_or(1);
            let fits = rows.is_none_or(|o| o.width() == height) && cols.is_none_or(|o| o.width() == width);
            if t.shape.len() > 2 && !conv || !fits {
                bail!("tensor {hf_name}: shape {:?} does not match the linear-attention heads of config.json", t.shape);
            }
            source = RowSource::Reordered { inner: Box::new(source), rows, cols };
        }
        let mut out = OutputTensor::new(mapped.name, storage, shape, t.kind, source, encoding);
        out.adjust(mapped.adjust);
        Ok(out)
    }
}

/// llama.cpp's names for another format's tensors, for `--imatrix`: the GGUF name of a Hugging Face
/// tensor (the entry of llama-imatrix's matrix for it) and the order llama.cpp gives its input
/// columns (the tiled V heads of `out_proj`).
pub struct LlamaNames {
    layers: u64,
    heads: Option<LinearHeads>,
}

impl LlamaNames {
    pub fn new(config: Option<&Value>) -> Result<LlamaNames> {
        let hp = Hparams::new(config)?;
        Ok(LlamaNames { layers: u64::from(hp.layers()?), heads: LinearHeads::new(&hp)? })
    }

    /// The entry for HF tensor `hf_name` (stacked experts as `mlp.experts.{gate,up,down}_proj`,
    /// the halves llama.cpp splits a fused `gate_up_proj` into), or `None` where llama.cpp has
    /// no place for it.
    pub fn imatrix_key(&self, hf_name: &str) -> Option<ImatrixKey> {
        let mapped = names::map(hf_name, self.layers)?;
        let leaf = hf_name.split_once("layers.").and_then(|(_, rest)| rest.split_once('.')).map(|(_, leaf)| leaf);
        let cols = match self.heads.zip(leaf).and_then(|(heads, leaf)| heads.reorder(leaf)) {
            Some(Reorder::Cols(order)) => Some(order),
            _ => None,
        };
        Some(ImatrixKey { name: mapped.name, cols })
    }
}

/// The sampling defaults of `generation_config.json` as `general.sampling.*`, which llama.cpp
/// uses unless told otherwise.
fn sampling(ck: &Checkpoint) -> Result<Metadata> {
    let Some(config) = vocab::json_file(ck, "generation_config.json")? else { return Ok(Vec::new()) };
    let mut kv = Vec::new();
    let float = |keys: &[&str]| keys.iter().find_map(|k| config.get(*k)?.as_f64()).map(|x| MetaValue::F32(x as f32));
    let int = |key: &str| config.get(key)?.as_i64().and_then(|x| i32::try_from(x).ok()).map(MetaValue::I32);
    let values = [
        ("sequence", config.get("sequence").and_then(Value::as_str).map(|s| MetaValue::Str(s.into()))),
        ("top_k", int("top_k")),
        ("top_p", float(&["top_p"])),
        ("min_p", float(&["min_p"])),
        ("xtc_probability", float(&["xtc_probability"])),
        ("xtc_threshold", float(&["xtc_threshold"])),
        ("temp", float(&["temperature"])),
        ("penalty_last_n", int("penalty_last_n")),
        ("penalty_repeat", float(&["penalty_repeat", "repetition_penalty"])),
        ("mirostat", int("mirostat")),
        ("mirostat_tau", float(&["mirostat_tau"])),
        ("mirostat_eta", float(&["mirostat_eta"])),
    ];
    for (name, value) in values {
        if let Some(v) = value {
            kv.push((format!("general.sampling.{name}"), v));
        }
    }
    Ok(kv)
}

/// The block a GGUF tensor name belongs to (`blk.N.…`).
fn block(name: &str) -> Option<u64> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// The next-token (MTP) blocks written after the `layers` transformer blocks: up to the last one
/// any tensor belongs to (never more than the tensors show, whatever config.json declares).
fn mtp_blocks(tensors: &[OutputTensor], layers: u64) -> u64 {
    tensors
        .iter()
        .filter_map(|t| block(&t.name))
        .filter(|&b| b >= layers)
        .map(|b| (b - layers).saturating_add(1))
        .max()
        .unwrap_or(0)
}

/// Refuses a config whose counts the tensors do not bear out: llama.cpp would refuse the file.
/// Every block, transformer and MTP, must hold tensors (so the block count is bounded by the
/// tensors, never by a number in a name or in config.json), and the vocabulary must be as long as
/// the embedding and the output are high. Returns the vocabulary's length.
fn check_counts(tensors: &[OutputTensor], layers: u64, vocab_size: Option<u32>) -> Result<Option<u64>> {
    let present: BTreeSet<u64> = tensors.iter().filter_map(|t| block(&t.name)).collect();
    let blocks = present.last().map_or(0, |b| b.saturating_add(1)).max(layers);
    if present.len() as u64 != blocks {
        let missing = (0..blocks).find(|b| !present.contains(b)).unwrap_or(0);
        if missing < layers {
            bail!("config.json: num_hidden_layers is {layers}, but the checkpoint holds no tensor of block {missing}");
        }
        bail!("the MTP head has no tensor of its layer {}: its layers must follow each other", missing - layers);
    }
    let mut rows = None;
    for name in ["token_embd.weight", "output.weight"] {
        let Some(t) = tensors.iter().find(|t| t.name == name) else { continue };
        let height = t.shape.first().copied().unwrap_or(0) as u64;
        if let Some(n) = vocab_size.filter(|&n| u64::from(n) != height) {
            bail!("config.json: vocab_size is {n}, but {name} has {height} rows; llama.cpp needs them equal");
        }
        if rows.is_some_and(|r| r != height) {
            bail!("token_embd.weight and output.weight differ in height; llama.cpp needs one vocabulary");
        }
        rows = Some(height);
    }
    Ok(rows.or(vocab_size.map(u64::from)))
}

/// Rows `range` of every lead of a coded source (one half of a fused gate/up expert tensor).
fn rows_of(source: &RowSource, range: std::ops::Range<usize>) -> Option<RowSource> {
    match source {
        RowSource::Coded { module, rows } => {
            Some(RowSource::Coded { module: *module, rows: rows.start + range.start..rows.start + range.end })
        }
        RowSource::Stack(members) => {
            members.iter().map(|m| rows_of(m, range.clone())).collect::<Option<_>>().map(RowSource::Stack)
        }
        RowSource::Int8(_)
        | RowSource::Tensor { .. }
        | RowSource::Reordered { .. }
        | RowSource::Slice { .. }
        | RowSource::Product(..)
        | RowSource::Literal { .. } => None,
    }
}

impl Layout for GgufLayout {
    fn name(&self) -> &'static str {
        "gguf"
    }

    fn shaping_flags(&self, flags: &mut FlagWords) {
        let o = &self.opts;
        flags.value("--format", self.name());
        // Fitted, the engine's `--max-size` chose every type.
        if !o.fitted {
            flags.value("--gguf-type", o.ty.name());
        }
        if let Some(auto) = o.auto {
            auto.shaping_flags(flags);
        }
        flags.value("--gguf-vocab", if o.vocab { "auto" } else { "none" });
        flags.value("--int8", o.int8.name());
        flags.value("--mtp", o.mtp.name());
    }

    fn tensors(
        &self,
        ck: &Checkpoint,
        cat: &Catalog,
        bias: BiasMode,
        warnings: &mut Vec<crate::warning::Warning>,
    ) -> Result<Vec<OutputTensor>> {
        let hp = Hparams::new(ck.config.as_ref())?;
        let model = Model { ck, cat, layers: u64::from(hp.layers()?), heads: LinearHeads::new(&hp)? };
        let mut hf_tensors = hf::tensors(ck, cat, DenseDtype::Bf16, bias);
        // A native EXL3 MoE's per-expert linears, stacked as llama.cpp's expert tensors.
        hf::restack_experts(&mut hf_tensors, false);
        mtp::apply(self.opts.mtp, &mut hf_tensors, ck.config.as_ref(), warnings);
        let mut out = Vec::with_capacity(hf_tensors.len() + 8);
        for t in &hf_tensors {
            let Some(base) = t.name.strip_suffix(names::FUSED_GATE_UP) else {
                out.push(self.convert(t, &t.name, &model)?);
                continue;
            };
            // [E, 2·I, H] → gate [E, I, H] (the first half of each expert's rows) and up.
            let rows = t.shape[t.shape.len() - 2];
            if rows % 2 != 0 {
                bail!("tensor {}: {rows} rows per expert do not split into gate and up halves", t.name);
            }
            let half = rows / 2;
            let source = &t.recipe.as_ref().expect("HF-layout tensors have recipes").source;
            for (part, rows) in [("gate_proj", 0..half), ("up_proj", half..2 * half)] {
                let mut piece = t.clone();
                let n = piece.shape.len();
                piece.shape[n - 2] = half;
                let split =
                    rows_of(source, rows).with_context(|| format!("tensor {}: cannot split gate and up", t.name))?;
                piece.recipe.as_mut().expect("recipe").source = split;
                out.push(self.convert(&piece, &format!("{base}mlp.experts.{part}"), &model)?);
            }
        }
        check_counts(&out, model.layers, hp.vocab_size()?)?;
        // The file as llama.cpp will read it, before any weight is decoded (the metadata's
        // warnings are said when it is written).
        loader::check(&self.metadata(ck, &out, &mut Vec::new())?, &out)?;
        if let Some(rule) = self.opts.ty.quantize() {
            quantize_as_llama_does(rule, &mut out, &hp, model.layers, self.opts.imatrix)?;
        }
        Ok(out)
    }

    /// `--gguf-type auto`: the type of every coded linear, from its decoded rows.
    fn refine(&self, tensors: &mut [OutputTensor], cat: &Catalog, probe: &dyn WeightProbe) -> Result<Vec<WidthChoice>> {
        match self.opts.auto {
            Some(auto) => choose_by_budget(auto, tensors, cat, probe),
            None => Ok(Vec::new()),
        }
    }

    fn fit_menu(
        &self,
        _ck: &Checkpoint,
        tensors: &[OutputTensor],
        cat: &Catalog,
        probe: &dyn WeightProbe,
    ) -> Result<Vec<FitTensor>> {
        types::fit_menu(tensors, cat, probe, self.opts.imatrix)
    }

    fn fit_apply(&self, tensors: &mut [OutputTensor], fit: &FitTensor, option: usize) {
        types::fit_apply(tensors, fit, option);
    }

    fn fit_recipes(&self, ck: &Checkpoint, tensors: &[OutputTensor], menu: &[FitTensor]) -> Result<Yardsticks> {
        let hp = Hparams::new(ck.config.as_ref())?;
        types::fit_recipes(tensors, menu, &hp, u64::from(hp.layers()?), self.opts.imatrix)
    }

    fn config(&self, _input: &Value, _tensors: &[OutputTensor]) -> Option<String> {
        None
    }

    fn container(&self) -> Box<dyn Container> {
        Box::new(Gguf)
    }

    fn metadata(
        &self,
        ck: &Checkpoint,
        tensors: &[OutputTensor],
        warnings: &mut Vec<crate::warning::Warning>,
    ) -> Result<Metadata> {
        let hp = Hparams::new(ck.config.as_ref())?;
        let layers = u64::from(hp.layers()?);
        let mtp_layers = u32::try_from(mtp_blocks(tensors, layers)).context("too many MTP layers")?;
        let mut kv: Metadata = vec![
            ("general.architecture".into(), MetaValue::Str(hp.arch.into())),
            ("general.type".into(), MetaValue::Str("model".into())),
            ("general.name".into(), MetaValue::Str(crate::checkpoint::source_name(&ck.root).0)),
            ("general.quantization_version".into(), MetaValue::U32(2)),
        ];
        kv.extend(sampling(ck)?);
        kv.extend(hp.metadata(mtp_layers, types::file_type(self.opts.ty, tensors))?);
        let vocab_size = check_counts(tensors, layers, hp.vocab_size()?)?;
        if self.opts.vocab {
            kv.extend(vocab::metadata(ck, vocab_size, warnings)?);
        } else {
            kv.extend(vocab::none(hp.arch, vocab_size)?);
        }
        Ok(kv)
    }

    fn copies_side_files(&self) -> bool {
        false
    }

    /// One file unless `--max-shard-size` asks for splits.
    fn default_max_shard_size(&self) -> u64 {
        u64::MAX
    }

    /// The MTP head is the next-token blocks (`blk.N.nextn.*`) after the transformer blocks.
    fn writes_mtp(&self, tensors: &[OutputTensor]) -> bool {
        tensors.iter().any(|t| t.name.contains(".nextn."))
    }

    fn mtp_note(&self, written: bool) -> &'static str {
        if written {
            "kept: the next-token block after the transformer blocks (`blk.N.nextn.*`, `nextn_predict_layers` 1), \
             which llama.cpp runs with `--spec-type draft-mtp`"
        } else {
            "not written (incomplete, or dropped on request): the file has no next-token block and no `nextn_predict_layers`"
        }
    }

    fn needs_config(&self) -> Option<&'static str> {
        Some("the GGUF's model keys, which llama.cpp builds the model from, are written from it")
    }

    fn card(&self, mtp: bool) -> FormatCard {
        let ty = if self.opts.fitted { "mixed" } else { self.opts.ty.name() };
        let draft = if mtp { " (add `--spec-type draft-mtp` to use its MTP head)" } else { "" };
        FormatCard {
            library: "gguf",
            tags: vec!["gguf".into(), ty.into(), "llama.cpp".into()],
            description: format!(
                "GGUF for llama.cpp ({}){}",
                if self.opts.fitted {
                    "each tensor's block type chosen by the size budget, int8 tables included".to_string()
                } else {
                    format!("`--gguf-type {ty}`")
                },
                // Under a size budget the tables take the types it chose; its note says which.
                if self.opts.int8 == Int8Mode::Exact && !self.opts.fitted { ", int8 layers as exact Q8_0" } else { "" }
            ),
            how_to_load: format!(
                "llama.cpp{draft}:\n\n```sh\nllama-cli -m path/to/model/model.gguf -p \"Hello\"\n```\n\n\
                 A split output loads from its first file (`model-00001-of-0000N.gguf`).\n"
            ),
        }
    }
}
