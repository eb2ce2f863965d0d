//! An importance matrix as llama-imatrix writes it: per weight matrix (named as llama.cpp names
//! GGUF tensors), the mean squared activation of each input column, per expert for a stacked
//! expert tensor. Two files: the GGUF one (`<name>.in_sum2` and `<name>.counts`, `imatrix.datasets`,
//! `imatrix.chunk_count`, `imatrix.chunk_size`; `gguf.rs`) and the legacy `.dat` (`dat.rs`). The
//! values are what llama-quantize hands ggml (`load_imatrix` of tools/quantize): each sum divided by
//! its expert's count (rounded to an integer first; every value 1 for an expert whose count is 0),
//! or for `.dat` by the call count. Every length in the file is checked against what is left of it
//! before anything is allocated; NaN, infinite or negative values are refused, naming the entry.

mod dat;
mod gguf;
#[cfg(test)]
mod tests;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// One matrix's values: `values.len()` is the columns times the experts.
#[derive(Clone, Debug)]
pub struct Entry {
    pub values: Arc<[f32]>,
}

/// A loaded importance matrix and what the file says about itself.
#[derive(Clone, Debug)]
pub struct Imatrix {
    /// By llama.cpp tensor name (`blk.0.attn_q.weight`).
    pub entries: BTreeMap<String, Entry>,
    /// The texts it was computed on (`imatrix.datasets`; the `.dat` trailer's one).
    pub datasets: Vec<String>,
    /// Chunks of text it was computed on (0 where a `.dat` file does not say).
    pub chunk_count: u32,
    /// Tokens per chunk (`None` in a `.dat` file).
    pub chunk_size: Option<u32>,
    /// The file's SHA-256, hex.
    pub sha256: String,
    /// `"gguf"` or `"dat"`.
    pub format: &'static str,
}

/// The entries as read, before their values are normalized.
struct Raw {
    /// Name → (sums, counts per expert).
    entries: BTreeMap<String, (Vec<f32>, Vec<f32>)>,
    datasets: Vec<String>,
    chunk_count: u32,
    chunk_size: Option<u32>,
}

impl Imatrix {
    /// Reads `path`, GGUF when it starts with GGUF's magic, else the legacy format.
    pub fn read(path: &Path) -> Result<Imatrix> {
        let file = std::fs::File::open(path).with_context(|| format!("opening --imatrix {}", path.display()))?;
        // SAFETY: read-only; the file is read once, front to back, and not kept.
        let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        Imatrix::from_bytes(&map).with_context(|| format!("--imatrix {}", path.display()))
    }

    /// The matrix a file's bytes hold.
    pub fn from_bytes(bytes: &[u8]) -> Result<Imatrix> {
        let sha256 = format!("{:x}", Sha256::digest(bytes));
        let (raw, format) =
            if bytes.starts_with(b"GGUF") { (gguf::read(bytes), "gguf") } else { (dat::read(bytes), "dat") };
        let raw = raw.with_context(|| format!("reading it as {format}"))?;
        let legacy = format == "dat";
        let mut entries = BTreeMap::new();
        for (name, (sums, counts)) in raw.entries {
            let values = normalize(&sums, &counts, legacy).with_context(|| format!("entry {name}"))?;
            entries.insert(name, Entry { values: values.into() });
        }
        if entries.is_empty() {
            bail!("no entries");
        }
        Ok(Imatrix {
            entries,
            datasets: raw.datasets,
            chunk_count: raw.chunk_count,
            chunk_size: raw.chunk_size,
            sha256,
            format,
        })
    }
}

/// llama-quantize's values of one entry: GGUF sums over the rounded count of their expert (every
/// value 1 where it is 0), `.dat` sums over the call count (as they are where it is not positive).
fn normalize(sums: &[f32], counts: &[f32], legacy: bool) -> Result<Vec<f32>> {
    if let Some(i) = sums.iter().position(|v| !v.is_finite() || *v < 0.0) {
        bail!("value {i} is {}: an importance is a finite mean square, never negative", sums[i]);
    }
    if let Some(i) = counts.iter().position(|v| !v.is_finite() || *v < 0.0 || *v >= 9.0e15) {
        bail!("count {i} is {}, not a count of tokens", counts[i]);
    }
    if counts.is_empty() || sums.is_empty() || !sums.len().is_multiple_of(counts.len()) {
        bail!("{} values do not divide into {} experts' counts", sums.len(), counts.len());
    }
    let ne0 = sums.len() / counts.len();
    let mut out = Vec::with_capacity(sums.len());
    for (row, &count) in sums.chunks_exact(ne0).zip(counts) {
        // C++'s std::lround then back to float (GGUF), or the int32 call count (dat).
        let count = count.round() as i64 as f32;
        if legacy {
            out.extend(row.iter().map(|&s| if count > 0.0 { s / count } else { s }));
        } else if count > 0.0 {
            out.extend(row.iter().map(|&s| s / count));
        } else {
            out.extend(std::iter::repeat_n(1.0, ne0));
        }
    }
    // A finite sum over a positive count cannot become NaN or negative; a subnormal count could
    // overflow it.
    if let Some(i) = out.iter().position(|v| !v.is_finite()) {
        bail!("value {i} overflows when divided by its count");
    }
    Ok(out)
}

/// A little-endian reader over a file's bytes that refuses to read past its end.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.left() {
            bail!("truncated at byte {}: {n} bytes wanted, {} left", self.at, self.left());
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    /// `n` little-endian f32, `n` checked against what is left before allocating.
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        let bytes = self.take(n.checked_mul(4).context("length overflows")?)?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
    }
}
