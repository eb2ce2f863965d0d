//! `--fit-memory M`: the model files' size a machine's memory leaves once the client has what it
//! allocates to run them: the K and V cache of the full-attention layers for the context, the
//! linear-attention layers' recurrent state, and an allowance for the runtime and the OS.
//! `max_size = M − kv_cache_bytes − reserve_bytes`, `reserve_bytes` = state + allowance
//! (docs/DECISIONS-QUANTIZED.md, "Memory budget").

use crate::checkpoint::architecture::{LayerType, TextModel};
use crate::failure::{classified, ErrorCode};
use crate::text::human_bytes;
use anyhow::{anyhow, Result};
use serde::Serialize;
use serde_json::Value;

/// `--fit-memory M [--context N] [--reserve R]` as asked: `None` where the default applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitMemory {
    pub memory: u64,
    pub context: Option<u64>,
    /// The allowance for the runtime and the OS, in place of `default_allowance`; the recurrent
    /// state is counted besides it.
    pub reserve: Option<u64>,
}

/// Tokens of context when `--context` is not given (the model's `max_position_embeddings` when
/// that is shorter).
const DEFAULT_CONTEXT: u64 = 8192;

/// Cache cells are allocated in steps of this many tokens: llama.cpp pads the context to a multiple
/// of 256 (`llama_context`), mlx-lm's `KVCache` grows 256 at a time.
const CACHE_STEP: u64 = 256;

/// Bytes of a K or V element in llama.cpp's default cache (`type_k`, `type_v`: F16), and in
/// mlx-lm's when the model computes in bf16 or f16.
pub const KV_ELEMENT_BYTES: u64 = 2;

/// Bytes of a recurrent-state element: llama.cpp keeps the conv and the delta-net state in F32,
/// mlx-lm the delta-net state in f32 and the conv state in the compute dtype (at most f32).
const STATE_ELEMENT_BYTES: u64 = 4;

/// The least allowance for the runtime and the OS.
const ALLOWANCE_FLOOR: u64 = 1 << 30;

/// The allowance for the runtime, the OS and other programs on a machine of `memory` bytes: a
/// third, at least `ALLOWANCE_FLOOR`. A third is what macOS keeps from the GPU of an Apple-silicon
/// machine of 16 GB (its default GPU working set is two thirds of the memory).
fn default_allowance(memory: u64) -> u64 {
    (memory / 3).max(ALLOWANCE_FLOOR)
}

/// The arithmetic of one `--fit-memory` run; `--json` reports the first four figures in `budget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryBudget {
    /// M, in bytes.
    pub memory: u64,
    /// Tokens of context the K/V cache is sized for.
    pub context: u64,
    /// The K and V cache of the full-attention layers for `context` tokens, as the client
    /// allocates it (whole steps of `CACHE_STEP` cells).
    pub kv_cache_bytes: u64,
    /// The recurrent state and the allowance.
    pub reserve_bytes: u64,
    /// The linear-attention layers' recurrent state (conv and delta-net state) for one sequence.
    #[serde(skip)]
    pub state_bytes: u64,
    /// For the runtime and the OS: `--reserve`, or `default_allowance`.
    #[serde(skip)]
    pub allowance: u64,
    /// Bytes of one K or V element.
    #[serde(skip)]
    pub element_bytes: u64,
    /// K and V elements per cache cell: `2 · num_key_value_heads · head_dim` per full-attention layer.
    #[serde(skip)]
    kv_elements: u64,
}

/// What a refused budget can change.
const FIX: &str = "give more memory, a shorter --context or a smaller --reserve";

/// A usage error: the flags ask for what this model cannot give.
fn usage(message: String) -> anyhow::Error {
    classified(anyhow!(message), ErrorCode::Usage)
}

impl MemoryBudget {
    /// The budget `ask` makes for the model `config` describes (`None`: a single `.safetensors`
    /// file), its K and V elements `element_bytes` each.
    pub fn new(config: Option<&Value>, ask: FitMemory, element_bytes: u64) -> Result<MemoryBudget> {
        let Some(config) = config else {
            return Err(usage(
                "--fit-memory sizes the K/V cache and the recurrent state from config.json, and IN has none (a \
                 single .safetensors file): give --max-size instead"
                    .into(),
            ));
        };
        let model = TextModel::from_config(config)?;
        let context = match (ask.context, model.max_positions) {
            (Some(n), Some(max)) if n > max => {
                return Err(usage(format!(
                    "--context {n} is beyond the model's max_position_embeddings ({max}, config.json): give \
                     --context {max} or less"
                )))
            }
            (Some(n), _) => n,
            (None, max) => max.map_or(DEFAULT_CONTEXT, |max| max.min(DEFAULT_CONTEXT)),
        };
        let count = |kind: LayerType| model.layer_types.iter().filter(|&&t| t == kind).count() as u128;
        let full = count(LayerType::FullAttention);
        let linear = count(LayerType::LinearAttention);
        let wide = |n: u128| u64::try_from(n).unwrap_or(u64::MAX);
        let kv_elements = wide(full * 2 * u128::from(model.kv_heads) * u128::from(model.head_dim));
        // Per linear layer: the conv's last `kernel − 1` inputs (q, k and v: 2·key_dim + value_dim
        // channels) and the state of each value head (head_k_dim × head_v_dim).
        let key_dim = u128::from(model.linear_key_heads) * u128::from(model.linear_key_dim);
        let value_dim = u128::from(model.linear_value_heads) * u128::from(model.linear_value_dim);
        let conv = u128::from(model.conv_kernel - 1) * (2 * key_dim + value_dim);
        let state = value_dim * u128::from(model.linear_key_dim);
        let state_bytes = wide(linear * (conv + state) * u128::from(STATE_ELEMENT_BYTES));
        let allowance = ask.reserve.unwrap_or_else(|| default_allowance(ask.memory));
        let budget = MemoryBudget {
            memory: ask.memory,
            context,
            kv_cache_bytes: 0,
            reserve_bytes: state_bytes.saturating_add(allowance),
            state_bytes,
            allowance,
            element_bytes,
            kv_elements,
        };
        Ok(budget.with_element_bytes(element_bytes))
    }

    /// The same budget with K and V elements of `element_bytes`.
    #[must_use]
    pub fn with_element_bytes(self, element_bytes: u64) -> MemoryBudget {
        let cells = u128::from(self.context).div_ceil(u128::from(CACHE_STEP)) * u128::from(CACHE_STEP);
        let bytes = cells * u128::from(self.kv_elements) * u128::from(element_bytes);
        MemoryBudget { element_bytes, kv_cache_bytes: u64::try_from(bytes).unwrap_or(u64::MAX), ..self }
    }

    /// The flags that ask for this budget again, every default spelled out.
    pub fn asked(&self) -> FitMemory {
        FitMemory { memory: self.memory, context: Some(self.context), reserve: Some(self.allowance) }
    }

    /// SIZE for the model files; a usage error when nothing is left.
    pub fn max_size(&self) -> Result<u64> {
        match self.memory.checked_sub(self.kv_cache_bytes.saturating_add(self.reserve_bytes)) {
            Some(size) if size > 0 => Ok(size),
            _ => Err(usage(format!("{} leaves no room for the model files; {FIX}", self.arithmetic()))),
        }
    }

    /// The refusal of a SIZE below the `smallest` output the format can make, in this budget's terms.
    pub fn too_small(&self, smallest: u64) -> anyhow::Error {
        let left = self.max_size().unwrap_or(0);
        usage(format!(
            "{} = {left} bytes ({}) for the model files, and the smallest output this format can make is {smallest} \
             bytes ({}); {FIX}; nothing was written",
            self.arithmetic(),
            human_bytes(left),
            human_bytes(smallest)
        ))
    }

    /// `--fit-memory M − the cache − the reserve`, every figure in bytes.
    fn arithmetic(&self) -> String {
        format!(
            "--fit-memory {} ({}) − {} bytes of K/V cache ({} tokens of --context) − {} bytes of reserve ({} of \
             recurrent state, {} for the runtime and the OS)",
            self.memory,
            human_bytes(self.memory),
            self.kv_cache_bytes,
            self.context,
            self.reserve_bytes,
            self.state_bytes,
            self.allowance
        )
    }

    /// The arithmetic in words, for the model card, the summary and `--dry-run`.
    pub fn words(&self) -> String {
        format!(
            "{} of memory − {} of K/V cache for {} tokens of context − {} of reserve ({} of \
             linear-attention state, {} for the runtime and the OS) = {} for the model files",
            human_bytes(self.memory),
            human_bytes(self.kv_cache_bytes),
            self.context,
            human_bytes(self.reserve_bytes),
            human_bytes(self.state_bytes),
            human_bytes(self.allowance),
            human_bytes(self.max_size().unwrap_or(0))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The dense 27B's text config, as far as the budget reads it.
    fn dense_27b() -> Value {
        let types: Vec<&str> =
            (1..=64).map(|i| if i % 4 == 0 { "full_attention" } else { "linear_attention" }).collect();
        json!({
            "model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64, "vocab_size": 248320,
            "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408,
            "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_num_value_heads": 48,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "layer_types": types,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 262144
        })
    }

    #[test]
    fn the_27b_takes_64_kib_of_cache_a_token() {
        let ask = FitMemory { memory: 16_000_000_000, context: None, reserve: None };
        let b = MemoryBudget::new(Some(&dense_27b()), ask, KV_ELEMENT_BYTES).unwrap();
        assert_eq!(b.context, 8192);
        assert_eq!(b.kv_cache_bytes, 8192 * 64 * 1024);
        // 48 linear layers: 3 × (2·2048 + 6144) conv values and 48 × 128 × 128 state values, f32.
        assert_eq!(b.state_bytes, 48 * (3 * 10240 + 48 * 128 * 128) * 4);
        assert_eq!(b.allowance, 16_000_000_000 / 3);
        assert_eq!(b.max_size().unwrap(), 16_000_000_000 - b.kv_cache_bytes - b.state_bytes - b.allowance);
        // A context that is not whole steps is cached as the next whole step; f32 doubles it.
        let ask = FitMemory { context: Some(8193), ..ask };
        let b = MemoryBudget::new(Some(&dense_27b()), ask, 4).unwrap();
        assert_eq!(b.kv_cache_bytes, (8192 + 256) * 128 * 1024);
    }

    #[test]
    fn bad_values_are_usage_errors_naming_the_numbers() {
        let ask = FitMemory { memory: 16_000_000_000, context: Some(300_000), reserve: None };
        let e = MemoryBudget::new(Some(&dense_27b()), ask, 2).unwrap_err();
        assert_eq!(crate::failure::code_of(&e), Some(ErrorCode::Usage));
        assert!(e.to_string().contains("--context 300000") && e.to_string().contains("262144"), "{e}");
        let ask = FitMemory { memory: 1_500_000_000, context: None, reserve: None };
        let e = MemoryBudget::new(Some(&dense_27b()), ask, 2).unwrap().max_size().unwrap_err();
        assert_eq!(crate::failure::code_of(&e), Some(ErrorCode::Usage));
        assert!(e.to_string().contains("--fit-memory 1500000000") && e.to_string().contains("no room"), "{e}");
        let e = MemoryBudget::new(None, ask, 2).unwrap_err();
        assert_eq!(crate::failure::code_of(&e), Some(ErrorCode::Usage));
    }
}
