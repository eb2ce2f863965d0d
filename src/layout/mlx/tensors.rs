//! The MLX tensors of a checkpoint: the family and its names, the model dtype, the norms that carry
//! the +1, and every output tensor (coded linears, int8 pairs, plain tensors, stacked experts) with
//! its encoding.

use super::options::{MlxOptions, INT8_SCALE_DTYPE, ROUTER_SPEC};
use crate::checkpoint::architecture::{Family as ModelFamily, TextModel};
use crate::checkpoint::tensor::is_float;
use crate::checkpoint::{Catalog, Checkpoint, Leaf};
use crate::layout::names::{natural_key, norm_kind};
use crate::layout::options::{BiasMode, Int8Mode};
use crate::layout::tensor::{Adjust, AffineParams, Encoding, Kind, OutputTensor, RowSource};
use crate::quant::affine::int8_group_size;
use anyhow::{bail, Result};
use safetensors::Dtype;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// Which mlx-lm model family names follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `qwen3_5`, `qwen3_5_moe`: `language_model.` prefixes.
    Qwen35,
    /// `qwen3_next`: names kept.
    Qwen3Next,
}

/// What the layout dropped, for warnings.
#[derive(Clone, Debug, Default)]
pub struct Dropped {
    pub mtp: usize,
    pub tied_head: usize,
    pub expert_biases: usize,
}

/// The model family, from config.json as the model check reads it (any `model_type` it accepts,
/// exllamav3's text-only `qwen3_5_text` and `qwen3_5_moe_text` included), or from the tensor names
/// when there is no config.
pub fn family(ck: &Checkpoint) -> Result<Family> {
    match &ck.config {
        Some(config) => Ok(match TextModel::from_config(config)?.family {
            ModelFamily::Dense | ModelFamily::Moe => Family::Qwen35,
            ModelFamily::Next => Family::Qwen3Next,
        }),
        None if ck.tensors.keys().any(|k| k.starts_with("model.language_model.")) => Ok(Family::Qwen35),
        None => Ok(Family::Qwen3Next),
    }
}

/// The model dtype mlx-lm would convert to: `torch_dtype`, else `text_config.dtype`; bf16 when
/// neither names a float type.
pub fn model_dtype(config: Option<&Value>) -> Dtype {
    let name = config.and_then(|c| {
        c.get("torch_dtype")
            .and_then(Value::as_str)
            .or_else(|| c.get("text_config").and_then(|t| t.get("dtype")).and_then(Value::as_str))
    });
    match name {
        Some("float16") => Dtype::F16,
        Some("float32") => Dtype::F32,
        _ => Dtype::BF16,
    }
}

/// The MLX name of an input key.
pub fn mlx_name(family: Family, name: &str) -> String {
    match family {
        Family::Qwen3Next => name.to_string(),
        Family::Qwen35 => {
            if let Some(rest) = name.strip_prefix("model.language_model.") {
                format!("language_model.model.{rest}")
            } else if name.starts_with("language_model.") {
                name.to_string()
            } else {
                format!("language_model.{name}")
            }
        }
    }
}

/// The Hugging Face name of MLX tensor `name`, as llama.cpp's names are mapped from: [`mlx_name`]'s
/// prefix taken off, a stacked `switch_mlp` weight named as HF's stacked experts.
pub(super) fn hf_name(family: Family, name: &str) -> String {
    let name = match family {
        Family::Qwen35 => name.strip_prefix("language_model.").unwrap_or(name),
        Family::Qwen3Next => name,
    };
    name.replacen(".switch_mlp.", ".experts.", 1)
}

/// mlx-lm's suffixes of the zero-centred norms (`sanitize`), matched on MLX names.
const OFFSET_NORMS: &[&str] = &[
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// Whether an (MLX-named, 1-D) tensor is a norm that carries +1 in MLX layout.
pub fn is_offset_norm(mlx_name: &str) -> bool {
    OFFSET_NORMS.iter().any(|s| mlx_name.ends_with(s))
}

/// Whether a module path is an `MoE` router that mlx-lm quantizes at [`ROUTER_SPEC`].
pub(super) fn is_router(path: &str) -> bool {
    path.ends_with("mlp.gate") || path.ends_with("shared_expert_gate")
}

/// `(prefix, expert, projection)` of a per-expert module path `prefix.experts.{e}.{gate,up,down}_proj`.
fn per_expert(path: &str) -> Option<(&str, usize, &str)> {
    let (prefix, rest) = path.rsplit_once(".experts.")?;
    let (e, leaf) = rest.split_once('.')?;
    let e = e.parse().ok()?;
    matches!(leaf, "gate_proj" | "up_proj" | "down_proj").then_some((prefix, e, leaf))
}

/// One per-expert module waiting to be stacked.
#[derive(Clone)]
struct Member {
    expert: usize,
    source: RowSource,
    rows: usize,
    cols: usize,
    kind: Kind,
}

/// Per-expert modules waiting to be stacked, by (MLX prefix, projection).
type Stacks = BTreeMap<(String, String), Vec<Member>>;

fn is_dropped_key(name: &str) -> bool {
    // mlx-lm's old loaders test `"mtp." in key`: any such key would trigger a second +1.
    name.contains("mtp.")
}

struct Builder<'a> {
    opts: MlxOptions,
    dtype: Dtype,
    moe: bool,
    out: &'a mut Vec<OutputTensor>,
}

impl Builder<'_> {
    /// A module `path` (MLX name, no suffix) with `cols` inputs and `lead` leading dims:
    /// quantized at `spec` when the run's group size divides `cols`, dense otherwise.
    fn linear(
        &mut self,
        path: &str,
        lead: &[usize],
        rows: usize,
        cols: usize,
        source: RowSource,
        kind: Kind,
    ) -> &mut OutputTensor {
        let spec = if self.moe && is_router(path) { ROUTER_SPEC } else { self.opts.spec };
        let shape = |last: usize| lead.iter().copied().chain([rows, last]).collect::<Vec<_>>();
        let name = format!("{path}.weight");
        if self.opts.spec.fits(cols) && spec.fits(cols) {
            let params = AffineParams { scales: format!("{path}.scales"), biases: format!("{path}.biases") };
            for n in [&params.scales, &params.biases] {
                self.out.push(OutputTensor::companion(n.clone(), self.dtype, shape(spec.groups(cols))));
            }
            let encoding = Encoding::Affine { spec, params };
            self.out.push(OutputTensor::new(name, Dtype::U32, shape(spec.packed_cols(cols)), kind, source, encoding));
        } else {
            self.out.push(OutputTensor::new(name, self.dtype, shape(cols), kind, source, Encoding::Float));
        }
        self.out.last_mut().expect("just pushed")
    }

    /// A plain float tensor cast to `dtype`.
    fn float(&mut self, name: String, src: &str, dtype: Dtype, shape: Vec<usize>, kind: Kind) -> &mut OutputTensor {
        let source = RowSource::whole(src, &shape);
        self.out.push(OutputTensor::new(name, dtype, shape, kind, source, Encoding::Float));
        self.out.last_mut().expect("just pushed")
    }
}

/// The MLX-layout output tensors of a checkpoint, sorted in model order.
pub fn tensors(
    ck: &Checkpoint,
    cat: &Catalog,
    opts: MlxOptions,
    bias: BiasMode,
) -> Result<(Vec<OutputTensor>, Dropped)> {
    let family = family(ck)?;
    let text = ck.text_config();
    let moe = family == Family::Qwen3Next
        || text.and_then(|t| t.get("num_experts")).and_then(Value::as_u64).unwrap_or(0) > 0
        || cat.coded.iter().any(|m| m.experts.is_some());
    let tied = text.and_then(|t| t.get("tie_word_embeddings")).and_then(Value::as_bool).unwrap_or(false);
    let dtype = model_dtype(ck.config.as_ref());
    let mut tensors = Vec::new();
    let mut dropped = Dropped::default();
    let mut b = Builder { opts, dtype, moe, out: &mut tensors };
    let skip = |name: &str, dropped: &mut Dropped| -> bool {
        if is_dropped_key(name) {
            dropped.mtp += 1;
            return true;
        }
        if tied && (name == "lm_head" || name.starts_with("lm_head.")) {
            dropped.tied_head += 1;
            return true;
        }
        false
    };
    // Stacked coded modules by path, for the dead channels of fused gate_up projections.
    let by_path: HashMap<&str, usize> = cat.coded.iter().enumerate().map(|(i, m)| (m.path.as_str(), i)).collect();

    let mut stacks = Stacks::new();
    for (i, m) in cat.coded.iter().enumerate() {
        if skip(&m.path, &mut dropped) {
            continue;
        }
        let path = mlx_name(family, &m.path);
        let (ic, oc) = (m.in_features, m.out_features);
        let all_rows = RowSource::Coded { module: i, rows: 0..oc };
        if let (None, Some((prefix, expert, leaf))) = (m.experts, per_expert(&path)) {
            let member = Member { expert, source: all_rows, rows: oc, cols: ic, kind: Kind::CodedExperts };
            stacks.entry((prefix.to_string(), leaf.to_string())).or_default().push(member);
            continue;
        }
        let Some(e) = m.experts else {
            b.linear(&path, &[], oc, ic, all_rows, Kind::Coded);
            if let Some(name) = m.tensor(Leaf::Bias).filter(|_| bias.keeps(m)) {
                let source = RowSource::Tensor { name: name.to_string(), rows: 0..1, cols: oc };
                b.out.push(OutputTensor::new(
                    format!("{path}.bias"),
                    dtype,
                    vec![oc],
                    Kind::Bias,
                    source,
                    Encoding::Float,
                ));
            }
            continue;
        };
        if bias.keeps(m) && m.tensor(Leaf::Bias).is_some() {
            dropped.expert_biases += 1;
        }
        let kind = Kind::CodedExperts;
        let Some((prefix, leaf)) = path.rsplit_once(".experts.") else {
            bail!("{}: a stacked [E] coded module outside `mlp.experts`; its MLX name is unknown", m.path);
        };
        let switch = format!("{prefix}.switch_mlp");
        match leaf {
            "gate_up_proj" => {
                if oc % 2 != 0 {
                    bail!("{}: fused gate_up with an odd output width {oc}", m.path);
                }
                let half = oc / 2;
                let gate = RowSource::Coded { module: i, rows: 0..half };
                b.linear(&format!("{switch}.gate_proj"), &[e], half, ic, gate, kind);
                let up = RowSource::Coded { module: i, rows: half..oc };
                b.linear(&format!("{switch}.up_proj"), &[e], half, ic, up, kind);
            }
            "down_proj" | "gate_proj" | "up_proj" => {
                let stem = m.path.rsplit_once('.').map_or("", |(stem, _)| stem);
                let fused = by_path.get(format!("{stem}.gate_up_proj").as_str()).copied();
                let dead = fused.filter(|&g| {
                    leaf == "down_proj" && cat.coded[g].experts == Some(e) && cat.coded[g].out_features == 2 * ic
                });
                let adjust = Adjust { dead_columns_of: dead, ..Adjust::default() };
                b.linear(&format!("{switch}.{leaf}"), &[e], oc, ic, all_rows, kind).adjust(adjust);
            }
            other => bail!("{}: unknown expert projection \"{other}\"", m.path),
        }
    }

    for (i, m) in cat.int8.iter().enumerate() {
        if skip(&m.path, &mut dropped) {
            continue;
        }
        let path = mlx_name(family, &m.path);
        let (rows, cols) = (m.shape[0], m.shape[1]);
        if let Some((prefix, expert, leaf)) = per_expert(&path) {
            // Stacked experts are quantized at the run's setting (no exact repack per expert).
            let member = Member { expert, source: RowSource::Int8(i), rows, cols, kind: Kind::Int8 };
            stacks.entry((prefix.to_string(), leaf.to_string())).or_default().push(member);
            continue;
        }
        match (opts.int8, int8_group_size(cols)) {
            (Int8Mode::Exact, Some(group_size)) => {
                let params = AffineParams { scales: format!("{path}.scales"), biases: format!("{path}.biases") };
                for n in [&params.scales, &params.biases] {
                    b.out.push(OutputTensor::companion(n.clone(), INT8_SCALE_DTYPE, vec![rows, cols / group_size]));
                }
                let encoding = Encoding::Int8Affine { group_size, params };
                let name = format!("{path}.weight");
                b.out.push(OutputTensor::new(
                    name,
                    Dtype::U32,
                    vec![rows, cols / 4],
                    Kind::Int8,
                    RowSource::Int8(i),
                    encoding,
                ));
            }
            _ => {
                b.linear(&path, &[], rows, cols, RowSource::Int8(i), Kind::Int8);
            }
        }
    }

    for p in &cat.plain {
        if skip(&p.name, &mut dropped) {
            continue;
        }
        let entry = &ck.tensors[&p.name];
        let name = mlx_name(family, &p.name);
        let float = is_float(entry.dtype);
        let shape = entry.shape.clone();
        if !float {
            let source = RowSource::whole(&p.name, &shape);
            b.out.push(OutputTensor::new(name, entry.dtype, shape, Kind::Plain, source, Encoding::Bytes));
        } else if shape.len() == 1 && is_offset_norm(&name) {
            // Zero-centred storage: the MLX layout folds the 1 in, rounding once.
            b.float(name, &p.name, dtype, shape, Kind::Norm).adjust(Adjust { plus_one: true, ..Adjust::default() });
        } else if name.ends_with("conv1d.weight") && shape.len() == 3 {
            // [C, 1, K] → [C, K, 1]: one axis has length 1, so the values keep their order.
            let source = RowSource::whole(&p.name, &shape);
            let shape = if shape[2] != 1 && shape[1] == 1 { vec![shape[0], shape[2], 1] } else { shape };
            b.out.push(OutputTensor::new(name, dtype, shape, Kind::Plain, source, Encoding::Float));
        } else if name.ends_with("A_log") {
            // F64 is kept as F32 is: mlx loads no F64.
            let kept = if entry.dtype == Dtype::F64 { Dtype::F32 } else { entry.dtype };
            let keep = if family == Family::Qwen35 { kept } else { dtype };
            b.float(name, &p.name, keep, shape, Kind::Plain);
        } else if let Some((prefix, expert, leaf)) =
            name.strip_suffix(".weight").filter(|_| shape.len() == 2).and_then(per_expert)
        {
            let source = RowSource::whole(&p.name, &shape);
            let member = Member { expert, source, rows: shape[0], cols: shape[1], kind: Kind::Plain };
            stacks.entry((prefix.to_string(), leaf.to_string())).or_default().push(member);
        } else if let Some(path) = name.strip_suffix(".weight").filter(|_| shape.len() == 2) {
            // A Linear or an Embedding: quantized like mlx-lm does.
            b.linear(path, &[], shape[0], shape[1], RowSource::whole(&p.name, &shape), Kind::Plain);
        } else if let Some((prefix, leaf)) = name.rsplit_once(".experts.").filter(|_| shape.len() == 3) {
            // Plain fused HF expert parameters (no `.weight` suffix).
            let switch = format!("{prefix}.switch_mlp");
            let (e, oc, ic) = (shape[0], shape[1], shape[2]);
            let rows = |rows| RowSource::Tensor { name: p.name.clone(), rows, cols: ic };
            match leaf {
                "gate_up_proj" if oc % 2 == 0 => {
                    let half = oc / 2;
                    b.linear(&format!("{switch}.gate_proj"), &[e], half, ic, rows(0..half), Kind::Plain);
                    b.linear(&format!("{switch}.up_proj"), &[e], half, ic, rows(half..oc), Kind::Plain);
                }
                "down_proj" => {
                    b.linear(&format!("{switch}.down_proj"), &[e], oc, ic, rows(0..oc), Kind::Plain);
                }
                other => bail!("{}: unknown plain expert parameter \"{other}\"", p.name),
            }
        } else {
            let kind = if norm_kind(&p.name).is_some() { Kind::Norm } else { Kind::Plain };
            b.float(name, &p.name, dtype, shape, kind);
        }
    }
    for ((prefix, leaf), mut members) in stacks {
        members.sort_by_key(|m| m.expert);
        let first = members[0].clone();
        let n = members.len();
        if members.iter().enumerate().any(|(i, m)| m.expert != i || m.rows != first.rows || m.cols != first.cols) {
            bail!("{prefix}.experts.*.{leaf}: experts are not numbered 0..{n} with one shape; cannot stack them");
        }
        let sources = members.into_iter().map(|m| m.source).collect();
        b.linear(
            &format!("{prefix}.switch_mlp.{leaf}"),
            &[n],
            first.rows,
            first.cols,
            RowSource::Stack(sources),
            first.kind,
        );
    }
    tensors.sort_by_cached_key(|t| natural_key(&t.name));
    Ok((tensors, dropped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        assert_eq!(
            mlx_name(Family::Qwen35, "model.language_model.layers.0.mlp.gate.weight"),
            "language_model.model.layers.0.mlp.gate.weight"
        );
        assert_eq!(mlx_name(Family::Qwen35, "lm_head.weight"), "language_model.lm_head.weight");
        assert_eq!(mlx_name(Family::Qwen35, "language_model.lm_head.weight"), "language_model.lm_head.weight");
        assert_eq!(mlx_name(Family::Qwen3Next, "model.layers.0.mlp.gate.weight"), "model.layers.0.mlp.gate.weight");
    }

    #[test]
    fn names_back_to_hugging_face() {
        let l = "language_model.model.layers.1";
        assert_eq!(
            hf_name(Family::Qwen35, &format!("{l}.mlp.switch_mlp.up_proj.weight")),
            "model.layers.1.mlp.experts.up_proj.weight"
        );
        assert_eq!(hf_name(Family::Qwen35, "language_model.lm_head.weight"), "lm_head.weight");
        assert_eq!(
            hf_name(Family::Qwen3Next, "model.layers.0.self_attn.q_proj.weight"),
            "model.layers.0.self_attn.q_proj.weight"
        );
    }

    #[test]
    fn offset_norms() {
        for n in [
            "language_model.model.layers.3.input_layernorm.weight",
            "language_model.model.layers.3.post_attention_layernorm.weight",
            "language_model.model.layers.3.self_attn.q_norm.weight",
            "language_model.model.layers.3.self_attn.k_norm.weight",
            "language_model.model.norm.weight",
            "model.norm.weight",
        ] {
            assert!(is_offset_norm(n), "{n}");
        }
        assert!(!is_offset_norm("language_model.model.layers.0.linear_attn.norm.weight"));
    }

    #[test]
    fn routers_and_dropped_keys() {
        assert!(is_router("language_model.model.layers.7.mlp.gate"));
        assert!(is_router("language_model.model.layers.7.mlp.shared_expert_gate"));
        assert!(!is_router("language_model.model.layers.7.mlp.gate_proj"));
        assert!(is_dropped_key("mtp.fc.weight"));
        assert!(is_dropped_key("model.tq_mtp.x"));
        assert_eq!(per_expert("model.layers.0.mlp.experts.12.up_proj"), Some(("model.layers.0.mlp", 12, "up_proj")));
        assert_eq!(per_expert("model.layers.0.mlp.experts.gate_up_proj"), None);
        assert_eq!(per_expert("model.layers.0.mlp.shared_expert.up_proj"), None);
    }

    #[test]
    fn model_dtypes() {
        assert_eq!(model_dtype(None), Dtype::BF16);
        assert_eq!(model_dtype(Some(&json!({"text_config": {"dtype": "float16"}}))), Dtype::F16);
        assert_eq!(
            model_dtype(Some(&json!({"torch_dtype": "bfloat16", "text_config": {"dtype": "float16"}}))),
            Dtype::BF16
        );
    }
}
