//! `--imatrix`: an importance matrix mapped onto the output tensors through the format's map of
//! its tensors to llama.cpp's names (which the matrix uses), each entry held to its tensor's
//! columns and experts, and what the report and the card say of the file.

use crate::imatrix::Imatrix;
use crate::layout::{Encoding, HeadOrder, ImatrixKey, Importance, OutputTensor};
use crate::storage::Storage;
use anyhow::{bail, Result};
use serde::Serialize;
use std::collections::HashMap;
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
    /// Output tensors whose storage the size budget chose with their errors weighed by an entry.
    pub steered_tensors: usize,
}

impl ImatrixReport {
    /// One line for the model card.
    pub fn words(&self) -> String {
        let datasets = if self.datasets.is_empty() { "unnamed text".to_string() } else { self.datasets.join(", ") };
        let size = self.chunk_size.map_or_else(String::new, |n| format!(" of {n} tokens"));
        let steered = match self.steered_tensors {
            0 => String::new(),
            n => format!("the size budget chose the storage of {n} tensors with their errors weighted by it; "),
        };
        let encoded = match self.weighted_tensors {
            0 if self.steered_tensors > 0 => "no tensor is encoded with it (the encoding takes none)".to_string(),
            n => format!("{n} tensors encoded with it, as llama-quantize --imatrix encodes them"),
        };
        format!(
            "`{}` ({} format, sha256 `{}`): {} entries from {} chunks{size} of {datasets}; {steered}{encoded}",
            self.file, self.format, self.sha256, self.entries, self.chunk_count
        )
    }
}

/// Whether a tensor of `storage` made by `encoding` is encoded with an importance matrix: ggml's
/// block types from float rows, but `Q8_0`, which ggml encodes the same with or without.
fn weighs(storage: Storage, encoding: &Encoding) -> bool {
    matches!(storage, Storage::Block(b) if b != crate::block_type::BlockType::Q8_0) && *encoding == Encoding::Float
}

/// An importance matrix read and held to the model's tensors.
pub struct Matrix {
    path: std::path::PathBuf,
    m: Imatrix,
    /// Each output tensor's entry, by its name, in its own order of columns.
    of: HashMap<String, Importance>,
}

/// Reads `path` and checks it against `tensors` (every tensor of the model, before `--only`),
/// whose entries `keys` name (the format's map to llama.cpp's names). An entry naming no tensor of
/// the model, or holding other than its tensor's columns times its experts, is a matrix of
/// another model: refused, naming the first. A tensor without an entry is encoded without one, as
/// llama-quantize does.
pub fn read(path: &Path, tensors: &[OutputTensor], keys: &[Option<ImatrixKey>]) -> Result<Matrix> {
    let m = Imatrix::read(path)?;
    let held: HashMap<&str, &OutputTensor> =
        tensors.iter().zip(keys).filter_map(|(t, k)| Some((k.as_ref()?.name.as_str(), t))).collect();
    if let Some(stray) = m.entries.keys().find(|n| !held.contains_key(n.as_str())) {
        bail!(
            "--imatrix {}: entry {stray} names no tensor of this model: a matrix of another model (make one with \
             llama-imatrix from a GGUF of this model)",
            path.display()
        );
    }
    let mut of = HashMap::new();
    for (t, key) in tensors.iter().zip(keys) {
        let Some(key) = key else { continue };
        let Some(entry) = m.entries.get(&key.name) else { continue };
        // The logical columns (an affine weight's last dimension packs them into words).
        let cols = t.columns();
        let leads: usize = t.shape.iter().rev().skip(2).product();
        let tensor = if key.name == t.name { String::new() } else { format!(" (tensor {})", t.name) };
        if entry.values.len() != cols * leads {
            bail!(
                "--imatrix {}: entry {}{tensor} holds {} values, but the tensor has {cols} columns{}: a matrix of another \
                 model",
                path.display(),
                key.name,
                entry.values.len(),
                if leads > 1 { format!(" × {leads} experts") } else { String::new() }
            );
        }
        let values = match key.cols {
            None => entry.values.clone(),
            Some(order) if order.width() == cols => in_own_order(&entry.values, cols, order).into(),
            Some(order) => bail!(
                "--imatrix {}: tensor {} has {cols} columns, but the linear-attention heads of config.json order {}",
                path.display(),
                t.name,
                order.width()
            ),
        };
        of.insert(t.name.clone(), Importance(values));
    }
    Ok(Matrix { path: path.to_path_buf(), m, of })
}

/// `values` (per lead, `cols` columns in llama.cpp's `order`) in the tensor's own column order:
/// llama.cpp's column i is the tensor's column `order.source(i)`.
fn in_own_order(values: &[f32], cols: usize, order: HeadOrder) -> Vec<f32> {
    let mut mine = vec![0.0f32; values.len()];
    for (lead, theirs) in values.chunks_exact(cols).enumerate() {
        for (i, &v) in theirs.iter().enumerate() {
            mine[lead * cols + order.source(i)] = v;
        }
    }
    mine
}

impl Matrix {
    /// Gives every tensor with an entry its importance, whatever it is stored as now: `--max-size`
    /// weighs each option's error by it before the types are chosen. The entries are shared, not
    /// copied.
    pub fn measure_with(&self, tensors: &mut [OutputTensor]) {
        for t in tensors.iter_mut() {
            if let (Some(importance), Some(r)) = (self.of.get(&t.name), t.recipe.as_mut()) {
                r.importance = Some(importance.clone());
            }
        }
    }

    /// Gives each tensor that a block type encodes from float rows the entry of its name (and
    /// takes it from every other), and says what was weighed (`steered`: the tensors the size
    /// budget chose for with weighted errors). A tensor without an entry whose type `needs` one is
    /// refused, naming it (llama-quantize aborts there).
    pub fn attach(
        self,
        tensors: &mut [OutputTensor],
        needs: &dyn Fn(&OutputTensor) -> bool,
        steered: usize,
    ) -> Result<ImatrixReport> {
        let mut weighted = 0;
        for t in tensors.iter_mut() {
            if !self.of.contains_key(&t.name) && needs(t) {
                bail!(
                    "--imatrix {}: no entry for tensor {}, whose type {} needs one (llama-quantize stops there too){}",
                    self.path.display(),
                    t.name,
                    t.storage.name(),
                    if t.name.contains(".nextn.") {
                        ": llama-imatrix records no MTP tensor (inference never runs them); --mtp drop writes none"
                    } else {
                        ": a matrix made by llama-imatrix from a GGUF of this model has an entry for every tensor it runs"
                    }
                );
            }
            let storage = t.storage;
            let Some(r) = t.recipe.as_mut() else { continue };
            r.importance = match self.of.get(&t.name) {
                Some(importance) if weighs(storage, &r.encoding) => {
                    weighted += 1;
                    Some(importance.clone())
                }
                _ => None,
            };
        }
        let path = &self.path;
        let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let m = self.m;
        Ok(ImatrixReport {
            file,
            format: m.format,
            sha256: m.sha256,
            datasets: m.datasets,
            chunk_count: m.chunk_count,
            chunk_size: m.chunk_size,
            entries: m.entries.len(),
            weighted_tensors: weighted,
            steered_tensors: steered,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_in_tiled_v_head_order_is_taken_back_to_grouped() {
        // Two key heads of two V heads of 3 columns: llama.cpp lays out k0v0 k1v0 k0v1 k1v1, the
        // tensor k0v0 k0v1 k1v0 k1v1. Each value is its llama.cpp column (plus 100 for lead 1).
        let (key_heads, per_key, head) = (2, 2, 3);
        let order = HeadOrder { skip: 0, key_heads, per_key, head };
        let cols = order.width();
        let theirs: Vec<f32> = (0..2 * cols).map(|i| (i % cols + 100 * (i / cols)) as f32).collect();
        let mine = in_own_order(&theirs, cols, order);
        for lead in 0..2 {
            for k in 0..key_heads {
                for v in 0..per_key {
                    for d in 0..head {
                        let own = (k * per_key + v) * head + d;
                        let llama = (v * key_heads + k) * head + d;
                        assert_eq!(mine[lead * cols + own], (llama + 100 * lead) as f32, "k{k} v{v} d{d}");
                    }
                }
            }
        }
    }
}
