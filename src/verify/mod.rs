//! `verify`: proves a decode right against the unquantized base model.
//!
//! Per coded linear (per expert for stacks, `coded.rs`): the overlap rule on the states the
//! conversion's own decoder extracts, the error ratio to the Shannon bound over live channels,
//! element-wise correlation and cosine, channel-scale correlations and the inner-domain scale.
//! Per norm (`norms.rs`): the norm-offset table. Per int8 pair (`int8.rs`): error against the
//! base. Work is split into 128-row output blocks and run in parallel; sums merge in a fixed
//! order, so reports are reproducible. Base rows are released as soon as they are compared, an
//! expert's codes when the expert is done and every tensor's pages once it is checked, so memory
//! grows neither with the model nor with its largest tensor.

mod base;
mod coded;
mod columns;
mod findings;
mod html;
mod int8;
mod names;
mod norms;
mod options;
mod report;
mod stats;

pub use base::BaseLayout;
pub use findings::{CodedFigures, CodedRow, ExpertRow, Int8Row, NormRow, VerifyReport};
pub use html::{render_html, write_html};
pub use options::{check_max_ratio, check_min_corr, VerifyOptions, DEFAULT_MAX_RATIO};
pub use report::render;

use crate::checkpoint::{catalog, Checkpoint, Leaf};
use crate::codec::TileDecoder;
use crate::layout::{hf, BiasMode, DenseDtype, RowSource};
use crate::select::selected;
use anyhow::{bail, Result};
use base::Base;
use findings::{failed, order};

pub fn verify(opts: &VerifyOptions, decoder: &dyn TileDecoder) -> Result<VerifyReport> {
    check_max_ratio(opts.max_ratio).map_err(anyhow::Error::msg)?;
    if let Some(c) = opts.min_corr {
        check_min_corr(c).map_err(anyhow::Error::msg)?;
    }
    let ck = Checkpoint::open(&opts.input)?;
    let cat = catalog(&ck)?;
    cat.check_convertible(&ck, true)?;
    let base = Base::open(&opts.base)?;
    let mut warnings = cat.notes();
    let pool = crate::pool::pool(opts.threads, &mut warnings)?;

    let outputs: Vec<_> = hf::tensors(&ck, &cat, DenseDtype::Bf16, BiasMode::Drop)
        .into_iter()
        .filter(|t| selected(&t.name, &opts.only) && base.may_hold(&t.name))
        .collect();
    if outputs.is_empty() && !opts.only.is_empty() {
        bail!("--only {} matches no tensor of {}", opts.only.join(" "), opts.input.display());
    }
    let (mut coded, mut int8, mut missing, mut missing_coded) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for t in &outputs {
        match t.recipe.as_ref().map(|r| &r.source) {
            Some(&RowSource::Coded { module, .. }) => {
                let m = &cat.coded[module];
                let Some(b) = base.matrix(&t.name)? else {
                    missing.push(t.name.clone());
                    missing_coded += 1;
                    continue;
                };
                coded.push(pool.install(|| coded::check_coded(&ck, m, &t.name, &b, opts, decoder))?);
                b.release();
                if let Some(code) = m.tensor(Leaf::Code) {
                    ck.release(ck.entry(code)?);
                }
            }
            Some(&RowSource::Int8(i)) => match base.matrix(&t.name)? {
                Some(b) => {
                    int8.push(int8::check_int8(&ck, &cat.int8[i], &t.name, &b)?);
                    b.release();
                }
                None => missing.push(t.name.clone()),
            },
            _ => {}
        }
    }
    let mut norms = norms::check_norms(&ck, &cat, &base, &opts.only, &mut missing)?;

    let checked = coded.len() + int8.len() + norms.len();
    if checked == 0 {
        bail!("{}: no tensor of {} was found in it; is it the right base?", opts.base.display(), opts.input.display());
    }
    let problems = problems(opts, &coded, &int8, &norms, missing_coded, &missing);
    order(&mut coded);
    order(&mut int8);
    order(&mut norms);
    let failed = failed(&coded) + failed(&int8) + failed(&norms);
    Ok(VerifyReport {
        input: opts.input.display().to_string(),
        base: opts.base.display().to_string(),
        input_hub: opts.input_hub.clone(),
        base_hub: opts.base_hub.clone(),
        base_layout: base.layout,
        base_fp8: base.fp8,
        decoder: decoder.name(),
        sampled_blocks: opts.sample,
        max_ratio: opts.max_ratio,
        min_corr: opts.min_corr,
        coded,
        int8,
        norms,
        missing_in_base: missing,
        passed: failed == 0 && problems.is_empty(),
        problems,
        checked,
        failed,
        warnings,
    })
}

/// Failures of the run as a whole: what was not proved, and a BASE that is another model.
fn problems(
    opts: &VerifyOptions,
    coded: &[CodedRow],
    int8: &[Int8Row],
    norms: &[NormRow],
    missing_coded: usize,
    missing: &[String],
) -> Vec<String> {
    let mut problems = Vec::new();
    if !opts.allow_missing && !missing.is_empty() {
        problems.push(format!(
            "{} tensors of IN ({missing_coded} coded) are not in BASE, first {}; --allow-missing accepts that",
            missing.len(),
            missing[0]
        ));
    }
    // --allow-missing forgives gaps in BASE, never a run that proved nothing about the decode.
    if coded.is_empty() {
        problems.push("no coded tensor was checked: nothing about the decode is proved".into());
    }
    let all_fail = |n: usize, f: usize| n == 0 || f == n;
    let disagree = all_fail(coded.len(), failed(coded))
        && all_fail(int8.len(), failed(int8))
        && all_fail(norms.len(), norms.iter().filter(|n| n.verdict == norms::NEITHER).count())
        && coded.len() + int8.len() + norms.len() > 0
        && !coded.is_empty();
    if disagree {
        problems
            .push("every coded tensor, int8 pair and norm disagrees with BASE: it looks like a different model".into());
    }
    problems
}
