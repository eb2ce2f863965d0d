//! Typed access to a module's data: one expert (or the single linear) of a coded module ready to
//! reconstruct, and int8 rows dequantized.

use super::input::Checkpoint;
use super::modules::{CodedModule, Int8Module, Leaf};
use crate::codec::Codebook;
use crate::transform::{fold_scales, CodedLinear};
use anyhow::Result;
use std::ops::Range;

/// The codes and folded scales of one expert of a coded module.
pub struct ExpertLinear<'a> {
    pub code: &'a [u8],
    /// `rin·s_in`, length `IC_p`.
    pub su: Vec<f32>,
    /// `rout·s_out`, length `OC_p`.
    pub sv: Vec<f32>,
    k: u32,
    codebook: Codebook,
}

impl ExpertLinear<'_> {
    pub fn linear(&self) -> CodedLinear<'_> {
        CodedLinear { code: self.code, k: self.k, codebook: self.codebook, su: &self.su, sv: &self.sv }
    }
}

impl CodedModule {
    /// Expert `expert` (0 for a single linear): its slice of the codes and of every vector.
    pub fn expert<'a>(&self, ck: &'a Checkpoint, expert: usize) -> Result<ExpertLinear<'a>> {
        let (su, sv) =
            (self.folded(ck, Leaf::Rin, Leaf::SIn, expert)?, self.folded(ck, Leaf::Rout, Leaf::SOut, expert)?);
        let code_entry = ck.entry(self.tensor(Leaf::Code).expect("validated: every coded module has codes"))?;
        let per_expert = code_entry.byte_len() / self.expert_count();
        Ok(ExpertLinear {
            code: &ck.bytes(code_entry)[expert * per_expert..(expert + 1) * per_expert],
            su,
            sv,
            k: self.k,
            codebook: self.codebook,
        })
    }

    /// `rout·s_out` of one expert: the output channel scales (zero for a pruned channel).
    pub fn output_scales(&self, ck: &Checkpoint, expert: usize) -> Result<Vec<f32>> {
        self.folded(ck, Leaf::Rout, Leaf::SOut, expert)
    }

    /// `r·s` of one expert: the sign×scale vector `r` folded with the optional scale `s`.
    fn folded(&self, ck: &Checkpoint, r: Leaf, s: Leaf, expert: usize) -> Result<Vec<f32>> {
        let len = if r == Leaf::Rin { self.in_padded } else { self.out_padded };
        let vector = |leaf: Leaf| -> Result<Option<Vec<f32>>> {
            let Some(name) = self.tensor(leaf) else { return Ok(None) };
            let mut v = Vec::with_capacity(len);
            ck.elements_f32(name, expert * len..(expert + 1) * len, &mut v)?;
            Ok(Some(v))
        };
        let r = vector(r)?.expect("validated: every coded module has rin and rout");
        Ok(fold_scales(&r, vector(s)?.as_deref()))
    }

    /// Whether the module carries a bias with any non-zero value.
    pub fn has_nonzero_bias(&self, ck: &Checkpoint) -> Result<bool> {
        let Some(name) = self.tensor(Leaf::Bias) else { return Ok(false) };
        let mut v = Vec::new();
        ck.elements_f32(name, 0..ck.entry(name)?.numel(), &mut v)?;
        Ok(v.iter().any(|&x| x != 0.0))
    }
}

impl Int8Module {
    /// Rows `rows` as stored: their int8 codes appended to `codes`, their scales to `scales`.
    pub fn raw_rows(
        &self,
        ck: &Checkpoint,
        rows: Range<usize>,
        cols: Range<usize>,
        codes: &mut Vec<u8>,
        scales: &mut Vec<f32>,
    ) -> Result<()> {
        ck.elements_f32(&self.scale, rows.clone(), scales)?;
        ck.rows_bytes(&self.weight, 0, rows, cols, codes)
    }

    /// Rows `rows` (columns `cols`) as f32, appended to `out`: `w8 · scale`, exact in f32 (8 × 11
    /// bits).
    pub fn dequantize_rows(
        &self,
        ck: &Checkpoint,
        rows: Range<usize>,
        cols: Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (mut codes, mut scales) = (Vec::new(), Vec::new());
        let width = cols.len().max(1);
        self.raw_rows(ck, rows, cols, &mut codes, &mut scales)?;
        for (row, &scale) in codes.chunks_exact(width).zip(&scales) {
            out.extend(row.iter().map(|&q| q as i8 as f32 * scale));
        }
        Ok(())
    }
}
