//! Decoded weights for a format that needs to see them before it fixes its plan (`--bits auto`,
//! `--gguf-type auto` choose encodings from them): the same rows the work units will read, in
//! parallel.

use super::rows::Reader;
use super::units::{bulk_input, dims, spans, Span};
use crate::layout::{Adjust, Importance, RowSource, WeightProbe};
use crate::quant::affine::round_slice;
use crate::quant::affine_error::WidthErrors;
use crate::quant::block_error::{StorageErrors, WEIGHTED_MEASURED_VALUES};
use crate::storage::Storage;
use anyhow::Result;
use rayon::prelude::*;
use safetensors::Dtype;

/// Rows of a tensor per row its weighted affine errors are measured on (at most every 4th).
const MEASURED_ROWS: usize = 1024;

pub struct Probe<'a> {
    pub reader: &'a Reader<'a>,
    /// Look at this many evenly spread blocks per tensor only (an estimate of the whole).
    pub sample: Option<usize>,
    /// Measure a block type that has no range estimate (IQ4) on every this many rows only.
    pub measured_row_step: usize,
}

impl Probe<'_> {
    /// Folds `add` over the adjusted rows of `source` (each span's values and width), starting
    /// every worker from `empty()` and joining them with `merge`; then releases the input's pages,
    /// as the conversion does, so that probing a model never holds it all in memory.
    fn fold_rows<E: Send>(
        &self,
        source: &RowSource,
        adjust: Adjust,
        empty: impl Fn() -> E + Sync + Send,
        add: impl Fn(&mut E, &mut Vec<f32>, &Span, (usize, usize)) + Sync + Send,
        merge: impl Fn(E, E) -> E + Sync + Send,
    ) -> Result<E> {
        // A test sees here whether any weight was decoded before OUT was checked.
        static FIRST: std::sync::Once = std::sync::Once::new();
        FIRST.call_once(|| crate::signals::pause_point("probe"));
        let (leads, n, cols) = dims(source, self.reader.ck, self.reader.cat)?;
        let mut spans: Vec<Span> = spans(source, (leads, n, cols), false).into_iter().map(|(_, s)| s).collect();
        if let Some(k) = self.sample.filter(|&k| k < spans.len()) {
            spans = (0..k).map(|i| spans[(2 * i + 1) * spans.len() / (2 * k)].clone()).collect();
        }
        let folded = spans
            .par_iter()
            .map_init(Vec::new, |values, span| -> Result<E> {
                self.reader.f32_rows(source, span, values)?;
                self.reader.adjust(adjust, source, span, values)?;
                let mut e = empty();
                add(&mut e, values, span, (n, cols));
                Ok(e)
            })
            .try_reduce(&empty, |a, b| Ok(merge(a, b)))?;
        let ck = self.reader.ck;
        let inputs = (0..leads).filter_map(|lead| bulk_input(source, lead, self.reader.cat));
        ck.release_all(inputs.map(|name| ck.entry(name)).collect::<Result<Vec<_>>>()?);
        Ok(folded)
    }

    /// Every how many sampled rows an importance-weighted error is measured: every row of a
    /// tensor of up to 2047 rows (a small tensor's few rows are all the measure has, and its
    /// largest ratio may be the plan's), of a larger one every 2nd … 4th.
    fn weighted_row_step(&self, source: &RowSource) -> Result<usize> {
        let (leads, rows, _) = dims(source, self.reader.ck, self.reader.cat)?;
        Ok((leads * rows / MEASURED_ROWS).clamp(1, self.measured_row_step.div_ceil(4)))
    }
}

impl WeightProbe for Probe<'_> {
    fn affine_errors(
        &self,
        source: &RowSource,
        adjust: Adjust,
        gs: usize,
        scale_dtype: Dtype,
        exact: bool,
    ) -> Result<(WidthErrors, Option<WidthErrors>)> {
        self.fold_rows(
            source,
            adjust,
            || (WidthErrors::default(), exact.then(WidthErrors::default)),
            |(estimate, measured), values, span, _| {
                let width = span.cols.len();
                round_slice(values, scale_dtype);
                estimate.add_estimate(values, width, gs);
                if let Some(m) = measured {
                    m.add_exact(values, width, gs, scale_dtype);
                }
            },
            |a, b| (a.0.merge(b.0), a.1.zip(b.1).map(|(x, y)| x.merge(y))),
        )
    }

    fn affine_errors_at(
        &self,
        source: &RowSource,
        adjust: Adjust,
        group_sizes: &[usize],
        scale_dtype: Dtype,
        importance: Option<&Importance>,
    ) -> Result<Vec<WidthErrors>> {
        let step = self.weighted_row_step(source)?;
        self.fold_rows(
            source,
            adjust,
            || vec![WidthErrors::default(); group_sizes.len()],
            |errors, values, span, (rows_per_lead, cols)| {
                round_slice(values, scale_dtype);
                let width = span.cols.len();
                match importance {
                    // The ranges do not see which values the importance falls on: measured.
                    Some(importance) => {
                        let of_row =
                            |i: usize| importance.of_row(span.rows.start + i, rows_per_lead, cols, span.cols.clone());
                        // Of a large unit, rows holding about WEIGHTED_MEASURED_VALUES values, as GGUF's.
                        let step = step.max(values.len().div_ceil(WEIGHTED_MEASURED_VALUES));
                        WidthErrors::add_measured_at(errors, values, width, group_sizes, scale_dtype, step, &of_row);
                    }
                    None => WidthErrors::add_estimates_at(errors, values, width, group_sizes),
                }
            },
            |a, b| a.into_iter().zip(b).map(|(x, y)| x.merge(y)).collect(),
        )
    }

    fn storage_errors<'i>(
        &self,
        source: &RowSource,
        adjust: Adjust,
        candidates: &[Storage],
        exact: bool,
        importance: Option<&'i Importance>,
    ) -> Result<(StorageErrors, Option<StorageErrors>)> {
        let step = if importance.is_some() { self.weighted_row_step(source)? } else { self.measured_row_step };
        self.fold_rows(
            source,
            adjust,
            || (StorageErrors::new(candidates), exact.then(|| StorageErrors::new(candidates))),
            |(estimate, measured), values, span, (rows_per_lead, cols)| {
                let width = span.cols.len();
                let of_row = |i: usize| {
                    let importance = importance.expect("called with an importance only");
                    importance.of_row(span.rows.start + i, rows_per_lead, cols, span.cols.clone())
                };
                let weights = importance.map(|_| &of_row as &dyn Fn(usize) -> &'i [f32]);
                estimate.add_weighted(values, width, step, weights);
                if let Some(m) = measured {
                    m.add_exact(values, width);
                }
            },
            |a, b| (a.0.merge(b.0), a.1.zip(b.1).map(|(x, y)| x.merge(y))),
        )
    }
}
