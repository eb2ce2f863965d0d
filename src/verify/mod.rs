//! `verify`: proves a decode right against the unquantized base model.
//!
//! Per coded linear (per expert for stacks): the overlap rule on the states the conversion's own
//! decoder extracts, the error ratio to the Shannon bound over live channels, element-wise
//! correlation and cosine, channel-scale correlations and the inner-domain scale. Per norm: the
//! norm-offset table. Per int8 pair: error against the base. Work is split into 128-row output
//! blocks and run in parallel; sums merge in a fixed order, so reports are reproducible.

mod base;
mod html;
mod report;
mod stats;

pub use base::BaseLayout;
pub use html::{render_html, write_html};
pub use report::render;

use crate::checkpoint::tensor::floats_to_f32;
use crate::checkpoint::{catalog, Catalog, Checkpoint, CodedModule};
use crate::codec::{bytes_per_tile, tile, TileDecoder, TILE_LEN};
use crate::layout::{hf, norm_kind, DenseDtype, NormKind, Recipe};
use crate::select::selected;
use crate::transform::hadamard::{fwht_across_rows, fwht_blocks, HADAMARD_SIZE};
use anyhow::Result;
use base::{Base, BaseMatrix};
use rayon::prelude::*;
use serde::Serialize;
use stats::{correlation, finite, PairSums};
use std::path::PathBuf;

/// A norm matches a candidate when the mean absolute difference is below this (bf16 rounding of
/// values near 1 is 2^-8).
const NORM_MATCH: f64 = 0.02;

#[derive(Clone, Debug)]
pub struct VerifyOptions {
    pub input: PathBuf,
    pub base: PathBuf,
    pub only: Vec<String>,
    /// Check this many evenly spread 128×128 blocks per tensor instead of whole tensors.
    pub sample: Option<usize>,
    pub max_ratio: f64,
    /// Minimum correlation; `None` = 0.8 for K=2 (and K=1), 0.9 for K≥3.
    pub min_corr: Option<f64>,
    pub threads: Option<usize>,
}

/// Figures for one coded linear, or one expert of a stack.
#[derive(Clone, Debug, Serialize)]
pub struct CodedFigures {
    pub corr: Option<f64>,
    pub cosine: Option<f64>,
    pub rel_err: Option<f64>,
    pub shannon_bound: f64,
    pub ratio: Option<f64>,
    pub compared: u64,
    pub live_channels: usize,
    pub pruned_channels: usize,
    pub tiles_checked: u64,
    pub overlap_violations: u64,
    pub corr_rout_row_norm: Option<f64>,
    pub corr_rin_col_norm: Option<f64>,
    pub inner_std: Option<f64>,
    pub codebook_rms: f32,
}

#[derive(Clone, Debug, Serialize)]
pub struct CodedRow {
    pub tensor: String,
    pub base_tensor: Vec<String>,
    pub k: u32,
    pub experts: Option<usize>,
    #[serde(flatten)]
    pub figures: CodedFigures,
    pub per_expert: Vec<CodedFigures>,
    pub failures: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Int8Row {
    pub tensor: String,
    pub corr: Option<f64>,
    pub rel_err: Option<f64>,
    pub failures: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct NormRow {
    pub tensor: String,
    pub kind: &'static str,
    pub escha_mean: f64,
    pub base_mean: f64,
    pub diff: f64,
    pub diff_plus_one: f64,
    pub verdict: &'static str,
    pub failures: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    pub input: String,
    pub base: String,
    pub base_layout: BaseLayout,
    pub base_fp8: bool,
    pub decoder: &'static str,
    pub sampled_blocks: Option<usize>,
    pub max_ratio: f64,
    pub coded: Vec<CodedRow>,
    pub int8: Vec<Int8Row>,
    pub norms: Vec<NormRow>,
    pub missing_in_base: Vec<String>,
    pub checked: usize,
    pub failed: usize,
    pub passed: bool,
}

pub fn verify(opts: &VerifyOptions, decoder: &dyn TileDecoder) -> Result<VerifyReport> {
    let ck = Checkpoint::open(&opts.input)?;
    let cat = catalog(&ck)?;
    let base = Base::open(&opts.base)?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(opts.threads.unwrap_or(0)).build()?;
    let mut missing = Vec::new();

    let outputs = hf::layout(&ck, &cat, DenseDtype::Bf16, false);
    let mut coded = Vec::new();
    let mut int8 = Vec::new();
    for t in outputs.iter().filter(|t| selected(&t.name, &opts.only)) {
        match t.recipe {
            Recipe::Coded(i) => match base.matrix(&t.name)? {
                Some(b) => coded.push(pool.install(|| check_coded(&ck, &cat.coded[i], &t.name, &b, opts, decoder))?),
                None => missing.push(t.name.clone()),
            },
            Recipe::Int8(i) => match base.matrix(&t.name)? {
                Some(b) => int8.push(check_int8(&ck, &cat, i, &t.name, &b)?),
                None => missing.push(t.name.clone()),
            },
            _ => {}
        }
    }
    let norms = check_norms(&ck, &cat, &base, opts, &mut missing)?;

    // Failures first, then the worst ratio first.
    let ratio = |r: &CodedRow| r.figures.ratio.unwrap_or(f64::INFINITY);
    coded.sort_by(|a, b| a.failures.is_empty().cmp(&b.failures.is_empty()).then(ratio(b).total_cmp(&ratio(a))));
    int8.sort_by_key(|r| r.failures.is_empty());
    let mut norms = norms;
    norms.sort_by_key(|r| r.failures.is_empty());

    let checked = coded.len() + int8.len() + norms.len();
    let failed = coded.iter().filter(|r| !r.failures.is_empty()).count()
        + int8.iter().filter(|r| !r.failures.is_empty()).count()
        + norms.iter().filter(|r| !r.failures.is_empty()).count();
    if checked == 0 {
        anyhow::bail!(
            "{}: no tensor of {} was found in the base model; is it the right base?",
            opts.base.display(),
            opts.input.display()
        );
    }
    Ok(VerifyReport {
        input: opts.input.display().to_string(),
        base: opts.base.display().to_string(),
        base_layout: base.layout,
        base_fp8: base.fp8,
        decoder: decoder.name(),
        sampled_blocks: opts.sample,
        max_ratio: opts.max_ratio,
        coded,
        int8,
        norms,
        missing_in_base: missing,
        checked,
        failed,
        passed: failed == 0,
    })
}

/// Sums from one 128-row output block of one expert.
#[derive(Default)]
struct BlockSums {
    pair: PairSums,
    tiles: u64,
    overlap_violations: u64,
    pruned: usize,
    /// (output channel, |sv|, base row norm) for live rows.
    rows: Vec<(usize, f64, f64)>,
    /// Squared base column sums over this block's live rows.
    col_sq: Vec<f64>,
    inner_sq: f64,
    inner_n: u64,
}

fn check_coded(
    ck: &Checkpoint,
    m: &CodedModule,
    name: &str,
    base: &BaseMatrix,
    opts: &VerifyOptions,
    decoder: &dyn TileDecoder,
) -> Result<CodedRow> {
    let experts = m.expert_count();
    let blocks = m.out_features.div_ceil(HADAMARD_SIZE);
    let shannon_bound = 2f64.powi(-(m.k as i32));
    let mut row = CodedRow {
        tensor: name.to_string(),
        base_tensor: base.names.clone(),
        k: m.k,
        experts: m.experts,
        figures: empty_figures(m, shannon_bound),
        per_expert: Vec::new(),
        failures: Vec::new(),
    };
    if base.rows() != m.out_features || base.cols != m.in_features || base.experts != m.experts {
        row.failures.push(format!(
            "shape: decoded {:?}×{}×{} vs base {:?}×{}×{}",
            m.experts,
            m.out_features,
            m.in_features,
            base.experts,
            base.rows(),
            base.cols
        ));
        return Ok(row);
    }

    // Units: every (expert, block) across all inputs, or N evenly spread 128×128 squares.
    let units: Vec<Region> = match opts.sample {
        Some(n) => {
            let squares = m.in_padded / HADAMARD_SIZE;
            let all = experts * blocks * squares;
            let pick = |i: usize| {
                let at = (2 * i + 1) * all / (2 * n.min(all));
                Region { expert: at / (blocks * squares), block: at / squares % blocks, square: Some(at % squares) }
            };
            (0..n.min(all)).map(pick).collect()
        }
        None => {
            (0..experts).flat_map(|e| (0..blocks).map(move |b| Region { expert: e, block: b, square: None })).collect()
        }
    };
    let sums: Vec<Result<(usize, BlockSums)>> =
        units.par_iter().map(|&u| check_block(ck, m, base, u, decoder).map(|s| (u.expert, s))).collect();

    let mut per_expert: Vec<Vec<BlockSums>> = (0..experts).map(|_| Vec::new()).collect();
    for s in sums {
        let (e, s) = s?;
        per_expert[e].push(s);
    }
    let mut total = Vec::new();
    for (e, blocks) in per_expert.into_iter().enumerate() {
        if blocks.is_empty() {
            continue;
        }
        let figures = figures(m, &blocks, &m.expert(ck, e)?.su, shannon_bound);
        if m.experts.is_some() {
            for f in failures(&figures, m.k, opts) {
                row.failures.push(format!("expert {e}: {f}"));
            }
            row.per_expert.push(figures);
        }
        total.extend(blocks.into_iter().map(|b| (e, b)));
    }
    // The tensor's own figures: all experts pooled (channel correlations per expert are in
    // per_expert).
    let pooled: Vec<BlockSums> = total.into_iter().map(|(_, b)| b).collect();
    row.figures = figures(m, &pooled, &m.expert(ck, 0)?.su, shannon_bound);
    if m.experts.is_some() {
        row.figures.corr_rin_col_norm = None;
        row.figures.corr_rout_row_norm = None;
    } else {
        row.failures = failures(&row.figures, m.k, opts);
    }
    row.failures.dedup();
    Ok(row)
}

fn empty_figures(m: &CodedModule, shannon_bound: f64) -> CodedFigures {
    CodedFigures {
        corr: None,
        cosine: None,
        rel_err: None,
        shannon_bound,
        ratio: None,
        compared: 0,
        live_channels: 0,
        pruned_channels: 0,
        tiles_checked: 0,
        overlap_violations: 0,
        corr_rout_row_norm: None,
        corr_rin_col_norm: None,
        inner_std: None,
        codebook_rms: m.codebook.rms(),
    }
}

fn figures(m: &CodedModule, blocks: &[BlockSums], su: &[f32], shannon_bound: f64) -> CodedFigures {
    let mut f = empty_figures(m, shannon_bound);
    let mut pair = PairSums::default();
    let mut col_sq = vec![0f64; m.in_features];
    let (mut rout, mut row_norm) = (Vec::new(), Vec::new());
    let (mut inner_sq, mut inner_n) = (0f64, 0u64);
    for b in blocks {
        pair.merge(&b.pair);
        f.tiles_checked += b.tiles;
        f.overlap_violations += b.overlap_violations;
        f.pruned_channels += b.pruned;
        f.live_channels += b.rows.len();
        for (c, v) in col_sq.iter_mut().zip(&b.col_sq) {
            *c += v;
        }
        for &(_, s, n) in &b.rows {
            rout.push(s);
            row_norm.push(n);
        }
        inner_sq += b.inner_sq;
        inner_n += b.inner_n;
    }
    f.compared = pair.n;
    // The trellis error is white in the inner domain, so after the orthogonal transform every
    // output channel receives an equal share; pruned channels (sv = 0) discard theirs. The bound
    // for the live channels is therefore 2^-K · sqrt(live / all).
    let channels = f.live_channels + f.pruned_channels;
    if channels > 0 {
        f.shannon_bound = shannon_bound * (f.live_channels as f64 / channels as f64).sqrt();
    }
    if pair.n > 0 {
        f.corr = finite(pair.corr());
        f.cosine = finite(pair.cosine());
        f.rel_err = finite(pair.rel_err());
        f.ratio = f.rel_err.map(|e| e / f.shannon_bound);
    }
    f.corr_rout_row_norm = finite(correlation(&rout, &row_norm));
    // Over the input features the checked regions covered.
    let (rin, col_norm): (Vec<f64>, Vec<f64>) =
        col_sq.iter().zip(su).filter(|(&c, _)| c > 0.0).map(|(&c, &u)| (u.abs() as f64, c.sqrt())).unzip();
    f.corr_rin_col_norm = finite(correlation(&rin, &col_norm));
    f.inner_std = (inner_n > 0).then(|| (inner_sq / inner_n as f64).sqrt());
    f
}

fn failures(f: &CodedFigures, k: u32, opts: &VerifyOptions) -> Vec<String> {
    let mut out = Vec::new();
    if f.overlap_violations > 0 {
        out.push(format!(
            "overlap: {} of {} tiles break the trellis overlap rule",
            f.overlap_violations, f.tiles_checked
        ));
    }
    let min_corr = opts.min_corr.unwrap_or(if k <= 2 { 0.8 } else { 0.9 });
    match (f.ratio, f.corr) {
        (Some(r), Some(c)) => {
            if r < 1.0 {
                out.push(format!("shannon: ratio {r:.3} < 1.0 is impossible for an honest decode (is BASE the quantized model itself?)"));
            } else if r > opts.max_ratio {
                out.push(format!("shannon: ratio {r:.3} > {:.3} (misplaced decode?)", opts.max_ratio));
            }
            if c < min_corr {
                out.push(format!("corr: {c:.4} < {min_corr}"));
            }
        }
        _ => out.push("no live weights to compare".into()),
    }
    out
}

/// What one verify work unit covers: a 128-row output block of one expert, either across every
/// input feature or (when sampling) one 128×128 square of it.
#[derive(Clone, Copy)]
struct Region {
    expert: usize,
    block: usize,
    square: Option<usize>,
}

fn check_block(
    ck: &Checkpoint,
    m: &CodedModule,
    base: &BaseMatrix,
    region: Region,
    decoder: &dyn TileDecoder,
) -> Result<BlockSums> {
    let Region { expert, block, square } = region;
    let ex = m.expert(ck, expert)?;
    let (lin, code, su, sv) = (ex.linear(), ex.code, &ex.su, &ex.sv);
    let mut s = BlockSums { col_sq: vec![0.0; m.in_features], ..Default::default() };

    // The input features covered, in padded coordinates, and the decoded rows over them.
    let (cols, decoded, stride) = match square {
        Some(c) => {
            let mut d = vec![0f32; HADAMARD_SIZE * HADAMARD_SIZE];
            lin.reconstruct_square(decoder, block, c, &mut d, HADAMARD_SIZE);
            (c * HADAMARD_SIZE..(c + 1) * HADAMARD_SIZE, d, HADAMARD_SIZE)
        }
        None => {
            let mut d = vec![0f32; HADAMARD_SIZE * m.in_padded];
            lin.reconstruct_block(decoder, block, &mut d);
            (0..m.in_padded, d, m.in_padded)
        }
    };

    // Overlap rule on the states this decoder extracts, for every tile of the region.
    let tile_bytes = bytes_per_tile(m.k);
    let out_tiles = m.out_padded / 16;
    let strip_tiles = HADAMARD_SIZE / 16;
    let mut states = vec![0u16; strip_tiles * TILE_LEN];
    for i in cols.start / 16..cols.end / 16 {
        let first = (i * out_tiles + block * strip_tiles) * tile_bytes;
        decoder.states(&code[first..first + strip_tiles * tile_bytes], m.k, &mut states);
        for t in states.chunks_exact(TILE_LEN) {
            s.tiles += 1;
            s.overlap_violations += (tile::overlap_violations(t, m.k) > 0) as u64;
        }
    }

    let r0 = block * HADAMARD_SIZE;
    let rows = (m.out_features - r0).min(HADAMARD_SIZE);
    let ic = m.in_features;
    let cols = cols.start.min(ic)..cols.end.min(ic); // padding is never compared
    let width = cols.len();
    let mut base_rows = Vec::new();
    base.read_rows(expert, r0..r0 + rows, &mut base_rows)?;
    let mut any_dead = rows < HADAMARD_SIZE || width < HADAMARD_SIZE || ic != m.in_padded;
    for r in 0..rows {
        let y = &base_rows[r * ic..(r + 1) * ic][cols.clone()];
        if sv[r0 + r] == 0.0 || y.iter().all(|&v| v == 0.0) {
            s.pruned += 1;
            any_dead = true;
            continue;
        }
        let x = &decoded[r * stride..][..width];
        for (&a, &b) in x.iter().zip(y) {
            s.pair.add(a, b);
        }
        let norm = y.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
        s.rows.push((r0 + r, sv[r0 + r].abs() as f64, norm));
        for (c, &v) in s.col_sq[cols.clone()].iter_mut().zip(y) {
            *c += (v as f64).powi(2);
        }
    }

    // Inner domain: the base pulled back through the inverse transform, where it is defined.
    let su = &su[cols.clone()];
    if !any_dead && su.iter().all(|&v| v != 0.0) {
        let mut z: Vec<f32> = Vec::with_capacity(rows * width);
        for (r, row) in base_rows.chunks_exact(ic).enumerate() {
            z.extend(row[cols.clone()].iter().zip(su).map(|(&y, &u)| y / (sv[r0 + r] * u)));
        }
        fwht_blocks(&mut z);
        fwht_across_rows(&mut z, width);
        let norm = 1.0 / HADAMARD_SIZE as f64;
        for v in &z {
            s.inner_sq += (*v as f64 * norm).powi(2);
        }
        s.inner_n += z.len() as u64;
    }
    Ok(s)
}

fn check_int8(ck: &Checkpoint, cat: &Catalog, i: usize, name: &str, base: &BaseMatrix) -> Result<Int8Row> {
    let m = &cat.int8[i];
    let (rows, cols) = (m.shape[0], m.shape[1]);
    let mut row = Int8Row { tensor: name.to_string(), corr: None, rel_err: None, failures: Vec::new() };
    if base.rows() != rows || base.cols != cols {
        row.failures.push(format!("shape: int8 {rows}×{cols} vs base {}×{}", base.rows(), base.cols));
        return Ok(row);
    }
    let mut pair = PairSums::default();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for r0 in (0..rows).step_by(1024) {
        let r1 = (r0 + 1024).min(rows);
        x.clear();
        m.dequantize_rows(ck, r0..r1, &mut x)?;
        base.read_rows(0, r0..r1, &mut y)?;
        for (&a, &b) in x.iter().zip(&y) {
            pair.add(a, b);
        }
    }
    row.corr = finite(pair.corr());
    row.rel_err = finite(pair.rel_err());
    if row.corr.map_or(true, |c| c < 0.9) {
        row.failures.push(format!("corr: {:.4} < 0.9", row.corr.unwrap_or(f64::NAN)));
    }
    Ok(row)
}

/// The norm-offset table: mean |e − b| and |e + 1 − b| decide how each norm is stored, and the
/// base's layout decides what is expected.
fn check_norms(
    ck: &Checkpoint,
    cat: &Catalog,
    base: &Base,
    opts: &VerifyOptions,
    missing: &mut Vec<String>,
) -> Result<Vec<NormRow>> {
    let mut rows = Vec::new();
    let mut e = Vec::new();
    for p in &cat.plain {
        let name = &p.name;
        let Some(kind) = norm_kind(name) else { continue };
        if !selected(name, &opts.only) {
            continue;
        }
        let gated = kind == NormKind::Plain;
        let Some(b) = base.vector(name)? else {
            missing.push(name.clone());
            continue;
        };
        let entry = &ck.tensors[name];
        floats_to_f32(ck.bytes(entry), entry.dtype, &mut e)?;
        if b.len() != e.len() {
            missing.push(format!("{name} (length {} vs {})", e.len(), b.len()));
            continue;
        }
        let n = e.len() as f64;
        let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let diff = e.iter().zip(&b).map(|(&x, &y)| (x as f64 - y as f64).abs()).sum::<f64>() / n;
        let diff1 = e.iter().zip(&b).map(|(&x, &y)| (x as f64 + 1.0 - y as f64).abs()).sum::<f64>() / n;
        let verdict = if diff < NORM_MATCH {
            "as stored"
        } else if diff1 < NORM_MATCH {
            "+1"
        } else {
            "neither"
        };
        let expected = match (base.layout, gated) {
            (BaseLayout::Mlx, false) => "+1",
            _ => "as stored",
        };
        let mut failures = Vec::new();
        if verdict != expected {
            failures.push(format!(
                "norm offset: base matches {verdict:?}, expected {expected:?} for a {} base",
                match base.layout {
                    BaseLayout::HuggingFace => "Hugging Face",
                    BaseLayout::Mlx => "MLX",
                }
            ));
        }
        rows.push(NormRow {
            tensor: name.clone(),
            kind: if gated { "plain" } else { "zero-centred" },
            escha_mean: mean(&e),
            base_mean: mean(&b),
            diff,
            diff_plus_one: diff1,
            verdict,
            failures,
        });
    }
    Ok(rows)
}
