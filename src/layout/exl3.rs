//! EXL3, exllamav3's own format: the checkpoint as exllamav3 would have quantized it itself, with
//! no trellis word changed, which exllamav3 (and what builds on it: `TabbyAPI`, `PonyExl3`) loads as
//! a text-only Qwen3.5 model (`Qwen3_5ForCausalLM`, `Qwen3_5MoeForCausalLM`).
//!
//! * coded linear `P` → `P.trellis` (the stored code words, I16 `[IC/16, OC/16, 16K]`),
//!   `P.suh` F16 `[IC]` = `f16(rin·s_in)`, `P.svh` F16 `[OC]` = `f16(rout·s_out)` (one rounding of the
//!   exact product; exact where s is 1), and the codebook marker exllamav3 writes (`P.mcg` or
//!   `P.mul1`, an I32 scalar holding the codebook's multiplier; none for 3INST);
//! * stacked experts `….experts.gate_up_proj` / `down_proj` `[E, …]` → one module per expert,
//!   `….experts.{e}.gate_proj` / `up_proj` / `down_proj`, the fused gate‖up cut at its half (whole
//!   16-column tiles);
//! * int8 pairs → `P.weight` bf16 (the exact product rounded once); every other tensor as in the
//!   Hugging Face layout ([`super::hf`]): norms zero-centred (exllamav3 adds the 1), 16-bit floats
//!   bf16, F32 kept;
//! * biases of coded linears, where `--bias` keeps them (by default an EXL3 input's) → `P.bias` F16,
//!   which exllamav3 adds after the matmul;
//! * config.json flattened to the text model, with the `quantization_config` exllamav3's converter
//!   writes, and `quantization_config.json` with its `tensor_storage` map.

use super::flags::FlagWords;
use super::hf::{self, DenseDtype};
use super::mtp::{self, MtpMode};
use super::names::natural_key;
use super::options::BiasMode;
use super::policy::{FormatCard, Layout};
use super::tensor::{Encoding, Kind, OutputTensor, RowSource};
use crate::checkpoint::tensor::to_f32_vec;
use crate::checkpoint::{Catalog, Checkpoint, CodedModule, Leaf};
use crate::codec::Codebook;
use crate::storage::Storage;
use anyhow::{bail, Result};
use half::f16;
use safetensors::Dtype;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashSet};

/// The exllamav3 release whose checkpoint format is written (its `quantization_config.version`).
pub const EXLLAMAV3_VERSION: &str = "1.6.5";

/// exllamav3's codebook multipliers (`modules/quant/exl3_lib/quantize.py`), stored in the markers.
const MCG_MULT: u32 = 0xCBAC_1FED;
const MUL1_MULT: u32 = 0x83DC_D12D;

/// The EXL3 layout.
#[derive(Clone, Copy, Debug)]
pub struct Exl3Layout {
    pub mtp: MtpMode,
}

/// The codebook marker of a coded linear: leaf name and multiplier.
fn marker(codebook: Codebook) -> Option<(&'static str, u32)> {
    match codebook {
        Codebook::Mcg => Some(("mcg", MCG_MULT)),
        Codebook::Mul1 => Some(("mul1", MUL1_MULT)),
        Codebook::ThreeInst => None,
    }
}

/// exllamav3's name of a codebook (`--codebook` of its converter).
fn codebook_name(codebook: Codebook) -> &'static str {
    match codebook {
        Codebook::Mcg => "mcg",
        Codebook::Mul1 => "mul1",
        Codebook::ThreeInst => "3inst",
    }
}

/// One EXL3 linear written from (one expert of) a coded module.
struct Piece<'a> {
    m: &'a CodedModule,
    /// Output module path.
    path: String,
    expert: usize,
    /// Output channels (tile columns × 16) of the module this linear takes.
    out: std::ops::Range<usize>,
}

impl Piece<'_> {
    fn tensors(&self, keep_bias: bool, kind: Kind) -> Vec<OutputTensor> {
        let m = self.m;
        let code = m.tensor(Leaf::Code).expect("validated: every coded module has codes");
        let tiles_in = m.in_padded / 16;
        let words = 16 * m.k as usize;
        let out_tiles = self.out.start / 16..self.out.end / 16;
        let lead0 = self.expert * tiles_in;
        let trellis = RowSource::Slice {
            name: code.to_string(),
            leads: lead0..lead0 + tiles_in,
            rows: out_tiles.clone(),
            cols: 0..words,
        };
        let mut out = vec![OutputTensor::new(
            format!("{}.trellis", self.path),
            Dtype::I16,
            vec![tiles_in, out_tiles.len(), words],
            kind,
            trellis,
            Encoding::Bytes,
        )];
        // A vector of the module, `[E, len]` or `[len]`: this expert's row, columns `cols`.
        let row = |name: &str, cols: std::ops::Range<usize>| RowSource::Slice {
            name: name.to_string(),
            leads: 0..1,
            rows: self.expert..self.expert + 1,
            cols,
        };
        let folded = |r: Leaf, s: Leaf, cols: std::ops::Range<usize>| {
            let r = row(m.tensor(r).expect("validated: rin and rout"), cols.clone());
            match m.tensor(s) {
                Some(s) => RowSource::Product(Box::new(r), Box::new(row(s, cols))),
                None => r,
            }
        };
        for (leaf, source, len) in [
            ("suh", folded(Leaf::Rin, Leaf::SIn, 0..m.in_padded), m.in_padded),
            ("svh", folded(Leaf::Rout, Leaf::SOut, self.out.clone()), self.out.len()),
        ] {
            let name = format!("{}.{leaf}", self.path);
            out.push(OutputTensor::new(name, Dtype::F16, vec![len], Kind::QuantParams, source, Encoding::Float));
        }
        if let Some((leaf, mult)) = marker(m.codebook) {
            let source = RowSource::Literal { bytes: mult.to_le_bytes().to_vec(), width: 1 };
            let name = format!("{}.{leaf}", self.path);
            out.push(OutputTensor::new(name, Dtype::I32, Vec::new(), Kind::QuantParams, source, Encoding::Bytes));
        }
        if let Some(bias) = m.tensor(Leaf::Bias).filter(|_| keep_bias) {
            let name = format!("{}.bias", self.path);
            let source = row(bias, self.out.clone());
            out.push(OutputTensor::new(name, Dtype::F16, vec![self.out.len()], Kind::Bias, source, Encoding::Float));
        }
        out
    }
}

/// The EXL3 linears of coded module `m`: itself, or one per expert (gate and up apart).
fn pieces<'a>(ck: &Checkpoint, m: &'a CodedModule) -> Result<Vec<Piece<'a>>> {
    let code = m.tensor(Leaf::Code).unwrap_or(&m.path);
    if m.in_features != m.in_padded || m.out_features != m.out_padded {
        bail!(
            "tensor {code}: padded ({}×{} stored for {}×{}); the EXL3 layout writes unpadded linears only",
            m.in_padded,
            m.out_padded,
            m.in_features,
            m.out_features
        );
    }
    let Some(experts) = m.experts else {
        return Ok(vec![Piece { m, path: m.path.clone(), expert: 0, out: 0..m.out_padded }]);
    };
    if let Some(bias) = m.tensor(Leaf::Bias) {
        let shape = &ck.entry(bias)?.shape;
        if *shape != [experts, m.out_padded] {
            bail!("tensor {bias}: shape {shape:?}; the EXL3 layout splits expert biases of shape [E, OC] only");
        }
    }
    let (parent, leaf) = m.path.rsplit_once('.').unwrap_or(("", &m.path));
    let at = |e: usize, name: &str| format!("{parent}.{e}.{name}");
    let mut out = Vec::new();
    for e in 0..experts {
        if leaf == "gate_up_proj" {
            let tiles = m.out_padded / 16;
            if !tiles.is_multiple_of(2) {
                bail!(
                    "tensor {code}: {} output channels ({tiles} tiles of 16) do not split into gate and up halves \
                     of whole 16-column tiles",
                    m.out_padded
                );
            }
            let half = m.out_padded / 2;
            out.push(Piece { m, path: at(e, "gate_proj"), expert: e, out: 0..half });
            out.push(Piece { m, path: at(e, "up_proj"), expert: e, out: half..m.out_padded });
        } else {
            out.push(Piece { m, path: at(e, leaf), expert: e, out: 0..m.out_padded });
        }
    }
    Ok(out)
}

/// The largest relative change one rounding to f16 makes to a value in float16's normal range:
/// half a unit in the last of its 11 significant bits.
pub const FOLD_BOUND: f64 = 1.0 / 2048.0;

/// The largest relative change folding `s` into `r` makes, over every channel of every coded
/// linear: `|f16(r·s) − r·s| / |r·s|`, 0 where s is 1 (or absent). A channel whose product f16
/// cannot hold within [`FOLD_BOUND`] (beyond 65504, or below float16's normal range, where
/// rounding keeps fewer bits or none) is refused naming the tensor: the EXL3 output would compute
/// other weights than IN's.
pub fn fold_change(ck: &Checkpoint, cat: &Catalog) -> Result<f64> {
    let mut worst = 0.0f64;
    for m in &cat.coded {
        for (r, s, leaf, len) in
            [(Leaf::Rin, Leaf::SIn, "suh", m.in_padded), (Leaf::Rout, Leaf::SOut, "svh", m.out_padded)]
        {
            let Some(s_name) = m.tensor(s) else { continue };
            let r_name = m.tensor(r).expect("validated: rin and rout");
            let (re, se) = (ck.entry(r_name)?, ck.entry(s_name)?);
            let (rv, sv) = (to_f32_vec(ck.bytes(re), re.dtype)?, to_f32_vec(ck.bytes(se), se.dtype)?);
            for (i, (&r, &s)) in rv.iter().zip(&sv).enumerate() {
                let exact = f64::from(r) * f64::from(s);
                if exact == 0.0 {
                    continue;
                }
                let stored = f64::from(f16::from_f32(crate::quant::dense::round_to_odd(exact)).to_f32());
                let change = (stored - exact).abs() / exact.abs();
                if change > FOLD_BOUND {
                    let why = if stored.is_infinite() {
                        "beyond float16's largest value, 65504"
                    } else {
                        "below float16's normal range (2^-14), where it keeps fewer bits, or none"
                    };
                    let expert = m.experts.map(|_| format!(" of expert {}", i / len)).unwrap_or_default();
                    bail!(
                        "tensor {s_name}: channel {}{expert}: {r:e} × {s:e} = {exact:.4e} becomes {stored:.4e} in the \
                         f16 {}.{leaf}, a change of {change:.1e} (the fold allows 2^-11): {why}; --format bf16 holds it",
                        i % len,
                        m.path,
                    );
                }
                worst = worst.max(change);
            }
        }
    }
    Ok(worst)
}

impl Layout for Exl3Layout {
    fn name(&self) -> &'static str {
        "exl3"
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
        rope_runs(ck.config.as_ref())?;
        let mut tensors = Vec::new();
        // Everything but the coded linears (and their biases) as in the Hugging Face layout.
        for t in hf::tensors(ck, cat, DenseDtype::Bf16, BiasMode::Drop) {
            let coded = t.recipe.as_ref().is_some_and(|r| !r.source.coded_modules().is_empty());
            if !coded {
                tensors.push(t);
            }
        }
        for m in &cat.coded {
            let kind = if m.experts.is_some() { Kind::CodedExperts } else { Kind::Coded };
            for piece in pieces(ck, m)? {
                tensors.extend(piece.tensors(bias.keeps(m), kind));
            }
        }
        tensors.sort_by_cached_key(|t| natural_key(&t.name));
        mtp::apply(self.mtp, &mut tensors, ck.config.as_ref(), warnings);
        Ok(tensors)
    }

    fn config(&self, input: &Value, tensors: &[OutputTensor]) -> Option<String> {
        Some(crate::json::to_text(&config(input, tensors), 4))
    }

    fn extra_files(&self, input: &Value, tensors: &[OutputTensor]) -> Vec<(String, String)> {
        let config = config(input, tensors);
        let mut q = config.get("quantization_config").cloned().unwrap_or_else(|| json!({}));
        q["tensor_storage"] = tensor_storage(tensors);
        vec![("quantization_config.json".into(), crate::json::to_text(&q, 4))]
    }

    /// exllamav3 adds `P.bias` after the matmul (`LinearEXL3`).
    fn applies_bias(&self) -> bool {
        true
    }

    fn fold_change(&self, ck: &Checkpoint, cat: &Catalog) -> Result<Option<f64>> {
        fold_change(ck, cat).map(Some)
    }

    /// exllamav3's converter writes 8 GB shards by default; 5 GB keeps to the Hub's habit.
    fn default_max_shard_size(&self) -> u64 {
        5_000_000_000
    }

    fn needs_config(&self) -> Option<&'static str> {
        Some("exllamav3 loads the text model's config.json and quantization_config.json written from it")
    }

    fn card(&self, _mtp: bool) -> FormatCard {
        FormatCard {
            library: "exllamav3",
            tags: vec!["exllamav3".into()],
            description: "EXL3 (exllamav3), the trellis codes exactly as stored; a text-only Qwen3.5 model".into(),
            how_to_load: "exllamav3:\n\n```python\nfrom exllamav3 import Config, Model, Cache, Tokenizer, Generator\n\
                 config = Config.from_directory(\"path/to/model\")\nmodel = Model.from_config(config)\n\
                 cache = Cache(model, max_num_tokens=8192)\nmodel.load()\n\
                 tokenizer = Tokenizer.from_config(config)\n\
                 generator = Generator(model=model, cache=cache, tokenizer=tokenizer)\n\
                 print(generator.generate(prompt=\"Hello\", max_new_tokens=64))\n```\n\n\
                 TabbyAPI: put the directory under its `models/` folder and set `model_name` to it (backend exllamav3).\n"
                .into(),
        }
    }

    fn rope_scaling_note(&self) -> Option<&'static str> {
        Some(
            "exllamav3 reads the text config's `rope_scaling`, else its `rope_parameters`, and runs linear, yarn, \
             llama3 and longrope; for YaRN it takes the factor as `max_position_embeddings / \
             original_max_position_embeddings` (not `factor`), and the attention factor from that, so \
             `max_position_embeddings` must be the context the scaling extends to",
        )
    }

    fn mtp_note(&self, written: bool) -> &'static str {
        if written {
            "kept as `mtp.*` tensors in the main shards (exllamav3's text-only Qwen3.5 model does not load them)"
        } else {
            "not written (incomplete, or dropped on request); mtp_num_hidden_layers is 0"
        }
    }
}

/// The rotary scaling exllamav3 runs (`util/rope.py`): it raises on a type it does not know
/// (dynamic), and `YaRN` needs `max_position_embeddings`, which its factor is computed from.
fn rope_runs(config: Option<&Value>) -> Result<()> {
    let Some(config) = config else { return Ok(()) };
    let text = config.get("text_config").filter(|t| t.is_object()).unwrap_or(config);
    let Some(rope) = ["rope_scaling", "rope_parameters"].iter().find_map(|k| text.get(k).filter(|r| r.is_object()))
    else {
        return Ok(());
    };
    let kind = rope.get("rope_type").or_else(|| rope.get("type")).and_then(Value::as_str).unwrap_or("default");
    match kind {
        "dynamic" => bail!(
            "config.json: rope_type \"dynamic\"; exllamav3 does not run it (\"Unknown rope_type\"): convert to another \
             format, or use linear or yarn"
        ),
        "yarn" if !text.get("max_position_embeddings").is_some_and(Value::is_u64) => bail!(
            "config.json: YaRN without max_position_embeddings; exllamav3 computes the YaRN factor from it and refuses \
             the model without"
        ),
        _ => Ok(()),
    }
}

/// Whether the checkpoint is the `MoE` family.
fn is_moe(input: &Value) -> bool {
    let text = input.get("text_config").unwrap_or(input);
    text.get("num_experts").is_some()
        || input.get("model_type").and_then(Value::as_str).is_some_and(|t| t.contains("moe"))
}

/// config.json for exllamav3's text-only Qwen3.5 classes: the text config's keys at the top, the
/// vision config dropped, the architecture `Qwen3_5ForCausalLM` (`…MoeForCausalLM`; another family keeps its own), and the
/// `quantization_config` exllamav3's converter writes (`conversion/compile.py`).
pub fn config(input: &Value, tensors: &[OutputTensor]) -> Value {
    let mut out = Map::new();
    let source_arch = input.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str).unwrap_or("");
    let arch = match source_arch {
        a if !a.is_empty() && !a.starts_with("Qwen3_5") => json!(input["architectures"]),
        _ if is_moe(input) => json!(["Qwen3_5MoeForCausalLM"]),
        _ => json!(["Qwen3_5ForCausalLM"]),
    };
    out.insert("architectures".into(), arch);
    if let Some(text) = input.get("text_config").and_then(Value::as_object) {
        for (k, v) in text {
            out.insert(k.clone(), v.clone());
        }
    }
    if let Some(top) = input.as_object() {
        for (k, v) in top {
            let skip = matches!(k.as_str(), "architectures" | "text_config" | "vision_config" | "quantization_config")
                || (k == "model_type" && out.contains_key("model_type"));
            if !skip && !out.contains_key(k) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    let mut config = Value::Object(out);
    if !tensors.iter().any(|t| mtp::is_mtp(&t.name)) {
        mtp::clear_declared_layers(&mut config);
    }
    // exllamav3 writes a separate head and says so (`update_config`); a tied source without
    // one keeps its tie, which is how exllamav3 finds the head in the embedding.
    if tensors.iter().any(|t| t.name.starts_with("lm_head.")) {
        if let Some(v) = config.get_mut("tie_word_embeddings") {
            *v = Value::from(false);
        }
    }
    config["quantization_config"] = quantization_config(input.get("quantization_config"), tensors);
    config
}

/// `{quant_method, version, bits, head_bits, codebook}` as exllamav3's converter writes them, the
/// source's own kept as `original_quantization_config` (or updated, for an EXL3 source).
fn quantization_config(original: Option<&Value>, tensors: &[OutputTensor]) -> Value {
    let (mut bits_weights, mut weights, mut head_bits) = (0.0f64, 0.0f64, 16.0f64);
    let mut codebooks: Vec<&str> = Vec::new();
    let names: HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    for t in tensors.iter().filter(|t| t.name.ends_with(".trellis")) {
        let k = (t.shape[2] / 16) as f64;
        let n = (t.shape[0] * t.shape[1] * 256) as f64;
        let module = &t.name[..t.name.len() - ".trellis".len()];
        if module == "lm_head" {
            head_bits = k;
        } else if !mtp::is_mtp(module) {
            bits_weights += k * n;
            weights += n;
        }
    }
    for t in tensors {
        let cb = match t.name.rsplit_once('.').map(|(_, leaf)| leaf) {
            Some("mcg") => codebook_name(Codebook::Mcg),
            Some("mul1") => codebook_name(Codebook::Mul1),
            Some("trellis") if !has_marker(&names, &t.name) => codebook_name(Codebook::ThreeInst),
            _ => continue,
        };
        if !codebooks.contains(&cb) {
            codebooks.push(cb);
        }
    }
    let bits = if weights > 0.0 { (bits_weights / weights * 100.0).round() / 100.0 } else { 0.0 };
    let mut q = match original {
        Some(o) if o.get("quant_method").and_then(Value::as_str) == Some("exl3") => o.clone(),
        _ => json!({"quant_method": "exl3", "version": EXLLAMAV3_VERSION}),
    };
    q["bits"] = json!(bits);
    q["head_bits"] = if head_bits.fract() == 0.0 { json!(head_bits as u64) } else { json!(head_bits) };
    if let [only] = codebooks[..] {
        q["codebook"] = json!(only);
    }
    if let Some(o) = original.filter(|o| o.get("quant_method").and_then(Value::as_str) != Some("exl3")) {
        q["original_quantization_config"] = o.clone();
    }
    q
}

fn has_marker(names: &HashSet<&str>, trellis: &str) -> bool {
    let module = &trellis[..trellis.len() - ".trellis".len()];
    ["mcg", "mul1"].iter().any(|m| names.contains(format!("{module}.{m}").as_str()))
}

/// torch's name of a stored element type, as exllamav3 lists it.
fn torch_dtype(storage: Storage) -> String {
    let name = match storage.element() {
        Some(Dtype::I16) => "int16",
        Some(Dtype::F16) => "float16",
        Some(Dtype::BF16) => "bfloat16",
        Some(Dtype::F32) => "float32",
        Some(Dtype::F64) => "float64",
        Some(Dtype::I32) => "int32",
        Some(Dtype::I64) => "int64",
        Some(Dtype::I8) => "int8",
        Some(Dtype::U8) => "uint8",
        Some(Dtype::BOOL) => "bool",
        _ => "unknown",
    };
    format!("torch.{name}")
}

/// The leaf modules of exllamav3's model, by key: what holds `weight`, `bias` or EXL3 tensors,
/// less the MTP head (which its text-only model does not build) and the linear attention's conv1d
/// (read by the attention module itself).
fn leaf_module(name: &str) -> Option<&str> {
    let (path, leaf) = name.rsplit_once('.')?;
    let known = matches!(leaf, "weight" | "bias" | "trellis" | "suh" | "svh" | "mcg" | "mul1");
    (known && !mtp::is_mtp(name) && !path.ends_with(".conv1d")).then_some(path)
}

/// `tensor_storage` of `quantization_config.json` (`conversion/quant_config.py`,
/// `create_quantization_config_json`): per leaf module, its stored tensors, and for an EXL3
/// linear its format, bits per weight and codebook multiplier.
fn tensor_storage(tensors: &[OutputTensor]) -> Value {
    let mut modules: Vec<&str> = Vec::new();
    let mut stored: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for t in tensors {
        let Some(module) = leaf_module(&t.name) else { continue };
        if !stored.contains_key(module) {
            modules.push(module);
        }
        let info = json!({"shape": t.shape, "n_bytes": t.byte_len(), "dtype": torch_dtype(t.storage)});
        stored.entry(module).or_default().insert(t.name.clone(), info);
    }
    let mut out = Map::new();
    for module in modules {
        let tensors_of = stored.remove(module).unwrap_or_default();
        let mut entry = Map::new();
        let trellis = tensors_of.get(&format!("{module}.trellis")).and_then(|t| t["shape"][2].as_u64());
        entry.insert("stored_tensors".into(), Value::Object(tensors_of.clone()));
        if let Some(words) = trellis {
            entry.insert("quant_format".into(), json!("exl3"));
            entry.insert("bits_per_weight".into(), json!(words / 16));
            for (leaf, mult, key) in [("mul1", MUL1_MULT, "mul1_multiplier"), ("mcg", MCG_MULT, "mcg_multiplier")] {
                if tensors_of.contains_key(&format!("{module}.{leaf}")) {
                    entry.insert(key.into(), json!(mult));
                }
            }
        }
        out.insert(module.to_string(), Value::Object(entry));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_flattened_to_the_text_model() {
        let input = json!({
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "text_config": {"model_type": "qwen3_5_moe_text", "hidden_size": 128, "num_experts": 4,
                            "mtp_num_hidden_layers": 1},
            "vision_config": {"depth": 2},
            "tie_word_embeddings": true,
            "quantization_config": {"quant_method": "eschamoe"}
        });
        let c = config(&input, &[]);
        assert_eq!(c["architectures"], json!(["Qwen3_5MoeForCausalLM"]));
        assert_eq!(c["model_type"], json!("qwen3_5_moe_text"));
        assert_eq!(c["hidden_size"], json!(128));
        assert!(c.get("vision_config").is_none() && c.get("text_config").is_none());
        assert_eq!(c["mtp_num_hidden_layers"], json!(0));
        // No head written: the tie stays.
        assert_eq!(c["tie_word_embeddings"], json!(true));
        let q = &c["quantization_config"];
        assert_eq!(q["quant_method"], json!("exl3"));
        assert_eq!(q["version"], json!(EXLLAMAV3_VERSION));
        assert_eq!(q["head_bits"], json!(16));
        assert_eq!(q["original_quantization_config"]["quant_method"], json!("eschamoe"));
    }

    #[test]
    fn leaf_modules_follow_exllamav3() {
        assert_eq!(
            leaf_module("model.layers.0.mlp.experts.3.up_proj.trellis"),
            Some("model.layers.0.mlp.experts.3.up_proj")
        );
        assert_eq!(leaf_module("model.layers.0.linear_attn.conv1d.weight"), None);
        assert_eq!(leaf_module("model.layers.0.linear_attn.A_log"), None);
        assert_eq!(leaf_module("mtp.fc.weight"), None);
        assert_eq!(leaf_module("lm_head.weight"), Some("lm_head"));
    }
}
