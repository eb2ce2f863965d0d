//! Decoded weights for a format that needs to see them before it fixes its plan (`--bits auto`
//! chooses widths from them): the same rows the work units will read, in parallel.

use super::rows::Reader;
use super::units::{bulk_input, dims, lead_runs, ELEMENTS_PER_UNIT};
use crate::layout::{Adjust, RowSource, WeightProbe};
use crate::quant::affine::round_slice;
use crate::quant::affine_error::WidthErrors;
use anyhow::Result;
use rayon::prelude::*;
use safetensors::Dtype;
use std::ops::Range;

pub struct Probe<'a> {
    pub reader: &'a Reader<'a>,
    /// Look at this many evenly spread blocks per tensor only (an estimate of the whole).
    pub sample: Option<usize>,
}

type Errors = (WidthErrors, Option<WidthErrors>);

impl WeightProbe for Probe<'_> {
    fn affine_errors(
        &self,
        source: &RowSource,
        adjust: Adjust,
        gs: usize,
        scale_dtype: Dtype,
        exact: bool,
    ) -> Result<Errors> {
        let (leads, n, cols) = dims(source, self.reader.ck, self.reader.cat)?;
        let per_unit = (ELEMENTS_PER_UNIT / cols.max(1)).max(1);
        let mut runs: Vec<Range<usize>> = (0..leads)
            .flat_map(|lead| {
                lead_runs(source, n, per_unit).into_iter().map(move |r| lead * n + r.start..lead * n + r.end)
            })
            .collect();
        if let Some(k) = self.sample.filter(|&k| k < runs.len()) {
            runs = (0..k).map(|i| runs[(2 * i + 1) * runs.len() / (2 * k)].clone()).collect();
        }
        let none = || (WidthErrors::default(), exact.then(WidthErrors::default));
        let errors = runs
            .par_iter()
            .map_init(Vec::new, |values, rows| -> Result<Errors> {
                self.reader.f32_rows(source, rows.clone(), values)?;
                self.reader.adjust(adjust, source, rows.clone(), cols, values)?;
                round_slice(values, scale_dtype);
                let (mut estimate, mut measured) = none();
                estimate.add_estimate(values, cols, gs);
                if let Some(m) = &mut measured {
                    m.add_exact(values, cols, gs, scale_dtype);
                }
                Ok((estimate, measured))
            })
            .try_reduce(none, |a, b| Ok((a.0.merge(b.0), a.1.zip(b.1).map(|(x, y)| x.merge(y)))))?;
        // As in the conversion, a tensor's pages go once it is read, so that probing a model
        // never holds it all in memory (the conversion reads them again).
        let ck = self.reader.ck;
        let inputs = (0..leads).filter_map(|lead| bulk_input(source, lead, self.reader.cat));
        ck.release_all(inputs.map(|name| ck.entry(name)).collect::<Result<Vec<_>>>()?);
        Ok(errors)
    }
}
