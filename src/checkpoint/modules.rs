//! Classification of a checkpoint's tensors into modules, with every structural check done before
//! any weight is decoded.
//!
//! * coded linear: `P.escha_code` (+ `escha_rin`, `escha_rout`, optional `escha_s_in`,
//!   `escha_s_out`, `escha_config`, `bias`), or native EXL3 `P.trellis` (+ `suh`, `svh`, optional
//!   `mcg`/`mul1` marker, `bias`); rank 3 is one linear, rank 4 a stack of `[E]` experts;
//! * int8 pair: `P.weight_int8` + per-row `P.weight_scale`;
//! * everything else is a plain tensor.

use super::input::Checkpoint;
use super::tensor::TensorEntry;
use super::tensor::{is_float, to_f32_vec, to_i32_vec};
use crate::codec::{Codebook, K_RANGE};
use crate::transform::hadamard::HADAMARD_SIZE;
use anyhow::{bail, Result};
use safetensors::Dtype;
use std::collections::{BTreeMap, BTreeSet};

/// Which naming scheme a coded linear uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodedSource {
    Escha,
    Exl3,
}

/// The role of a tensor inside a coded linear.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Leaf {
    Code,
    Rin,
    Rout,
    SIn,
    SOut,
    Config,
    Bias,
    McgMarker,
    Mul1Marker,
}

const ESCHA_LEAVES: &[(&str, Leaf)] = &[
    ("escha_code", Leaf::Code),
    ("escha_rin", Leaf::Rin),
    ("escha_rout", Leaf::Rout),
    ("escha_s_in", Leaf::SIn),
    ("escha_s_out", Leaf::SOut),
    ("escha_config", Leaf::Config),
    ("bias", Leaf::Bias),
];

const EXL3_LEAVES: &[(&str, Leaf)] = &[
    ("trellis", Leaf::Code),
    ("suh", Leaf::Rin),
    ("svh", Leaf::Rout),
    ("mcg", Leaf::McgMarker),
    ("mul1", Leaf::Mul1Marker),
    ("bias", Leaf::Bias),
];

/// One coded linear, or a stack of `[E]` experts coded alike.
#[derive(Clone, Debug)]
pub struct CodedModule {
    /// Module path `P` (tensor names are `P.<leaf>`).
    pub path: String,
    pub source: CodedSource,
    /// Tensor name of each leaf present.
    pub leaves: BTreeMap<Leaf, String>,
    /// Number of stacked experts; `None` for a single linear.
    pub experts: Option<usize>,
    pub k: u32,
    pub codebook: Codebook,
    /// Padded (stored) widths: `16·code.shape[-3]`, `16·code.shape[-2]`.
    pub in_padded: usize,
    pub out_padded: usize,
    /// True widths; smaller than the padded ones only when the checkpoint says so.
    pub in_features: usize,
    pub out_features: usize,
}

impl CodedModule {
    pub fn tensor(&self, leaf: Leaf) -> Option<&str> {
        self.leaves.get(&leaf).map(String::as_str)
    }

    /// Weights per expert (true size).
    pub fn weights_per_expert(&self) -> usize {
        self.in_features * self.out_features
    }

    pub fn expert_count(&self) -> usize {
        self.experts.unwrap_or(1)
    }

    /// Whether the runtime the source was made for adds this linear's `bias` after the matmul:
    /// exllamav3 does for an EXL3 linear (`LinearEXL3`); Escha's reference runtime never does.
    pub fn source_applies_bias(&self) -> bool {
        self.source == CodedSource::Exl3
    }
}

/// An int8 weight with one scale per row.
#[derive(Clone, Debug)]
pub struct Int8Module {
    pub path: String,
    pub weight: String,
    pub scale: String,
    pub shape: Vec<usize>,
}

/// A tensor that is neither coded nor an int8 pair.
#[derive(Clone, Debug)]
pub struct PlainTensor {
    pub name: String,
}

/// Every tensor of a checkpoint, by kind.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub coded: Vec<CodedModule>,
    pub int8: Vec<Int8Module>,
    pub plain: Vec<PlainTensor>,
    /// Vision-tower tensors: none ship in a released checkpoint; dropped and reported.
    pub vision: Vec<String>,
}

/// Splits `name` at its last dot into (module path, leaf).
fn split_leaf(name: &str) -> (&str, &str) {
    name.rsplit_once('.').unwrap_or(("", name))
}

fn is_vision(name: &str) -> bool {
    name.starts_with("model.visual.") || name.starts_with("visual.") || name.starts_with("vision_tower")
}

/// Builds the catalogue and validates every module. Errors name the file, tensor and problem.
pub fn catalog(ck: &Checkpoint) -> Result<Catalog> {
    let mut cat = Catalog::default();
    let mut claimed: BTreeSet<&str> = BTreeSet::new();
    let err = |name: &str, what: String| -> anyhow::Error {
        let file = ck.tensors.get(name).map(|e| ck.file_of(e).display().to_string()).unwrap_or_default();
        anyhow::anyhow!("{file}: tensor {name}: {what}")
    };

    // Unknown escha_* leaves, in any case (`escHa_s_out` is one flipped bit away from a scale), would
    // decode as confident noise with the fixed Hadamard: refuse them.
    for name in ck.tensors.keys() {
        let (_, leaf) = split_leaf(name);
        if leaf.to_ascii_lowercase().starts_with("escha") && !ESCHA_LEAVES.iter().any(|(l, _)| *l == leaf) {
            bail!(err(
                name,
                format!("unknown Escha leaf \"{leaf}\"; refusing to decode a format this tool does not know")
            ));
        }
    }

    // Coded modules, found by their code tensor; a module without one is caught by its vectors.
    for (source, leaves, code_leaf) in
        [(CodedSource::Escha, ESCHA_LEAVES, "escha_code"), (CodedSource::Exl3, EXL3_LEAVES, "trellis")]
    {
        let mut paths: BTreeSet<&str> = BTreeSet::new();
        for name in ck.tensors.keys() {
            let (path, leaf) = split_leaf(name);
            let code_like = matches!(leaf, "escha_rin" | "escha_rout" | "escha_s_in" | "escha_s_out" | "escha_config");
            if leaf == code_leaf || (source == CodedSource::Escha && code_like) {
                paths.insert(path);
            }
        }
        for path in paths {
            let mut found = BTreeMap::new();
            for (leaf_name, leaf) in leaves {
                let full = format!("{path}.{leaf_name}");
                if let Some((k, _)) = ck.tensors.get_key_value(&full) {
                    found.insert(*leaf, k.clone());
                }
            }
            if source == CodedSource::Exl3 {
                for legacy in ["su", "sv", "scale"] {
                    let full = format!("{path}.{legacy}");
                    if ck.tensors.contains_key(&full) {
                        bail!(err(&full, "legacy EXL3 leaf (packed signs or global scale) is not supported".into()));
                    }
                }
            }
            let module = validate_coded(ck, path, source, found, &err)?;
            for name in module.leaves.values() {
                claimed.insert(ck.tensors.get_key_value(name).unwrap().0.as_str());
            }
            cat.coded.push(module);
        }
    }

    // Anything else beside a coded linear's leaves is a leaf this tool does not know (a damaged
    // name of one it does): passed through as a plain tensor, it would leave the linear without it.
    let coded_paths: BTreeSet<&str> = cat.coded.iter().map(|m| m.path.as_str()).collect();
    for name in ck.tensors.keys() {
        let (path, leaf) = split_leaf(name);
        // (`P.weight` is named as a second source of the output `P.weight` instead.)
        if coded_paths.contains(path) && !claimed.contains(name.as_str()) && leaf != "weight" {
            let m = cat.coded.iter().find(|m| m.path == path).expect("a coded path");
            let known = match m.source {
                CodedSource::Escha => ESCHA_LEAVES,
                CodedSource::Exl3 => EXL3_LEAVES,
            };
            let known: Vec<&str> = known.iter().map(|(l, _)| *l).collect();
            bail!(err(
                name,
                format!(
                    "unknown leaf \"{leaf}\" of coded linear {path} (known: {}); refusing to guess",
                    known.join(", ")
                )
            ));
        }
    }

    // int8 pairs.
    for (name, entry) in &ck.tensors {
        let (path, leaf) = split_leaf(name);
        match leaf {
            "weight_int8" => {
                let scale = format!("{path}.weight_scale");
                let Some(se) = ck.tensors.get(&scale) else {
                    bail!(err(name, format!("int8 weight without its per-row scale {scale}")));
                };
                if entry.dtype != Dtype::I8 || entry.shape.len() != 2 || entry.shape.contains(&0) {
                    bail!(err(
                        name,
                        format!("expected a non-empty I8 matrix, found {:?} {:?}", entry.dtype, entry.shape)
                    ));
                }
                if !is_float(se.dtype) || se.shape.iter().product::<usize>() != entry.shape[0] {
                    bail!(err(
                        &scale,
                        format!(
                            "expected {} float scales (one per row of {name}), found {:?} {:?}",
                            entry.shape[0], se.dtype, se.shape
                        )
                    ));
                }
                check_finite(ck, &scale, &err)?;
                claimed.insert(name);
                claimed.insert(ck.tensors.get_key_value(&scale).unwrap().0);
                cat.int8.push(Int8Module {
                    path: path.to_string(),
                    weight: name.clone(),
                    scale,
                    shape: entry.shape.clone(),
                });
            }
            "weight_scale" if !ck.tensors.contains_key(&format!("{path}.weight_int8")) => {
                bail!(err(name, format!("int8 scale without its weight {path}.weight_int8")));
            }
            _ => {}
        }
    }

    for name in ck.tensors.keys() {
        if claimed.contains(name.as_str()) {
            continue;
        }
        if is_vision(name) {
            cat.vision.push(name.clone());
            continue;
        }
        cat.plain.push(PlainTensor { name: name.clone() });
    }
    Ok(cat)
}

impl Catalog {
    /// What is decodable but unusual enough to say: codebooks no Escha release uses.
    pub fn notes(&self) -> Vec<crate::warning::Warning> {
        self.coded
            .iter()
            .filter(|m| m.source == CodedSource::Escha && m.codebook != Codebook::Mcg)
            .map(|m| {
                crate::warning::Warning::new(
                    crate::warning::WarningCode::UnusualCodebook,
                    format!(
                    "{}: escha_config names codebook {} ({}), which no Escha release uses (every release is MCG) and \
                     the vendor runtime rejects; decoded as {} all the same",
                    m.path,
                    m.codebook.name(),
                    m.codebook.id(),
                    m.codebook.name()
                ),
                )
            })
            .collect()
    }

    /// Refuses what cannot be converted: a model (`model`: not a separate MTP head) without a
    /// single coded tensor, saying what it looks like instead; plain tensors that hold quantized
    /// values, which would pass through as garbage.
    pub fn check_convertible(&self, ck: &Checkpoint, model: bool) -> Result<()> {
        if model && self.coded.is_empty() {
            bail!(
                "{}: not an Escha-W2 checkpoint: no coded tensor (escha_code or trellis); it looks like {}",
                ck.root.display(),
                looks_like(ck)
            );
        }
        for p in &self.plain {
            let entry = &ck.tensors[&p.name];
            if let Some(why) = quantized_plain(ck, &p.name, entry) {
                bail!(
                    "{}: tensor {}: {why}; it cannot pass through as a plain tensor, and this tool does not decode it",
                    ck.file_of(entry).display(),
                    p.name
                );
            }
        }
        Ok(())
    }
}

/// Why a tensor left over after classification holds quantized values, if it does.
fn quantized_plain(ck: &Checkpoint, name: &str, e: &TensorEntry) -> Option<String> {
    let (path, leaf) = split_leaf(name);
    let sibling = |leaf: &str| ck.tensors.contains_key(&format!("{path}.{leaf}"));
    match e.dtype {
        Dtype::F8_E4M3 | Dtype::F8_E5M2 | Dtype::F8_E5M2FNUZ | Dtype::F8_E4M3FNUZ | Dtype::F8_E8M0 => Some(format!(
            "{:?} values (an fp8 weight{})",
            e.dtype,
            if sibling("weight_scale_inv") { " with block scales" } else { "" }
        )),
        Dtype::F4 | Dtype::F6_E2M3 | Dtype::F6_E3M2 => Some(format!("{:?} values (a sub-byte float)", e.dtype)),
        _ if leaf == "weight_scale_inv" => Some("the block scales of an fp8 weight".into()),
        Dtype::U32 | Dtype::I32 | Dtype::U8 | Dtype::I8
            if sibling("scales") || sibling("qzeros") || sibling("weight_scale") =>
        {
            Some(format!("packed {:?} codes of a quantized weight", e.dtype))
        }
        _ if matches!(leaf, "scales" | "biases")
            && sibling("weight")
            && ck.tensors[&format!("{path}.weight")].dtype == Dtype::U32 =>
        {
            Some("the scales or biases of an MLX-quantized weight".into())
        }
        _ if matches!(leaf, "qweight" | "qzeros" | "g_idx") => {
            Some("part of an integer-packed (GPTQ/AWQ) weight".into())
        }
        _ => None,
    }
}

/// What a checkpoint without coded tensors looks like, for the refusal.
fn looks_like(ck: &Checkpoint) -> String {
    let has = |f: &dyn Fn(&str, &TensorEntry) -> bool| ck.tensors.iter().any(|(n, e)| f(n, e));
    let quant_method = ck
        .config
        .as_ref()
        .and_then(|c| c.get("quantization_config"))
        .and_then(|q| q.get("quant_method"))
        .and_then(serde_json::Value::as_str);
    if has(&|n, e| e.dtype == Dtype::F8_E4M3 || n.ends_with(".weight_scale_inv")) {
        "an fp8 block-scaled model (the unquantized base? pass it to verify --base)".into()
    } else if has(&|n, e| n.ends_with(".weight") && e.dtype == Dtype::U32) && has(&|n, _| n.ends_with(".scales")) {
        "an MLX-quantized model".into()
    } else if has(&|n, _| n.ends_with(".qweight")) {
        "an integer-packed (GPTQ/AWQ) model".into()
    } else if quant_method == Some("escha") {
        "an Escha config whose coded tensors are missing (an incomplete download?)".into()
    } else if has(&|_, e| matches!(e.dtype, Dtype::BF16 | Dtype::F16)) {
        "a dense bf16/f16 Hugging Face model (an unquantized model, or an output of this tool)".into()
    } else {
        "something else".into()
    }
}

fn validate_coded(
    ck: &Checkpoint,
    path: &str,
    source: CodedSource,
    leaves: BTreeMap<Leaf, String>,
    err: &dyn Fn(&str, String) -> anyhow::Error,
) -> Result<CodedModule> {
    let need = |leaf: Leaf, what: &str| -> Result<(&String, &TensorEntry)> {
        if let Some(n) = leaves.get(&leaf) {
            Ok((n, &ck.tensors[n]))
        } else {
            let any = leaves.values().next().map_or(path, String::as_str);
            Err(err(any, format!("coded linear {path} has no {what} tensor")))
        }
    };
    let (leaf_code, leaf_rin, leaf_rout) = match source {
        CodedSource::Escha => ("escha_code", "escha_rin", "escha_rout"),
        CodedSource::Exl3 => ("trellis", "suh", "svh"),
    };
    let (code_name, code) = need(Leaf::Code, leaf_code)?;
    let (rin_name, rin) = need(Leaf::Rin, leaf_rin)?;
    let (rout_name, rout) = need(Leaf::Rout, leaf_rout)?;

    if code.dtype != Dtype::I16 {
        bail!(err(code_name, format!("code must be I16, found {:?}", code.dtype)));
    }
    let rank = code.shape.len();
    if rank != 3 && rank != 4 {
        bail!(err(
            code_name,
            format!("code must have rank 3 ([IC/16, OC/16, 16K]) or 4 ([E, …]), found shape {:?}", code.shape)
        ));
    }
    if code.shape.contains(&0) {
        bail!(err(code_name, format!("code has an empty dimension: shape {:?}", code.shape)));
    }
    let last = code.shape[rank - 1];
    let k = u32::try_from(last / 16).unwrap_or(0);
    if source == CodedSource::Exl3 && last % 16 == 8 && K_RANGE.contains(&(k + 1)) {
        // exllamav3 1.6 writes a half-integer K (alternating K−½ and K+½ bit steps) as 16·K words.
        bail!(err(
            code_name,
            format!(
                "last dimension {last} is 16·K with K = {k}.5: a fractional EXL3 bitrate, which this tool does \
                 not read yet (integer K in 1..8 only)"
            )
        ));
    }
    if last % 16 != 0 || !K_RANGE.contains(&k) {
        bail!(err(code_name, format!("last dimension {last} must be 16·K with K in 1..8 (words per tile)")));
    }
    let experts = (rank == 4).then(|| code.shape[0]);
    let padded =
        |tiles: usize| tiles.checked_mul(16).ok_or_else(|| err(code_name, format!("shape {:?} overflows", code.shape)));
    let (in_padded, out_padded) = (padded(code.shape[rank - 3])?, padded(code.shape[rank - 2])?);
    let lead: Vec<usize> = experts.into_iter().collect();

    let expect_vec = |name: &str, e: &TensorEntry, len: usize| -> Result<()> {
        let want: Vec<usize> = lead.iter().copied().chain([len]).collect();
        if !is_float(e.dtype) {
            bail!(err(name, format!("expected a float vector, found {:?}", e.dtype)));
        }
        if e.shape != want {
            bail!(err(name, format!("shape {:?} does not match the code (expected {want:?})", e.shape)));
        }
        Ok(())
    };
    expect_vec(rin_name, rin, in_padded)?;
    expect_vec(rout_name, rout, out_padded)?;
    let mut scale_names = vec![rin_name.as_str(), rout_name.as_str()];
    for (leaf, len) in [(Leaf::SIn, in_padded), (Leaf::SOut, out_padded)] {
        if let Some(n) = leaves.get(&leaf) {
            expect_vec(n, &ck.tensors[n], len)?;
            scale_names.push(n);
        }
    }
    if let Some(n) = leaves.get(&Leaf::Bias) {
        let e = &ck.tensors[n];
        let want: Vec<usize> = lead.iter().copied().chain([out_padded]).collect();
        if !is_float(e.dtype)
            || (e.shape != want && e.shape.iter().product::<usize>() != want.iter().product::<usize>())
        {
            bail!(err(n, format!("bias must be a float vector of shape {want:?}, found {:?} {:?}", e.dtype, e.shape)));
        }
    }

    let mut codebook = match source {
        CodedSource::Escha => Codebook::Mcg,
        CodedSource::Exl3 => match (leaves.contains_key(&Leaf::McgMarker), leaves.contains_key(&Leaf::Mul1Marker)) {
            (true, true) => bail!(err(code_name, "both mcg and mul1 markers present".into())),
            (true, false) => Codebook::Mcg,
            (false, true) => Codebook::Mul1,
            (false, false) => Codebook::ThreeInst,
        },
    };
    let (mut in_features, mut out_features) = (in_padded, out_padded);
    if let Some(n) = leaves.get(&Leaf::Config) {
        let e = &ck.tensors[n];
        if e.dtype != Dtype::I32 || e.shape.len() != 1 || (e.shape[0] != 6 && e.shape[0] != 9) {
            bail!(err(n, format!("expected I32 [6] or [9], found {:?} {:?}", e.dtype, e.shape)));
        }
        let c = to_i32_vec(ck.bytes(e));
        let mismatch = |what: String| err(n, format!("{what} (config {c:?}, code shape {:?})", code.shape));
        if c[0] != 16 {
            bail!(mismatch(format!("field 0 must be 16, found {}", c[0])));
        }
        if c[1] != k as i32 {
            bail!(mismatch(format!("says K={} but the code has K={k}", c[1])));
        }
        if c[2] != 2 {
            bail!(mismatch(format!("field 2 must be 2, found {}", c[2])));
        }
        codebook = Codebook::from_id(c[3] as i64).ok_or_else(|| mismatch(format!("unknown codebook id {}", c[3])))?;
        let (ic, oc) = if c.len() == 9 {
            if experts != Some(c[4] as usize) {
                bail!(mismatch(format!("says {} experts", c[4])));
            }
            if c[7] as usize != in_padded || c[8] as usize != out_padded {
                bail!(mismatch(format!("padded dims {}×{} disagree with the code", c[7], c[8])));
            }
            (c[5], c[6])
        } else {
            if experts.is_some() {
                bail!(mismatch("a 6-field config on a stacked [E] code".into()));
            }
            (c[4], c[5])
        };
        if ic <= 0 || oc <= 0 || ic as usize > in_padded || oc as usize > out_padded {
            bail!(mismatch(format!("dims {ic}×{oc} do not fit the code")));
        }
        if c.len() == 6 && (ic as usize != in_padded || oc as usize != out_padded) {
            bail!(mismatch(format!("dims {ic}×{oc} disagree with the code and the header has no padding fields")));
        }
        (in_features, out_features) = (ic as usize, oc as usize);
    }
    if in_padded % HADAMARD_SIZE != 0 || out_padded % HADAMARD_SIZE != 0 {
        bail!(err(
            code_name,
            format!(
                "stored dims {in_padded}×{out_padded} are not multiples of 128 and the checkpoint gives no padding"
            )
        ));
    }
    for n in scale_names {
        check_finite(ck, n, err)?;
    }
    // The folded products the reconstruction multiplies by must be finite too.
    for (r, s, what) in [(Leaf::Rin, Leaf::SIn, "rin·s_in"), (Leaf::Rout, Leaf::SOut, "rout·s_out")] {
        if let (Some(r), Some(s)) = (leaves.get(&r), leaves.get(&s)) {
            let (rv, sv) = (
                to_f32_vec(ck.bytes(&ck.tensors[r]), ck.tensors[r].dtype)?,
                to_f32_vec(ck.bytes(&ck.tensors[s]), ck.tensors[s].dtype)?,
            );
            if let Some(i) = rv.iter().zip(&sv).position(|(a, b)| !(a * b).is_finite()) {
                bail!(err(s, format!("{what} overflows f32 at index {i} ({:e} × {:e})", rv[i], sv[i])));
            }
        }
    }
    Ok(CodedModule {
        path: path.to_string(),
        source,
        leaves,
        experts,
        k,
        codebook,
        in_padded,
        out_padded,
        in_features,
        out_features,
    })
}

/// Refuses NaN or infinite values in a scale vector: they would poison every weight they touch.
fn check_finite(ck: &Checkpoint, name: &str, err: &dyn Fn(&str, String) -> anyhow::Error) -> Result<()> {
    let e = &ck.tensors[name];
    let values = to_f32_vec(ck.bytes(e), e.dtype)?;
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        bail!(err(name, format!("non-finite scale {} at index {i}", values[i])));
    }
    Ok(())
}
