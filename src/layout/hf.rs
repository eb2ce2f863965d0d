//! Hugging Face layout (the source model family's own): what transformers and mlx-lm load as
//! they load the base model.
//!
//! * coded linear `P` → `P.weight` `[out, in]`; an `[E]` stack → `P` `[E, out, in]` (the fused
//!   Qwen3.5-MoE expert parameters `mlp.experts.gate_up_proj` / `down_proj` carry no suffix);
//! * int8 pair `P` → `P.weight`;
//! * norms are kept exactly as stored: HF Qwen3.5 norms are zero-centred and the runtime adds 1;
//! * every other tensor passes through, 16-bit floats cast to the output dtype, F32 kept F32;
//! * `bias` of coded linears where `--bias` keeps it ([`BiasMode`]);
//! * the MTP head as `mtp.*` tensors in the main shards, when complete (see [`super::mtp`]);
//! * a native EXL3 `MoE`'s per-expert linears (`….experts.{e}.gate_proj`, …) stacked as the fused
//!   `….experts.gate_up_proj` / `down_proj` transformers expects.

use super::flags::FlagWords;
use super::mtp::{self, MtpMode};
use super::names::{natural_key, norm_kind};
use super::options::BiasMode;
use super::policy::{FormatCard, Layout};
use super::tensor::{Encoding, Kind, OutputTensor, RowSource};
use crate::checkpoint::tensor::is_float;
use crate::checkpoint::{Catalog, Checkpoint, Leaf};
use anyhow::Result;
use safetensors::Dtype;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Dense output element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseDtype {
    Bf16,
    F16,
}

impl DenseDtype {
    pub fn dtype(self) -> Dtype {
        match self {
            DenseDtype::Bf16 => Dtype::BF16,
            DenseDtype::F16 => Dtype::F16,
        }
    }
}

/// Dense weights in the Hugging Face layout.
#[derive(Clone, Copy, Debug)]
pub struct HfLayout {
    pub dtype: DenseDtype,
    pub mtp: MtpMode,
}

impl Layout for HfLayout {
    fn name(&self) -> &'static str {
        match self.dtype {
            DenseDtype::Bf16 => "bf16",
            DenseDtype::F16 => "f16",
        }
    }

    fn shaping_flags(&self, flags: &mut FlagWords) {
        flags.value("--format", self.name());
        flags.value("--mtp", self.mtp.name());
    }

    fn tensors(
        &self,
        ck: &Checkpoint,
        cat: &Catalog,
        bias: BiasMode,
        warnings: &mut Vec<crate::warning::Warning>,
    ) -> Result<Vec<OutputTensor>> {
        let mut tensors = tensors(ck, cat, self.dtype, bias);
        restack_experts(&mut tensors, true);
        mtp::apply(self.mtp, &mut tensors, ck.config.as_ref(), warnings);
        Ok(tensors)
    }

    fn config(&self, input: &Value, tensors: &[OutputTensor]) -> Option<String> {
        let mut config = dense_config(input);
        set_dtype(&mut config, self.dtype);
        if !tensors.iter().any(|t| mtp::is_mtp(&t.name)) {
            // No client may expect a head that is not there.
            mtp::clear_declared_layers(&mut config);
        }
        Some(crate::json::to_text(&config, 2))
    }

    fn default_max_shard_size(&self) -> u64 {
        5_000_000_000
    }

    fn card(&self, mtp: bool) -> FormatCard {
        let dtype = self.name();
        let no_mtp = if mtp { "" } else { " --no-mtp" };
        FormatCard {
            library: "transformers",
            tags: vec![dtype.into()],
            description: format!("dense {dtype} safetensors, Hugging Face layout (norms zero-centred, as the base model stores them)"),
            how_to_load: format!(
                "transformers:\n\n```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\
                 model = AutoModelForCausalLM.from_pretrained(\"path/to/model\", dtype=\"auto\")\n\
                 tokenizer = AutoTokenizer.from_pretrained(\"path/to/model\")\n```\n\n\
                 mlx-lm (it adds the norm offset itself):\n\n```python\nfrom mlx_lm import load\n\
                 model, tokenizer = load(\"path/to/model\")\n```\n\n\
                 llama.cpp (GGUF), from a llama.cpp checkout:\n\n```sh\n\
                 python convert_hf_to_gguf.py path/to/model --outtype {dtype} --outfile model-{dtype}.gguf{no_mtp}\n```\n"
            ),
        }
    }
}

/// The output tensors in Hugging Face names, in model order.
pub fn tensors(ck: &Checkpoint, cat: &Catalog, dtype: DenseDtype, bias: BiasMode) -> Vec<OutputTensor> {
    let out = dtype.dtype();
    let mut tensors = Vec::new();
    for (i, m) in cat.coded.iter().enumerate() {
        let lead: Vec<usize> = m.experts.into_iter().collect();
        let shape = |last: &[usize]| lead.iter().chain(last).copied().collect::<Vec<_>>();
        let (name, kind) = match m.experts {
            None => (format!("{}.weight", m.path), Kind::Coded),
            Some(_) => (m.path.clone(), Kind::CodedExperts),
        };
        let source = RowSource::Coded { module: i, rows: 0..m.out_features };
        tensors.push(OutputTensor::new(
            name,
            out,
            shape(&[m.out_features, m.in_features]),
            kind,
            source,
            Encoding::Float,
        ));
        if let Some(b) = m.tensor(Leaf::Bias).filter(|_| bias.keeps(m)) {
            let source = RowSource::Tensor { name: b.to_string(), rows: 0..m.expert_count(), cols: m.out_features };
            let name = format!("{}.bias", m.path);
            tensors.push(OutputTensor::new(name, out, shape(&[m.out_features]), Kind::Bias, source, Encoding::Float));
        }
    }
    for (i, m) in cat.int8.iter().enumerate() {
        let name = format!("{}.weight", m.path);
        tensors.push(OutputTensor::new(name, out, m.shape.clone(), Kind::Int8, RowSource::Int8(i), Encoding::Float));
    }
    for p in &cat.plain {
        let entry = &ck.tensors[&p.name];
        let (dtype, encoding) = match entry.dtype {
            Dtype::F16 | Dtype::BF16 => (out, Encoding::Float),
            // F64 is read as f32 and written as an F32 tensor is: kept F32 (no client loads F64).
            Dtype::F64 => (Dtype::F32, Encoding::Float),
            other if is_float(other) => (other, Encoding::Float),
            other => (other, Encoding::Bytes),
        };
        let kind = if norm_kind(&p.name).is_some() { Kind::Norm } else { Kind::Plain };
        let source = RowSource::whole(&p.name, &entry.shape);
        tensors.push(OutputTensor::new(p.name.clone(), dtype, entry.shape.clone(), kind, source, encoding));
    }
    tensors.sort_by_cached_key(|t| natural_key(&t.name));
    tensors
}

/// The per-expert leaf of a name `<parent>.experts.<e>.<proj>.weight` (a native EXL3 `MoE` stores
/// every expert as its own linear): (`<parent>.experts`, e, proj).
pub(crate) fn expert_leaf(name: &str) -> Option<(&str, usize, &str)> {
    let rest = name.strip_suffix(".weight")?;
    let (head, proj) = rest.rsplit_once('.')?;
    let (parent, e) = head.rsplit_once('.')?;
    let e = e.parse().ok()?;
    (parent.ends_with(".experts") && matches!(proj, "gate_proj" | "up_proj" | "down_proj")).then_some((parent, e, proj))
}

/// Per-expert coded linears (`….experts.{e}.gate_proj` / `up_proj` / `down_proj`, every e of
/// 0..E, one shape per projection) stacked as the fused parameters transformers' `Qwen3.5-MoE`
/// expects (their biases, which it has no slot for, left out): `….experts.gate_up_proj` `[E, 2·I, H]` (gate rows first) and
/// `….experts.down_proj` `[E, H, I]`. Stored `[E, 2·I, H]` is stored `[2·E, I, H]`: the gate and
/// up of each expert stack as leads of their own. Without `fuse_gate_up`, gate and up stack apart
/// (`….experts.gate_proj`, `….experts.up_proj`, `[E, I, H]` each: the halves GGUF splits the fused
/// tensor into).
pub fn restack_experts(tensors: &mut Vec<OutputTensor>, fuse_gate_up: bool) {
    let mut groups: BTreeMap<String, BTreeMap<(usize, String), usize>> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        if let Some((parent, e, proj)) = expert_leaf(&t.name).filter(|_| t.kind == Kind::Coded) {
            groups.entry(parent.to_string()).or_default().insert((e, proj.to_string()), i);
        }
    }
    let mut gone = BTreeSet::new();
    let mut fused = Vec::new();
    for (parent, members) in groups {
        let experts = members.len() / 3;
        let at = |e: usize, p: &str| members.get(&(e, p.to_string())).map(|&i| &tensors[i]);
        let complete = members.len() == 3 * experts
            && (0..experts).all(|e| ["gate_proj", "up_proj", "down_proj"].iter().all(|p| at(e, p).is_some()));
        if experts == 0 || !complete {
            continue;
        }
        let shape_of = |p: &str| at(0, p).map(|t| t.shape.clone()).unwrap_or_default();
        let (gate, down) = (shape_of("gate_proj"), shape_of("down_proj"));
        let alike = (0..experts).all(|e| {
            at(e, "gate_proj").unwrap().shape == gate
                && at(e, "up_proj").unwrap().shape == gate
                && at(e, "down_proj").unwrap().shape == down
        });
        if !alike || gate.len() != 2 || down.len() != 2 {
            continue;
        }
        let source = |e: usize, p: &str| at(e, p).and_then(|t| t.recipe.as_ref()).map(|r| r.source.clone()).unwrap();
        let storage = at(0, "gate_proj").unwrap().storage;
        let stack = |p: &str| (0..experts).map(|e| source(e, p)).collect::<Vec<_>>();
        let mut stacks = vec![(format!("{parent}.down_proj"), vec![experts, down[0], down[1]], stack("down_proj"))];
        if fuse_gate_up {
            let gate_up = (0..experts).flat_map(|e| [source(e, "gate_proj"), source(e, "up_proj")]).collect();
            stacks.push((format!("{parent}.gate_up_proj"), vec![experts, 2 * gate[0], gate[1]], gate_up));
        } else {
            for p in ["gate_proj", "up_proj"] {
                stacks.push((format!("{parent}.{p}"), vec![experts, gate[0], gate[1]], stack(p)));
            }
        }
        for (name, shape, members) in stacks {
            let source = RowSource::Stack(members);
            fused.push(OutputTensor::new(name, storage, shape, Kind::CodedExperts, source, Encoding::Float));
        }
        gone.extend(members.values().copied());
        // The fused layout has no slot for an expert's bias: left out (the engine says so).
        let prefix = format!("{parent}.");
        gone.extend(
            tensors
                .iter()
                .enumerate()
                .filter(|(_, t)| t.kind == Kind::Bias && t.name.starts_with(&prefix))
                .map(|(i, _)| i),
        );
    }
    if gone.is_empty() {
        return;
    }
    let mut i = 0;
    tensors.retain(|_| {
        i += 1;
        !gone.contains(&(i - 1))
    });
    tensors.extend(fused);
    tensors.sort_by_cached_key(|t| natural_key(&t.name));
}

/// Writes the output dtype into the config's dtype fields (`torch_dtype`, `dtype`, at the top
/// and in `text_config`) where they exist, so loaders pick the dtype the weights are stored in.
fn set_dtype(config: &mut Value, dtype: DenseDtype) {
    let name = match dtype {
        DenseDtype::Bf16 => "bfloat16",
        DenseDtype::F16 => "float16",
    };
    let set = |obj: &mut Value| {
        for key in ["torch_dtype", "dtype"] {
            if let Some(v) = obj.get_mut(key).filter(|v| v.is_string()) {
                *v = Value::from(name);
            }
        }
    };
    set(config);
    if let Some(text) = config.get_mut("text_config") {
        set(text);
    }
}

/// The input config with its `quantization_config` removed, and nothing else changed.
pub fn dense_config(config: &Value) -> Value {
    let mut c = config.clone();
    if let Some(obj) = c.as_object_mut() {
        obj.shift_remove("quantization_config");
    }
    c
}
