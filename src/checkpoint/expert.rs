//! Typed access to a module's data: one expert (or the single linear) of a coded module ready to
//! reconstruct, and int8 rows dequantized.

use super::tensor::floats_to_f32;
use super::{Checkpoint, CodedModule, Int8Module, Leaf};
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
        let vector = |leaf: Leaf, len: usize| -> Result<Option<Vec<f32>>> {
            let Some(name) = self.tensor(leaf) else { return Ok(None) };
            let e = &ck.tensors[name];
            let el = e.dtype.bitsize() / 8;
            let mut v = Vec::with_capacity(len);
            floats_to_f32(&ck.bytes(e)[expert * len * el..(expert + 1) * len * el], e.dtype, &mut v)?;
            Ok(Some(v))
        };
        let rin = vector(Leaf::Rin, self.in_padded)?.expect("validated: every coded module has rin");
        let rout = vector(Leaf::Rout, self.out_padded)?.expect("validated: every coded module has rout");
        let s_in = vector(Leaf::SIn, self.in_padded)?;
        let s_out = vector(Leaf::SOut, self.out_padded)?;
        let code_entry = &ck.tensors[self.tensor(Leaf::Code).expect("validated: every coded module has codes")];
        let per_expert = code_entry.byte_len() / self.expert_count();
        Ok(ExpertLinear {
            code: &ck.bytes(code_entry)[expert * per_expert..(expert + 1) * per_expert],
            su: fold_scales(&rin, s_in.as_deref()),
            sv: fold_scales(&rout, s_out.as_deref()),
            k: self.k,
            codebook: self.codebook,
        })
    }

    /// Whether the module carries a bias with any non-zero value.
    pub fn has_nonzero_bias(&self, ck: &Checkpoint) -> Result<bool> {
        let Some(name) = self.tensor(Leaf::Bias) else { return Ok(false) };
        let e = &ck.tensors[name];
        let mut v = Vec::new();
        floats_to_f32(ck.bytes(e), e.dtype, &mut v)?;
        Ok(v.iter().any(|&x| x != 0.0))
    }
}

impl Int8Module {
    /// Rows `rows` as f32, appended to `out`: `w8 · scale`, exact in f32 (8 × 11 bits).
    pub fn dequantize_rows(&self, ck: &Checkpoint, rows: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        let cols = self.shape[1];
        let (w, s) = (&ck.tensors[&self.weight], &ck.tensors[&self.scale]);
        let s_el = s.dtype.bitsize() / 8;
        let mut scales = Vec::with_capacity(rows.len());
        floats_to_f32(&ck.bytes(s)[rows.start * s_el..rows.end * s_el], s.dtype, &mut scales)?;
        let weights = &ck.bytes(w)[rows.start * cols..rows.end * cols];
        for (row, &scale) in weights.chunks_exact(cols).zip(&scales) {
            out.extend(row.iter().map(|&q| q as i8 as f32 * scale));
        }
        Ok(())
    }
}
