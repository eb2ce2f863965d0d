//! Running work units: each reads its rows, adjusts them, encodes them and hands the bytes to the
//! writer at their planned offsets.

use super::progress::Progress;
use super::rows::Reader;
use super::units::{dims, units, Unit, Units};
use crate::layout::{Adjust, Encoding, Recipe};
use crate::output::{ShardFiles, WriteQueue};
use crate::plan::Plan;
use crate::quant::affine::{self, AffineOut};
use crate::quant::{blocks, dense};
use crate::storage::Storage;
use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Per-thread buffers, reused across units.
#[derive(Default)]
struct Scratch {
    values: Vec<f32>,
    codes: Vec<u8>,
    row_scales: Vec<f32>,
    /// The unit's bytes, and for affine encodings its scales and biases.
    bytes: Vec<u8>,
    params: [Vec<u8>; 2],
}

/// Where a unit's bytes go: offsets within the tensor, and within its scales and biases.
struct Placed {
    offset: u64,
    params_offset: u64,
}

/// Output bytes a batch of consecutive units gathers: a worker runs a batch in order, so tiny
/// tensors are written, and their inputs released, many at a time; a large unit is a batch of
/// its own.
const BATCH_BYTES: u64 = 1 << 20;
/// Writes smaller than this are gathered with the batch's other writes they continue.
const GATHER_BELOW: usize = 64 << 10;
/// Output runs a batch gathers at once (a tensor, its scales and its biases).
const STREAMS: usize = 3;

/// Writes the shards of `plan` that `owned` marks into `dir`, reading from `reader`.
pub fn write_shards(plan: &Plan, reader: &Reader, dir: &Path, owned: &[bool], progress: &Progress) -> Result<()> {
    let queue = WriteQueue::start(ShardFiles::create(dir, plan, owned)?);
    let Units { mut units, inputs } = units(plan, reader.ck, reader.cat)?;
    // A unit is run when anything it writes (its tensor, or an affine tensor's scales and
    // biases) lies in a shard of this run.
    let writes_here = |t: usize| owned[plan.tensors[t].shard];
    units.retain(|u| {
        writes_here(u.tensor) || plan.tensors[u.tensor].params.is_some_and(|p| p.iter().any(|&t| writes_here(t)))
    });
    // Units left per input tensor: when the last one is done, its pages are released.
    let left: Vec<AtomicUsize> = {
        let mut n = vec![0; inputs.len()];
        units.iter().filter_map(|u| u.input).for_each(|i| n[i] += 1);
        n.into_iter().map(AtomicUsize::new).collect()
    };
    let batches = batches(&units);
    let computed = batches.par_iter().try_for_each_init(Scratch::default, |scratch, batch| -> Result<()> {
        let mut out = Gather { queue: &queue, progress, owned, runs: Vec::new() };
        let mut done = Vec::new();
        for unit in &units[batch.clone()] {
            let planned = &plan.tensors[unit.tensor];
            let placed = run_unit(plan, reader, unit, scratch)
                .with_context(|| format!("while writing {}", planned.tensor.name))?;
            out.write(planned.shard, planned.offset + placed.offset, &mut scratch.bytes)?;
            if let Some(params) = planned.params {
                for (t, buffer) in params.into_iter().zip(&mut scratch.params) {
                    let p = &plan.tensors[t];
                    out.write(p.shard, p.offset + placed.params_offset, buffer)?;
                }
            }
            if let Some(i) = unit.input {
                if left[i].fetch_sub(1, Ordering::AcqRel) == 1 {
                    done.push(reader.ck.entry(&inputs[i])?);
                }
            }
        }
        out.flush()?;
        reader.ck.release_all(done);
        Ok(())
    });
    // A failed write stops the workers with "writer stopped": report the write's own error.
    queue.finish()?;
    computed
}

/// Consecutive units in batches of about [`BATCH_BYTES`] of output.
fn batches(units: &[Unit]) -> Vec<Range<usize>> {
    let mut batches = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, u) in units.iter().enumerate() {
        bytes += u.bytes;
        if bytes >= BATCH_BYTES {
            batches.push(start..i + 1);
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < units.len() {
        batches.push(start..units.len());
    }
    batches
}

/// A batch's writes: large ones go to the writer as they come, small ones that continue each
/// other are gathered into one buffer first.
struct Gather<'a> {
    queue: &'a WriteQueue,
    progress: &'a Progress,
    /// The shards this run writes; bytes for another part's are dropped.
    owned: &'a [bool],
    /// Open runs: shard, offset, bytes.
    runs: Vec<(usize, u64, Vec<u8>)>,
}

impl Gather<'_> {
    /// Takes the bytes of `buffer` (to be written at `offset` of `shard`), leaving it empty.
    fn write(&mut self, shard: usize, offset: u64, buffer: &mut Vec<u8>) -> Result<()> {
        if !self.owned[shard] {
            buffer.clear();
            return Ok(());
        }
        self.progress.inc(buffer.len() as u64);
        if buffer.len() >= GATHER_BELOW {
            let bytes = std::mem::replace(buffer, self.queue.buffer());
            return self.queue.write(shard, offset, bytes);
        }
        let next = self.runs.iter().position(|(s, o, b)| *s == shard && o + b.len() as u64 == offset);
        let i = if let Some(i) = next {
            i
        } else {
            if self.runs.len() == STREAMS {
                let (s, o, b) = self.runs.remove(0);
                self.queue.write(s, o, b)?;
            }
            self.runs.push((shard, offset, self.queue.buffer()));
            self.runs.len() - 1
        };
        self.runs[i].2.extend_from_slice(buffer);
        buffer.clear();
        if self.runs[i].2.len() as u64 >= BATCH_BYTES {
            let (s, o, b) = self.runs.remove(i);
            self.queue.write(s, o, b)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        for (s, o, b) in self.runs.drain(..) {
            self.queue.write(s, o, b)?;
        }
        Ok(())
    }
}

/// One unit: read, adjust, encode into the scratch buffers.
fn run_unit(plan: &Plan, reader: &Reader, unit: &Unit, s: &mut Scratch) -> Result<Placed> {
    let planned = &plan.tensors[unit.tensor];
    let tensor = &planned.tensor;
    let Some(Recipe { source, adjust, encoding, importance }) = &tensor.recipe else {
        bail!("a companion tensor has no units of its own");
    };
    let (_, rows_per_lead, cols) = dims(source, reader.ck, reader.cat)?;
    let span = &unit.span;
    let width = span.cols.len();
    // Offsets within the tensor (and its scales), in values: the span's first row and column.
    let (first_row, first_col) = (span.rows.start as u64, span.cols.start as u64);
    let first = first_row * cols as u64 + first_col;
    let at = |i: usize| (span.rows.start + i / width.max(1), span.cols.start + i % width.max(1));
    let size = |dtype: safetensors::Dtype| (dtype.bitsize() / 8) as u64;
    let params_dtype = planned.params.and_then(|[scales, _]| plan.tensors[scales].tensor.storage.element());
    let offset = tensor.storage.byte_len(first as usize) as u64;
    s.bytes.clear();
    s.params.iter_mut().for_each(Vec::clear);
    if !matches!(encoding, Encoding::Float | Encoding::Affine { .. }) && *adjust != Adjust::default() {
        bail!("only float rows can be adjusted");
    }
    // A block of a coded linear's rows (the unit) whose values the output's precision cannot hold
    // as normal numbers (channel scales far below 1) would be written as a few bits or zeros.
    let coded = !source.coded_modules().is_empty();
    let check_range = |values: &[f32], held_in: safetensors::Dtype| -> Result<()> {
        match coded.then(|| dense::below_normal_range(values, held_in)).flatten() {
            Some(largest) => bail!(
                "rows {}..{}: their largest magnitude {largest:e} is below {held_in:?}'s normal range ({:e}), so they \
                 would be written with fewer bits than the format holds, or as zeros{}",
                span.rows.start,
                span.rows.end,
                dense::smallest_normal(held_in).unwrap_or_default(),
                if held_in == safetensors::Dtype::F16 {
                    " (bf16 holds them: --format bf16, --gguf-type bf16)"
                } else {
                    ""
                }
            ),
            None => Ok(()),
        }
    };
    match encoding {
        Encoding::Float => {
            reader.f32_rows(source, span, &mut s.values)?;
            reader.adjust(*adjust, source, span, &mut s.values)?;
            // Block types compute with f16 scales.
            check_range(&s.values, tensor.storage.element().unwrap_or(safetensors::Dtype::F16))?;
            // The one rounding is to the output storage.
            match tensor.storage {
                Storage::Element(dtype) => {
                    dense::encode(&s.values, dtype, &mut s.bytes);
                    if let Some(i) = dense::first_non_finite(&s.bytes, dtype) {
                        let reason = dense::non_finite_reason(s.values[i], dtype);
                        let (row, col) = at(i);
                        bail!("row {row}, column {col}: {reason}");
                    }
                }
                Storage::Block(block) => {
                    if let Some(i) = blocks::first_unholdable(&s.values) {
                        let (row, col) = at(i);
                        let value = s.values[i];
                        if !value.is_finite() {
                            bail!("row {row}, column {col}: the value is {value}");
                        }
                        bail!(
                            "row {row}, block {} (column {col}): {value:e} is beyond float16's 65504, which {} blocks \
                             are computed in (their scales, llama.cpp's kernels); --gguf-type bf16 or f32 holds it",
                            col / block.elements(),
                            tensor.storage.name()
                        );
                    }
                    match importance {
                        None => blocks::quantize(block, &s.values, None, &mut s.bytes),
                        Some(importance) => {
                            // The legacy types weigh by the mean square of the whole row.
                            if block.is_legacy() && width != cols {
                                bail!(
                                    "rows of {cols} values are encoded in pieces, which {} with --imatrix cannot be",
                                    block.name()
                                );
                            }
                            for (i, row) in s.values.chunks_exact(width).enumerate() {
                                let w = importance.of_row(span.rows.start + i, rows_per_lead, cols, span.cols.clone());
                                blocks::quantize(block, row, Some(w), &mut s.bytes);
                            }
                        }
                    }
                }
            }
            Ok(Placed { offset, params_offset: 0 })
        }
        Encoding::Bytes => {
            reader.byte_rows(source, span, &mut s.bytes)?;
            // A float stored as it is (no layout does so today) must be finite all the same.
            let dtype = tensor.storage.element().context("stored bytes need an element type")?;
            if let Some(i) = dense::first_non_finite(&s.bytes, dtype) {
                let (row, col) = at(i);
                bail!("row {row}, column {col}: the value is not finite");
            }
            Ok(Placed { offset, params_offset: 0 })
        }
        Encoding::Int8Blocks => {
            reader.int8_rows(source, span, &mut s.codes, &mut s.row_scales)?;
            // The scales are f16 (the layout checked), so the round trip through f32 is exact.
            for (row, &scale) in s.codes.chunks_exact(width).zip(&s.row_scales) {
                blocks::q8_0_from_int8(row, half::f16::from_f32(scale), &mut s.bytes);
            }
            Ok(Placed { offset, params_offset: 0 })
        }
        Encoding::Affine { spec, .. } => {
            let scale_dtype = params_dtype.context("affine tensor without scales")?;
            reader.f32_rows(source, span, &mut s.values)?;
            reader.adjust(*adjust, source, span, &mut s.values)?;
            check_range(&s.values, scale_dtype)?;
            // The values a model in the scales' dtype holds are what gets quantized.
            let [scales, biases] = &mut s.params;
            let out = &mut AffineOut { packed: &mut s.bytes, scales, biases };
            affine::round_and_quantize_rows(&mut s.values, width, *spec, scale_dtype, out);
            if s.params.iter().any(|p| dense::first_non_finite(p, scale_dtype).is_some()) {
                bail!("rows from {first_row}: a group's scale or bias is not finite in {scale_dtype:?}");
            }
            let packed_words = first_row * spec.packed_cols(cols) as u64 + first_col * u64::from(spec.bits) / 32;
            let groups = first_row * spec.groups(cols) as u64 + first_col / spec.group_size as u64;
            Ok(Placed { offset: packed_words * 4, params_offset: groups * size(scale_dtype) })
        }
        Encoding::Int8Affine { group_size, .. } => {
            let scale_dtype = params_dtype.context("int8 repack without scales")?;
            reader.int8_rows(source, span, &mut s.codes, &mut s.row_scales)?;
            let [scales, biases] = &mut s.params;
            let out = &mut AffineOut { packed: &mut s.bytes, scales, biases };
            affine::repack_int8_rows(&s.codes, &s.row_scales, width, *group_size, scale_dtype, out);
            let groups = first_row * (cols / group_size) as u64 + first_col / *group_size as u64;
            Ok(Placed { offset: first, params_offset: groups * size(scale_dtype) })
        }
    }
}
