//! Running work units: each produces its bytes and writes them at their planned offsets.

use super::units::{row_source_dims, units, Unit, Work};
use super::{pretty, Part};
use crate::checkpoint::tensor::{floats_to_f32, is_float};
use crate::checkpoint::{Checkpoint, Leaf, TensorEntry};
use crate::codec::TileDecoder;
use crate::layout::mlx::{self, MlxRecipe, RowSource};
use crate::layout::{self, DenseDtype, Recipe};
use crate::output::{ShardFiles, WriteQueue};
use crate::quant::{dense, mlx_affine};
use crate::transform::hadamard::HADAMARD_SIZE;
use anyhow::{Context, Result};
use rayon::prelude::*;
use safetensors::Dtype;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

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

pub(super) fn write_part(
    part: &Part,
    dir: &Path,
    dtype: DenseDtype,
    decoder: &dyn TileDecoder,
    progress: &indicatif::ProgressBar,
) -> Result<()> {
    let queue = WriteQueue::start(ShardFiles::create(dir, &part.plan)?);
    let units = units(part);
    // Units left per output tensor: when a tensor's last unit is done, its large inputs are
    // released from memory.
    let mut left: Vec<usize> = vec![0; part.plan.tensors.len()];
    for u in &units {
        left[u.tensor] += 1;
    }
    let left: Vec<AtomicUsize> = left.into_iter().map(AtomicUsize::new).collect();
    let computed = units.par_iter().try_for_each_init(Scratch::default, |scratch, unit| -> Result<()> {
        let planned = &part.plan.tensors[unit.tensor];
        let offset = run_unit(part, unit, dtype, decoder, scratch)
            .with_context(|| format!("while writing {}", planned.tensor.name))?;
        progress.inc(scratch.bytes.len() as u64);
        let bytes = std::mem::replace(&mut scratch.bytes, queue.buffer());
        queue.write(planned.shard, planned.offset + offset, bytes)?;
        if let Work::MlxRows { params: Some([s, b]), .. } = unit.work {
            for (t, buffer) in [(s, &mut scratch.scales), (b, &mut scratch.biases)] {
                let p = &part.plan.tensors[t];
                progress.inc(buffer.len() as u64);
                let bytes = std::mem::replace(buffer, queue.buffer());
                queue.write(p.shard, p.offset + scratch.params_offset, bytes)?;
            }
        }
        if left[unit.tensor].fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(entry) = bulk_input(part, &planned.tensor.recipe) {
                part.ck.release(entry);
            }
        }
        Ok(())
    });
    // A failed write stops the workers with "writer stopped": report the write's own error.
    queue.finish()?;
    computed?;
    let mut index = part.plan.index_json();
    if part.plan.tensors.iter().any(|p| matches!(p.tensor.recipe, Recipe::Mlx(_))) {
        let params = mlx::total_parameters(part.plan.tensors.iter().map(|p| &p.tensor));
        index["metadata"]["total_parameters"] = params.into();
    }
    std::fs::write(dir.join("model.safetensors.index.json"), pretty(&index))?;
    Ok(())
}

/// The large input a recipe reads (codes, int8 weights, copied tensors).
fn bulk_input<'a>(part: &'a Part, recipe: &Recipe) -> Option<&'a TensorEntry> {
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
                RowSource::Plain { name, rows }
                    if rows.start == 0
                        && rows.end == part.ck.tensors[name].shape[part.ck.tensors[name].shape.len() - 2] =>
                {
                    name
                }
                RowSource::Plain { .. } | RowSource::Stack(_) => return None,
            },
            MlxRecipe::Int8Exact { int8, .. } => &part.cat.int8[*int8].weight,
            MlxRecipe::NormPlusOne(_) | MlxRecipe::Companion => return None,
        },
    };
    part.ck.tensors.get(name)
}

/// Fills `scratch.bytes` with the unit's output and returns its offset within the tensor.
fn run_unit(
    part: &Part,
    unit: &Unit,
    dtype: DenseDtype,
    decoder: &dyn TileDecoder,
    scratch: &mut Scratch,
) -> Result<u64> {
    let (ck, cat) = (&part.ck, &part.cat);
    let tensor = &part.plan.tensors[unit.tensor].tensor;
    let el = tensor.dtype.bitsize() / 8;
    scratch.bytes.clear();
    match (&tensor.recipe, &unit.work) {
        (Recipe::Coded(i), Work::CodedBlock { expert, block }) => {
            let m = &cat.coded[*i];
            scratch.block.resize(HADAMARD_SIZE * m.in_padded, 0.0);
            m.expert(ck, *expert)?.linear().reconstruct_block(decoder, *block, &mut scratch.block);
            let rows = (m.out_features - block * HADAMARD_SIZE).min(HADAMARD_SIZE);
            for row in scratch.block.chunks_exact(m.in_padded).take(rows) {
                dense::encode(&row[..m.in_features], dtype.dtype(), &mut scratch.bytes);
            }
            let first_row = expert * m.out_features + block * HADAMARD_SIZE;
            Ok((first_row * m.in_features * el) as u64)
        }
        (Recipe::Int8(i), Work::Int8Rows(rows)) => {
            let m = &cat.int8[*i];
            scratch.values.clear();
            m.dequantize_rows(ck, rows.clone(), &mut scratch.values)?;
            // The one rounding is to the output dtype.
            dense::encode(&scratch.values, tensor.dtype, &mut scratch.bytes);
            Ok((rows.start * m.shape[1] * el) as u64)
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
        (Recipe::Mlx(r), Work::MlxRows { lead, rows, .. }) => {
            run_mlx_rows(part, r, tensor, *lead, rows.clone(), decoder, scratch)
        }
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
        mlx_affine::repack_int8_rows(
            w8,
            &scratch.values,
            cols,
            *group_size,
            mlx::INT8_SCALE_DTYPE,
            &mut scratch.bytes,
            &mut scratch.scales,
            &mut scratch.biases,
        );
        scratch.params_offset = (rows.start * (cols / group_size) * mlx::INT8_SCALE_DTYPE.bitsize() / 8) as u64;
        return Ok((rows.start * cols) as u64);
    }
    let (source, quantized) = match recipe {
        MlxRecipe::Quantized { source, spec, scale_dtype, .. } => (source, Some((*spec, *scale_dtype))),
        MlxRecipe::Dense(source) => (source, None),
        _ => unreachable!("other MLX recipes have no row units"),
    };
    let (_, all_rows, cols) = row_source_dims(part, source);
    let in_block = mlx_source_rows(part, source, lead, rows.clone(), decoder, scratch)?;
    let values = match in_block {
        Some(range) => &mut scratch.block[range],
        None => &mut scratch.values[..],
    };
    // The output row index within the tensor: experts are stacked, each with `all_rows` rows.
    let row = lead * all_rows.len() + (rows.start - all_rows.start);
    match quantized {
        Some((spec, scale_dtype)) => {
            // The values MLX would quantize: the weight in the model dtype (= scale dtype).
            mlx_affine::round_and_quantize_rows(
                values,
                cols,
                spec,
                scale_dtype,
                &mut scratch.bytes,
                &mut scratch.scales,
                &mut scratch.biases,
            );
            scratch.params_offset = (row * spec.groups(cols) * scale_dtype.bitsize() / 8) as u64;
            Ok((row * spec.packed_cols(cols) * 4) as u64)
        }
        None => {
            dense::encode(values, tensor.dtype, &mut scratch.bytes);
            Ok((row * cols * tensor.dtype.bitsize() / 8) as u64)
        }
    }
}

/// Rows `rows` of expert `lead` of a row source as f32 (`rows × cols`): in `scratch.values`
/// (`None`), or, for a coded source whose rows are not padded, in place in `scratch.block`
/// (`Some(range)`), which saves copying the block.
fn mlx_source_rows(
    part: &Part,
    source: &RowSource,
    lead: usize,
    rows: Range<usize>,
    decoder: &dyn TileDecoder,
    scratch: &mut Scratch,
) -> Result<Option<Range<usize>>> {
    let ck = &part.ck;
    scratch.values.clear();
    match source {
        RowSource::Stack(members) => return mlx_source_rows(part, &members[lead], 0, rows, decoder, scratch),
        RowSource::Coded { coded, dead_columns_from, .. } => {
            let m = &part.cat.coded[*coded];
            let block = rows.start / HADAMARD_SIZE;
            scratch.block.resize(HADAMARD_SIZE * m.in_padded, 0.0);
            m.expert(ck, lead)?.linear().reconstruct_block(decoder, block, &mut scratch.block);
            let first = rows.start - block * HADAMARD_SIZE;
            // Unpadded rows are contiguous in the block: use them where they are.
            let in_block = m.in_padded == m.in_features;
            let range = first * m.in_features..(first + rows.len()) * m.in_features;
            if !in_block {
                for r in rows.clone() {
                    let local = (r - block * HADAMARD_SIZE) * m.in_padded;
                    scratch.values.extend_from_slice(&scratch.block[local..local + m.in_features]);
                }
            }
            if let Some(g) = dead_columns_from {
                // A channel whose gate and up rows are exactly zero never fires; its down_proj
                // column only widens the affine ranges. Zero it (mlx-affine.md §9).
                let gm = &part.cat.coded[*g];
                let gsv = gm.expert(ck, lead)?.sv;
                let half = gm.out_features / 2;
                let dead: Vec<usize> = (0..m.in_features).filter(|&c| gsv[c] == 0.0 && gsv[half + c] == 0.0).collect();
                if !dead.is_empty() {
                    let v = if in_block { &mut scratch.block[range.clone()] } else { &mut scratch.values[..] };
                    for row in v.chunks_exact_mut(m.in_features) {
                        dead.iter().for_each(|&c| row[c] = 0.0);
                    }
                }
            }
            return Ok(in_block.then_some(range));
        }
        RowSource::Int8(i) => part.cat.int8[*i].dequantize_rows(ck, rows, &mut scratch.values)?,
        RowSource::Plain { name, .. } => {
            let e = &ck.tensors[name];
            let (r_all, cols) = (e.shape[e.shape.len() - 2], e.shape[e.shape.len() - 1]);
            let el = e.dtype.bitsize() / 8;
            let start = (lead * r_all + rows.start) * cols * el;
            let end = (lead * r_all + rows.end) * cols * el;
            floats_to_f32(&ck.bytes(e)[start..end], e.dtype, &mut scratch.values)?;
        }
    }
    Ok(None)
}

/// Copies elements `range` of `entry`, converting floats to `out` when the dtypes differ.
fn copy_elements(
    ck: &Checkpoint,
    entry: &TensorEntry,
    out: Dtype,
    range: Range<usize>,
    scratch: &mut Scratch,
) -> Result<()> {
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
