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

use super::fit::{FitOption, FitRecipe, FitTensor};
use super::flags::FlagWords;
use super::mtp;
use super::names::{natural_key, norm_kind};
use super::options::{AutoBits, BiasMode, Int8Mode};
use super::policy::{Chosen, FormatCard, Layout, WeightProbe, WidthChoice};
use super::tensor::{Adjust, AffineParams, Encoding, Kind, OutputTensor, Recipe, RowSource};
use crate::checkpoint::tensor::is_float;
use crate::checkpoint::{Catalog, Checkpoint, Leaf};
use crate::container::{MetaValue, Metadata};
use crate::quant::affine::{int8_group_size, AffineSpec, BITS, GROUP_SIZES};
use crate::quant::budget::budget;
use crate::select::selected;
use crate::storage::Storage;
use crate::warning::{Warning, WarningCode};
use anyhow::{bail, Result};
use safetensors::Dtype;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Options of an MLX-layout conversion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlxOptions {
    /// The run's default bits and group size.
    pub spec: AffineSpec,
    pub int8: Int8Mode,
    /// `--bits auto`: each coded linear at its own width.
    pub auto: Option<AutoBits>,
    /// `--max-size`: every quantized tensor at the width and group size the size budget chose.
    pub fitted: bool,
}

impl MlxOptions {
    /// `--format mlx` with no other flag: 4 bits, group size 64, int8 repacked exactly.
    pub const DEFAULT: MlxOptions =
        MlxOptions { spec: AffineSpec { bits: 4, group_size: 64 }, int8: Int8Mode::Exact, auto: None, fitted: false };
}

/// Scales and biases of exactly repacked int8 modules: F32 keeps the repack exact.
pub const INT8_SCALE_DTYPE: Dtype = Dtype::F32;

/// The setting mlx-lm's `MoE` `quant_predicate` gives routers.
pub const ROUTER_SPEC: AffineSpec = AffineSpec { bits: 8, group_size: 64 };

/// Which mlx-lm model family names follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `qwen3_5`, `qwen3_5_moe`: `language_model.` prefixes.
    Qwen35,
    /// `qwen3_next`: names kept.
    Qwen3Next,
}

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
        let Some(auto) = self.opts.auto else { return Ok(Vec::new()) };
        // The scales' dtype is the dtype of the values quantized.
        let scale_dtypes: HashMap<String, Dtype> = tensors
            .iter()
            .filter(|t| t.recipe.is_none())
            .filter_map(|t| Some((t.name.clone(), t.storage.element()?)))
            .collect();
        let mut choices = Vec::new();
        for t in tensors {
            let Some(Recipe { source, adjust, encoding: Encoding::Affine { spec, params } }) = &mut t.recipe else {
                continue;
            };
            let Some(&module) = source.coded_modules().first() else { continue };
            let k = cat.coded[module].k;
            let budget = budget(auto.max_added_error, k);
            let cols = t.shape.last().copied().unwrap_or(0) * 32 / spec.bits as usize;
            let scale_dtype = scale_dtypes[&params.scales];
            let (estimate, exact) = probe.affine_errors(source, *adjust, spec.group_size, scale_dtype, auto.exact)?;
            let estimate_bits = estimate.narrowest_within(budget);
            let bits = exact.as_ref().map_or(estimate_bits, |e| e.narrowest_within(budget));
            spec.bits = bits;
            *t.shape.last_mut().expect("a packed weight has a shape") = spec.packed_cols(cols);
            choices.push(WidthChoice {
                tensor: t.name.clone(),
                k,
                chosen: Chosen::Bits(bits),
                bits_per_weight: spec.bits_per_weight(scale_dtype),
                budget,
                predicted: estimate.relative(bits),
                actual: exact.map(|e| e.relative(bits)),
                estimate: exact.map(|_| Chosen::Bits(estimate_bits)),
                group_size: None,
                bytes: None,
                ratio: None,
            });
        }
        Ok(choices)
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
        let dtype = model_dtype(ck.config.as_ref());
        let moe = is_moe(tensors);
        let scale_bytes = dtype.bitsize() as u64 / 8;
        let mut menu = Vec::new();
        for (index, t) in tensors.iter().enumerate() {
            let Some(recipe) = &t.recipe else { continue };
            let last = t.shape.last().copied().unwrap_or(0);
            let (cols, repack) = match &recipe.encoding {
                Encoding::Affine { spec, .. } => (last * 32 / spec.bits as usize, None),
                Encoding::Int8Affine { group_size, .. } => (last * 4, Some(*group_size)),
                _ => continue,
            };
            if cols == 0 || (moe && t.name.strip_suffix(".weight").is_some_and(is_router)) {
                continue;
            }
            let rows = (t.numel() / last) as u64;
            let mut options = Vec::new();
            if let Some(gs) = repack {
                let scales = 2 * (cols / gs) as u64 * INT8_SCALE_DTYPE.bitsize() as u64 / 8;
                options.push(FitOption {
                    chosen: Chosen::Bits(8),
                    group_size: Some(gs),
                    storage: Storage::Element(INT8_SCALE_DTYPE),
                    lossless: true,
                    bytes: rows * (cols as u64 + scales),
                    error: 0.0,
                });
            }
            let sizes: Vec<usize> = GROUP_SIZES.iter().copied().filter(|g| cols % g == 0).collect();
            let errors = probe.affine_errors_at(&recipe.source, recipe.adjust, &sizes, dtype)?;
            for (e, &group_size) in errors.iter().zip(&sizes) {
                for bits in BITS {
                    let spec = AffineSpec { bits, group_size };
                    let per_row = spec.packed_cols(cols) as u64 * 4 + 2 * spec.groups(cols) as u64 * scale_bytes;
                    options.push(FitOption {
                        chosen: Chosen::Bits(bits),
                        group_size: Some(group_size),
                        storage: Storage::Element(dtype),
                        lossless: false,
                        bytes: rows * per_row,
                        error: e.relative(bits),
                    });
                }
            }
            let k = recipe.source.coded_modules().first().map(|&m| cat.coded[m].k);
            menu.push(FitTensor { index, name: t.name.clone(), k, weights: t.weights(), options });
        }
        Ok(menu)
    }

    /// A uniform `--bits B --group-size G` run: every menu tensor at that setting, an exactly
    /// repacked int8 table kept exact (as this run's `--int8` keeps it).
    fn fit_recipes(&self, _ck: &Checkpoint, _tensors: &[OutputTensor], menu: &[FitTensor]) -> Result<Vec<FitRecipe>> {
        let mut recipes = Vec::new();
        for group_size in GROUP_SIZES {
            for bits in BITS {
                let name = format!("--bits {bits} --group-size {group_size}");
                let at =
                    |o: &FitOption| !o.lossless && o.chosen == Chosen::Bits(bits) && o.group_size == Some(group_size);
                let pick =
                    |t: &FitTensor| t.options.iter().position(|o| o.lossless).or_else(|| t.options.iter().position(at));
                recipes.extend(FitRecipe::from_menu(name, menu, pick));
            }
        }
        Ok(recipes)
    }

    fn fit_apply(&self, tensors: &mut [OutputTensor], fit: &FitTensor, option: usize) {
        let o = &fit.options[option];
        let (Chosen::Bits(bits), Some(group_size)) = (&o.chosen, o.group_size) else { return };
        let t = &mut tensors[fit.index];
        let Some(recipe) = t.recipe.as_mut() else { return };
        let last = t.shape.last().copied().unwrap_or(0);
        let (cols, params) = match &recipe.encoding {
            Encoding::Affine { spec, params } => (last * 32 / spec.bits as usize, params.clone()),
            Encoding::Int8Affine { params, .. } => (last * 4, params.clone()),
            _ => return,
        };
        let spec = AffineSpec { bits: *bits, group_size };
        let (encoding, packed) = if o.lossless {
            (Encoding::Int8Affine { group_size, params: params.clone() }, cols / 4)
        } else {
            (Encoding::Affine { spec, params: params.clone() }, spec.packed_cols(cols))
        };
        recipe.encoding = encoding;
        *t.shape.last_mut().expect("a packed weight has a shape") = packed;
        for c in tensors.iter_mut().filter(|c| c.name == params.scales || c.name == params.biases) {
            c.storage = o.storage;
            *c.shape.last_mut().expect("scales have a shape") = cols / group_size;
        }
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
        let AffineSpec { bits, group_size } = self.opts.spec;
        let int8 = match self.opts.int8 {
            Int8Mode::Exact => "int8 layers repacked exactly as 8-bit affine",
            Int8Mode::Requant => "int8 layers requantized",
        };
        // Under a size budget every quantized tensor, int8 tables and routers included, takes the
        // encoding the budget chose; its own note says how the tables were kept.
        let (tag, setting) = if self.opts.fitted {
            (
                "mixed-bit".to_string(),
                "at the width and group size the size budget chose per tensor (int8 tables and routers \
                 included)"
                    .to_string(),
            )
        } else {
            (format!("{bits}-bit"), format!("at {bits} bits, group size {group_size} (routers at 8 bits); {int8}"))
        };
        FormatCard {
            library: "mlx",
            tags: vec!["mlx".into(), tag],
            description: format!("MLX layout, affine-quantized {setting}"),
            how_to_load: "mlx-lm:\n\n```python\nfrom mlx_lm import load, generate\n\
                          model, tokenizer = load(\"path/to/model\")\n\
                          print(generate(model, tokenizer, prompt=\"Hello\"))\n```\n"
                .into(),
        }
    }
}

/// What the layout dropped, for warnings.
#[derive(Clone, Debug, Default)]
pub struct Dropped {
    pub mtp: usize,
    pub tied_head: usize,
    pub expert_biases: usize,
}

/// The model family, from `model_type` (or from the tensor names when there is no config).
pub fn family(ck: &Checkpoint) -> Result<Family> {
    let model_type = ck.config.as_ref().and_then(|c| c.get("model_type")).and_then(Value::as_str);
    match model_type {
        Some("qwen3_5" | "qwen3_5_moe") => Ok(Family::Qwen35),
        Some("qwen3_next") => Ok(Family::Qwen3Next),
        Some(other) => bail!(
            "{}: model_type \"{other}\": the MLX layout is defined for qwen3_5, qwen3_5_moe and qwen3_next",
            ck.root.display()
        ),
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
fn is_router(path: &str) -> bool {
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

/// The module path (MLX name without `.weight`) and setting of every quantized module.
pub fn quantized_modules(tensors: &[OutputTensor]) -> Vec<(String, AffineSpec)> {
    tensors
        .iter()
        .filter_map(|t| {
            let spec = match &t.recipe.as_ref()?.encoding {
                Encoding::Affine { spec, .. } => *spec,
                Encoding::Int8Affine { group_size, .. } => AffineSpec { bits: 8, group_size: *group_size },
                _ => return None,
            };
            Some((t.name.strip_suffix(".weight")?.to_string(), spec))
        })
        .collect()
}

/// `config.json`'s `quantization`: the run's defaults plus one entry per module that differs
/// (and, as mlx-lm writes them, every `MoE` router).
pub fn quantization(tensors: &[OutputTensor], opts: MlxOptions, moe: bool) -> Value {
    let mut q = Map::new();
    q.insert("group_size".into(), json!(opts.spec.group_size));
    q.insert("bits".into(), json!(opts.spec.bits));
    q.insert("mode".into(), json!("affine"));
    for (path, spec) in quantized_modules(tensors) {
        if spec != opts.spec || (moe && is_router(&path)) {
            q.insert(path, json!({ "group_size": spec.group_size, "bits": spec.bits }));
        }
    }
    Value::Object(q)
}

/// The MLX `config.json`: the input config without Escha's `quantization_config`,
/// `_name_or_path` and `vision_config` (as mlx-lm's `save_config` drops them), with identical
/// `quantization` and `quantization_config`, top-level keys sorted.
pub fn config_json(config: &Value, quantization: Value) -> Value {
    let Some(obj) = config.as_object() else { return config.clone() };
    let mut out: Vec<(String, Value)> = obj
        .iter()
        .filter(|(k, _)| {
            !matches!(k.as_str(), "quantization_config" | "quantization" | "_name_or_path" | "vision_config")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.push(("quantization".into(), quantization.clone()));
    out.push(("quantization_config".into(), quantization));
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Value::Object(out.into_iter().collect())
}

/// The index's `total_parameters` as mlx-lm counts them: a quantized module counts its
/// unpacked weight (`packed·32/bits`), scales and biases count nothing, the parameters of leaf
/// modules their elements.
pub fn total_parameters(tensors: &[OutputTensor]) -> u64 {
    tensors
        .iter()
        .map(|t| match t.recipe.as_ref().map(|r| &r.encoding) {
            // mlx-lm counts leaf modules only: the GDN block's own parameters are left out.
            Some(Encoding::Float | Encoding::Bytes) if t.name.ends_with(".A_log") || t.name.ends_with(".dt_bias") => 0,
            _ => t.weights(),
        })
        .sum()
}

/// Whether the layout has `MoE` routers (for [`quantization`]).
pub fn is_moe(tensors: &[OutputTensor]) -> bool {
    tensors.iter().any(|t| t.name.contains(".switch_mlp."))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn config_is_sorted_and_carries_both_copies() {
        let c = json!({"model_type": "qwen3_5", "vision_config": {}, "quantization_config": {"quant_method": "escha"}, "architectures": ["x"]});
        let q = json!({"group_size": 64, "bits": 4, "mode": "affine"});
        let out = config_json(&c, q.clone());
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["architectures", "model_type", "quantization", "quantization_config"]);
        assert_eq!(out["quantization"], q);
        assert_eq!(out["quantization_config"], q);
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
