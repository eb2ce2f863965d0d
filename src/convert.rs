//! The conversion engine: catalogue → layout → plan → parallel work units → finished directory.
//!
//! A work unit is one 128-row output block of one coded linear (or expert), a run of int8 rows,
//! or a run of elements of a plain tensor. Each unit reads its inputs from the memory maps,
//! produces its output bytes and writes them at their planned offset, so memory is bounded by
//! threads × one unit, and the bytes do not depend on the thread count or schedule.

use crate::checkpoint::tensor::{floats_to_f32, is_float};
use crate::checkpoint::{catalog, Catalog, Checkpoint, CodedModule, Leaf};
use crate::codec::TileDecoder;
use crate::layout::{self, DenseDtype, Recipe};
use crate::output::{ShardFiles, Staging};
use crate::plan::Plan;
use crate::quant::dense;
use crate::select::selected;
use crate::transform::hadamard::HADAMARD_SIZE;
use crate::transform::{fold_scales, CodedLinear};
use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use safetensors::Dtype;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
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
        parts.push(open_part(&mtp, "mtp", opts, &mut warnings)?);
    }

    let mut report = ConvertReport {
        input: opts.input.display().to_string(),
        output: opts.output.display().to_string(),
        format: match opts.dtype {
            DenseDtype::Bf16 => "bf16",
            DenseDtype::F16 => "f16",
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
            report.weights += p.tensor.shape.iter().product::<usize>() as u64;
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
        pool.install(|| write_part(part, &dir, opts.dtype, decoder, &progress))?;
        report.copied_files.extend(copy_side_files(&part.ck, &dir, part.subdir)?);
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
    let mut tensors = layout::hf::layout(&ck, &cat, opts.dtype, opts.keep_bias);
    tensors.retain(|t| selected(&t.name, &opts.only));
    if tensors.is_empty() && subdir.is_empty() {
        bail!("{}: nothing to convert{}", path.display(), if opts.only.is_empty() { "" } else { " (no tensor matches --only)" });
    }
    let plan = Plan::new(tensors, opts.max_shard_size, "pt");
    Ok(Part { ck, cat, plan, subdir })
}

fn nonzero_biases(ck: &Checkpoint, cat: &Catalog) -> Result<usize> {
    let mut n = 0;
    let mut v = Vec::new();
    for m in &cat.coded {
        if let Some(name) = m.tensor(Leaf::Bias) {
            let e = &ck.tensors[name];
            floats_to_f32(ck.bytes(e), e.dtype, &mut v)?;
            n += v.iter().any(|&x| x != 0.0) as usize;
        }
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

/// The work of one unit.
enum Work {
    CodedBlock { expert: usize, block: usize },
    Int8Rows(Range<usize>),
    Elements(Range<usize>),
}

struct Unit {
    tensor: usize,
    work: Work,
}

fn units(part: &Part) -> Vec<Unit> {
    let mut units = Vec::new();
    for (t, p) in part.plan.tensors.iter().enumerate() {
        match &p.tensor.recipe {
            Recipe::Coded(i) => {
                let m = &part.cat.coded[*i];
                let blocks = m.out_features.div_ceil(HADAMARD_SIZE);
                for expert in 0..m.expert_count() {
                    for block in 0..blocks {
                        units.push(Unit { tensor: t, work: Work::CodedBlock { expert, block } });
                    }
                }
            }
            Recipe::Int8(i) => {
                let shape = &part.cat.int8[*i].shape;
                let rows_per_unit = (ELEMENTS_PER_UNIT / shape[1].max(1)).max(1);
                for start in (0..shape[0]).step_by(rows_per_unit) {
                    units.push(Unit { tensor: t, work: Work::Int8Rows(start..(start + rows_per_unit).min(shape[0])) });
                }
            }
            Recipe::Bias(_) | Recipe::Copy(_) => {
                let n = p.tensor.shape.iter().product::<usize>();
                for start in (0..n.max(1)).step_by(ELEMENTS_PER_UNIT) {
                    units.push(Unit { tensor: t, work: Work::Elements(start..(start + ELEMENTS_PER_UNIT).min(n)) });
                }
            }
        }
    }
    units
}

/// Per-thread scratch, reused across units.
#[derive(Default)]
struct Scratch {
    block: Vec<f32>,
    values: Vec<f32>,
    bytes: Vec<u8>,
}

fn write_part(part: &Part, dir: &Path, dtype: DenseDtype, decoder: &dyn TileDecoder, progress: &indicatif::ProgressBar) -> Result<()> {
    let files = ShardFiles::create(dir, &part.plan)?;
    let units = units(part);
    // Units left per output tensor: when a tensor's last unit is done, its large inputs are
    // released from memory.
    let mut left: Vec<usize> = vec![0; part.plan.tensors.len()];
    for u in &units {
        left[u.tensor] += 1;
    }
    let left: Vec<AtomicUsize> = left.into_iter().map(AtomicUsize::new).collect();
    units.par_iter().try_for_each_init(Scratch::default, |scratch, unit| -> Result<()> {
        let planned = &part.plan.tensors[unit.tensor];
        let offset = run_unit(part, unit, dtype, decoder, scratch)
            .with_context(|| format!("while writing {}", planned.tensor.name))?;
        files.write_at(planned.shard, planned.offset + offset, &scratch.bytes)?;
        progress.inc(scratch.bytes.len() as u64);
        if left[unit.tensor].fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(entry) = bulk_input(part, &planned.tensor.recipe) {
                part.ck.release(entry);
            }
        }
        Ok(())
    })?;
    files.finish()?;
    std::fs::write(dir.join("model.safetensors.index.json"), pretty(&part.plan.index_json()))?;
    Ok(())
}

/// The large input a recipe reads (codes, int8 weights, copied tensors).
fn bulk_input<'a>(part: &'a Part, recipe: &Recipe) -> Option<&'a crate::checkpoint::TensorEntry> {
    let name = match recipe {
        Recipe::Coded(i) => part.cat.coded[*i].tensor(Leaf::Code)?,
        Recipe::Int8(i) => &part.cat.int8[*i].weight,
        Recipe::Copy(name) => name,
        Recipe::Bias(_) => return None,
    };
    part.ck.tensors.get(name)
}

/// Fills `scratch.bytes` with the unit's output and returns its offset within the tensor.
fn run_unit(part: &Part, unit: &Unit, dtype: DenseDtype, decoder: &dyn TileDecoder, scratch: &mut Scratch) -> Result<u64> {
    let (ck, cat) = (&part.ck, &part.cat);
    let tensor = &part.plan.tensors[unit.tensor].tensor;
    let el = tensor.dtype.bitsize() / 8;
    scratch.bytes.clear();
    match (&tensor.recipe, &unit.work) {
        (Recipe::Coded(i), Work::CodedBlock { expert, block }) => {
            let m = &cat.coded[*i];
            let (su, sv) = expert_scales(ck, m, *expert)?;
            let code_entry = &ck.tensors[m.tensor(Leaf::Code).unwrap()];
            let per_expert = code_entry.byte_len() / m.expert_count();
            let code = &ck.bytes(code_entry)[expert * per_expert..(expert + 1) * per_expert];
            let lin = CodedLinear { code, k: m.k, codebook: m.codebook, su: &su, sv: &sv };
            scratch.block.resize(HADAMARD_SIZE * m.in_padded, 0.0);
            lin.reconstruct_block(decoder, *block, &mut scratch.block);
            let rows = (m.out_features - block * HADAMARD_SIZE).min(HADAMARD_SIZE);
            for row in scratch.block.chunks_exact(m.in_padded).take(rows) {
                dense::encode(&row[..m.in_features], dtype.dtype(), &mut scratch.bytes);
            }
            let first_row = expert * m.out_features + block * HADAMARD_SIZE;
            Ok((first_row * m.in_features * el) as u64)
        }
        (Recipe::Int8(i), Work::Int8Rows(rows)) => {
            let m = &cat.int8[*i];
            let cols = m.shape[1];
            let w = &ck.tensors[&m.weight];
            let s = &ck.tensors[&m.scale];
            let weights = &ck.bytes(w)[rows.start * cols..rows.end * cols];
            floats_to_f32(ck.bytes(s), s.dtype, &mut scratch.values)?;
            let scales = &scratch.values[rows.clone()];
            scratch.block.clear();
            for (row, &scale) in weights.chunks_exact(cols).zip(scales) {
                // int8 × fp16 is exact in f32; the one rounding is to the output dtype.
                scratch.block.extend(row.iter().map(|&q| q as i8 as f32 * scale));
            }
            dense::encode(&scratch.block, tensor.dtype, &mut scratch.bytes);
            Ok((rows.start * cols * el) as u64)
        }
        (Recipe::Copy(name), Work::Elements(range)) => {
            copy_elements(ck, &ck.tensors[name], tensor.dtype, range.clone(), scratch)?;
            Ok((range.start * el) as u64)
        }
        (Recipe::Bias(i), Work::Elements(range)) => {
            let name = cat.coded[*i].tensor(Leaf::Bias).unwrap();
            copy_elements(ck, &ck.tensors[name], tensor.dtype, range.clone(), scratch)?;
            Ok((range.start * el) as u64)
        }
        _ => unreachable!("work units are built from their recipe"),
    }
}

/// Copies elements `range` of `entry`, converting floats to `out` when the dtypes differ.
fn copy_elements(ck: &Checkpoint, entry: &crate::checkpoint::TensorEntry, out: Dtype, range: Range<usize>, scratch: &mut Scratch) -> Result<()> {
    let el = entry.dtype.bitsize() / 8;
    let src = &ck.bytes(entry)[range.start * el..range.end * el];
    if entry.dtype == out || !is_float(entry.dtype) {
        scratch.bytes.extend_from_slice(src);
    } else {
        floats_to_f32(src, entry.dtype, &mut scratch.values)?;
        dense::encode(&scratch.values, out, &mut scratch.bytes);
    }
    Ok(())
}

/// `su = rin·s_in` and `sv = rout·s_out` of one expert (or of the single linear), in f32.
pub fn expert_scales(ck: &Checkpoint, m: &CodedModule, expert: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    let slice = |leaf: Leaf, len: usize| -> Result<Option<Vec<f32>>> {
        let Some(name) = m.tensor(leaf) else { return Ok(None) };
        let e = &ck.tensors[name];
        let el = e.dtype.bitsize() / 8;
        let bytes = &ck.bytes(e)[expert * len * el..(expert + 1) * len * el];
        let mut v = Vec::with_capacity(len);
        floats_to_f32(bytes, e.dtype, &mut v)?;
        Ok(Some(v))
    };
    let rin = slice(Leaf::Rin, m.in_padded)?.expect("validated");
    let rout = slice(Leaf::Rout, m.out_padded)?.expect("validated");
    let s_in = slice(Leaf::SIn, m.in_padded)?;
    let s_out = slice(Leaf::SOut, m.out_padded)?;
    Ok((fold_scales(&rin, s_in.as_deref()), fold_scales(&rout, s_out.as_deref())))
}

/// Copies tokenizer/generation files and writes config.json without `quantization_config`.
fn copy_side_files(ck: &Checkpoint, dir: &Path, subdir: &str) -> Result<Vec<String>> {
    let mut copied = Vec::new();
    for src in &ck.copied_files {
        let name = src.file_name().unwrap();
        std::fs::copy(src, dir.join(name)).with_context(|| format!("{}: cannot copy", src.display()))?;
        copied.push(Path::new(subdir).join(name).display().to_string());
    }
    if let Some(config) = &ck.config {
        std::fs::write(dir.join("config.json"), pretty(&dense_config(config)))?;
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

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("JSON serialises");
    s.push('\n');
    s
}
