//! One memory-mapped safetensors file and its validated header.

use super::regular::open_regular;
use super::tensor::TensorEntry;
use crate::signals;
use anyhow::{bail, Context, Result};
use memmap2::Mmap;
use safetensors::{SafeTensorError, SafeTensors};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// A safetensors file, mapped read-only. The input is never written.
pub struct Shard {
    pub path: PathBuf,
    mmap: Mmap,
    file: File,
    /// Size and modification time when it was opened.
    opened: (u64, Option<SystemTime>),
}

impl Shard {
    /// Maps `path` and reads its header; every tensor's offsets are checked against the file.
    pub fn open(path: &Path) -> Result<(Self, Vec<(String, TensorEntry)>)> {
        let file = open_regular(path)?;
        let stat = file.metadata().with_context(|| format!("{}: cannot read", path.display()))?;
        let opened = (stat.len(), stat.modified().ok());
        // SAFETY: the map is read-only. A file that shrinks while mapped raises SIGBUS on the next
        // read past its end: the handler registered below names it and removes the staging
        // output; any other change is caught by `check_unchanged` before the output is committed.
        let mmap = unsafe { Mmap::map(&file) }.with_context(|| format!("{}: cannot map", path.display()))?;
        signals::register_mapping(mmap.as_ptr(), mmap.len(), path);
        // Owned from here on, so that an invalid header still unregisters the mapping (Drop).
        let shard = Self { path: path.to_path_buf(), mmap, file, opened };
        let mmap = &shard.mmap;
        let (_, meta) = SafeTensors::read_metadata(mmap).map_err(|e| describe(path, mmap, e))?;
        let header_len = 8 + u64::from_le_bytes(mmap[..8].try_into().unwrap()) as usize;
        let mut entries: Vec<(String, TensorEntry)> = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (start, end) = info.data_offsets;
                let entry = TensorEntry {
                    shard: 0,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    range: header_len + start..header_len + end,
                };
                (name, entry)
            })
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((shard, entries))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// Fails when the file's size or modification time differs from when it was opened: what was
    /// read may not be what is there now.
    pub fn check_unchanged(&self) -> Result<()> {
        let meta = self.file.metadata().with_context(|| format!("{}: cannot read", self.path.display()))?;
        if (meta.len(), meta.modified().ok()) != self.opened {
            bail!(
                "{}: changed during conversion (size or modification time); no output was written",
                self.path.display()
            );
        }
        Ok(())
    }

    /// Drops the pages of `range` from this process's memory (they stay in the page cache), so
    /// resident memory does not grow with the model. Reading the range again simply re-faults it.
    pub fn release(&self, range: std::ops::Range<usize>) {
        // SAFETY: the mapping is private and never written, so after MADV_DONTNEED a later access
        // reads the same file bytes back; no reference observes different contents.
        let _ =
            unsafe { self.mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, range.start, range.len()) };
    }
}

/// One line naming the file (and, where the header can say, the tensor) and what is wrong with it.
fn describe(path: &Path, bytes: &[u8], e: SafeTensorError) -> anyhow::Error {
    let p = path.display();
    let len = bytes.len();
    let what = match e {
        SafeTensorError::HeaderTooSmall => format!("file of {len} bytes is too short to hold a safetensors header"),
        SafeTensorError::InvalidHeaderLength => {
            format!("header length runs past the end of the file ({len} bytes): truncated or not a safetensors file")
        }
        SafeTensorError::HeaderTooLarge => "header length is implausibly large: not a safetensors file".into(),
        SafeTensorError::InvalidHeader(_) => "header is not valid UTF-8".into(),
        SafeTensorError::InvalidHeaderDeserialization(e) => format!("header is not valid safetensors JSON: {e}"),
        SafeTensorError::InvalidOffset(name) => {
            format!("tensor {name}: data offsets are out of range or overlap another tensor")
        }
        SafeTensorError::TensorInvalidInfo | SafeTensorError::ValidationOverflow => {
            mis_sized(bytes).unwrap_or_else(|| {
                "a tensor's byte size does not match its dtype and shape (or its shape overflows)".into()
            })
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            format!("tensor data does not end at the end of the file ({len} bytes): truncated or padded")
        }
        other => format!("invalid safetensors file: {other}"),
    };
    anyhow::anyhow!("{p}: {what}")
}

/// The first tensor of a header (already read once, so bounded) whose shape overflows or whose
/// data offsets do not hold the bytes its shape and dtype need, said with both: the safetensors
/// crate's errors for these name no tensor.
fn mis_sized(bytes: &[u8]) -> Option<String> {
    let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let text = bytes.get(8..usize::try_from(len).ok()?.checked_add(8)?)?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(text).ok()?;
    header.into_iter().filter(|(name, _)| name != "__metadata__").find_map(|(name, v)| {
        let info: safetensors::tensor::TensorInfo = serde_json::from_value(v).ok()?;
        let (start, end) = info.data_offsets;
        let held = end.checked_sub(start)?;
        let shape = crate::text::shape(&info.shape);
        let dtype = info.dtype;
        let bits =
            info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).and_then(|n| n.checked_mul(dtype.bitsize()));
        match bits {
            None => Some(format!(
                "tensor {name}: shape {shape} of {dtype:?} overflows (its data offsets hold {held} bytes)"
            )),
            Some(bits) if bits.div_ceil(8) != held => Some(format!(
                "tensor {name}: shape {shape} of {dtype:?} is {} bytes, but its data offsets hold {held}",
                bits.div_ceil(8)
            )),
            Some(_) => None,
        }
    })
}

/// Fails unless `path` looks like a safetensors file by name.
pub fn require_safetensors_name(path: &Path) -> Result<()> {
    if path.extension().is_some_and(|e| e == "safetensors") {
        Ok(())
    } else {
        bail!("{}: not a .safetensors file", path.display())
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        signals::unregister_mapping(self.mmap.as_ptr());
    }
}
