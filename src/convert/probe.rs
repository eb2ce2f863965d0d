//! Decoded weights for a format that needs to see them before it fixes its plan (`--bits auto`
//! chooses widths from them): the same rows the work units will read, in parallel.

use super::rows::Reader;
use super::units::{bulk_input, dims, spans, Span};
use crate::layout::{Adjust, RowSource, WeightProbe};
use crate::quant::affine::round_slice;
use crate::quant::affine_error::WidthErrors;
use anyhow::Result;
use rayon::prelude::*;
use safetensors::Dtype;

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
        let mut spans: Vec<Span> = spans(source, (leads, n, cols), false).into_iter().map(|(_, s)| s).collect();
        if let Some(k) = self.sample.filter(|&k| k < spans.len()) {
            spans = (0..k).map(|i| spans[(2 * i + 1) * spans.len() / (2 * k)].clone()).collect();
        }
        let none = || (WidthErrors::default(), exact.then(WidthErrors::default));
        let errors = spans
            .par_iter()
            .map_init(Vec::new, |values, span| -> Result<Errors> {
                self.reader.f32_rows(source, span, values)?;
                self.reader.adjust(adjust, source, span, values)?;
                round_slice(values, scale_dtype);
                let width = span.cols.len();
                let (mut estimate, mut measured) = none();
                estimate.add_estimate(values, width, gs);
                if let Some(m) = &mut measured {
                    m.add_exact(values, width, gs, scale_dtype);
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
