//! The mixtures of `llama-quantize` (`Q2_K`, `Q3_K_S`, `Q3_K_M`, `Q3_K_L`, `Q4_K_M`, `Q5_K_M`,
//! `Q4_K_S`, `Q5_K_S`, `Q6_K`, `IQ4_XS`, `Q8_0`, and the low-bit ones `IQ2_XXS`, `IQ2_XS`, `IQ2_S`,
//! `IQ2_M`, `IQ3_XXS`, `IQ3_XS`, `IQ3_S`, `IQ3_M`, `Q2_K_S`):
//! which ggml type each tensor of a `qwen35` / `qwen35moe` GGUF gets, as llama.cpp decides it in
//! `src/llama-quant.cpp` (`tensor_allows_quantization`, `llama_tensor_get_type_impl`,
//! `tensor_type_fallback`, `tensor_requires_imatrix`) of the llama-cpp-python 0.3.36 sdist, with
//! llama-quantize's default options, with or without an importance matrix (which changes
//! `IQ3_XXS`'s and `IQ4_XS`'s rules; [`requires_imatrix`] says where llama-quantize refuses to run
//! without one).
//!
//! The choice depends on the header's `block_count` (every block, the MTP ones too),
//! `expert_count` and grouped-query ratio (`head_count / head_count_kv` of the first block), on a
//! tensor's name, number of dimensions and row length (the innermost
//! dimension), and on which other tensors the file holds: whether it has `output.weight` (else the
//! embeddings are tied and `token_embd` takes the output's rule) and where an `attn_v`-like tensor
//! (`attn_v`, `attn_qkv`) or, without experts, an `ffn_down` falls among its kind in llama.cpp's
//! tensor order (by block, then by name). [`ModelShape`] holds that; [`tensor_type`] applies the
//! rule to one tensor.
//!
//! `fixtures/gguf-mixtures.json` (written by `scripts/gguf-mixture-cases.py` with the real
//! llama-quantize, re-checked by `tests/python/test_gguf_mixture.py`) holds llama-quantize's choice
//! for every tensor of six models and every mixture of [`Mixture::ALL`] (the low-bit ones,
//! [`Mixture::LOW_BIT`], with a flat importance matrix: most need one to run); `tests.rs` checks
//! the rule against all of them.

use crate::block_type::BlockType;
use crate::storage::Storage;
use anyhow::{bail, Result};
use safetensors::Dtype;

/// A `llama-quantize` mixture, by the name llama-quantize takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(not(test), allow(dead_code))] // the tests hold every mixture to llama-quantize's choices
pub enum Mixture {
    Q4KM,
    Q4KS,
    Q5KM,
    Q5KS,
    Q6K,
    Q8_0,
    Q2K,
    Q3KS,
    Q3KM,
    Q3KL,
    IQ4XS,
    IQ2XXS,
    IQ2XS,
    IQ2S,
    IQ2M,
    IQ3XXS,
    IQ3XS,
    IQ3S,
    IQ3M,
    Q2KS,
}

#[cfg_attr(not(test), allow(dead_code))]
impl Mixture {
    /// Every mixture, as `fixtures/gguf-mixtures.json` records them (the [`Mixture::LOW_BIT`] ones
    /// last, recorded with an importance matrix).
    pub const ALL: [Mixture; 20] = [
        Mixture::Q4KM,
        Mixture::Q4KS,
        Mixture::Q5KM,
        Mixture::Q5KS,
        Mixture::Q6K,
        Mixture::Q8_0,
        Mixture::Q2K,
        Mixture::Q3KS,
        Mixture::Q3KM,
        Mixture::Q3KL,
        Mixture::IQ4XS,
        Mixture::IQ2XXS,
        Mixture::IQ2XS,
        Mixture::IQ2S,
        Mixture::IQ2M,
        Mixture::IQ3XXS,
        Mixture::IQ3XS,
        Mixture::IQ3S,
        Mixture::IQ3M,
        Mixture::Q2KS,
    ];

    /// The 2–3.5-bit mixtures, llama-quantize's `IQ2_XXS` … `Q2_K_S`.
    pub const LOW_BIT: [Mixture; 9] = [
        Mixture::IQ2XXS,
        Mixture::IQ2XS,
        Mixture::IQ2S,
        Mixture::IQ2M,
        Mixture::IQ3XXS,
        Mixture::IQ3XS,
        Mixture::IQ3S,
        Mixture::IQ3M,
        Mixture::Q2KS,
    ];

    /// llama-quantize's name (`Q4_K_M`).
    pub fn name(self) -> &'static str {
        match self {
            Mixture::Q4KM => "Q4_K_M",
            Mixture::Q4KS => "Q4_K_S",
            Mixture::Q5KM => "Q5_K_M",
            Mixture::Q5KS => "Q5_K_S",
            Mixture::Q6K => "Q6_K",
            Mixture::Q8_0 => "Q8_0",
            Mixture::Q2K => "Q2_K",
            Mixture::Q3KS => "Q3_K_S",
            Mixture::Q3KM => "Q3_K_M",
            Mixture::Q3KL => "Q3_K_L",
            Mixture::IQ4XS => "IQ4_XS",
            Mixture::IQ2XXS => "IQ2_XXS",
            Mixture::IQ2XS => "IQ2_XS",
            Mixture::IQ2S => "IQ2_S",
            Mixture::IQ2M => "IQ2_M",
            Mixture::IQ3XXS => "IQ3_XXS",
            Mixture::IQ3XS => "IQ3_XS",
            Mixture::IQ3S => "IQ3_S",
            Mixture::IQ3M => "IQ3_M",
            Mixture::Q2KS => "Q2_K_S",
        }
    }

    pub fn from_name(name: &str) -> Option<Mixture> {
        Mixture::ALL.into_iter().find(|m| m.name() == name)
    }

    /// `general.file_type`: llama.cpp's `LLAMA_FTYPE_MOSTLY_*` (include/llama.h).
    pub fn file_type(self) -> u32 {
        match self {
            Mixture::Q8_0 => 7,
            Mixture::Q2K => 10,
            Mixture::Q3KS => 11,
            Mixture::Q3KM => 12,
            Mixture::Q3KL => 13,
            Mixture::Q4KS => 14,
            Mixture::Q4KM => 15,
            Mixture::Q5KS => 16,
            Mixture::Q5KM => 17,
            Mixture::Q6K => 18,
            Mixture::IQ4XS => 30,
            Mixture::IQ2XXS => 19,
            Mixture::IQ2XS => 20,
            Mixture::Q2KS => 21,
            Mixture::IQ3XS => 22,
            Mixture::IQ3XXS => 23,
            Mixture::IQ3S => 26,
            Mixture::IQ3M => 27,
            Mixture::IQ2S => 28,
            Mixture::IQ2M => 29,
        }
    }

    /// The type of every tensor no rule singles out (`llama_ftype_get_default_type`).
    fn default_type(self) -> BlockType {
        match self {
            Mixture::Q4KM | Mixture::Q4KS => BlockType::Q4_K,
            Mixture::Q5KM | Mixture::Q5KS => BlockType::Q5_K,
            Mixture::Q6K => BlockType::Q6_K,
            Mixture::Q8_0 => BlockType::Q8_0,
            Mixture::Q2K | Mixture::Q2KS => BlockType::Q2_K,
            Mixture::Q3KS | Mixture::Q3KM | Mixture::Q3KL => BlockType::Q3_K,
            Mixture::IQ4XS => BlockType::IQ4_XS,
            Mixture::IQ2XXS => BlockType::IQ2_XXS,
            Mixture::IQ2XS | Mixture::IQ2S => BlockType::IQ2_XS,
            Mixture::IQ2M => BlockType::IQ2_S,
            Mixture::IQ3XXS => BlockType::IQ3_XXS,
            Mixture::IQ3XS | Mixture::IQ3S | Mixture::IQ3M => BlockType::IQ3_S,
        }
    }

    /// The mixtures llama.cpp's rule treats as one family (`IQ2_XXS`, `IQ2_XS`, `IQ2_S`, `IQ2_M`;
    /// its `IQ1_*` too).
    fn is_iq2(self) -> bool {
        matches!(self, Mixture::IQ2XXS | Mixture::IQ2XS | Mixture::IQ2S | Mixture::IQ2M)
    }
}

/// What of the whole model llama-quantize's rule looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// `{arch}.block_count`: every block, the MTP (`nextn`) ones included.
    block_count: u32,
    /// `{arch}.expert_count`, 0 without one.
    expert_count: u32,
    /// `n_gqa()` of the first block: `head_count / head_count_kv`, 0 where `head_count_kv` is 0.
    gqa: u32,
    /// No `output.weight`: the output shares `token_embd`.
    tied: bool,
    /// `attn_v`-like tensors (`attn_v`, `attn_qkv`, `attn_kv_b`) in the model.
    n_attention_wv: usize,
    /// The quantized `attn_v`-like tensors, in llama.cpp's order.
    attention_wv: Vec<(i64, String)>,
    /// The quantized `ffn_down`-like tensors, in llama.cpp's order.
    ffn_down: Vec<(i64, String)>,
    /// The quantized `ffn_gate`-like and `ffn_up`-like tensors, in llama.cpp's order.
    ffn_gate: Vec<(i64, String)>,
    ffn_up: Vec<(i64, String)>,
}

impl ModelShape {
    /// The model whose header says `block_count` and `expert_count` (0 when absent) and that holds
    /// `tensors` (every tensor of the file: name and shape in torch order, outermost first).
    pub fn new<'a>(
        block_count: u32,
        expert_count: u32,
        tensors: impl IntoIterator<Item = (&'a str, &'a [usize])>,
    ) -> ModelShape {
        let mut m = ModelShape {
            block_count,
            expert_count,
            gqa: 1,
            tied: true,
            n_attention_wv: 0,
            attention_wv: Vec::new(),
            ffn_down: Vec::new(),
            ffn_gate: Vec::new(),
            ffn_up: Vec::new(),
        };
        for (name, shape) in tensors {
            let category = category(name);
            m.tied &= category != Category::Output;
            if category.is_attn_v() {
                m.n_attention_wv += 1;
            }
            // The counters advance only for tensors that reach the mixture's rule.
            if allows_quantization(name, shape) {
                match category {
                    c if c.is_attn_v() => m.attention_wv.push(order_key(name)),
                    Category::FfnDown => m.ffn_down.push(order_key(name)),
                    Category::FfnGate => m.ffn_gate.push(order_key(name)),
                    Category::FfnUp => m.ffn_up.push(order_key(name)),
                    _ => {}
                }
            }
        }
        m.attention_wv.sort();
        m.ffn_down.sort();
        m.ffn_gate.sort();
        m.ffn_up.sort();
        m
    }

    /// The model with `head_count` query heads and `head_count_kv` key/value heads in its first
    /// block (llama.cpp's default for an absent `head_count_kv` is `head_count`): without this,
    /// a grouped-query ratio of 1.
    #[must_use]
    pub fn with_heads(mut self, head_count: u32, head_count_kv: u32) -> ModelShape {
        self.gqa = head_count.checked_div(head_count_kv).unwrap_or(0);
        self
    }
}

/// The storage `llama-quantize IN OUT mixture` gives tensor `name` of shape `shape` (torch order,
/// outermost first) in `model`, with (`imatrix`) or without `--imatrix`, or `None` where it leaves the tensor as it is: fewer than 2
/// dimensions, norms, `ssm_conv1d`, routers (`ffn_gate_inp`), names not ending in `weight` (`ssm_a`,
/// biases). Errors where llama-quantize fails: an expert model's FFN tensor outside `blk.N.` with
/// N < `block_count`.
pub fn tensor_type(
    mixture: Mixture,
    model: &ModelShape,
    name: &str,
    shape: &[usize],
    imatrix: bool,
) -> Result<Option<Storage>> {
    if !allows_quantization(name, shape) {
        return Ok(None);
    }
    // ne[0], the row length.
    let ncols = shape.last().copied().unwrap_or(1);
    let chosen = mixture_type(mixture, model, name, ncols, imatrix)?;
    Ok(Some(fallback(chosen, ncols)))
}

/// `tensor_requires_imatrix`: whether llama-quantize refuses to write tensor `name` as `storage`
/// (its type after the fallback) in `mixture` without an importance matrix. The embeddings and
/// the output never need one.
pub fn requires_imatrix(mixture: Mixture, name: &str, storage: Storage) -> bool {
    if matches!(name, "token_embd.weight" | "per_layer_token_embd.weight" | "output.weight") {
        return false;
    }
    match storage {
        Storage::Block(BlockType::IQ3_XXS | BlockType::IQ2_XXS | BlockType::IQ2_XS | BlockType::IQ2_S) => true,
        Storage::Block(BlockType::Q2_K) => mixture == Mixture::Q2KS,
        _ => false,
    }
}

/// One type for every tensor llama-quantize quantizes, with its fallback where rows are not
/// whole blocks; `None` where it leaves the tensor as it is.
pub fn uniform_type(ty: BlockType, name: &str, shape: &[usize]) -> Option<Storage> {
    allows_quantization(name, shape).then(|| fallback(ty, shape.last().copied().unwrap_or(1)))
}

/// llama.cpp's broad tensor kinds (`tensor_get_category`), by the first that matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttentionQ,
    AttentionV,
    AttentionK,
    AttentionQkv,
    AttentionKvB,
    AttentionOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

impl Category {
    /// `category_is_attn_v`: the kinds llama.cpp counts and treats as `attn_v`.
    fn is_attn_v(self) -> bool {
        matches!(self, Category::AttentionV | Category::AttentionQkv | Category::AttentionKvB)
    }
}

/// `tensor_get_category`'s substrings, in its order.
const BY_SUBSTRING: &[(&str, Category)] = &[
    ("attn_qkv.weight", Category::AttentionQkv),
    ("attn_kv_b.weight", Category::AttentionKvB),
    ("attn_v.weight", Category::AttentionV),
    ("attn_k.weight", Category::AttentionK),
    ("attn_q.weight", Category::AttentionQ),
    ("attn_output.weight", Category::AttentionOutput),
    ("ffn_up", Category::FfnUp),
    ("ffn_gate", Category::FfnGate),
    ("ffn_down", Category::FfnDown),
];

fn category(name: &str) -> Category {
    if name == "output.weight" {
        return Category::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Category::TokenEmbd;
    }
    BY_SUBSTRING.iter().find(|(s, _)| name.contains(s)).map_or(Category::Other, |&(_, c)| c)
}

/// `ggml_n_dims`: the dimensions up to the last one (in ggml's innermost-first order) that is not 1.
fn n_dims(shape: &[usize]) -> usize {
    let leading_ones = shape.iter().take_while(|&&d| d == 1).count();
    (shape.len() - leading_ones).max(1)
}

/// Substrings of the names `tensor_allows_quantization` never quantizes.
const NEVER: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// `tensor_allows_quantization` with llama-quantize's defaults (the output is quantized, not
/// `--only-copy`), without its GLM5-next rules.
fn allows_quantization(name: &str, shape: &[usize]) -> bool {
    if n_dims(shape) < 2 {
        return false;
    }
    // llama.cpp's `name.rfind("weight") == name.size() - 6`, which also holds for every 5-byte name
    // (both sides are npos).
    if !(name.ends_with("weight") || name.len() == 5) {
        return false;
    }
    name != "position_embd.weight" && name != "token_types.weight" && !NEVER.iter().any(|s| name.contains(s))
}

/// `sscanf(name, "blk.%d.", &layer)`: the block number, if the name starts with one.
fn block_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    rest[..digits].parse().ok()
}

/// The key of llama.cpp's tensor order (`weight_name_comparer`): block (-1 outside blocks), then name.
fn order_key(name: &str) -> (i64, String) {
    (block_of(name).unwrap_or(-1), name.to_string())
}

/// How many of `sorted` come before tensor `name` in llama.cpp's order: its counter value.
fn position(sorted: &[(i64, String)], name: &str) -> i64 {
    let key = (block_of(name).unwrap_or(-1), name);
    sorted.partition_point(|(b, n)| (*b, n.as_str()) < key) as i64
}

/// `use_more_bits`: the first and last eighth of the layers, and every third one between.
fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// `llama_tensor_get_type_impl` for these mixtures, before the fallback; `imatrix`: whether
/// llama-quantize has an importance matrix.
fn mixture_type(mixture: Mixture, model: &ModelShape, name: &str, ncols: usize, imatrix: bool) -> Result<BlockType> {
    use BlockType as T;
    use Mixture as M;
    let default = mixture.default_type();
    let category = category(name);
    let eight_experts = model.expert_count == 8;
    let gqa4 = model.gqa >= 4;
    let n_layer = model.block_count as i64;
    // `layer_info`: with experts the block number from the name, else the kind's counter.
    let layer_info = |counter: &[(i64, String)]| -> Result<i64> {
        if model.expert_count <= 1 {
            return Ok(position(counter, name));
        }
        let Some(i) = block_of(name) else { bail!("llama-quantize: failed to determine the layer of tensor {name}") };
        if i >= n_layer {
            bail!("llama-quantize: bad layer {i} for tensor {name}: must be in [0, {n_layer})");
        }
        Ok(i)
    };
    // IQ2_S and IQ2_M lift what the IQ2 family lifts to IQ3_S, the others to Q2_K.
    let iq2_lift = if matches!(mixture, M::IQ2S | M::IQ2M) { T::IQ3_S } else { T::Q2_K };
    Ok(match category {
        Category::Output | Category::TokenEmbd if category == Category::Output || model.tied => {
            if !ncols.is_multiple_of(default.elements()) {
                T::Q8_0
            } else if mixture.is_iq2() || mixture == M::IQ3XXS {
                T::Q5_K
            } else if default != T::Q8_0 {
                T::Q6_K
            } else {
                default
            }
        }
        // Untied token_embd.
        Category::TokenEmbd => match mixture {
            M::IQ2XXS | M::IQ2XS => T::Q2_K,
            M::IQ2S | M::IQ2M | M::IQ3XXS => T::IQ3_S,
            _ => default,
        },
        // The IQ2 family's own rule (llama.cpp's first branch after the embeddings).
        c if mixture.is_iq2() => match c {
            c if c.is_attn_v() => {
                if gqa4 || model.expert_count >= 4 {
                    T::Q4_K
                } else {
                    iq2_lift
                }
            }
            Category::AttentionK if eight_experts => T::Q4_K,
            Category::FfnDown if position(&model.ffn_down, name) < n_layer / 8 => iq2_lift,
            Category::AttentionOutput if eight_experts => T::Q5_K,
            Category::AttentionOutput if matches!(mixture, M::IQ2S | M::IQ2M) => T::IQ3_S,
            _ => default,
        },
        c if c.is_attn_v() => {
            let (i, n) = (position(&model.attention_wv, name), model.n_attention_wv as i64);
            let t = match mixture {
                M::Q2K | M::Q2KS | M::IQ3XXS | M::IQ3XS | M::IQ3S if gqa4 => T::Q4_K,
                M::Q2K => T::Q3_K,
                M::IQ3XXS if !imatrix => T::IQ3_S,
                M::Q3KM if i < 2 => T::Q5_K,
                M::IQ3M | M::Q3KM => T::Q4_K,
                M::Q3KL => T::Q5_K,
                M::IQ4XS if gqa4 => T::Q5_K,
                M::Q4KM | M::Q5KM if use_more_bits(i, n) => T::Q6_K,
                M::Q4KS if i < 4 => T::Q5_K,
                _ => default,
            };
            if eight_experts {
                T::Q8_0
            } else {
                t
            }
        }
        Category::AttentionK if eight_experts => T::Q8_0,
        Category::AttentionK | Category::AttentionQ if mixture == M::IQ3XS => T::IQ3_XXS,
        Category::AttentionK | Category::AttentionQ if mixture == M::IQ3XXS => T::IQ2_S,
        Category::FfnDown => {
            let i = layer_info(&model.ffn_down)?;
            match mixture {
                M::Q2K => T::Q3_K,
                M::Q2KS if i < n_layer / 8 => T::Q4_K,
                M::IQ3XXS if !imatrix && i < n_layer / 8 => T::Q4_K,
                M::IQ3XXS if !imatrix => T::Q3_K,
                M::Q3KM if i < n_layer / 16 => T::Q5_K,
                M::Q3KM => T::Q4_K,
                M::IQ3M if i < n_layer / 8 || (eight_experts && use_more_bits(i, n_layer)) => T::Q4_K,
                M::Q3KL => T::Q5_K,
                M::Q4KM | M::Q5KM if use_more_bits(i, n_layer) => T::Q6_K,
                M::IQ4XS if !imatrix && i < n_layer / 8 => T::Q5_K,
                M::Q4KS if i < n_layer / 8 => T::Q5_K,
                _ => default,
            }
        }
        Category::AttentionOutput if eight_experts => match mixture {
            M::Q2K | M::IQ3XS | M::IQ3XXS | M::Q3KS | M::Q3KM | M::Q4KS | M::Q4KM | M::IQ3S | M::IQ3M | M::IQ4XS => {
                T::Q5_K
            }
            _ => default,
        },
        Category::AttentionOutput => match mixture {
            M::Q2K => T::Q3_K,
            M::IQ3XXS => T::IQ3_S,
            M::Q3KM | M::IQ3M => T::Q4_K,
            M::Q3KL => T::Q5_K,
            _ => default,
        },
        Category::FfnGate | Category::FfnUp => {
            // Only IQ3_XS singles these out, but llama-quantize checks the layer for every mixture
            // outside the IQ2 family.
            let counter = if category == Category::FfnGate { &model.ffn_gate } else { &model.ffn_up };
            let i = layer_info(counter)?;
            if mixture == M::IQ3XS && i >= n_layer / 8 && i < 7 * n_layer / 8 {
                T::IQ3_XXS
            } else {
                default
            }
        }
        _ => default,
    })
}

/// `tensor_type_fallback`: a row length that is not a multiple of the type's block gets the next
/// type with 32-value blocks, and F16 where that does not fit either.
pub(super) fn fallback(t: BlockType, ncols: usize) -> Storage {
    use BlockType as T;
    if ncols.is_multiple_of(t.elements()) {
        return Storage::Block(t);
    }
    let smaller = match t {
        T::Q2_K | T::Q3_K => T::Q4_0,
        T::IQ4_XS | T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S => T::IQ4_NL,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        // The 32-value types: nothing smaller, F16 below.
        T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q5_1 | T::Q8_0 | T::IQ4_NL => t,
    };
    if ncols.is_multiple_of(smaller.elements()) {
        Storage::Block(smaller)
    } else {
        Storage::Element(Dtype::F16)
    }
}

#[cfg(test)]
mod tests;
