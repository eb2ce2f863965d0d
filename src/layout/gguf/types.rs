//! Which storage each GGUF tensor gets. First what llama.cpp's converter writes (1-D tensors,
//! norms, routers and conv1d in F32; the rest in the chosen type; the exact `Q8_0` of int8 pairs
//! whose row scale is an f16); then, for a K-quant type, what llama-quantize would make of that
//! file (`mixture/`); or, for `auto`, per coded linear the narrowest type within the error budget
//! that `--bits auto` spends too.

use super::hparams::Hparams;
use super::mixture::{self, Mixture, ModelShape};
use super::GgufOptions;
use crate::block_type::BlockType;
use crate::checkpoint::{Catalog, Checkpoint};
use crate::layout::{AutoBits, Int8Mode};
use crate::layout::{
    Chosen, Encoding, FitOption, FitTensor, OutputTensor, RowSource, WeightProbe, WidthChoice, Yardsticks,
};
use crate::quant::budget::{budget, narrowest_within};
use crate::storage::Storage;
use anyhow::{bail, Context, Result};
use safetensors::Dtype;

/// `--gguf-type`: the type of every tensor llama.cpp does not keep in F32: what its converter
/// writes (`bf16`, `f16`, `f32`, `q8_0`), one K-quant for every tensor llama-quantize quantizes
/// (`q4_k`, `q5_k`, `q6_k`), llama-quantize's mixtures (`q2_k`, `q3_k_s`, `q3_k_m`, `q3_k_l`,
/// `iq4_xs`, `q4_k_m`, `q5_k_m`, and the low-bit `iq2_xxs` … `iq3_m`, `q2_k_s`), or per coded
/// linear within the error budget (`auto`).
#[allow(non_camel_case_types)] // llama.cpp's names
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufType {
    /// As llama.cpp's converter writes these models by default.
    Bf16,
    F16,
    F32,
    /// As the converter's `--outtype q8_0`, from the exact reconstruction.
    Q8_0,
    /// `Q4_K` for every tensor llama-quantize quantizes (its fallbacks where rows are not 256-blocks).
    Q4_K,
    Q5_K,
    Q6_K,
    /// llama-quantize's `Q4_K_M` mixture.
    Q4_K_M,
    /// llama-quantize's `Q5_K_M` mixture.
    Q5_K_M,
    /// llama-quantize's `Q2_K` mixture.
    Q2_K,
    /// llama-quantize's `Q3_K_S` mixture.
    Q3_K_S,
    /// llama-quantize's `Q3_K_M` mixture.
    Q3_K_M,
    /// llama-quantize's `Q3_K_L` mixture.
    Q3_K_L,
    /// llama-quantize's `IQ4_XS` mixture.
    IQ4_XS,
    /// llama-quantize's low-bit mixtures (`IQ2_XXS` … `Q2_K_S`), most of them only with
    /// `--imatrix` (where llama-quantize needs a matrix).
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ2_M,
    IQ3_XXS,
    IQ3_XS,
    IQ3_S,
    IQ3_M,
    Q2_K_S,
    /// Per coded linear, the narrowest of `Q2_K`, `Q3_K`, `IQ4_XS`, `Q4_K`, `Q5_K`, `Q6_K` and
    /// `Q8_0` within the error budget (`--max-added-error`), else BF16.
    Auto,
}

/// How llama-quantize's choice is made for a K-quant `--gguf-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Quantize {
    /// One type for every tensor it quantizes (rows that are not whole blocks fall back).
    Uniform(BlockType),
    Mixture(Mixture),
}

impl GgufType {
    /// What llama.cpp's converter writes, and what llama-quantize starts from for a K-quant.
    fn converter_storage(self) -> Storage {
        match self {
            GgufType::F16 => Storage::Element(Dtype::F16),
            GgufType::F32 => Storage::Element(Dtype::F32),
            GgufType::Q8_0 => Storage::Block(BlockType::Q8_0),
            _ => Storage::Element(Dtype::BF16),
        }
    }

    /// Whether llama-quantize makes it (a K-quant or `IQ4_XS` file type): the types an importance
    /// matrix weighs.
    pub fn is_quantized_by_llama(self) -> bool {
        self.quantize().is_some()
    }

    pub(super) fn quantize(self) -> Option<Quantize> {
        Some(match self {
            GgufType::Q4_K => Quantize::Uniform(BlockType::Q4_K),
            GgufType::Q5_K => Quantize::Uniform(BlockType::Q5_K),
            GgufType::Q6_K => Quantize::Uniform(BlockType::Q6_K),
            GgufType::Q4_K_M => Quantize::Mixture(Mixture::Q4KM),
            GgufType::Q5_K_M => Quantize::Mixture(Mixture::Q5KM),
            GgufType::Q2_K => Quantize::Mixture(Mixture::Q2K),
            GgufType::Q3_K_S => Quantize::Mixture(Mixture::Q3KS),
            GgufType::Q3_K_M => Quantize::Mixture(Mixture::Q3KM),
            GgufType::Q3_K_L => Quantize::Mixture(Mixture::Q3KL),
            GgufType::IQ4_XS => Quantize::Mixture(Mixture::IQ4XS),
            GgufType::IQ2_XXS => Quantize::Mixture(Mixture::IQ2XXS),
            GgufType::IQ2_XS => Quantize::Mixture(Mixture::IQ2XS),
            GgufType::IQ2_S => Quantize::Mixture(Mixture::IQ2S),
            GgufType::IQ2_M => Quantize::Mixture(Mixture::IQ2M),
            GgufType::IQ3_XXS => Quantize::Mixture(Mixture::IQ3XXS),
            GgufType::IQ3_XS => Quantize::Mixture(Mixture::IQ3XS),
            GgufType::IQ3_S => Quantize::Mixture(Mixture::IQ3S),
            GgufType::IQ3_M => Quantize::Mixture(Mixture::IQ3M),
            GgufType::Q2_K_S => Quantize::Mixture(Mixture::Q2KS),
            GgufType::Bf16 | GgufType::F16 | GgufType::F32 | GgufType::Q8_0 | GgufType::Auto => return None,
        })
    }

    /// `general.file_type`: llama.cpp's `LLAMA_FTYPE_MOSTLY_*`; a uniform K-quant the number
    /// `llama-quantize --pure` writes for it (it takes `Q4_K` and `Q5_K` for their `_M` mixtures).
    fn fixed_file_type(self) -> Option<u32> {
        Some(match self {
            GgufType::Auto => return None,
            GgufType::F32 => 0,
            GgufType::F16 => 1,
            GgufType::Q8_0 => 7,

            GgufType::Q6_K => Mixture::Q6K.file_type(),
            GgufType::Q4_K | GgufType::Q4_K_M => Mixture::Q4KM.file_type(),
            GgufType::Q5_K | GgufType::Q5_K_M => Mixture::Q5KM.file_type(),
            GgufType::Q2_K => Mixture::Q2K.file_type(),
            GgufType::Q3_K_S => Mixture::Q3KS.file_type(),
            GgufType::Q3_K_M => Mixture::Q3KM.file_type(),
            GgufType::Q3_K_L => Mixture::Q3KL.file_type(),
            GgufType::IQ4_XS => Mixture::IQ4XS.file_type(),
            GgufType::IQ2_XXS => Mixture::IQ2XXS.file_type(),
            GgufType::IQ2_XS => Mixture::IQ2XS.file_type(),
            GgufType::IQ2_S => Mixture::IQ2S.file_type(),
            GgufType::IQ2_M => Mixture::IQ2M.file_type(),
            GgufType::IQ3_XXS => Mixture::IQ3XXS.file_type(),
            GgufType::IQ3_XS => Mixture::IQ3XS.file_type(),
            GgufType::IQ3_S => Mixture::IQ3S.file_type(),
            GgufType::IQ3_M => Mixture::IQ3M.file_type(),
            GgufType::Q2_K_S => Mixture::Q2KS.file_type(),
            GgufType::Bf16 => 32,
        })
    }

    /// `tensor_requires_imatrix`: whether llama-quantize refuses to write tensor `name` as
    /// `storage` in this file type without an importance matrix (or without the tensor's entry).
    pub fn requires_imatrix(self, name: &str, storage: Storage) -> bool {
        matches!(self.quantize(), Some(Quantize::Mixture(m)) if mixture::requires_imatrix(m, name, storage))
    }

    pub fn name(self) -> &'static str {
        match self {
            GgufType::Bf16 => "bf16",
            GgufType::F16 => "f16",
            GgufType::F32 => "f32",
            GgufType::Q8_0 => "q8_0",
            GgufType::Q4_K => "q4_k",
            GgufType::Q5_K => "q5_k",
            GgufType::Q6_K => "q6_k",
            GgufType::Q4_K_M => "q4_k_m",
            GgufType::Q5_K_M => "q5_k_m",
            GgufType::Q2_K => "q2_k",
            GgufType::Q3_K_S => "q3_k_s",
            GgufType::Q3_K_M => "q3_k_m",
            GgufType::Q3_K_L => "q3_k_l",
            GgufType::IQ4_XS => "iq4_xs",
            GgufType::IQ2_XXS => "iq2_xxs",
            GgufType::IQ2_XS => "iq2_xs",
            GgufType::IQ2_S => "iq2_s",
            GgufType::IQ2_M => "iq2_m",
            GgufType::IQ3_XXS => "iq3_xxs",
            GgufType::IQ3_XS => "iq3_xs",
            GgufType::IQ3_S => "iq3_s",
            GgufType::IQ3_M => "iq3_m",
            GgufType::Q2_K_S => "q2_k_s",
            GgufType::Auto => "auto",
        }
    }
}

/// Whether llama.cpp keeps tensor `name` of `shape` in F32 whatever the file type.
fn always_f32(name: &str, shape: &[usize]) -> bool {
    shape.len() <= 1
        || name.ends_with("_norm.weight")
        || !name.ends_with(".weight")
        || [".ffn_gate_inp.", ".ffn_gate_inp_shexp.", ".ssm_conv1d."].iter().any(|k| name.contains(k))
}

/// The types llama-quantize gives the tensors of a file of `layers` transformer blocks (and its
/// next-token blocks), with `hp`'s experts and heads, starting from what the converter writes:
/// each float tensor it quantizes gets the rule's type (falling back where rows are not whole
/// blocks); what it leaves alone, and the exact `Q8_0` of int8 pairs, stay as they are.
pub(super) fn quantize_as_llama_does(
    rule: Quantize,
    tensors: &mut [OutputTensor],
    hp: &Hparams,
    layers: u64,
    imatrix: bool,
) -> Result<()> {
    let blocks = layers + super::mtp_blocks(tensors, layers);
    let blocks = u32::try_from(blocks).context("too many blocks for llama.cpp")?;
    let experts = hp.count("num_experts")?.or(hp.count("num_local_experts")?);
    // `head_count` and `head_count_kv` as the header writes them; llama.cpp reads an absent
    // `head_count_kv` as `head_count`.
    let heads = hp.count("num_attention_heads")?.unwrap_or(0);
    let kv_heads = hp.count("num_key_value_heads")?.unwrap_or(heads);
    let shapes: Vec<(String, Vec<usize>)> = tensors.iter().map(|t| (t.name.clone(), t.shape.clone())).collect();
    let model = ModelShape::new(blocks, experts.unwrap_or(0), shapes.iter().map(|(n, s)| (n.as_str(), s.as_slice())))
        .with_heads(heads, kv_heads);
    for t in tensors.iter_mut().filter(|t| t.recipe.as_ref().is_some_and(|r| r.encoding == Encoding::Float)) {
        let chosen = match rule {
            Quantize::Mixture(m) => mixture::tensor_type(m, &model, &t.name, &t.shape, imatrix)?,
            Quantize::Uniform(ty) => mixture::uniform_type(ty, &t.name, &t.shape),
        };
        if let Some(storage) = chosen {
            // llama-quantize refuses here, before it quantizes anything.
            if let Quantize::Mixture(m) = rule {
                if !imatrix && mixture::requires_imatrix(m, &t.name, storage) {
                    bail!(
                        "tensor {}: llama-quantize's {} writes it as {}, which needs an importance matrix: give \
                         --imatrix FILE (the base model's published matrix, or one made with llama-imatrix -m \
                         OUT/model.gguf -f text.txt -o imatrix.gguf from this tool's --gguf-type q8_0 GGUF of the \
                         model)",
                        t.name,
                        m.name(),
                        storage.name()
                    );
                }
            }
            t.storage = storage;
        }
    }
    Ok(())
}

/// The storage and encoding of output `name` of `shape`, made from `t` (an HF-layout tensor).
pub(super) fn converter_choice(
    opts: GgufOptions,
    name: &str,
    shape: &[usize],
    t: &OutputTensor,
    (ck, cat): (&Checkpoint, &Catalog),
) -> (Storage, Encoding) {
    let recipe = t.recipe.as_ref().expect("HF-layout tensors have recipes");
    if recipe.encoding == Encoding::Bytes {
        return (t.storage, Encoding::Bytes);
    }
    if always_f32(name, shape) {
        return (Storage::Element(Dtype::F32), Encoding::Float);
    }
    let cols = shape.last().copied().unwrap_or(1);
    if let RowSource::Int8(i) = recipe.source {
        let f16_scale = ck.tensors.get(&cat.int8[i].scale).is_some_and(|s| s.dtype == Dtype::F16);
        if opts.int8 == Int8Mode::Exact && f16_scale && cols % BlockType::Q8_0.elements() == 0 {
            return (Storage::Block(BlockType::Q8_0), Encoding::Int8Blocks);
        }
    }
    match opts.ty.converter_storage() {
        // llama.cpp's converter writes F16 where rows are not whole blocks.
        Storage::Block(b) if cols % b.elements() != 0 => (Storage::Element(Dtype::F16), Encoding::Float),
        s => (s, Encoding::Float),
    }
}

/// The types `--gguf-type auto` chooses among, narrowest first (BF16 after them all).
const AUTO_TYPES: [BlockType; 7] = [
    BlockType::Q2_K,
    BlockType::Q3_K,
    BlockType::IQ4_XS,
    BlockType::Q4_K,
    BlockType::Q5_K,
    BlockType::Q6_K,
    BlockType::Q8_0,
];

/// `--gguf-type auto`: each coded linear gets the narrowest of [`AUTO_TYPES`] whose blocks divide
/// its rows and whose added error is within `R · 2^-K`, else BF16; everything else stays what the
/// converter writes (BF16, F32, the exact `Q8_0` of int8 pairs). Says what it chose.
pub(super) fn choose_by_budget(
    auto: AutoBits,
    tensors: &mut [OutputTensor],
    cat: &Catalog,
    probe: &dyn WeightProbe,
) -> Result<Vec<WidthChoice>> {
    let mut choices = Vec::new();
    for t in tensors.iter_mut() {
        let Some(recipe) = &t.recipe else { continue };
        if recipe.encoding != Encoding::Float || t.storage != Storage::Element(Dtype::BF16) {
            continue;
        }
        let Some(&module) = recipe.source.coded_modules().first() else { continue };
        let k = cat.coded[module].k;
        let budget = budget(auto.max_added_error, k);
        let cols = t.shape.last().copied().unwrap_or(1);
        let candidates: Vec<Storage> = AUTO_TYPES
            .into_iter()
            .filter(|b| cols % b.elements() == 0)
            .map(Storage::Block)
            .chain([Storage::Element(Dtype::BF16)])
            .collect();
        let (estimate, exact) = probe.storage_errors(&recipe.source, recipe.adjust, &candidates, auto.exact, None)?;
        let estimated = narrowest_within(&estimate.relative(), budget);
        let chosen = exact.as_ref().map_or(estimated, |e| narrowest_within(&e.relative(), budget));
        let error_of = |e: &crate::quant::block_error::StorageErrors| {
            e.relative().into_iter().find(|&(c, _)| c == chosen).map_or(0.0, |(_, x)| x)
        };
        t.storage = chosen;
        choices.push(WidthChoice {
            tensor: t.name.clone(),
            k,
            chosen: Chosen::GgufType(chosen.name()),
            bits_per_weight: chosen.bits_per_weight(),
            budget,
            predicted: error_of(&estimate),
            actual: exact.as_ref().map(error_of),
            estimate: exact.map(|_| Chosen::GgufType(estimated.name())),
            group_size: None,
            bytes: None,
            ratio: None,
        });
    }
    Ok(choices)
}

/// When a [`FIT_TYPES`] entry is offered: as llama-quantize makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Offered {
    Always,
    /// With `--imatrix`, to any tensor: a type llama-quantize makes without the tensor's entry
    /// (`IQ3_S`, which its `iq3_*` files give the embedding) but that only its low-bit file types
    /// use, all of them made with a matrix.
    WithImatrix,
    /// Only to a tensor with an entry: llama-quantize refuses it without one
    /// (`tensor_requires_imatrix`).
    WithEntry,
}

/// The types `--max-size` chooses among, narrowest first, one line each. A row that is not whole
/// 256-value blocks gets each K-quant's and IQ type's fallback instead, as llama-quantize gives
/// it (`Q2_K`, `Q3_K` → `Q4_0`; `IQ4_XS` and the IQ2/IQ3 types → `IQ4_NL`; `Q4_K` → `Q5_0`; …):
/// the legacy 32-value types. Every type of every llama-quantize file type is here, so that each
/// of its files is a recipe the plan can be held to.
pub(super) const FIT_TYPES: [(BlockType, Offered); 16] = [
    (BlockType::IQ2_XXS, Offered::WithEntry),
    (BlockType::IQ2_XS, Offered::WithEntry),
    (BlockType::IQ2_S, Offered::WithEntry),
    (BlockType::Q2_K, Offered::Always),
    (BlockType::IQ3_XXS, Offered::WithEntry),
    (BlockType::IQ3_S, Offered::WithImatrix),
    (BlockType::Q3_K, Offered::Always),
    (BlockType::IQ4_XS, Offered::Always),
    (BlockType::Q4_0, Offered::Always),
    (BlockType::Q4_K, Offered::Always),
    (BlockType::Q4_1, Offered::Always),
    (BlockType::Q5_0, Offered::Always),
    (BlockType::Q5_K, Offered::Always),
    (BlockType::Q5_1, Offered::Always),
    (BlockType::Q6_K, Offered::Always),
    (BlockType::Q8_0, Offered::Always),
];

/// The block types of [`FIT_TYPES`] a row of `cols` values can hold, given whether there is a
/// matrix (`imatrix`) and an entry of it for the tensor (`entry`), each in its fallback where its
/// blocks do not divide the row, once each.
fn fit_types(cols: usize, imatrix: bool, entry: bool) -> Vec<BlockType> {
    let mut types = Vec::new();
    for (ty, offered) in FIT_TYPES {
        let offer = match offered {
            Offered::Always => true,
            Offered::WithImatrix => imatrix,
            Offered::WithEntry => entry,
        };
        if !offer {
            continue;
        }
        if let Storage::Block(b) = mixture::fallback(ty, cols) {
            if !types.contains(&b) {
                types.push(b);
            }
        }
    }
    types
}

/// `--max-size`: every tensor the converter writes in BF16 that llama.cpp quantizes, and every
/// exact `Q8_0` int8 table, at each of [`FIT_TYPES`] its rows hold, or that type's fallback (an exact table
/// also as its exact `Q8_0`, which adds nothing); a type that needs an entry of the matrix only
/// where the tensor has one, the other low-bit types only with `imatrix`.
pub(super) fn fit_menu(
    tensors: &[OutputTensor],
    cat: &Catalog,
    probe: &dyn WeightProbe,
    imatrix: bool,
) -> Result<Vec<FitTensor>> {
    let mut menu = Vec::new();
    for (index, t) in tensors.iter().enumerate() {
        let Some(recipe) = &t.recipe else { continue };
        let exact = recipe.encoding == Encoding::Int8Blocks;
        let float_bf16 = recipe.encoding == Encoding::Float && t.storage == Storage::Element(Dtype::BF16);
        if !(exact || float_bf16) || t.shape.len() < 2 {
            continue;
        }
        let cols = t.shape.last().copied().unwrap_or(1);
        let candidates: Vec<Storage> = fit_types(cols, imatrix, recipe.importance.is_some())
            .into_iter()
            .filter(|b| !(exact && *b == BlockType::Q8_0))
            .map(Storage::Block)
            .collect();
        if candidates.is_empty() {
            continue;
        }
        let mut options = Vec::new();
        if exact {
            options.push(FitOption {
                chosen: Chosen::GgufType(t.storage.name()),
                group_size: None,
                storage: t.storage,
                lossless: true,
                bytes: t.byte_len() as u64,
                error: 0.0,
            });
        }
        let (estimate, _) =
            probe.storage_errors(&recipe.source, recipe.adjust, &candidates, false, recipe.importance.as_ref())?;
        for (storage, error) in estimate.relative() {
            options.push(FitOption {
                chosen: Chosen::GgufType(storage.name()),
                group_size: None,
                storage,
                lossless: false,
                bytes: storage.byte_len(t.numel()) as u64,
                error,
            });
        }
        let k = recipe.source.coded_modules().first().map(|&m| cat.coded[m].k);
        menu.push(FitTensor { index, name: t.name.clone(), k, weights: t.weights(), options });
    }
    Ok(menu)
}

/// Gives `tensors[fit.index]` option `option`: a block type from its rows, or the exact `Q8_0`.
pub(super) fn fit_apply(tensors: &mut [OutputTensor], fit: &FitTensor, option: usize) {
    let o = &fit.options[option];
    let t = &mut tensors[fit.index];
    t.storage = o.storage;
    if let Some(recipe) = t.recipe.as_mut() {
        recipe.encoding = if o.lossless { Encoding::Int8Blocks } else { Encoding::Float };
    }
}

/// `general.file_type`: the type's, or for `auto` (and `--max-size`) the one llama.cpp would give the file from the
/// type that holds the most weights (its `llama_model_loader` guess, by weights rather than by
/// tensor count so that the many small F32 norms do not decide).
pub(super) fn file_type(ty: GgufType, tensors: &[OutputTensor]) -> u32 {
    if let Some(fixed) = ty.fixed_file_type() {
        return fixed;
    }
    let mut weights: Vec<(Storage, usize)> = Vec::new();
    for t in tensors.iter().filter(|t| t.storage != Storage::Element(Dtype::F32)) {
        match weights.iter_mut().find(|(s, _)| *s == t.storage) {
            Some((_, n)) => *n += t.numel(),
            None => weights.push((t.storage, t.numel())),
        }
    }
    let most = weights.iter().max_by_key(|(_, n)| *n).map(|(s, _)| *s);
    // llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_0, _Q4_1, _Q5_0, _Q5_1, _IQ4_NL (a --max-size file may
    // hold most of its weights in a 32-value type).
    let legacy = match most {
        Some(Storage::Block(BlockType::Q4_0)) => Some(2),
        Some(Storage::Block(BlockType::Q4_1)) => Some(3),
        Some(Storage::Block(BlockType::Q5_0)) => Some(8),
        Some(Storage::Block(BlockType::Q5_1)) => Some(9),
        Some(Storage::Block(BlockType::IQ4_NL)) => Some(25),
        _ => None,
    };
    if let Some(ftype) = legacy {
        return ftype;
    }
    let named = match most {
        Some(Storage::Element(Dtype::F16)) => GgufType::F16,
        Some(Storage::Block(BlockType::Q8_0)) => GgufType::Q8_0,
        Some(Storage::Block(BlockType::IQ2_XXS)) => GgufType::IQ2_XXS,
        Some(Storage::Block(BlockType::IQ2_XS)) => GgufType::IQ2_XS,
        Some(Storage::Block(BlockType::IQ2_S)) => GgufType::IQ2_S,
        Some(Storage::Block(BlockType::Q2_K)) => GgufType::Q2_K,
        Some(Storage::Block(BlockType::IQ3_XXS)) => GgufType::IQ3_XXS,
        Some(Storage::Block(BlockType::IQ3_S)) => GgufType::IQ3_S,
        Some(Storage::Block(BlockType::Q3_K)) => GgufType::Q3_K_M,
        Some(Storage::Block(BlockType::IQ4_XS)) => GgufType::IQ4_XS,
        Some(Storage::Block(BlockType::Q4_K)) => GgufType::Q4_K_M,
        Some(Storage::Block(BlockType::Q5_K)) => GgufType::Q5_K_M,
        Some(Storage::Block(BlockType::Q6_K)) => GgufType::Q6_K,
        _ => GgufType::Bf16,
    };
    named.fixed_file_type().unwrap_or(32)
}

/// The `--gguf-type`s llama-quantize makes, narrowest first: `--max-size`'s yardsticks.
const FIXED_RECIPES: [GgufType; 10] = [
    GgufType::Q2_K,
    GgufType::Q3_K_S,
    GgufType::Q3_K_M,
    GgufType::Q3_K_L,
    GgufType::IQ4_XS,
    GgufType::Q4_K,
    GgufType::Q4_K_M,
    GgufType::Q5_K,
    GgufType::Q5_K_M,
    GgufType::Q6_K,
];

/// The file types llama-quantize makes only with a matrix (most of their tensors need one): with
/// `--imatrix`, yardsticks too.
const IMATRIX_RECIPES: [GgufType; 9] = [
    GgufType::IQ2_XXS,
    GgufType::IQ2_XS,
    GgufType::IQ2_S,
    GgufType::IQ2_M,
    GgufType::Q2_K_S,
    GgufType::IQ3_XXS,
    GgufType::IQ3_XS,
    GgufType::IQ3_S,
    GgufType::IQ3_M,
];

/// `--max-size`'s yardsticks: each `--gguf-type` that llama-quantize makes (its mixtures and the
/// uniform K-quants; with `imatrix` its low-bit IQ files too) as it would type the menu's tensors
/// (with `imatrix`, as it types them given one), an exact int8 table kept exact.
pub(super) fn fit_recipes(
    tensors: &[OutputTensor],
    menu: &[FitTensor],
    hp: &Hparams,
    layers: u64,
    imatrix: bool,
) -> Result<Yardsticks> {
    let mut recipes = Yardsticks::default();
    let low: &[GgufType] = if imatrix { &IMATRIX_RECIPES } else { &[] };
    let types = FIXED_RECIPES.iter().chain(low).copied();
    for (ty, requant) in types.flat_map(|ty| [(ty, false), (ty, true)]) {
        let rule = ty.quantize().expect("a type llama-quantize makes");
        let mut typed = tensors.to_vec();
        if requant {
            // `--int8 requant`: the int8 tables from their float rows, as llama-quantize types a
            // bf16 file's (narrower than their exact Q8_0 in the low-bit mixtures).
            for r in typed.iter_mut().filter_map(|t| t.recipe.as_mut()) {
                if r.encoding == Encoding::Int8Blocks {
                    r.encoding = Encoding::Float;
                }
            }
        }
        quantize_as_llama_does(rule, &mut typed, hp, layers, imatrix)?;
        let pick = |t: &FitTensor| {
            let as_typed = &typed[t.index];
            let lossless = as_typed.recipe.as_ref().is_some_and(|r| r.encoding == Encoding::Int8Blocks);
            let exact_q8 = |o: &FitOption| o.lossless && as_typed.storage == Storage::Block(BlockType::Q8_0);
            // A table requantized to Q8_0 is its exact Q8_0: the same bytes, no error.
            t.options.iter().position(|o| (o.lossless == lossless && o.storage == as_typed.storage) || exact_q8(o))
        };
        let name = format!("--gguf-type {}{}", ty.name(), if requant { " --int8 requant" } else { "" });
        recipes.add(name, menu, pick);
    }
    Ok(recipes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use BlockType as T;

    #[test]
    fn the_fit_menu_offers_the_low_bit_types_or_llama_quantize_s_fallbacks() {
        // Whole 256-value blocks: every type as itself, the IQ2 and IQ3 types only with a matrix,
        // all but IQ3_S only where the tensor has an entry (llama-quantize's iq3_* files give the
        // embedding, which has none, IQ3_S).
        assert_eq!(fit_types(512, true, true), FIT_TYPES.map(|(t, _)| t).to_vec());
        let plain: Vec<BlockType> = FIT_TYPES.iter().filter(|(_, o)| *o == Offered::Always).map(|(t, _)| *t).collect();
        assert_eq!(fit_types(512, false, false), plain);
        assert!(!plain.iter().any(|t| t.name().starts_with("iq2") || t.name().starts_with("iq3")));
        let no_entry = fit_types(512, true, false);
        assert_eq!(no_entry.iter().filter(|t| !plain.contains(t)).collect::<Vec<_>>(), [&T::IQ3_S]);
        // 32-value blocks only: Q2_K and Q3_K fall back to Q4_0, IQ4_XS to IQ4_NL, the other
        // K-quants to their legacy types; each once.
        assert_eq!(fit_types(128, false, false), [T::Q4_0, T::IQ4_NL, T::Q5_0, T::Q4_1, T::Q5_1, T::Q8_0]);
        // No whole block at all: nothing to choose (the tensor stays as laid out).
        assert!(fit_types(100, true, true).is_empty());
    }
}
