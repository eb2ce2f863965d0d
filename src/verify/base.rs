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

/// Rows and columns of one fp8 scale block.
const FP8_BLOCK: usize = 128;

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
    name: &'a str,
    entry: &'a TensorEntry,
    /// The tensor's stored bytes.
    data: &'a [u8],
    scale_inv: Option<(&'a str, &'a TensorEntry)>,
    /// Rows of the piece in the matrix: stored rows `skip..skip + rows` of each lead.
    rows: usize,
    skip: usize,
    /// Stored rows per lead.
    height: usize,
}

/// One stored row of a base matrix (every column), read without a copy.
pub enum BaseRow<'a> {
    Bf16(&'a [u8]),
    /// F16 or F32.
    Float(&'a [u8], Dtype),
    /// fp8 e4m3 codes and the scale of each 128-column block of the row.
    Fp8(&'a [u8], Vec<f32>),
}

impl BaseRow<'_> {
    /// Columns `cols` as f32, replacing `out`; the values [`BaseMatrix::read_rows`] gives.
    pub fn values(&self, cols: Range<usize>, out: &mut Vec<f32>) {
        out.clear();
        match self {
            BaseRow::Bf16(b) => widen(&b[2 * cols.start..2 * cols.end], Dtype::BF16, out),
            BaseRow::Float(b, dtype) => {
                let el = dtype.bitsize() / 8;
                widen(&b[el * cols.start..el * cols.end], *dtype, out);
            }
            BaseRow::Fp8(b, scales) => {
                out.extend(cols.clone().map(|c| e4m3_to_f32(b[c]) * scales[c / FP8_BLOCK]));
            }
        }
    }
}

fn widen(bytes: &[u8], dtype: Dtype, out: &mut Vec<f32>) {
    floats_to_f32(bytes, dtype, out).expect("a float dtype, checked when the matrix was opened");
}

/// A base weight `[E?, rows, cols]`, possibly stored as several row ranges (MLX splits experts'
/// gate and up), or one expert's rows of a stacked weight (a per-expert linear of IN).
pub struct BaseMatrix<'a> {
    base: &'a Base,
    pieces: Vec<Piece<'a>>,
    /// The stored lead every read goes to, for a per-expert view.
    expert: Option<usize>,
    pub cols: usize,
    pub experts: Option<usize>,
    /// The base tensor names, for reports.
    pub names: Vec<String>,
}

impl Base {
    pub fn open(path: &Path) -> Result<Base> {
        let ck = Checkpoint::open(path)?;
        if let Some(why) = quantized(&ck) {
            bail!(
                "{}: BASE is quantized ({why}); verify needs the unquantized model (bf16, f16, f32 or fp8)",
                path.display()
            );
        }
        let layout = if ck.tensors.keys().any(|n| n.starts_with("language_model.model.")) {
            BaseLayout::Mlx
        } else {
            BaseLayout::HuggingFace
        };
        let fp8 = ck.tensors.values().any(|e| e.dtype == Dtype::F8_E4M3);
        Ok(Base { ck, layout, fp8 })
    }

    /// Whether a base of this layout holds tensor `hf` at all: an MLX-layout base never has the
    /// MTP head (mlx-lm has none), so its absence proves nothing wrong.
    pub fn may_hold(&self, hf: &str) -> bool {
        !(self.layout == BaseLayout::Mlx && crate::layout::mtp::is_mtp(hf))
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

    /// The base name and length of a float tensor, by HF name (read in pieces by the caller).
    pub fn vector(&self, hf: &str) -> Option<(String, usize)> {
        let name = self.rename(hf);
        let len = self.ck.tensors.get(&name).filter(|e| is_float(e.dtype))?.numel();
        Some((name, len))
    }

    /// The matrix behind HF name `hf` (`P.weight`, a fused expert parameter `P`, or one expert's
    /// `….experts.{e}.{gate,up,down}_proj.weight`, the per-expert layout of native EXL3, read from
    /// the base's stacked experts).
    pub fn matrix(&self, hf: &str) -> Result<Option<BaseMatrix<'_>>> {
        if !self.ck.tensors.contains_key(&self.rename(hf)) {
            if let Some((parent, e, proj)) = crate::layout::hf::expert_leaf(hf) {
                return self.expert_view(parent, e, proj);
            }
        }
        self.stored(hf)
    }

    /// Expert `e`'s `proj` of the stacked experts under `parent`: its rows of the fused
    /// `gate_up_proj` (gate first; MLX's `switch_mlp` stores the halves apart) or of `down_proj`.
    fn expert_view(&self, parent: &str, e: usize, proj: &str) -> Result<Option<BaseMatrix<'_>>> {
        let half = match proj {
            "gate_proj" => Some(0),
            "up_proj" => Some(1),
            _ => None,
        };
        let stacked = if half.is_some() { "gate_up_proj" } else { proj };
        let Some(mut m) = self.stored(&format!("{parent}.{stacked}"))? else { return Ok(None) };
        let Some(experts) = m.experts.filter(|&n| e < n) else { return Ok(None) };
        if let Some(h) = half {
            if m.pieces.len() == 2 {
                m.pieces.swap_remove(1 - h);
                m.names.swap_remove(1 - h);
            } else {
                let p = &mut m.pieces[0];
                if p.rows % 2 != 0 {
                    bail!("tensor {}: {} rows do not split into gate and up halves", p.name, p.rows);
                }
                p.rows /= 2;
                p.skip = h * p.rows;
                m.names[0] = format!("{}[{}]", m.names[0], ["gate", "up"][h]);
            }
        }
        m.expert = Some(e);
        m.experts = None;
        m.names[0] = format!("{} (expert {e} of {experts})", m.names[0]);
        Ok(Some(m))
    }

    /// The stored matrix behind HF name `hf`.
    fn stored(&self, hf: &str) -> Result<Option<BaseMatrix<'_>>> {
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
            let Some((n, entry)) = self.ck.tensors.get_key_value(n) else { return Ok(None) };
            let file = self.ck.file_of(entry).display();
            if !matches!(entry.shape.len(), 2 | 3) {
                bail!("{file}: tensor {n}: expected a matrix or a stack of matrices, found shape {:?}", entry.shape);
            }
            let scale_inv = self.scale_inv_of(n);
            match (entry.dtype, scale_inv) {
                (Dtype::F8_E4M3, None) => bail!("{file}: tensor {n}: fp8 weight without weight_scale_inv"),
                (Dtype::F8_E4M3, Some((s, se))) => check_scales(&self.ck, n, entry, s, se)?,
                (d, _) if is_float(d) => {}
                (d, _) => bail!("{file}: tensor {n}: unsupported base dtype {d:?}"),
            }
            let rows = entry.shape[entry.shape.len() - 2];
            pieces.push(Piece { name: n, entry, data: self.ck.bytes(entry), scale_inv, rows, skip: 0, height: rows });
        }
        let first = pieces[0].entry;
        let lead = &first.shape[..first.shape.len() - 1];
        for p in &pieces[1..] {
            let s = &p.entry.shape;
            if s.len() != first.shape.len()
                || s[..s.len() - 2] != lead[..lead.len() - 1]
                || s[s.len() - 1] != first.shape[first.shape.len() - 1]
            {
                bail!(
                    "{}: tensor {} and {}: tensor {} are parts of one weight but disagree in shape ({:?} vs {:?})",
                    self.ck.file_of(first).display(),
                    pieces[0].name,
                    self.ck.file_of(p.entry).display(),
                    p.name,
                    first.shape,
                    s
                );
            }
        }
        let rank = first.shape.len();
        Ok(Some(BaseMatrix {
            base: self,
            expert: None,
            cols: first.shape[rank - 1],
            experts: (rank == 3).then(|| first.shape[0]),
            pieces,
            names,
        }))
    }

    fn scale_inv_of(&self, name: &str) -> Option<(&str, &TensorEntry)> {
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        [format!("{stem}.weight_scale_inv"), format!("{name}_scale_inv")]
            .iter()
            .find_map(|n| self.ck.tensors.get_key_value(n))
            .map(|(k, v)| (k.as_str(), v))
    }
}

/// Why a checkpoint is quantized in a way verify cannot read, if it is.
fn quantized(ck: &Checkpoint) -> Option<String> {
    for (name, e) in &ck.tensors {
        if name.ends_with(".escha_code") || name.ends_with(".trellis") {
            return Some(format!("trellis codes: {name}"));
        }
        if let Some(stem) = name.strip_suffix(".scales") {
            if ck.tensors.contains_key(&format!("{stem}.biases")) {
                return Some(format!("MLX affine: {name}"));
            }
        }
        if name.ends_with(".qweight") || name.ends_with(".weight_packed") {
            return Some(format!("packed integer weights: {name}"));
        }
        if matches!(e.dtype, Dtype::F4 | Dtype::F6_E2M3 | Dtype::F6_E3M2 | Dtype::F8_E5M2 | Dtype::F8_E8M0) {
            return Some(format!("{:?} tensor {name}", e.dtype));
        }
    }
    None
}

/// Checks that an fp8 weight's block scales are one float per 128×128 block (per expert).
fn check_scales(ck: &Checkpoint, name: &str, w: &TensorEntry, scale: &str, s: &TensorEntry) -> Result<()> {
    let rank = w.shape.len();
    let experts: usize = w.shape[..rank - 2].iter().product();
    let want = experts * w.shape[rank - 2].div_ceil(FP8_BLOCK) * w.shape[rank - 1].div_ceil(FP8_BLOCK);
    if !is_float(s.dtype) || s.numel() != want {
        bail!(
            "{}: tensor {scale}: expected {want} float block scales for {name} {:?}, found {:?} {:?}",
            ck.file_of(s).display(),
            w.shape,
            s.dtype,
            s.shape
        );
    }
    Ok(())
}

impl BaseMatrix<'_> {
    pub fn rows(&self) -> usize {
        self.pieces.iter().map(|p| p.rows).sum()
    }

    /// The stored lead of expert `expert` (0 for a plain matrix).
    fn lead(&self, expert: usize) -> usize {
        self.expert.unwrap_or(expert)
    }

    /// Rows `rows` of expert `expert` (0 for a plain matrix) as f32, row-major, into `out`.
    pub fn read_rows(&self, expert: usize, rows: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        out.clear();
        let expert = self.lead(expert);
        let mut first_row = 0;
        for p in &self.pieces {
            let lo = rows.start.max(first_row);
            let hi = rows.end.min(first_row + p.rows);
            if lo < hi {
                self.read_piece(p, expert, lo - first_row..hi - first_row, out)?;
            }
            first_row += p.rows;
        }
        Ok(())
    }

    /// Row `r` of expert `expert` (0 for a plain matrix), as stored.
    pub fn row(&self, expert: usize, r: usize) -> Result<BaseRow<'_>> {
        let expert = self.lead(expert);
        let mut first_row = 0;
        for p in &self.pieces {
            if r >= first_row + p.rows {
                first_row += p.rows;
                continue;
            }
            let local = p.skip + r - first_row;
            let el = p.entry.dtype.bitsize() / 8;
            let start = (expert * p.height + local) * self.cols * el;
            let Some(bytes) = p.data.get(start..start + self.cols * el) else {
                bail!("tensor {}: row {local} of expert {expert} is outside its shape {:?}", p.name, p.entry.shape);
            };
            return Ok(match (p.entry.dtype, p.scale_inv) {
                (Dtype::F8_E4M3, Some((scale, _))) => {
                    let (br, bc) = (p.height.div_ceil(FP8_BLOCK), self.cols.div_ceil(FP8_BLOCK));
                    let first = (expert * br + local / FP8_BLOCK) * bc;
                    let mut scales = Vec::with_capacity(bc);
                    self.base.ck.elements_f32(scale, first..first + bc, &mut scales)?;
                    BaseRow::Fp8(bytes, scales)
                }
                (Dtype::BF16, _) => BaseRow::Bf16(bytes),
                (dtype, _) => BaseRow::Float(bytes, dtype),
            });
        }
        bail!("{}: row {r} is outside the matrix's {} rows", self.names.join(" + "), self.rows())
    }

    /// Drops the pages of rows `rows` of expert `expert` once they have been checked, so that
    /// memory stays flat within one large weight too (a page shared with the next rows is simply
    /// read again).
    pub fn release_rows(&self, expert: usize, rows: Range<usize>) {
        let expert = self.lead(expert);
        let mut first_row = 0;
        for p in &self.pieces {
            let (lo, hi) = (rows.start.max(first_row), rows.end.min(first_row + p.rows));
            if lo < hi {
                let row_bytes = self.cols * (p.entry.dtype.bitsize() / 8);
                let at = |r: usize| (expert * p.height + p.skip + r - first_row) * row_bytes;
                self.base.ck.release_part(p.entry, at(lo)..at(hi));
            }
            first_row += p.rows;
        }
    }

    /// Drops the base weight's pages from memory once it has been checked.
    pub fn release(&self) {
        for p in &self.pieces {
            self.base.ck.release(p.entry);
            if let Some((_, s)) = p.scale_inv {
                self.base.ck.release(s);
            }
        }
    }

    /// Rows `rows` of one piece (of stored lead `expert`), appended to `out`.
    fn read_piece(&self, p: &Piece, expert: usize, rows: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        let ck = &self.base.ck;
        let cols = self.cols;
        let rows = p.skip + rows.start..p.skip + rows.end;
        let Some((scale, _)) = p.scale_inv else {
            return ck.rows_f32(p.name, expert, rows, 0..cols, out);
        };
        // fp8: one scale per 128×128 block; only the block rows these rows touch are read.
        let mut codes = Vec::with_capacity(rows.len() * cols);
        ck.rows_bytes(p.name, expert, rows.clone(), 0..cols, &mut codes)?;
        let (br, bc) = (p.height.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK));
        let (b0, b1) = (rows.start / FP8_BLOCK, (rows.end - 1) / FP8_BLOCK + 1);
        let mut scales = Vec::with_capacity((b1 - b0) * bc);
        ck.elements_f32(scale, (expert * br + b0) * bc..(expert * br + b1) * bc, &mut scales)?;
        for (r, row) in rows.zip(codes.chunks_exact(cols)) {
            let srow = &scales[(r / FP8_BLOCK - b0) * bc..][..bc];
            out.extend(row.iter().enumerate().map(|(c, &q)| e4m3_to_f32(q) * srow[c / FP8_BLOCK]));
        }
        Ok(())
    }
}
