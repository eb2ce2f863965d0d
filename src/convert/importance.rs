//! `--imatrix`: an importance matrix mapped onto the output tensors by their names (the format's
//! own names are llama.cpp's, which the matrix uses), each entry held to its tensor's columns and
//! experts, and what the report and the card say of the file.

use crate::imatrix::Imatrix;
use crate::layout::{Encoding, Importance, OutputTensor};
use crate::storage::Storage;
use anyhow::{bail, Result};
use serde::Serialize;
use std::collections::HashSet;
use std::path::Path;

/// What `--json` and the card record of the matrix.
#[derive(Clone, Debug, Serialize)]
pub struct ImatrixReport {
    /// The file's name (no directory: a card names no path of the machine).
    pub file: String,
    /// `gguf` (llama-imatrix's file) or `dat` (its legacy one).
    pub format: &'static str,
    pub sha256: String,
    /// The texts it was computed on.
    pub datasets: Vec<String>,
    /// Chunks of text it was computed on (0 where the file does not say).
    pub chunk_count: u32,
    /// Tokens per chunk (`null` for a `.dat` file).
    pub chunk_size: Option<u32>,
    /// Its entries, and how many output tensors are encoded with one.
    pub entries: usize,
    pub weighted_tensors: usize,
}

impl ImatrixReport {
    /// One line for the model card.
    pub fn words(&self) -> String {
        let datasets = if self.datasets.is_empty() { "unnamed text".to_string() } else { self.datasets.join(", ") };
        let size = self.chunk_size.map_or_else(String::new, |n| format!(" of {n} tokens"));
        format!(
            "`{}` ({} format, sha256 `{}`): {} entries from {} chunks{size} of {datasets}; {} tensors encoded with it, \
             as llama-quantize --imatrix encodes them",
            self.file, self.format, self.sha256, self.entries, self.chunk_count, self.weighted_tensors
        )
    }
}

/// Whether a tensor of `storage` made by `encoding` is encoded with an importance matrix: ggml's
/// block types from float rows, but `Q8_0`, which ggml encodes the same with or without.
fn weighs(storage: Storage, encoding: &Encoding) -> bool {
    matches!(storage, Storage::Block(b) if b != crate::block_type::BlockType::Q8_0) && *encoding == Encoding::Float
}

/// Reads `path` and gives each output tensor of `tensors` (every tensor of the model, before
/// `--only`) that a block type encodes the entry of its name. An entry naming no tensor of the
/// model, or holding other than its columns times its experts, is a matrix of another model:
/// refused, naming the first. A tensor without an entry is encoded without one, as llama-quantize
/// does, unless `needs` says its type needs one (llama-quantize aborts there): refused, naming it.
pub fn attach(
    path: &Path,
    tensors: &mut [OutputTensor],
    needs: &dyn Fn(&OutputTensor) -> bool,
) -> Result<ImatrixReport> {
    let m = Imatrix::read(path)?;
    let names: HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    if let Some(stray) = m.entries.keys().find(|n| !names.contains(n.as_str())) {
        bail!(
            "--imatrix {}: entry {stray} names no tensor of this model: a matrix of another model (make one with \
             llama-imatrix from a GGUF of this model)",
            path.display()
        );
    }
    let mut weighted = 0;
    for t in tensors.iter_mut() {
        let Some(entry) = m.entries.get(&t.name) else {
            if needs(t) {
                bail!(
                    "--imatrix {}: no entry for tensor {}, whose type {} needs one (llama-quantize stops there too){}",
                    path.display(),
                    t.name,
                    t.storage.name(),
                    if t.name.contains(".nextn.") {
                        ": llama-imatrix records no MTP tensor (inference never runs them); --mtp drop writes none"
                    } else {
                        ": a matrix made by llama-imatrix from a GGUF of this model has an entry for every tensor it runs"
                    }
                );
            }
            continue;
        };
        let cols = t.shape.last().copied().unwrap_or(1);
        let leads: usize = t.shape.iter().rev().skip(2).product();
        if entry.values.len() != cols * leads {
            bail!(
                "--imatrix {}: entry {} holds {} values, but the tensor has {cols} columns{}: a matrix of another model",
                path.display(),
                t.name,
                entry.values.len(),
                if leads > 1 { format!(" × {leads} experts") } else { String::new() }
            );
        }
        let storage = t.storage;
        if let Some(r) = t.recipe.as_mut().filter(|r| weighs(storage, &r.encoding)) {
            r.importance = Some(Importance(entry.values.clone()));
            weighted += 1;
        }
    }
    let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    Ok(ImatrixReport {
        file,
        format: m.format,
        sha256: m.sha256,
        datasets: m.datasets,
        chunk_count: m.chunk_count,
        chunk_size: m.chunk_size,
        entries: m.entries.len(),
        weighted_tensors: weighted,
    })
}
