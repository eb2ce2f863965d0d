//! The unquantized base model a decode is checked against: Hugging Face layout (bf16/f16/f32, or
//! fp8 e4m3 with 128×128 `weight_scale_inv` blocks) or MLX layout (renamed keys, split experts,
//! norms already +1). Tensors are looked up by their Hugging Face output name.

use crate::checkpoint::fp8::e4m3_to_f32;
use crate::checkpoint::tensor::{floats_to_f32, is_float};
use crate::checkpoint::{Checkpoint, TensorEntry};
use anyhow::{bail, Result};
use safetensors::Dtype;
use serde::Serialize;
use std::ops::Range;
use std::path::Path;

/// How the base checkpoint names and stores things.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BaseLayout {
    /// `model.language_model.*`, zero-centred norms, fused experts.
    HuggingFace,
    /// `language_model.model.*`, norms with +1 folded in, `switch_mlp` experts.
    Mlx,
}

pub struct Base {
    pub ck: Checkpoint,
    pub layout: BaseLayout,
    pub fp8: bool,
}

/// One stored piece of a base matrix, with its fp8 block scales when quantized.
struct Piece<'a> {
    entry: &'a TensorEntry,
    scale_inv: Option<&'a TensorEntry>,
    rows: usize,
}

/// A base weight `[E?, rows, cols]`, possibly stored as several row ranges (MLX splits experts'
/// gate and up).
pub struct BaseMatrix<'a> {
    base: &'a Base,
    pieces: Vec<Piece<'a>>,
    pub cols: usize,
    pub experts: Option<usize>,
    /// The base tensor names, for reports.
    pub names: Vec<String>,
}

impl Base {
    pub fn open(path: &Path) -> Result<Base> {
        let ck = Checkpoint::open(path)?;
        if let Some(coded) = ck.tensors.keys().find(|n| n.ends_with(".escha_code") || n.ends_with(".trellis")) {
            bail!("{}: holds trellis codes ({coded}); BASE must be the unquantized model", path.display());
        }
        let layout = if ck.tensors.keys().any(|n| n.starts_with("language_model.model.")) {
            BaseLayout::Mlx
        } else {
            BaseLayout::HuggingFace
        };
        let fp8 = ck.tensors.values().any(|e| e.dtype == Dtype::F8_E4M3);
        Ok(Base { ck, layout, fp8 })
    }

    /// The base name of an HF-layout tensor name.
    fn rename(&self, hf: &str) -> String {
        match self.layout {
            BaseLayout::HuggingFace => hf.to_string(),
            BaseLayout::Mlx => {
                if let Some(rest) = hf.strip_prefix("model.language_model.") {
                    format!("language_model.model.{rest}")
                } else if hf.starts_with("lm_head.") {
                    format!("language_model.{hf}")
                } else {
                    hf.to_string()
                }
            }
        }
    }

    /// A plain (1-D or small) tensor as f32, by HF name.
    pub fn vector(&self, hf: &str) -> Result<Option<Vec<f32>>> {
        let Some(e) = self.ck.tensors.get(&self.rename(hf)) else { return Ok(None) };
        if !is_float(e.dtype) {
            return Ok(None);
        }
        let mut v = Vec::new();
        floats_to_f32(self.ck.bytes(e), e.dtype, &mut v)?;
        Ok(Some(v))
    }

    /// The matrix behind HF name `hf` (`P.weight` or a fused expert parameter `P`).
    pub fn matrix(&self, hf: &str) -> Result<Option<BaseMatrix<'_>>> {
        let name = self.rename(hf);
        let mut names = vec![name.clone()];
        if !self.ck.tensors.contains_key(&name) && self.layout == BaseLayout::Mlx {
            // MLX keeps experts as switch_mlp.{gate,up,down}_proj.weight.
            if let Some(stem) = name.strip_suffix(".mlp.experts.gate_up_proj") {
                names = vec![
                    format!("{stem}.mlp.switch_mlp.gate_proj.weight"),
                    format!("{stem}.mlp.switch_mlp.up_proj.weight"),
                ];
            } else if let Some(stem) = name.strip_suffix(".mlp.experts.down_proj") {
                names = vec![format!("{stem}.mlp.switch_mlp.down_proj.weight")];
            }
        }
        let mut pieces = Vec::new();
        for n in &names {
            let Some(entry) = self.ck.tensors.get(n) else { return Ok(None) };
            let scale_inv = self.scale_inv_of(n);
            let rank = entry.shape.len();
            if rank < 2 {
                bail!(
                    "{}: tensor {n}: expected a matrix, found shape {:?}",
                    self.ck.file_of(entry).display(),
                    entry.shape
                );
            }
            if entry.dtype == Dtype::F8_E4M3 && scale_inv.is_none() {
                bail!("{}: tensor {n}: fp8 weight without weight_scale_inv", self.ck.file_of(entry).display());
            }
            pieces.push(Piece { entry, scale_inv, rows: entry.shape[rank - 2] });
        }
        let first = pieces[0].entry;
        let rank = first.shape.len();
        Ok(Some(BaseMatrix {
            base: self,
            cols: first.shape[rank - 1],
            experts: (rank == 3).then(|| first.shape[0]),
            pieces,
            names,
        }))
    }

    fn scale_inv_of(&self, name: &str) -> Option<&TensorEntry> {
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        [format!("{stem}.weight_scale_inv"), format!("{name}_scale_inv")].iter().find_map(|n| self.ck.tensors.get(n))
    }
}

impl BaseMatrix<'_> {
    pub fn rows(&self) -> usize {
        self.pieces.iter().map(|p| p.rows).sum()
    }

    /// Rows `rows` of expert `expert` (0 for a plain matrix) as f32, row-major, into `out`.
    pub fn read_rows(&self, expert: usize, rows: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        out.clear();
        let mut first_row = 0;
        let mut tmp = Vec::new();
        for p in &self.pieces {
            let lo = rows.start.max(first_row);
            let hi = rows.end.min(first_row + p.rows);
            if lo < hi {
                read_piece(self.base, p, expert, lo - first_row..hi - first_row, self.cols, &mut tmp)?;
                out.extend_from_slice(&tmp);
            }
            first_row += p.rows;
        }
        Ok(())
    }
}

fn read_piece(
    base: &Base,
    p: &Piece,
    expert: usize,
    rows: Range<usize>,
    cols: usize,
    out: &mut Vec<f32>,
) -> Result<()> {
    let e = p.entry;
    let el = e.dtype.bitsize() / 8;
    let start = (expert * p.rows + rows.start) * cols * el;
    let bytes = &base.ck.bytes(e)[start..start + rows.len() * cols * el];
    match (e.dtype, p.scale_inv) {
        (Dtype::F8_E4M3, Some(s)) => {
            let mut scales = Vec::new();
            floats_to_f32(base.ck.bytes(s), s.dtype, &mut scales)?;
            let (br, bc) = (p.rows.div_ceil(128), cols.div_ceil(128));
            if scales.len() != base_blocks(e, br, bc) {
                bail!(
                    "{}: tensor {}: weight_scale_inv has {} values, expected {}",
                    base.ck.file_of(s).display(),
                    "scale",
                    scales.len(),
                    base_blocks(e, br, bc)
                );
            }
            out.clear();
            for (r, row) in rows.clone().zip(bytes.chunks_exact(cols)) {
                let srow = &scales[(expert * br + r / 128) * bc..][..bc];
                out.extend(row.iter().enumerate().map(|(c, &q)| e4m3_to_f32(q) * srow[c / 128]));
            }
        }
        (d, _) if is_float(d) => {
            out.clear();
            floats_to_f32(bytes, d, out)?
        }
        (d, _) => bail!("{}: base tensor has unsupported dtype {d:?}", base.ck.file_of(e).display()),
    }
    Ok(())
}

fn base_blocks(e: &TensorEntry, br: usize, bc: usize) -> usize {
    let experts = if e.shape.len() == 3 { e.shape[0] } else { 1 };
    experts * br * bc
}
