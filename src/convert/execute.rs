//! Running work units: each reads its rows, adjusts them, encodes them and hands the bytes to the
//! writer at their planned offsets.

use super::progress::Progress;
use super::rows::Reader;
use super::units::{dims, units, Unit, Units};
use crate::layout::{Adjust, Encoding, Recipe};
use crate::output::{ShardFiles, WriteQueue};
use crate::plan::Plan;
use crate::quant::{dense, mlx_affine};
use anyhow::{bail, Context, Result};
use rayon::prelude::*;
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
    let computed = units.par_iter().try_for_each_init(Scratch::default, |scratch, unit| -> Result<()> {
        let planned = &plan.tensors[unit.tensor];
        let placed =
            run_unit(plan, reader, unit, scratch).with_context(|| format!("while writing {}", planned.tensor.name))?;
        let hand_over = |t: usize, offset: u64, buffer: &mut Vec<u8>| -> Result<()> {
            let p = &plan.tensors[t];
            if !owned[p.shard] {
                return Ok(());
            }
            progress.inc(buffer.len() as u64);
            let bytes = std::mem::replace(buffer, queue.buffer());
            queue.write(p.shard, p.offset + offset, bytes)
        };
        hand_over(unit.tensor, placed.offset, &mut scratch.bytes)?;
        if let Some(params) = planned.params {
            for (t, buffer) in params.into_iter().zip(&mut scratch.params) {
                hand_over(t, placed.params_offset, buffer)?;
            }
        }
        if let Some(i) = unit.input {
            if left[i].fetch_sub(1, Ordering::AcqRel) == 1 {
                reader.ck.release(reader.ck.entry(&inputs[i])?);
            }
        }
        Ok(())
    });
    // A failed write stops the workers with "writer stopped": report the write's own error.
    queue.finish()?;
    computed
}

/// One unit: read, adjust, encode into the scratch buffers.
fn run_unit(plan: &Plan, reader: &Reader, unit: &Unit, s: &mut Scratch) -> Result<Placed> {
    let planned = &plan.tensors[unit.tensor];
    let tensor = &planned.tensor;
    let Some(Recipe { source, adjust, encoding }) = &tensor.recipe else {
        bail!("a companion tensor has no units of its own");
    };
    let cols = dims(source, reader.ck, reader.cat)?.2;
    let rows = unit.rows.clone();
    let first = rows.start as u64;
    let size = |dtype: safetensors::Dtype| (dtype.bitsize() / 8) as u64;
    let params_dtype = planned.params.map(|[scales, _]| plan.tensors[scales].tensor.dtype);
    s.bytes.clear();
    s.params.iter_mut().for_each(Vec::clear);
    if !matches!(encoding, Encoding::Float | Encoding::Affine { .. }) && *adjust != Adjust::default() {
        bail!("only float rows can be adjusted");
    }
    match encoding {
        Encoding::Float => {
            reader.f32_rows(source, rows.clone(), &mut s.values)?;
            reader.adjust(*adjust, source, rows.clone(), cols, &mut s.values)?;
            // The one rounding is to the output dtype.
            dense::encode(&s.values, tensor.dtype, &mut s.bytes);
            if let Some(i) = dense::first_non_finite(&s.bytes, tensor.dtype) {
                let reason = dense::non_finite_reason(s.values[i], tensor.dtype);
                bail!("row {}, column {}: {reason}", first as usize + i / cols.max(1), i % cols.max(1));
            }
            Ok(Placed { offset: first * cols as u64 * size(tensor.dtype), params_offset: 0 })
        }
        Encoding::Bytes => {
            reader.byte_rows(source, rows, &mut s.bytes)?;
            Ok(Placed { offset: first * cols as u64 * size(tensor.dtype), params_offset: 0 })
        }
        Encoding::Affine { spec, .. } => {
            let scale_dtype = params_dtype.context("affine tensor without scales")?;
            reader.f32_rows(source, rows.clone(), &mut s.values)?;
            reader.adjust(*adjust, source, rows.clone(), cols, &mut s.values)?;
            // The values a model in the scales' dtype holds are what gets quantized.
            let [scales, biases] = &mut s.params;
            mlx_affine::round_and_quantize_rows(&mut s.values, cols, *spec, scale_dtype, &mut s.bytes, scales, biases);
            if s.params.iter().any(|p| dense::first_non_finite(p, scale_dtype).is_some()) {
                bail!("rows from {first}: a group's scale or bias is not finite in {scale_dtype:?}");
            }
            Ok(Placed {
                offset: first * spec.packed_cols(cols) as u64 * 4,
                params_offset: first * spec.groups(cols) as u64 * size(scale_dtype),
            })
        }
        Encoding::Int8Affine { group_size, .. } => {
            let scale_dtype = params_dtype.context("int8 repack without scales")?;
            reader.int8_rows(source, rows, &mut s.codes, &mut s.row_scales)?;
            let [scales, biases] = &mut s.params;
            mlx_affine::repack_int8_rows(
                &s.codes,
                &s.row_scales,
                cols,
                *group_size,
                scale_dtype,
                &mut s.bytes,
                scales,
                biases,
            );
            Ok(Placed {
                offset: first * cols as u64,
                params_offset: first * (cols / group_size) as u64 * size(scale_dtype),
            })
        }
    }
}
