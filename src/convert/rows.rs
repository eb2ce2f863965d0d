//! Reading the rows of a row source, and adjusting them: the engine's one way into the input.

use super::units::{dims, Span};
use crate::checkpoint::tensor::view;
use crate::checkpoint::{Catalog, Checkpoint};
use crate::codec::TileDecoder;
use crate::layout::{Adjust, RowSource};
use crate::transform::hadamard::HADAMARD_SIZE;
use anyhow::{bail, Result};
use std::ops::Range;

/// Reads rows from one opened checkpoint.
pub struct Reader<'a> {
    pub ck: &'a Checkpoint,
    pub cat: &'a Catalog,
    pub decoder: &'a dyn TileDecoder,
}

impl Reader<'_> {
    /// Span `span` of `source` as f32, `rows × cols` values, replacing `out`.
    pub fn f32_rows(&self, source: &RowSource, span: &Span, out: &mut Vec<f32>) -> Result<()> {
        let Span { rows, cols } = span.clone();
        match source {
            RowSource::Coded { module, rows: all } => {
                let [(lead, r)] = lead_runs(all.len(), rows).try_into().map_err(|_| several_leads())?;
                if cols != (0..self.cat.coded[*module].in_features) {
                    bail!("{}: a coded row is reconstructed whole, not columns {cols:?}", self.cat.coded[*module].path);
                }
                // Reconstructed in place: `out` keeps its size from one block to the next.
                self.coded_rows(*module, lead, all.start + r.start..all.start + r.end, out)
            }
            RowSource::Stack(members) => {
                let n = dims(source, self.ck, self.cat)?.1;
                let [(lead, r)] = lead_runs(n, rows).try_into().map_err(|_| several_leads())?;
                self.f32_rows(&members[lead], &Span { rows: r, cols }, out)
            }
            RowSource::Reordered { inner, cols: order, .. } => {
                self.f32_rows(inner, &self.inner_span(source, span)?, out)?;
                if let Some(order) = order {
                    order.apply_to_rows(out, &mut Vec::new());
                }
                Ok(())
            }
            RowSource::Int8(i) => {
                out.clear();
                self.cat.int8[*i].dequantize_rows(self.ck, rows, cols, out)
            }
            RowSource::Tensor { name, rows: all, cols: width } => {
                out.clear();
                if self.is_whole(name, all, *width)? && cols.len() == *width {
                    // Leads follow each other: output rows are the tensor's rows in order.
                    return self.ck.elements_f32(name, rows.start * width..rows.end * width, out);
                }
                for (lead, r) in lead_runs(all.len(), rows) {
                    self.ck.rows_f32(name, lead, all.start + r.start..all.start + r.end, cols.clone(), out)?;
                }
                Ok(())
            }
            RowSource::Slice { name, leads, rows: all, cols: box_cols } => {
                out.clear();
                for (lead, r) in lead_runs(all.len(), rows) {
                    let c = box_cols.start + cols.start..box_cols.start + cols.end;
                    self.ck.rows_f32(name, leads.start + lead, all.start + r.start..all.start + r.end, c, out)?;
                }
                Ok(())
            }
            RowSource::Product(a, b) => {
                let (mut x, mut y) = (Vec::new(), Vec::new());
                self.f32_rows(a, span, &mut x)?;
                self.f32_rows(b, span, &mut y)?;
                out.clear();
                out.extend(
                    x.iter().zip(&y).map(|(&x, &y)| crate::quant::dense::round_to_odd(f64::from(x) * f64::from(y))),
                );
                Ok(())
            }
            RowSource::Literal { .. } => bail!("a constant is copied as bytes, not read as numbers"),
        }
    }

    /// The span of a reordered source's input that its span `span` reads: the rows its row order
    /// maps them from (a unit lies within one run of the order), and every column when the
    /// columns are reordered.
    fn inner_span(&self, source: &RowSource, span: &Span) -> Result<Span> {
        let RowSource::Reordered { rows: row_order, cols: col_order, .. } = source else {
            bail!("not a reordered source");
        };
        let width = dims(source, self.ck, self.cat)?.2;
        if col_order.is_some_and(|o| o.width() != width || span.cols != (0..width)) {
            bail!("{}: columns are reordered in whole rows only", source.describe(self.cat));
        }
        let rows = match row_order {
            None => span.rows.clone(),
            Some(order) => {
                let first = order.source(span.rows.start);
                let last = order.source(span.rows.end - 1);
                if span.rows.is_empty() || last + 1 != first + span.rows.len() {
                    bail!("{}: rows {:?} do not stay together in the new order", source.describe(self.cat), span.rows);
                }
                first..last + 1
            }
        };
        Ok(Span { rows, cols: span.cols.clone() })
    }

    /// Span `span` of a tensor source as stored bytes, replacing `out`.
    pub fn byte_rows(&self, source: &RowSource, span: &Span, out: &mut Vec<u8>) -> Result<()> {
        let Span { rows, cols } = span.clone();
        out.clear();
        match source {
            RowSource::Slice { name, leads, rows: all, cols: box_cols } => {
                for (lead, r) in lead_runs(all.len(), rows) {
                    let c = box_cols.start + cols.start..box_cols.start + cols.end;
                    self.ck.rows_bytes(name, leads.start + lead, all.start + r.start..all.start + r.end, c, out)?;
                }
                return Ok(());
            }
            RowSource::Literal { bytes, width } => {
                let size = bytes.len() / (*width).max(1);
                out.extend_from_slice(&bytes[cols.start * size..cols.end * size]);
                return Ok(());
            }
            _ => {}
        }
        let RowSource::Tensor { name, rows: all, cols: width } = source else {
            bail!("only input tensors can be copied as bytes");
        };
        if self.is_whole(name, all, *width)? && cols.len() == *width {
            return self.ck.element_bytes(name, rows.start * width..rows.end * width, out);
        }
        for (lead, r) in lead_runs(all.len(), rows) {
            self.ck.rows_bytes(name, lead, all.start + r.start..all.start + r.end, cols.clone(), out)?;
        }
        Ok(())
    }

    /// Whether a tensor source covers every row and column of its tensor.
    fn is_whole(&self, name: &str, rows: &Range<usize>, cols: usize) -> Result<bool> {
        let (_, height, width) = view(&self.ck.entry(name)?.shape);
        Ok(*rows == (0..height) && cols == width)
    }

    /// Span `span` of an int8 source as stored: codes and row scales, replacing both.
    pub fn int8_rows(&self, source: &RowSource, span: &Span, codes: &mut Vec<u8>, scales: &mut Vec<f32>) -> Result<()> {
        if let RowSource::Reordered { inner, cols: order, .. } = source {
            self.int8_rows(inner, &self.inner_span(source, span)?, codes, scales)?;
            if let Some(order) = order {
                order.apply_to_rows(codes, &mut Vec::new());
            }
            return Ok(());
        }
        let RowSource::Int8(i) = source else { bail!("only int8 pairs are repacked") };
        codes.clear();
        scales.clear();
        self.cat.int8[*i].raw_rows(self.ck, span.rows.clone(), span.cols.clone(), codes, scales)
    }

    /// Rows `rows` (within one 128-row block) of expert `lead` of a coded module, reconstructed.
    fn coded_rows(&self, module: usize, lead: usize, rows: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        let m = &self.cat.coded[module];
        let block = rows.start / HADAMARD_SIZE;
        if rows.is_empty() || (rows.end - 1) / HADAMARD_SIZE != block {
            bail!("{}: coded rows {rows:?} do not lie in one 128-row block", m.path);
        }
        let (ic, ic_p) = (m.in_features, m.in_padded);
        out.resize(HADAMARD_SIZE * ic_p, 0.0);
        m.expert(self.ck, lead)?.linear().reconstruct_block(self.decoder, block, out);
        // Keep the requested rows and the true input width, moving rows down in place.
        let first = rows.start - block * HADAMARD_SIZE;
        if first > 0 || ic < ic_p {
            for r in 0..rows.len() {
                let from = (first + r) * ic_p;
                out.copy_within(from..from + ic, r * ic);
            }
        }
        out.truncate(rows.len() * ic);
        Ok(())
    }

    /// Applies `adjust` to `values`, span `span` of `source`.
    pub fn adjust(&self, adjust: Adjust, source: &RowSource, span: &Span, values: &mut [f32]) -> Result<()> {
        if adjust.plus_one {
            for v in values.iter_mut() {
                *v += 1.0;
            }
        }
        if adjust.neg_exp {
            for v in values.iter_mut() {
                *v = -f64::from(*v).exp() as f32;
            }
        }
        if let Some(g) = adjust.dead_columns_of {
            let n = dims(source, self.ck, self.cat)?.1;
            let gate_up = &self.cat.coded[g];
            let half = gate_up.out_features / 2;
            let width = span.cols.len();
            let mut start = 0;
            for (lead, r) in lead_runs(n, span.rows.clone()) {
                let sv = gate_up.output_scales(self.ck, lead)?;
                let dead: Vec<usize> = span
                    .cols
                    .clone()
                    .filter(|&c| c < half && sv[c] == 0.0 && sv[half + c] == 0.0)
                    .map(|c| c - span.cols.start)
                    .collect();
                let run = &mut values[start * width..(start + r.len()) * width];
                start += r.len();
                if dead.is_empty() {
                    continue;
                }
                for row in run.chunks_exact_mut(width) {
                    for &c in &dead {
                        row[c] = 0.0;
                    }
                }
            }
        }
        Ok(())
    }
}

fn several_leads() -> anyhow::Error {
    anyhow::anyhow!("a work unit of a coded or stacked source spans several leads")
}

/// Output rows `rows` of a source with `n` rows per lead, as runs within one lead each:
/// `(lead, rows within the lead)`.
fn lead_runs(n: usize, rows: Range<usize>) -> Vec<(usize, Range<usize>)> {
    let mut runs = Vec::new();
    let mut g = rows.start;
    while g < rows.end && n > 0 {
        let lead = g / n;
        let end = rows.end.min((lead + 1) * n);
        runs.push((lead, g - lead * n..end - lead * n));
        g = end;
    }
    runs
}
