//! The mixtures of `llama-quantize` (`Q2_K`, `Q3_K_S`, `Q3_K_M`, `Q3_K_L`, `Q4_K_M`, `Q5_K_M`,
//! `Q4_K_S`, `Q5_K_S`, `Q6_K`, `IQ4_XS`, `Q8_0`):
//! which ggml type each tensor of a `qwen35` / `qwen35moe` GGUF gets, as llama.cpp decides it in
//! `src/llama-quant.cpp` (`tensor_allows_quantization`, `llama_tensor_get_type_impl`,
//! `tensor_type_fallback`) of the llama-cpp-python 0.3.36 sdist, without an importance matrix and
//! with llama-quantize's default options.
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
//! for every tensor of six models and every mixture; the tests below check the rule against all of
//! them.

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
}

#[cfg_attr(not(test), allow(dead_code))]
impl Mixture {
    pub const ALL: [Mixture; 11] = [
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
        }
    }

    /// The type of every tensor no rule singles out (`llama_ftype_get_default_type`).
    fn default_type(self) -> BlockType {
        match self {
            Mixture::Q4KM | Mixture::Q4KS => BlockType::Q4_K,
            Mixture::Q5KM | Mixture::Q5KS => BlockType::Q5_K,
            Mixture::Q6K => BlockType::Q6_K,
            Mixture::Q8_0 => BlockType::Q8_0,
            Mixture::Q2K => BlockType::Q2_K,
            Mixture::Q3KS | Mixture::Q3KM | Mixture::Q3KL => BlockType::Q3_K,
            Mixture::IQ4XS => BlockType::IQ4_XS,
        }
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
                    _ => {}
                }
            }
        }
        m.attention_wv.sort();
        m.ffn_down.sort();
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
/// outermost first) in `model`, or `None` where it leaves the tensor as it is: fewer than 2
/// dimensions, norms, `ssm_conv1d`, routers (`ffn_gate_inp`), names not ending in `weight` (`ssm_a`,
/// biases). Errors where llama-quantize fails: an expert model's FFN tensor outside `blk.N.` with
/// N < `block_count`.
pub fn tensor_type(mixture: Mixture, model: &ModelShape, name: &str, shape: &[usize]) -> Result<Option<Storage>> {
    if !allows_quantization(name, shape) {
        return Ok(None);
    }
    // ne[0], the row length.
    let ncols = shape.last().copied().unwrap_or(1);
    let chosen = mixture_type(mixture, model, name, ncols)?;
    Ok(Some(fallback(chosen, ncols)))
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

/// `llama_tensor_get_type_impl` for these mixtures, before the fallback.
fn mixture_type(mixture: Mixture, model: &ModelShape, name: &str, ncols: usize) -> Result<BlockType> {
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
    Ok(match category {
        Category::Output | Category::TokenEmbd if category == Category::Output || model.tied => {
            if !ncols.is_multiple_of(default.elements()) {
                T::Q8_0
            } else if default != T::Q8_0 {
                T::Q6_K
            } else {
                default
            }
        }
        // Untied token_embd: the default for these mixtures.
        Category::TokenEmbd => default,
        c if c.is_attn_v() => {
            let (i, n) = (position(&model.attention_wv, name), model.n_attention_wv as i64);
            let t = match mixture {
                M::Q2K if gqa4 => T::Q4_K,
                M::Q2K => T::Q3_K,
                M::Q3KM if i < 2 => T::Q5_K,
                M::Q3KM => T::Q4_K,
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
        Category::FfnDown => {
            let i = layer_info(&model.ffn_down)?;
            match mixture {
                M::Q2K => T::Q3_K,
                M::Q3KM if i < n_layer / 16 => T::Q5_K,
                M::Q3KM => T::Q4_K,
                M::Q3KL => T::Q5_K,
                M::Q4KM | M::Q5KM if use_more_bits(i, n_layer) => T::Q6_K,
                // IQ4_XS: without an importance matrix, as here.
                M::IQ4XS | M::Q4KS if i < n_layer / 8 => T::Q5_K,
                _ => default,
            }
        }
        Category::AttentionOutput if eight_experts => match mixture {
            M::Q2K | M::Q3KS | M::Q3KM | M::IQ4XS | M::Q4KS | M::Q4KM => T::Q5_K,
            _ => default,
        },
        Category::AttentionOutput => match mixture {
            M::Q2K => T::Q3_K,
            M::Q3KM => T::Q4_K,
            M::Q3KL => T::Q5_K,
            _ => default,
        },
        Category::FfnGate | Category::FfnUp => {
            // Only IQ3_XS singles these out, but llama-quantize checks the layer for every mixture.
            layer_info(&[])?;
            default
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
        T::IQ4_XS => T::IQ4_NL,
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
mod tests {
    use super::*;
    use serde_json::Value;

    /// llama-quantize's choices (scripts/gguf-mixture-cases.py).
    const CASES: &str = "fixtures/gguf-mixtures.json";

    fn model(names: &[(&str, &[usize])], block_count: u32, expert_count: u32) -> ModelShape {
        ModelShape::new(block_count, expert_count, names.iter().copied())
    }

    /// The block type `name` gets, `None` where it stays as it is (a float type fails the test).
    fn ty(mixture: Mixture, m: &ModelShape, name: &str, shape: &[usize]) -> Option<BlockType> {
        tensor_type(mixture, m, name, shape).unwrap().map(|s| match s {
            Storage::Block(b) => b,
            Storage::Element(d) => panic!("{name}: {d:?}"),
        })
    }

    /// The storage llama-quantize's report names `name` (gguf-py's spelling: `BF16`, `Q4_K`).
    fn named(name: &str) -> Storage {
        [Dtype::F32, Dtype::F16, Dtype::BF16]
            .map(Storage::Element)
            .into_iter()
            .chain(BlockType::ALL.map(Storage::Block))
            .find(|s| s.name() == name)
            .unwrap_or_else(|| panic!("no storage is named {name}"))
    }

    #[test]
    fn matches_llama_quantize_on_every_case() {
        let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CASES)).unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        for (mixture, ft) in doc["file_types"].as_object().unwrap() {
            assert_eq!(Mixture::from_name(mixture).unwrap().file_type() as u64, ft.as_u64().unwrap(), "{mixture}");
        }
        let mut checked = 0;
        let mut wrong = Vec::new();
        for m in doc["models"].as_array().unwrap() {
            let arch = m["arch"].as_str().unwrap();
            let kv = |key: &str| {
                let key = format!("{arch}.{key}");
                m["kv"].as_array().unwrap().iter().find(|e| e[0] == key.as_str()).map(|e| e[2].as_u64().unwrap() as u32)
            };
            let tensors: Vec<(String, Vec<usize>, Storage)> = m["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let shape = t[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
                    (t[0].as_str().unwrap().to_string(), shape, named(t[2].as_str().unwrap()))
                })
                .collect();
            let heads = kv("attention.head_count").unwrap();
            let shape = ModelShape::new(
                kv("block_count").unwrap(),
                kv("expert_count").unwrap_or(0),
                tensors.iter().map(|(n, s, _)| (n.as_str(), s.as_slice())),
            )
            .with_heads(heads, kv("attention.head_count_kv").unwrap_or(heads));
            let types = m["types"].as_object().unwrap();
            assert_eq!(types.len(), Mixture::ALL.len());
            for (mixture, want) in types {
                let mixture = Mixture::from_name(mixture).unwrap();
                let want: Vec<&str> = want.as_str().unwrap().split(' ').collect();
                assert_eq!(want.len(), tensors.len());
                for ((name, dims, input), want) in tensors.iter().zip(want) {
                    let got = tensor_type(mixture, &shape, name, dims).unwrap().unwrap_or(*input);
                    if got.name() != want {
                        wrong.push(format!(
                            "{} {} {name} {dims:?}: ours {}, llama-quantize {want}",
                            m["name"],
                            mixture.name(),
                            got.name()
                        ));
                    }
                    checked += 1;
                }
            }
        }
        assert!(wrong.is_empty(), "{} of {checked} differ:\n{}", wrong.len(), wrong.join("\n"));
        assert!(checked > 10_000, "{checked}");
    }

    #[test]
    fn never_quantized() {
        let m = model(&[], 4, 0);
        for (name, shape) in [
            ("blk.0.attn_norm.weight", &[128][..]),
            ("blk.0.ssm_a", &[2]),
            ("blk.0.ssm_dt.bias", &[2]),
            ("blk.0.ssm_conv1d.weight", &[384, 4]),
            ("blk.0.ffn_gate_inp.weight", &[4, 128]),
            // [1, hidden]: one dimension for ggml.
            ("blk.0.ffn_gate_inp_shexp.weight", &[1, 128]),
            ("blk.3.attn_q_norm.weight", &[128]),
        ] {
            assert_eq!(ty(Mixture::Q4KM, &m, name, shape), None, "{name}");
        }
        // 2-D, ending in `weight`: quantized, though llama.cpp's converter names them like norms.
        assert_eq!(ty(Mixture::Q4KM, &m, "blk.0.ssm_alpha.weight", &[2, 256]), Some(BlockType::Q4_K));
        assert_eq!(ty(Mixture::Q4KM, &m, "blk.3.nextn.eh_proj.weight", &[256, 512]), Some(BlockType::Q4_K));
    }

    #[test]
    fn fallback_for_short_rows() {
        use BlockType as T;
        let f16 = Storage::Element(Dtype::F16);
        for (t, n, want) in [
            (T::Q4_K, 256, Storage::Block(T::Q4_K)),
            (T::Q4_K, 128, Storage::Block(T::Q5_0)),
            (T::Q5_K, 128, Storage::Block(T::Q5_1)),
            (T::Q6_K, 128, Storage::Block(T::Q8_0)),
            (T::Q8_0, 128, Storage::Block(T::Q8_0)),
            (T::Q4_K, 80, f16),
            (T::Q8_0, 80, f16),
        ] {
            assert_eq!(fallback(t, n), want, "{t:?} {n}");
        }
    }

    #[test]
    fn output_and_embeddings() {
        let untied = model(&[("output.weight", &[64, 256]), ("token_embd.weight", &[64, 256])], 4, 0);
        let tied = model(&[("token_embd.weight", &[64, 256])], 4, 0);
        assert_eq!(ty(Mixture::Q4KM, &untied, "output.weight", &[64, 256]), Some(BlockType::Q6_K));
        assert_eq!(ty(Mixture::Q4KM, &untied, "token_embd.weight", &[64, 256]), Some(BlockType::Q4_K));
        assert_eq!(ty(Mixture::Q4KM, &tied, "token_embd.weight", &[64, 256]), Some(BlockType::Q6_K));
        assert_eq!(ty(Mixture::Q8_0, &tied, "token_embd.weight", &[64, 256]), Some(BlockType::Q8_0));
        // A row not a multiple of the mixture's block: Q8_0, not the Q6_K → Q8_0 fallback's way.
        assert_eq!(ty(Mixture::Q5KM, &untied, "output.weight", &[64, 128]), Some(BlockType::Q8_0));
    }

    #[test]
    fn layer_positions() {
        // 64 blocks + 1 MTP block: the first 8, from 56 on, and every third between get more bits.
        let names: Vec<String> = (0..65).map(|b| format!("blk.{b}.ffn_down.weight")).collect();
        let tensors: Vec<(&str, &[usize])> = names.iter().map(|n| (n.as_str(), &[256usize, 512][..])).collect();
        let m = ModelShape::new(65, 0, tensors.iter().copied());
        let q6: Vec<usize> =
            (0..65).filter(|&b| ty(Mixture::Q4KM, &m, &names[b], &[256, 512]) == Some(BlockType::Q6_K)).collect();
        let want: Vec<usize> = (0..8).chain((10..56).step_by(3)).chain(56..65).collect();
        assert_eq!(q6, want);
        let q5: Vec<usize> =
            (0..65).filter(|&b| ty(Mixture::Q4KS, &m, &names[b], &[256, 512]) == Some(BlockType::Q5_K)).collect();
        assert_eq!(q5, (0..8).collect::<Vec<_>>());
        // The counter follows llama.cpp's order (block, then name), not the order given.
        let mut rev = tensors.clone();
        rev.reverse();
        assert_eq!(ModelShape::new(65, 0, rev), m);
    }

    #[test]
    fn eight_experts() {
        let m = model(&[("blk.0.attn_qkv.weight", &[512, 256])], 24, 8);
        assert_eq!(ty(Mixture::Q4KM, &m, "blk.0.attn_qkv.weight", &[512, 256]), Some(BlockType::Q8_0));
        assert_eq!(ty(Mixture::Q5KM, &m, "blk.3.attn_k.weight", &[128, 256]), Some(BlockType::Q8_0));
        assert_eq!(ty(Mixture::Q4KM, &m, "blk.3.attn_output.weight", &[256, 256]), Some(BlockType::Q5_K));
        assert_eq!(ty(Mixture::Q5KM, &m, "blk.3.attn_output.weight", &[256, 256]), Some(BlockType::Q5_K));
        assert_eq!(ty(Mixture::Q6K, &m, "blk.3.attn_output.weight", &[256, 256]), Some(BlockType::Q6_K));
        assert!(tensor_type(Mixture::Q4KM, &m, "blk.24.ffn_up_exps.weight", &[8, 32, 256]).is_err());
    }

    #[test]
    fn file_types() {
        let ft: Vec<u32> = Mixture::ALL.iter().map(|m| m.file_type()).collect();
        assert_eq!(ft, [15, 14, 17, 16, 18, 7, 10, 11, 12, 13, 30]);
    }

    #[test]
    fn low_bit_rules() {
        use BlockType as T;
        let names: Vec<String> = (0..16).map(|b| format!("blk.{b}.attn_v.weight")).collect();
        let tensors: Vec<(&str, &[usize])> = names.iter().map(|n| (n.as_str(), &[256usize, 512][..])).collect();
        let one = ModelShape::new(16, 0, tensors.iter().copied());
        // Four query heads per key/value head: llama.cpp gives attn_v more bits.
        let gqa4 = one.clone().with_heads(8, 2);
        let v = |m: Mixture, shape: &ModelShape, b: usize| ty(m, shape, &names[b], &[256, 512]);
        assert_eq!(v(Mixture::Q2K, &one, 5), Some(T::Q3_K));
        assert_eq!(v(Mixture::Q2K, &gqa4, 5), Some(T::Q4_K));
        assert_eq!(v(Mixture::IQ4XS, &one, 5), Some(T::IQ4_XS));
        assert_eq!(v(Mixture::IQ4XS, &gqa4, 5), Some(T::Q5_K));
        assert_eq!(v(Mixture::Q3KS, &gqa4, 5), Some(T::Q3_K));
        assert_eq!(v(Mixture::Q3KL, &one, 5), Some(T::Q5_K));
        let q3km: Vec<Option<BlockType>> = (0..4).map(|b| v(Mixture::Q3KM, &one, b)).collect();
        assert_eq!(q3km, [Some(T::Q5_K), Some(T::Q5_K), Some(T::Q4_K), Some(T::Q4_K)]);
        // No key/value heads: a ratio of 0, never 4.
        assert_eq!(v(Mixture::Q2K, &one.clone().with_heads(8, 0), 5), Some(T::Q3_K));

        // ffn_down by position among 32 blocks; attn_output by mixture.
        let names: Vec<String> = (0..32).map(|b| format!("blk.{b}.ffn_down.weight")).collect();
        let tensors: Vec<(&str, &[usize])> = names.iter().map(|n| (n.as_str(), &[256usize, 512][..])).collect();
        let m = ModelShape::new(32, 0, tensors.iter().copied());
        let down = |mix: Mixture, b: usize| ty(mix, &m, &names[b], &[256, 512]);
        assert_eq!((down(Mixture::Q2K, 0), down(Mixture::Q2K, 31)), (Some(T::Q3_K), Some(T::Q3_K)));
        assert_eq!((down(Mixture::Q3KM, 1), down(Mixture::Q3KM, 2)), (Some(T::Q5_K), Some(T::Q4_K)));
        assert_eq!(down(Mixture::Q3KL, 20), Some(T::Q5_K));
        assert_eq!((down(Mixture::IQ4XS, 3), down(Mixture::IQ4XS, 4)), (Some(T::Q5_K), Some(T::IQ4_XS)));
        assert_eq!(down(Mixture::Q3KS, 0), Some(T::Q3_K));
        let out = |mix: Mixture| ty(mix, &m, "blk.3.attn_output.weight", &[256, 256]);
        let outs = [Mixture::Q2K, Mixture::Q3KS, Mixture::Q3KM, Mixture::Q3KL, Mixture::IQ4XS].map(out);
        assert_eq!(outs, [Some(T::Q3_K), Some(T::Q3_K), Some(T::Q4_K), Some(T::Q5_K), Some(T::IQ4_XS)]);
        // The output takes Q6_K whatever the mixture.
        assert_eq!(ty(Mixture::Q2K, &m, "output.weight", &[64, 256]), Some(T::Q6_K));
    }

    #[test]
    fn low_bit_fallbacks() {
        use BlockType as T;
        let f16 = Storage::Element(Dtype::F16);
        for (t, n, want) in [
            (T::Q2_K, 128, Storage::Block(T::Q4_0)),
            (T::Q3_K, 160, Storage::Block(T::Q4_0)),
            (T::IQ4_XS, 128, Storage::Block(T::IQ4_NL)),
            (T::IQ4_XS, 512, Storage::Block(T::IQ4_XS)),
            (T::Q2_K, 80, f16),
            (T::IQ4_XS, 80, f16),
            (T::IQ4_NL, 96, Storage::Block(T::IQ4_NL)),
        ] {
            assert_eq!(fallback(t, n), want, "{t:?} {n}");
        }
    }
}
