//! `inspect`: what a user asks first about a checkpoint, without decoding any weight.

use crate::checkpoint::tensor::{floats_to_f32, is_float, scan_chunks};
use crate::checkpoint::{catalog, Checkpoint, CodedSource, HubSource, Leaf};
use crate::codec::best_decoder;
use crate::convert::{planned_tensor_bytes, ConvertOptions};
use crate::layout::{norm_kind, NormKind};
use crate::layout::{
    AutoBits, BiasMode, DenseDtype, GgufOptions, GgufType, MlxOptions, MtpMode, OutputFormat, WidthChoice,
};
use crate::text::{escape_controls, human_bytes, shape};
use anyhow::Result;
use serde::Serialize;
use serde_json::Value;
use std::fmt::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Serialize)]
pub struct CodedReport {
    pub module: String,
    pub format: &'static str,
    pub experts: Option<usize>,
    pub in_features: usize,
    pub out_features: usize,
    pub k: u32,
    pub codebook: &'static str,
    pub has_s_in_s_out: bool,
    pub has_bias: bool,
    pub bias_nonzero: bool,
    /// Output channels whose `rout` is exactly zero (pruned), over all experts.
    pub zero_rout_channels: usize,
}

#[derive(Debug, Serialize)]
pub struct Sizes {
    pub input_bytes: u64,
    pub bf16_bytes: u64,
    pub f16_bytes: u64,
    /// `--format mlx` at its defaults (4 bits, group 64, exact int8); absent when the model type
    /// has no MLX layout.
    pub mlx_4bit_bytes: Option<u64>,
    /// `--format mlx --bits auto` at its defaults (R = 0.5, group 64), the widths estimated from
    /// a few sampled blocks per coded linear.
    pub mlx_auto_bytes: Option<u64>,
    /// `--format gguf` at its defaults (bf16), and with `--gguf-type q4_k_m`; absent when the
    /// architecture has no GGUF layout.
    pub gguf_bf16_bytes: Option<u64>,
    pub gguf_q4_k_m_bytes: Option<u64>,
    /// `--format gguf --gguf-type auto` at its defaults (R = 0.5), the types estimated from a few
    /// sampled blocks per coded linear.
    pub gguf_auto_bytes: Option<u64>,
    /// `--format exl3` at its defaults: the trellis codes as stored, one module per expert; absent
    /// when a coded linear cannot be written as EXL3 (padded, or a fused gate/up of an odd tile
    /// count).
    pub exl3_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct InspectReport {
    /// IN as read: the path given, or the cache snapshot a Hub id resolved to.
    pub input: String,
    /// The Hub id IN was given as, and the commit read (`null` for a local path).
    pub hub: Option<HubSource>,
    pub model_type: Option<String>,
    pub architectures: Vec<String>,
    pub quant_method: Option<String>,
    pub layers: Option<u64>,
    pub shards: usize,
    pub tensors: usize,
    pub coded: Vec<CodedReport>,
    pub coded_weights: u64,
    pub bits_per_weight: f64,
    pub int8: Vec<String>,
    pub plain: usize,
    pub norms_zero_centred: usize,
    pub norms_plain: usize,
    pub norm_convention: String,
    pub biases_present: usize,
    pub biases_nonzero: usize,
    pub mtp: bool,
    pub sizes: Sizes,
    /// The type `--gguf-type auto` would give each coded linear, with its estimated error.
    pub gguf_auto_types: Vec<WidthChoice>,
    pub problems: Vec<String>,
}

pub fn inspect(path: &Path) -> Result<InspectReport> {
    let ck = Checkpoint::open(path)?;
    let cat = catalog(&ck)?;
    cat.check_convertible(&ck, true)?;
    let config = ck.config.as_ref();
    let text = ck.text_config();
    let str_of = |v: Option<&Value>| v.and_then(Value::as_str).map(String::from);
    let mut problems: Vec<String> = cat.notes().into_iter().map(|w| w.message).collect();
    let mut scratch = Vec::new();

    let mut coded = Vec::new();
    let (mut coded_weights, mut coded_bits) = (0u64, 0u64);
    for m in &cat.coded {
        let weights = (m.weights_per_expert() * m.expert_count()) as u64;
        coded_weights += weights;
        coded_bits += weights * m.k as u64;
        let rout = &ck.tensors[m.tensor(Leaf::Rout).unwrap()];
        scratch.clear();
        floats_to_f32(ck.bytes(rout), rout.dtype, &mut scratch)?;
        let zero_rout_channels = scratch.iter().filter(|&&v| v == 0.0).count();
        let bias_nonzero = m.has_nonzero_bias(&ck)?;
        if m.source == CodedSource::Escha && m.tensor(Leaf::Config).is_none() {
            problems.push(format!("{}: no escha_config header (K taken from the code shape, codebook MCG)", m.path));
        }
        coded.push(CodedReport {
            module: m.path.clone(),
            format: match m.source {
                CodedSource::Escha => "escha",
                CodedSource::Exl3 => "exl3",
            },
            experts: m.experts,
            in_features: m.in_features,
            out_features: m.out_features,
            k: m.k,
            codebook: m.codebook.name(),
            has_s_in_s_out: m.tensor(Leaf::SIn).is_some() || m.tensor(Leaf::SOut).is_some(),
            has_bias: m.tensor(Leaf::Bias).is_some(),
            bias_nonzero,
            zero_rout_channels,
        });
    }

    // Non-finite plain floats; norm convention: zero-centred weights sit near 0, plain ones near 1.
    let (mut zc, mut plain_norms, mut zc_mean_sum, mut unknown) = (0usize, 0usize, 0f64, false);
    for p in &cat.plain {
        let e = &ck.tensors[&p.name];
        if !is_float(e.dtype) {
            continue;
        }
        let (mut bad, mut sum) = (0usize, 0f64);
        for chunk in scan_chunks(e.numel()) {
            scratch.clear();
            ck.elements_f32(&p.name, chunk, &mut scratch)?;
            bad += scratch.iter().filter(|v| !v.is_finite()).count();
            sum += scratch.iter().map(|&v| v as f64).sum::<f64>();
        }
        if bad > 0 {
            problems.push(format!("{}: {bad} non-finite values (conversion refuses them)", p.name));
        }
        let Some(kind) = norm_kind(&p.name) else { continue };
        if bad > 0 {
            unknown |= kind == NormKind::ZeroCentred;
            continue;
        }
        let mean = sum / e.numel().max(1) as f64;
        if kind == NormKind::ZeroCentred {
            zc += 1;
            zc_mean_sum += mean;
        } else {
            plain_norms += 1;
        }
    }
    let zc_mean = zc_mean_sum / zc.max(1) as f64;
    let norm_convention = if unknown {
        "unknown: some offset-kind norms hold non-finite values".to_string()
    } else if zc == 0 {
        "no norms".to_string()
    } else if zc_mean.abs() < 0.5 {
        format!("zero-centred (HF Qwen3.5: runtime adds 1); mean of offset norms {zc_mean:.4}")
    } else {
        problems
            .push(format!("offset-kind norms average {zc_mean:.3}: they look already shifted by +1 (not HF layout)"));
        format!("shifted (+1 already applied); mean of offset norms {zc_mean:.4}")
    };
    if !cat.vision.is_empty() {
        problems.push(format!("{} vision-tower tensors (dropped on conversion)", cat.vision.len()));
    }

    let input_bytes = ck.shards.iter().map(|s| s.bytes().len() as u64).sum();
    let auto = Some(AutoBits::DEFAULT);
    let mlx_auto = auto_plan(path, OutputFormat::Mlx(MlxOptions { auto, ..MlxOptions::DEFAULT }));
    let gguf_auto =
        auto_plan(path, OutputFormat::Gguf(GgufOptions { ty: GgufType::Auto, auto, ..GgufOptions::DEFAULT }));
    let biases: Vec<&CodedReport> = coded.iter().filter(|c| c.has_bias).collect();

    Ok(InspectReport {
        input: path.display().to_string(),
        hub: None,
        model_type: str_of(config.and_then(|c| c.get("model_type"))),
        architectures: config
            .and_then(|c| c.get("architectures"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default(),
        quant_method: str_of(config.and_then(|c| c.get("quantization_config")).and_then(|q| q.get("quant_method"))),
        layers: text.and_then(|t| t.get("num_hidden_layers")).and_then(Value::as_u64),
        shards: ck.shards.len(),
        tensors: ck.tensors.len(),
        coded_weights,
        bits_per_weight: if coded_weights == 0 { 0.0 } else { coded_bits as f64 / coded_weights as f64 },
        int8: cat.int8.iter().map(|m| m.path.clone()).collect(),
        plain: cat.plain.len(),
        norms_zero_centred: zc,
        norms_plain: plain_norms,
        norm_convention,
        biases_present: biases.len(),
        biases_nonzero: biases.iter().filter(|c| c.bias_nonzero).count(),
        mtp: ck.mtp_dir.is_some() || ck.tensors.keys().any(|n| n.starts_with("mtp.")),
        sizes: Sizes {
            input_bytes,
            bf16_bytes: output_bytes(&ck, &cat, dense(DenseDtype::Bf16)).unwrap_or(0),
            f16_bytes: output_bytes(&ck, &cat, dense(DenseDtype::F16)).unwrap_or(0),
            mlx_4bit_bytes: output_bytes(&ck, &cat, OutputFormat::Mlx(MlxOptions::DEFAULT)),
            mlx_auto_bytes: mlx_auto.map(|(bytes, _)| bytes),
            gguf_bf16_bytes: output_bytes(&ck, &cat, OutputFormat::Gguf(GgufOptions::DEFAULT)),
            gguf_q4_k_m_bytes: output_bytes(
                &ck,
                &cat,
                OutputFormat::Gguf(GgufOptions { ty: GgufType::Q4_K_M, ..GgufOptions::DEFAULT }),
            ),
            gguf_auto_bytes: gguf_auto.as_ref().map(|(bytes, _)| *bytes),
            exl3_bytes: output_bytes(&ck, &cat, OutputFormat::Exl3 { mtp: MtpMode::Auto }),
        },
        gguf_auto_types: gguf_auto.map(|(_, choices)| choices).unwrap_or_default(),
        coded,
        problems,
    })
}

/// A dense format at its defaults.
fn dense(dtype: DenseDtype) -> OutputFormat {
    OutputFormat::Dense { dtype, mtp: MtpMode::Auto }
}

/// The exact tensor bytes `format` writes with no other flag, from its own layout (`None` when
/// the layout refuses the checkpoint).
fn output_bytes(ck: &Checkpoint, cat: &crate::checkpoint::Catalog, format: OutputFormat) -> Option<u64> {
    let tensors = format.layout().tensors(ck, cat, BiasMode::Auto, &mut Vec::new()).ok()?;
    Some(tensors.iter().map(|t| t.byte_len() as u64).sum())
}

/// Blocks per coded linear the `--bits auto` size is estimated from.
const AUTO_SAMPLE: usize = 4;

/// The size `format` (an auto choice at its defaults) would write (tensor bytes) and what it
/// chooses, estimated from a few sampled blocks per coded linear.
fn auto_plan(input: &Path, format: OutputFormat) -> Option<(u64, Vec<WidthChoice>)> {
    let opts = ConvertOptions {
        format,
        card: false,
        dry_run: true,
        ..ConvertOptions::new(input.to_path_buf(), PathBuf::new())
    };
    planned_tensor_bytes(&opts, best_decoder(), Some(AUTO_SAMPLE)).ok()
}

/// Human-readable rendering of the report.
pub fn render(r: &InspectReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}", crate::checkpoint::hub::described(&r.input, r.hub.as_ref()));
    let _ = writeln!(
        s,
        "  model_type {}  architectures {}  quant_method {}",
        r.model_type.as_deref().unwrap_or("?"),
        if r.architectures.is_empty() { "?".into() } else { r.architectures.join(",") },
        r.quant_method.as_deref().unwrap_or("?")
    );
    let _ = writeln!(
        s,
        "  layers {}  shards {}  tensors {}  mtp {}",
        r.layers.map_or("?".into(), |l| l.to_string()),
        r.shards,
        r.tensors,
        if r.mtp { "yes" } else { "no" }
    );
    let _ = writeln!(
        s,
        "coded projections: {} ({} weights, {:.3} bits/weight)",
        r.coded.len(),
        r.coded_weights,
        r.bits_per_weight
    );
    for c in &r.coded {
        let dims: Vec<usize> = c.experts.into_iter().chain([c.out_features, c.in_features]).collect();
        let _ = writeln!(
            s,
            "  {:<60} {:<16} K={} {:<5} {}{}{}",
            escape_controls(&c.module),
            shape(&dims),
            c.k,
            c.codebook,
            if c.has_s_in_s_out { "s_in/s_out " } else { "" },
            if c.has_bias {
                if c.bias_nonzero {
                    "bias(non-zero) "
                } else {
                    "bias(zero) "
                }
            } else {
                ""
            },
            if c.zero_rout_channels > 0 { format!("pruned channels {}", c.zero_rout_channels) } else { String::new() },
        );
    }
    let _ = writeln!(s, "int8 pairs: {}", r.int8.len());
    for m in &r.int8 {
        let _ = writeln!(s, "  {}", escape_controls(m));
    }
    let _ = writeln!(s, "plain tensors: {}", r.plain);
    let _ = writeln!(s, "norms: {} offset-kind, {} plain; {}", r.norms_zero_centred, r.norms_plain, r.norm_convention);
    let _ = writeln!(s, "biases: {} present, {} non-zero (dropped by default)", r.biases_present, r.biases_nonzero);
    let _ = writeln!(
        s,
        "sizes: input {}, bf16 output {}, f16 output {}, mlx output (4 bit, group 64) {}, mlx --bits auto \
         (estimated) {}",
        human_bytes(r.sizes.input_bytes),
        human_bytes(r.sizes.bf16_bytes),
        human_bytes(r.sizes.f16_bytes),
        r.sizes.mlx_4bit_bytes.map_or("n/a".into(), human_bytes),
        r.sizes.mlx_auto_bytes.map_or("n/a".into(), human_bytes)
    );
    let _ = writeln!(
        s,
        "       gguf output (bf16) {}, gguf --gguf-type q4_k_m {}, gguf --gguf-type auto (estimated) {}",
        r.sizes.gguf_bf16_bytes.map_or("n/a".into(), human_bytes),
        r.sizes.gguf_q4_k_m_bytes.map_or("n/a".into(), human_bytes),
        r.sizes.gguf_auto_bytes.map_or("n/a".into(), human_bytes)
    );
    let _ = writeln!(s, "       exl3 output (exllamav3) {}", r.sizes.exl3_bytes.map_or("n/a".into(), human_bytes));
    if !r.gguf_auto_types.is_empty() {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for c in &r.gguf_auto_types {
            let chosen = c.chosen.to_string();
            match counts.iter_mut().find(|(t, _)| *t == chosen) {
                Some((_, n)) => *n += 1,
                None => counts.push((chosen, 1)),
            }
        }
        let counts: Vec<String> = counts.iter().map(|(t, n)| format!("{t} ×{n}")).collect();
        let _ = writeln!(s, "gguf --gguf-type auto types (estimated; every tensor in --json): {}", counts.join(", "));
    }
    if r.problems.is_empty() {
        let _ = writeln!(s, "problems: none found");
    } else {
        let _ = writeln!(s, "problems:");
        for p in &r.problems {
            let _ = writeln!(s, "  {}", escape_controls(p));
        }
    }
    s
}
