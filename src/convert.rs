//! The conversion engine: catalogue → layout → plan → parallel work units → finished directory.
//!
//! A work unit is one 128-row output block of one coded linear (or expert), a run of int8 rows,
//! or a run of elements of a plain tensor. Each unit reads its inputs from the memory maps,
//! produces its output bytes and writes them at their planned offset, so memory is bounded by
//! threads × one unit, and the bytes do not depend on the thread count or schedule.

use crate::checkpoint::tensor::{floats_to_f32, is_float};
use crate::checkpoint::{catalog, Catalog, Checkpoint, CodedModule, Leaf};
use crate::codec::TileDecoder;
use crate::layout::mlx::{self, MlxOptions, MlxRecipe, RowSource};
use crate::layout::{self, DenseDtype, Recipe};
use crate::output::{ShardFiles, Staging};
use crate::plan::Plan;
use crate::quant::{dense, mlx_affine};
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
        pool.install(|| write_part(part, &dir, opts.dtype, decoder, &progress))?;
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
                warnings.push(format!("{}: dropped {} MTP tensors (the MLX layout carries none)", path.display(), dropped.mtp));
            }
            if dropped.tied_head > 0 {
                warnings.push(format!("{}: dropped lm_head: tie_word_embeddings is set", path.display()));
            }
            if dropped.expert_biases > 0 {
                warnings.push(format!("{}: dropped {} bias tensors of stacked experts (no MLX slot)", path.display(), dropped.expert_biases));
            }
            mlx::retain_selected(&mut tensors, &opts.only);
            tensors
        }
    };
    if tensors.is_empty() && subdir.is_empty() {
        bail!("{}: nothing to convert{}", path.display(), if opts.only.is_empty() { "" } else { " (no tensor matches --only)" });
    }
    let plan = Plan::new(tensors, opts.max_shard_size, if opts.mlx.is_some() { "mlx" } else { "pt" });
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
    /// MLX: rows `rows` of expert `lead` of a row source; `params`: the plan indices of the
    /// `.scales` and `.biases` tensors the unit also writes.
    MlxRows { lead: usize, rows: Range<usize>, params: Option<[usize; 2]> },
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
            Recipe::Bias(_) | Recipe::Copy(_) | Recipe::Mlx(MlxRecipe::NormPlusOne(_)) => {
                let n = p.tensor.shape.iter().product::<usize>();
                for start in (0..n.max(1)).step_by(ELEMENTS_PER_UNIT) {
                    units.push(Unit { tensor: t, work: Work::Elements(start..(start + ELEMENTS_PER_UNIT).min(n)) });
                }
            }
            Recipe::Mlx(r) => mlx_units(part, t, r, &mut units),
        }
    }
    units
}

/// Units of an MLX row recipe: one per 128-row block of a coded source (per expert), runs of
/// rows otherwise. Quantized units also carry where their scales and biases go.
fn mlx_units(part: &Part, t: usize, recipe: &MlxRecipe, units: &mut Vec<Unit>) {
    let index = |name: &str| part.plan.tensors.iter().position(|p| p.tensor.name == name);
    let (source, params) = match recipe {
        MlxRecipe::Quantized { source, scales, biases, .. } => (source, index(scales).zip(index(biases))),
        MlxRecipe::Int8Exact { int8, scales, biases, .. } => {
            let rows = part.cat.int8[*int8].shape[0];
            let params = index(scales).zip(index(biases)).map(|(s, b)| [s, b]);
            let per_unit = (ELEMENTS_PER_UNIT / part.cat.int8[*int8].shape[1].max(1)).max(1);
            for start in (0..rows).step_by(per_unit) {
                units.push(Unit { tensor: t, work: Work::MlxRows { lead: 0, rows: start..(start + per_unit).min(rows), params } });
            }
            return;
        }
        MlxRecipe::Dense(source) => (source, None),
        MlxRecipe::NormPlusOne(_) | MlxRecipe::Companion => return,
    };
    let params = params.map(|(s, b)| [s, b]);
    if let RowSource::Stack(members) = source {
        for (lead, member) in members.iter().enumerate() {
            let (_, rows, cols) = row_source_dims(part, member);
            let per_unit = match member {
                RowSource::Coded { .. } => HADAMARD_SIZE,
                _ => (ELEMENTS_PER_UNIT / cols.max(1)).max(1),
            };
            for start in (rows.start..rows.end).step_by(per_unit) {
                units.push(Unit { tensor: t, work: Work::MlxRows { lead, rows: start..(start + per_unit).min(rows.end), params } });
            }
        }
        return;
    }
    match source {
        RowSource::Coded { coded, rows, .. } => {
            let m = &part.cat.coded[*coded];
            for lead in 0..m.expert_count() {
                for block in rows.start / HADAMARD_SIZE..rows.end.div_ceil(HADAMARD_SIZE) {
                    let r = (block * HADAMARD_SIZE).max(rows.start)..((block + 1) * HADAMARD_SIZE).min(rows.end);
                    units.push(Unit { tensor: t, work: Work::MlxRows { lead, rows: r, params } });
                }
            }
        }
        RowSource::Int8(_) | RowSource::Plain { .. } | RowSource::Stack(_) => {
            let (leads, rows, cols) = row_source_dims(part, source);
            let per_unit = (ELEMENTS_PER_UNIT / cols.max(1)).max(1);
            for lead in 0..leads {
                for start in (rows.start..rows.end).step_by(per_unit) {
                    units.push(Unit { tensor: t, work: Work::MlxRows { lead, rows: start..(start + per_unit).min(rows.end), params } });
                }
            }
        }
    }
}

/// (leading count, row range, columns) of a row source.
fn row_source_dims(part: &Part, source: &RowSource) -> (usize, Range<usize>, usize) {
    match source {
        RowSource::Coded { coded, rows, .. } => {
            let m = &part.cat.coded[*coded];
            (m.expert_count(), rows.clone(), m.in_features)
        }
        RowSource::Int8(i) => {
            let shape = &part.cat.int8[*i].shape;
            (1, 0..shape[0], shape[1])
        }
        RowSource::Plain { name, rows } => {
            let shape = &part.ck.tensors[name].shape;
            let leads = shape[..shape.len() - 2].iter().product();
            (leads, rows.clone(), shape[shape.len() - 1])
        }
        RowSource::Stack(members) => {
            let (_, rows, cols) = row_source_dims(part, &members[0]);
            (members.len(), rows, cols)
        }
    }
}

/// Per-thread scratch, reused across units.
#[derive(Default)]
struct Scratch {
    block: Vec<f32>,
    values: Vec<f32>,
    bytes: Vec<u8>,
    /// MLX: the unit's scales and biases, and their offset within their tensors.
    scales: Vec<u8>,
    biases: Vec<u8>,
    params_offset: u64,
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
        if let Work::MlxRows { params: Some([s, b]), .. } = unit.work {
            for (t, bytes) in [(s, &scratch.scales), (b, &scratch.biases)] {
                let p = &part.plan.tensors[t];
                files.write_at(p.shard, p.offset + scratch.params_offset, bytes)?;
                progress.inc(bytes.len() as u64);
            }
        }
        if left[unit.tensor].fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(entry) = bulk_input(part, &planned.tensor.recipe) {
                part.ck.release(entry);
            }
        }
        Ok(())
    })?;
    files.finish()?;
    let mut index = part.plan.index_json();
    if part.plan.tensors.iter().any(|p| matches!(p.tensor.recipe, Recipe::Mlx(_))) {
        let params = mlx::total_parameters(part.plan.tensors.iter().map(|p| &p.tensor));
        index["metadata"]["total_parameters"] = params.into();
    }
    std::fs::write(dir.join("model.safetensors.index.json"), pretty(&index))?;
    Ok(())
}

/// The large input a recipe reads (codes, int8 weights, copied tensors).
fn bulk_input<'a>(part: &'a Part, recipe: &Recipe) -> Option<&'a crate::checkpoint::TensorEntry> {
    let name = match recipe {
        Recipe::Coded(i) => part.cat.coded[*i].tensor(Leaf::Code)?,
        Recipe::Int8(i) => &part.cat.int8[*i].weight,
        Recipe::Copy(name) => name,
        Recipe::Bias(_) => return None,
        Recipe::Mlx(r) => match r {
            MlxRecipe::Quantized { source, .. } | MlxRecipe::Dense(source) => match source {
                // A fused gate_up feeds two outputs: released by neither.
                RowSource::Coded { coded, rows, .. } => {
                    let m = &part.cat.coded[*coded];
                    if rows.len() != m.out_features {
                        return None;
                    }
                    m.tensor(Leaf::Code)?
                }
                RowSource::Int8(i) => &part.cat.int8[*i].weight,
                RowSource::Plain { name, rows } if rows.start == 0 && rows.end == part.ck.tensors[name].shape[part.ck.tensors[name].shape.len() - 2] => name,
                RowSource::Plain { .. } | RowSource::Stack(_) => return None,
            },
            MlxRecipe::Int8Exact { int8, .. } => &part.cat.int8[*int8].weight,
            MlxRecipe::NormPlusOne(_) | MlxRecipe::Companion => return None,
        },
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
        (Recipe::Mlx(MlxRecipe::NormPlusOne(name)), Work::Elements(range)) => {
            let e = &ck.tensors[name];
            let src_el = e.dtype.bitsize() / 8;
            floats_to_f32(&ck.bytes(e)[range.start * src_el..range.end * src_el], e.dtype, &mut scratch.values)?;
            // Zero-centred storage: MLX layout folds the 1 in, rounding once.
            scratch.values.iter_mut().for_each(|v| *v += 1.0);
            dense::encode(&scratch.values, tensor.dtype, &mut scratch.bytes);
            Ok((range.start * el) as u64)
        }
        (Recipe::Mlx(r), Work::MlxRows { lead, rows, .. }) => run_mlx_rows(part, r, tensor, *lead, rows.clone(), decoder, scratch),
        _ => unreachable!("work units are built from their recipe"),
    }
}

/// An MLX row unit: fills `scratch.bytes` (and, when quantized, `scratch.scales`/`biases` with
/// `scratch.params_offset`) and returns the offset of `scratch.bytes` within the tensor.
fn run_mlx_rows(
    part: &Part,
    recipe: &MlxRecipe,
    tensor: &layout::OutputTensor,
    lead: usize,
    rows: Range<usize>,
    decoder: &dyn TileDecoder,
    scratch: &mut Scratch,
) -> Result<u64> {
    scratch.scales.clear();
    scratch.biases.clear();
    if let MlxRecipe::Int8Exact { int8, group_size, .. } = recipe {
        let m = &part.cat.int8[*int8];
        let cols = m.shape[1];
        let (w, s) = (&part.ck.tensors[&m.weight], &part.ck.tensors[&m.scale]);
        let s_el = s.dtype.bitsize() / 8;
        floats_to_f32(&part.ck.bytes(s)[rows.start * s_el..rows.end * s_el], s.dtype, &mut scratch.values)?;
        let w8 = &part.ck.bytes(w)[rows.start * cols..rows.end * cols];
        mlx_affine::repack_int8_rows(w8, &scratch.values, cols, *group_size, mlx::INT8_SCALE_DTYPE, &mut scratch.bytes, &mut scratch.scales, &mut scratch.biases);
        scratch.params_offset = (rows.start * (cols / group_size) * mlx::INT8_SCALE_DTYPE.bitsize() / 8) as u64;
        return Ok((rows.start * cols) as u64);
    }
    let (source, quantized) = match recipe {
        MlxRecipe::Quantized { source, spec, scale_dtype, .. } => (source, Some((*spec, *scale_dtype))),
        MlxRecipe::Dense(source) => (source, None),
        _ => unreachable!("other MLX recipes have no row units"),
    };
    let (_, all_rows, cols) = row_source_dims(part, source);
    mlx_source_rows(part, source, lead, rows.clone(), decoder, scratch)?;
    // The output row index within the tensor: experts are stacked, each with `all_rows` rows.
    let row = lead * all_rows.len() + (rows.start - all_rows.start);
    match quantized {
        Some((spec, scale_dtype)) => {
            // The values MLX would quantize: the weight in the model dtype (= scale dtype).
            scratch.values.iter_mut().for_each(|v| *v = mlx_affine::round_to(*v, scale_dtype));
            mlx_affine::quantize_rows(&scratch.values, cols, spec, scale_dtype, &mut scratch.bytes, &mut scratch.scales, &mut scratch.biases);
            scratch.params_offset = (row * spec.groups(cols) * scale_dtype.bitsize() / 8) as u64;
            Ok((row * spec.packed_cols(cols) * 4) as u64)
        }
        None => {
            dense::encode(&scratch.values, tensor.dtype, &mut scratch.bytes);
            Ok((row * cols * tensor.dtype.bitsize() / 8) as u64)
        }
    }
}

/// Rows `rows` of expert `lead` of a row source as f32 in `scratch.values` (`rows × cols`).
fn mlx_source_rows(part: &Part, source: &RowSource, lead: usize, rows: Range<usize>, decoder: &dyn TileDecoder, scratch: &mut Scratch) -> Result<()> {
    let ck = &part.ck;
    scratch.values.clear();
    match source {
        RowSource::Stack(members) => return mlx_source_rows(part, &members[lead], 0, rows, decoder, scratch),
        RowSource::Coded { coded, dead_columns_from, .. } => {
            let m = &part.cat.coded[*coded];
            let (su, sv) = expert_scales(ck, m, lead)?;
            let code_entry = &ck.tensors[m.tensor(Leaf::Code).unwrap()];
            let per_expert = code_entry.byte_len() / m.expert_count();
            let code = &ck.bytes(code_entry)[lead * per_expert..(lead + 1) * per_expert];
            let lin = CodedLinear { code, k: m.k, codebook: m.codebook, su: &su, sv: &sv };
            let block = rows.start / HADAMARD_SIZE;
            scratch.block.resize(HADAMARD_SIZE * m.in_padded, 0.0);
            lin.reconstruct_block(decoder, block, &mut scratch.block);
            for r in rows.clone() {
                let local = (r - block * HADAMARD_SIZE) * m.in_padded;
                scratch.values.extend_from_slice(&scratch.block[local..local + m.in_features]);
            }
            if let Some(g) = dead_columns_from {
                // A channel whose gate and up rows are exactly zero never fires; its down_proj
                // column only widens the affine ranges. Zero it (mlx-affine.md §9).
                let gm = &part.cat.coded[*g];
                let (_, gsv) = expert_scales(ck, gm, lead)?;
                let half = gm.out_features / 2;
                let dead: Vec<usize> = (0..m.in_features).filter(|&c| gsv[c] == 0.0 && gsv[half + c] == 0.0).collect();
                if !dead.is_empty() {
                    for row in scratch.values.chunks_exact_mut(m.in_features) {
                        dead.iter().for_each(|&c| row[c] = 0.0);
                    }
                }
            }
        }
        RowSource::Int8(i) => {
            let m = &part.cat.int8[*i];
            let cols = m.shape[1];
            let (w, s) = (&ck.tensors[&m.weight], &ck.tensors[&m.scale]);
            let s_el = s.dtype.bitsize() / 8;
            let mut scales = Vec::new();
            floats_to_f32(&ck.bytes(s)[rows.start * s_el..rows.end * s_el], s.dtype, &mut scales)?;
            let weights = &ck.bytes(w)[rows.start * cols..rows.end * cols];
            for (row, &scale) in weights.chunks_exact(cols).zip(&scales) {
                // Exact in f32, as in the dense export.
                scratch.values.extend(row.iter().map(|&q| q as i8 as f32 * scale));
            }
        }
        RowSource::Plain { name, .. } => {
            let e = &ck.tensors[name];
            let (r_all, cols) = (e.shape[e.shape.len() - 2], e.shape[e.shape.len() - 1]);
            let el = e.dtype.bitsize() / 8;
            let start = (lead * r_all + rows.start) * cols * el;
            let end = (lead * r_all + rows.end) * cols * el;
            floats_to_f32(&ck.bytes(e)[start..end], e.dtype, &mut scratch.values)?;
        }
    }
    Ok(())
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
    let mut ser = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(b"    "));
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
