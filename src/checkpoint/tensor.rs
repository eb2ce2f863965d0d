//! A tensor's place in a shard, and typed views of its bytes.

use anyhow::{bail, Result};
use safetensors::Dtype;
use std::ops::Range;

/// Where one tensor lives: its shard, dtype, shape and absolute byte range in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub shard: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub range: Range<usize>,
}

impl TensorEntry {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn byte_len(&self) -> usize {
        self.range.len()
    }
}

/// A tensor of this shape viewed as `[leads, rows, width]`: its last axis is the width, the one
/// before it the rows (a vector is one row, a scalar one element), the rest are leads.
pub fn view(shape: &[usize]) -> (usize, usize, usize) {
    match shape {
        [] => (1, 1, 1),
        [w] => (1, 1, *w),
        [lead @ .., r, w] => (lead.iter().product(), *r, *w),
    }
}

/// Values read at once when a whole tensor is scanned: memory stays bounded whatever its size.
pub const SCAN_CHUNK: usize = 1 << 20;

/// The element ranges a scan of `numel` values reads, [`SCAN_CHUNK`] at a time.
pub fn scan_chunks(numel: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..numel).step_by(SCAN_CHUNK).map(move |s| s..(s + SCAN_CHUNK).min(numel))
}

/// Whether `dtype` is a float type this tool reads as numbers (F64 as the nearest f32).
pub fn is_float(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
}

/// Widens little-endian F16/BF16/F32 bytes to f32 (exact), F64 rounded to the nearest f32,
/// appending to `out`.
pub fn floats_to_f32(bytes: &[u8], dtype: Dtype, out: &mut Vec<f32>) -> Result<()> {
    if !crate::quant::dense::decode(bytes, dtype, out) {
        bail!("dtype {dtype:?} is not a float type");
    }
    Ok(())
}

/// The same as [`floats_to_f32`], returning a fresh vector.
pub fn to_f32_vec(bytes: &[u8], dtype: Dtype) -> Result<Vec<f32>> {
    let mut v = Vec::with_capacity(bytes.len() / 2);
    floats_to_f32(bytes, dtype, &mut v)?;
    Ok(v)
}

/// Reads little-endian I32 values.
pub fn to_i32_vec(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()
}
