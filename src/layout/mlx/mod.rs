//! MLX layout (mlx-lm's own, after its `sanitize`) with MLX affine quantization, for Qwen3.5,
//! Qwen3.5-MoE and Qwen3-Next (`mlx-affine.md` §5–§7, §9).
//!
//! * names: Qwen3.5 `model.language_model.X` → `language_model.model.X`, other keys get a
//!   `language_model.` prefix (`lm_head.X` → `language_model.lm_head.X`); Qwen3-Next keeps its
//!   names;
//! * every Linear/Embedding weight (coded, int8 pair or plain 2-D `.weight`) is quantized as
//!   `P.weight` (U32) + `P.scales` + `P.biases`, unless its input width is not a multiple of the
//!   run's group size (then it stays a dense weight in the model dtype), exactly as
//!   `mlx_lm.convert -q` decides; `MoE` routers (`mlp.gate`, `shared_expert_gate`) at 8 bits,
//!   group 64, as mlx-lm's `quant_predicate` does;
//! * coded linears are reconstructed to f32, rounded once to the model dtype (bf16), then
//!   quantized: the result is byte-identical to `mlx_lm.convert -q` (CPU) applied to this
//!   converter's own bf16 Hugging Face export, with no bf16 copy on disk;
//! * int8 pairs: exact 8-bit repack (F32 scales, largest group size dividing the row) by default,
//!   or requantized at the run's setting from their bf16 dequantization;
//! * stacked experts go to `mlp.switch_mlp.{gate,up,down}_proj` `[E, out, in]` (fused `gate_up`
//!   split gate-first); a channel whose gate and up rows are both exactly zero (its `rout` scales
//!   are zero) is dead, and its `down_proj` input column is zeroed before quantizing;
//! * norms of the five offset kinds get +1 folded in (`round(f32(w) + 1)`), `linear_attn.norm`
//!   does not; conv1d is written `[C, K, 1]`; `A_log` keeps its source dtype (Qwen3.5); other
//!   floats are cast to the model dtype;
//! * no `mtp.*` key and no vision tensor is written (either would make some loader shift the
//!   norms a second time or fail a strict load).

mod card;
mod config;
mod options;
mod tensors;
mod widths;

pub use config::{config_json, is_moe, quantization, quantized_modules, total_parameters};
pub use options::{MlxOptions, INT8_SCALE_DTYPE, ROUTER_SPEC};
pub use tensors::{family, is_offset_norm, mlx_name, model_dtype, tensors, Dropped, Family};

use super::choice::WidthChoice;
use super::fit::{FitTensor, Yardsticks};
use super::flags::FlagWords;
use super::gguf::LlamaNames;
use super::mtp;
use super::options::BiasMode;
use super::policy::{FormatCard, Layout, WeightProbe};
use super::tensor::{ImatrixKey, OutputTensor};
use crate::checkpoint::{Catalog, Checkpoint};
use crate::container::{MetaValue, Metadata};
use crate::select::selected;
use crate::warning::{Warning, WarningCode};
use anyhow::{bail, Result};
use config::{config_fragment, QUANTIZATION_FILE, TENSORS_ONLY_STEP};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// MLX layout with affine quantization.
#[derive(Clone, Copy, Debug)]
pub struct MlxLayout {
    pub opts: MlxOptions,
}

impl Layout for MlxLayout {
    fn name(&self) -> &'static str {
        "mlx"
    }

    fn shaping_flags(&self, flags: &mut FlagWords) {
        let o = &self.opts;
        flags.value("--format", self.name());
        // Fitted, the engine's `--max-size` chose every width and group size.
        if !o.fitted {
            match o.auto {
                Some(auto) => {
                    flags.value("--bits", "auto");
                    auto.shaping_flags(flags);
                }
                None => flags.value("--bits", &o.spec.bits.to_string()),
            }
            flags.value("--group-size", &o.spec.group_size.to_string());
        }
        flags.value("--int8", o.int8.name());
    }

    fn tensors(
        &self,
        ck: &Checkpoint,
        cat: &Catalog,
        bias: BiasMode,
        warnings: &mut Vec<Warning>,
    ) -> Result<Vec<OutputTensor>> {
        let (tensors, dropped) = tensors(ck, cat, self.opts, bias)?;
        let root = ck.root.display();
        if dropped.mtp > 0 {
            warnings.push(Warning::new(
                WarningCode::MlxMtpDropped,
                format!("{root}: dropped {} MTP tensors (the MLX layout carries none)", dropped.mtp),
            ));
        }
        if dropped.tied_head > 0 {
            warnings.push(Warning::new(
                WarningCode::TiedHeadDropped,
                format!("{root}: dropped lm_head: tie_word_embeddings is set"),
            ));
        }
        if dropped.expert_biases > 0 {
            warnings.push(Warning::new(
                WarningCode::ExpertBiasesDropped,
                format!("{root}: dropped {} bias tensors of stacked experts (no MLX slot)", dropped.expert_biases),
            ));
        }
        Ok(tensors)
    }

    /// `--bits auto`: the width of every coded linear, from its decoded rows.
    fn refine(&self, tensors: &mut [OutputTensor], cat: &Catalog, probe: &dyn WeightProbe) -> Result<Vec<WidthChoice>> {
        widths::refine(self.opts, tensors, cat, probe)
    }

    /// `--imatrix`: each weight's entry under llama.cpp's name for it (a stacked `switch_mlp` weight
    /// as the GGUF expert tensor), with llama.cpp's order of its input columns.
    fn imatrix_keys(&self, ck: &Checkpoint, tensors: &[OutputTensor]) -> Result<Vec<Option<ImatrixKey>>> {
        if ck.config.is_none() {
            bail!(
                "--imatrix: {} is a single .safetensors file without config.json, which maps the matrix's \
                 llama.cpp names onto MLX's: put the file in a directory with the model's config.json",
                ck.root.display()
            );
        }
        let names = LlamaNames::new(ck.config.as_ref())?;
        let family = family(ck)?;
        Ok(tensors
            .iter()
            .map(|t| t.recipe.as_ref().and_then(|_| names.imatrix_key(&tensors::hf_name(family, &t.name))))
            .collect())
    }

    /// `--max-size`: every affine tensor but the routers (mlx-lm fixes theirs) at each width and
    /// group size MLX offers; an exactly repacked int8 table also as that repack, which adds nothing.
    fn fit_menu(
        &self,
        ck: &Checkpoint,
        tensors: &[OutputTensor],
        cat: &Catalog,
        probe: &dyn WeightProbe,
    ) -> Result<Vec<FitTensor>> {
        widths::fit_menu(ck, tensors, cat, probe)
    }

    /// mlx-lm computes in the dtype the embedding hands the first layer (its scales' when it is
    /// quantized: F32 for an exact int8 repack), and caches K and V in it.
    fn cache_element_bytes(&self, tensors: &[OutputTensor]) -> u64 {
        let dtype = |end: &str| tensors.iter().find(|t| t.name.ends_with(end)).and_then(|t| t.storage.element());
        let compute = dtype("embed_tokens.scales").or_else(|| dtype("embed_tokens.weight"));
        compute.map_or(2, |d| d.bitsize() as u64 / 8)
    }

    /// A uniform `--bits B --group-size G` run: every menu tensor at that setting, an exactly
    /// repacked int8 table kept exact (as this run's `--int8` keeps it).
    fn fit_recipes(&self, _ck: &Checkpoint, _tensors: &[OutputTensor], menu: &[FitTensor]) -> Result<Yardsticks> {
        Ok(widths::fit_recipes(menu))
    }

    fn fit_apply(&self, tensors: &mut [OutputTensor], fit: &FitTensor, option: usize) {
        widths::fit_apply(tensors, fit, option);
    }

    /// Keeps the tensors `--only` selects, together with the other tensors of their module (a
    /// packed `.weight` is useless without its `.scales` and `.biases`).
    fn select(&self, tensors: &mut Vec<OutputTensor>, only: &[String]) {
        let module = |name: &str| -> String {
            for leaf in [".weight", ".scales", ".biases"] {
                if let Some(p) = name.strip_suffix(leaf) {
                    return p.to_string();
                }
            }
            name.to_string()
        };
        let keep: BTreeSet<String> =
            tensors.iter().filter(|t| selected(&t.name, only)).map(|t| module(&t.name)).collect();
        tensors.retain(|t| keep.contains(&module(&t.name)));
    }

    fn config(&self, input: &Value, tensors: &[OutputTensor]) -> Option<String> {
        let mut config = config_json(input, quantization(tensors, self.opts, is_moe(tensors)));
        // The layout has no MTP head: no client may expect one.
        mtp::clear_declared_layers(&mut config);
        Some(crate::json::to_text(&config, 4))
    }

    /// mlx-lm reads each module's width and group size from config.json's `quantization`, which
    /// the model's own config.json does not hold: `quantization.json` holds it, merged in one line.
    fn tensors_only_step(&self) -> &'static str {
        TENSORS_ONLY_STEP
    }

    fn tensors_only_files(&self, tensors: &[OutputTensor]) -> Vec<(String, String)> {
        let fragment = config_fragment(tensors, self.opts);
        vec![(QUANTIZATION_FILE.into(), crate::json::to_text(&fragment, 4))]
    }

    fn metadata(
        &self,
        _ck: &Checkpoint,
        _tensors: &[OutputTensor],
        _warnings: &mut Vec<crate::warning::Warning>,
    ) -> Result<Metadata> {
        Ok(vec![("format".into(), MetaValue::Str("mlx".into()))])
    }

    fn index_metadata(&self, tensors: &[OutputTensor]) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("total_parameters".into(), total_parameters(tensors).into());
        m
    }

    /// mlx-lm's own shard limit.
    fn default_max_shard_size(&self) -> u64 {
        5 << 30
    }

    fn card(&self, _mtp: bool) -> FormatCard {
        card::card(self.opts)
    }
}
