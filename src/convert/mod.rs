//! The conversion engine: catalogue → layout → plan → parallel work units → finished directory.
//!
//! A work unit is one 128-row output block of one coded linear (or expert), a run of int8 rows,
//! or a run of elements of a plain tensor. Each unit reads its inputs from the memory maps,
//! produces its output bytes and writes them at their planned offset, so memory is bounded by
//! threads × one unit, and the bytes do not depend on the thread count or schedule.

use crate::checkpoint::{catalog, Catalog, Checkpoint};
use crate::codec::TileDecoder;
use crate::layout::mlx::{self, MlxOptions};
use crate::layout::{self, DenseDtype};
use crate::output::Staging;
use crate::plan::Plan;
use crate::select::selected;
use crate::transform::hadamard::HADAMARD_SIZE;
mod execute;
mod units;

use execute::write_part;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Elements per work unit for int8 and plain tensors (bounded memory, enough work per unit).
const ELEMENTS_PER_UNIT: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub dtype: DenseDtype,
    pub keep_bias: bool,
    pub max_shard_size: u64,
    pub only: Vec<String>,
    pub threads: Option<usize>,
    pub force: bool,
    pub dry_run: bool,
    pub progress: bool,
    /// MLX layout with affine quantization instead of dense Hugging Face layout (`dtype` is then
    /// unused: dense MLX tensors take the model dtype).
    pub mlx: Option<MlxOptions>,
}

/// One planned output tensor, for `--dry-run` and `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct TensorReport {
    pub name: String,
    pub kind: &'static str,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: u64,
    pub file: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ShardReport {
    pub file: String,
    pub tensors: usize,
    pub bytes: u64,
}

/// What a conversion (or a dry run) did; printed as text, or as one JSON document with `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct ConvertReport {
    pub input: String,
    pub output: String,
    pub format: &'static str,
    pub dry_run: bool,
    pub decoder: &'static str,
    pub threads: usize,
    pub counts: BTreeMap<&'static str, usize>,
    pub shards: Vec<ShardReport>,
    pub bytes_written: u64,
    pub weights: u64,
    pub seconds: f64,
    pub gb_per_s: f64,
    pub weights_per_s: f64,
    pub peak_memory_estimate: u64,
    pub copied_files: Vec<String>,
    pub warnings: Vec<String>,
    pub tensors: Vec<TensorReport>,
}

/// A checkpoint part (the main one, or `mtp/`) with everything needed to write it.
struct Part {
    ck: Checkpoint,
    cat: Catalog,
    plan: Plan,
    /// Sub-directory of the output ("" or "mtp").
    subdir: &'static str,
}

pub fn convert(opts: &ConvertOptions, decoder: &dyn TileDecoder) -> Result<ConvertReport> {
    let started = Instant::now();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(opts.threads.unwrap_or(0)).build()?;
    let mut warnings = Vec::new();

    let mut parts = vec![open_part(&opts.input, "", opts, &mut warnings)?];
    if let Some(mtp) = parts[0].ck.mtp_dir.clone() {
        if opts.mlx.is_some() {
            // mlx-lm has no MTP head, and an `mtp.*` key makes older loaders shift every norm again.
            warnings.push(format!("{}: not written: the MLX layout carries no MTP head", mtp.display()));
        } else {
            parts.push(open_part(&mtp, "mtp", opts, &mut warnings)?);
        }
    }

    let mut report = ConvertReport {
        input: opts.input.display().to_string(),
        output: opts.output.display().to_string(),
        format: match (opts.mlx, opts.dtype) {
            (Some(_), _) => "mlx",
            (None, DenseDtype::Bf16) => "bf16",
            (None, DenseDtype::F16) => "f16",
        },
        dry_run: opts.dry_run,
        decoder: decoder.name(),
        threads: pool.current_num_threads(),
        counts: BTreeMap::new(),
        shards: Vec::new(),
        bytes_written: 0,
        weights: 0,
        seconds: 0.0,
        gb_per_s: 0.0,
        weights_per_s: 0.0,
        peak_memory_estimate: 0,
        copied_files: Vec::new(),
        warnings: Vec::new(),
        tensors: Vec::new(),
    };
    for part in &parts {
        for p in &part.plan.tensors {
            *report.counts.entry(p.tensor.kind.name()).or_default() += 1;
            report.weights += p.tensor.weights();
            let file = Path::new(part.subdir).join(&part.plan.shards[p.shard].file_name);
            report.tensors.push(TensorReport {
                name: p.tensor.name.clone(),
                kind: p.tensor.kind.name(),
                dtype: format!("{:?}", p.tensor.dtype),
                shape: p.tensor.shape.clone(),
                bytes: p.tensor.byte_len() as u64,
                file: file.display().to_string(),
            });
        }
        for s in &part.plan.shards {
            let file = Path::new(part.subdir).join(&s.file_name).display().to_string();
            report.shards.push(ShardReport { file, tensors: s.tensor_count, bytes: s.len });
        }
        report.bytes_written += part.plan.shards.iter().map(|s| s.len).sum::<u64>();
    }
    let widest = parts.iter().flat_map(|p| p.cat.coded.iter()).map(|m| m.in_padded).max().unwrap_or(0);
    report.peak_memory_estimate = report.threads as u64 * unit_memory(widest) as u64;

    if opts.dry_run {
        report.warnings = warnings;
        return Ok(report);
    }

    let staging = Staging::prepare(&opts.output, &opts.input, opts.force)?;
    let progress = progress_bar(opts.progress, report.bytes_written);
    for part in &parts {
        let dir = staging.path().join(part.subdir);
        std::fs::create_dir_all(&dir)?;
        pool.install(|| write_part(part, &dir, opts.dtype, decoder, &progress))
            .with_context(|| format!("{}: cannot write the output", opts.output.display()))?;
        let config = part.ck.config.as_ref().map(|c| match opts.mlx {
            Some(m) => {
                let tensors: Vec<_> = part.plan.tensors.iter().map(|p| p.tensor.clone()).collect();
                mlx::config_json(c, mlx::quantization(&tensors, m, mlx::is_moe(&tensors)))
            }
            None => dense_config(c),
        });
        report.copied_files.extend(copy_side_files(&part.ck, &dir, part.subdir, config)?);
    }
    progress.finish_and_clear();
    staging.commit()?;

    report.seconds = started.elapsed().as_secs_f64();
    report.gb_per_s = report.bytes_written as f64 / 1e9 / report.seconds;
    report.weights_per_s = report.weights as f64 / report.seconds;
    report.warnings = warnings;
    Ok(report)
}

fn open_part(path: &Path, subdir: &'static str, opts: &ConvertOptions, warnings: &mut Vec<String>) -> Result<Part> {
    let ck = Checkpoint::open(path)?;
    let cat = catalog(&ck)?;
    if !cat.vision.is_empty() {
        warnings.push(format!("{}: dropped {} vision-tower tensors", path.display(), cat.vision.len()));
    }
    if !opts.keep_bias {
        let nonzero = nonzero_biases(&ck, &cat)?;
        if nonzero > 0 {
            warnings.push(format!(
                "{}: dropped {nonzero} non-zero bias tensors of coded linears (the reference runtime never applies them; --bias keep writes them)",
                path.display()
            ));
        }
    }
    let tensors = match opts.mlx {
        None => {
            let mut tensors = layout::hf::layout(&ck, &cat, opts.dtype, opts.keep_bias);
            tensors.retain(|t| selected(&t.name, &opts.only));
            tensors
        }
        Some(m) => {
            let (mut tensors, dropped) = mlx::layout(&ck, &cat, m, opts.keep_bias)?;
            if dropped.mtp > 0 {
                warnings.push(format!(
                    "{}: dropped {} MTP tensors (the MLX layout carries none)",
                    path.display(),
                    dropped.mtp
                ));
            }
            if dropped.tied_head > 0 {
                warnings.push(format!("{}: dropped lm_head: tie_word_embeddings is set", path.display()));
            }
            if dropped.expert_biases > 0 {
                warnings.push(format!(
                    "{}: dropped {} bias tensors of stacked experts (no MLX slot)",
                    path.display(),
                    dropped.expert_biases
                ));
            }
            mlx::retain_selected(&mut tensors, &opts.only);
            tensors
        }
    };
    if tensors.is_empty() && subdir.is_empty() {
        bail!(
            "{}: nothing to convert{}",
            path.display(),
            if opts.only.is_empty() { "" } else { " (no tensor matches --only)" }
        );
    }
    let plan = Plan::new(tensors, opts.max_shard_size, if opts.mlx.is_some() { "mlx" } else { "pt" });
    Ok(Part { ck, cat, plan, subdir })
}

fn nonzero_biases(ck: &Checkpoint, cat: &Catalog) -> Result<usize> {
    let mut n = 0;
    for m in &cat.coded {
        n += m.has_nonzero_bias(ck)? as usize;
    }
    Ok(n)
}

/// Bytes of scratch one coded work unit needs at input width `ic`.
fn unit_memory(ic: usize) -> usize {
    HADAMARD_SIZE * ic * (4 + 4) + ELEMENTS_PER_UNIT * (4 + 4)
}

fn progress_bar(enabled: bool, total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .expect("a valid template"),
    );
    bar
}

/// Copies tokenizer/generation files and writes `config` (the dense or MLX config.json).
fn copy_side_files(ck: &Checkpoint, dir: &Path, subdir: &str, config: Option<Value>) -> Result<Vec<String>> {
    let mut copied = Vec::new();
    for src in &ck.copied_files {
        let name = src.file_name().unwrap();
        std::fs::copy(src, dir.join(name)).with_context(|| format!("{}: cannot copy", src.display()))?;
        copied.push(Path::new(subdir).join(name).display().to_string());
    }
    if let Some(config) = &config {
        let text = if config.get("quantization").is_some() { pretty_mlx(config) } else { pretty(config) };
        std::fs::write(dir.join("config.json"), text)?;
        copied.push(Path::new(subdir).join("config.json").display().to_string());
    }
    Ok(copied)
}

/// The input config with its `quantization_config` removed, and nothing else changed.
pub fn dense_config(config: &Value) -> Value {
    let mut c = config.clone();
    if let Some(obj) = c.as_object_mut() {
        obj.shift_remove("quantization_config");
    }
    c
}

/// JSON with a 4-space indent, as mlx-lm's `save_config` writes it.
fn pretty_mlx(v: &Value) -> String {
    let mut out = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(b"    "));
    v.serialize(&mut ser).expect("JSON serialises");
    let mut s = String::from_utf8(out).expect("JSON is UTF-8");
    s.push('\n');
    s
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("JSON serialises");
    s.push('\n');
    s
}
