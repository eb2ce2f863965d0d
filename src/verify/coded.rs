//! The checks of one coded linear (or of every expert of a stack) against its base weight:
//! overlap rule, error ratio to the Shannon bound, element-wise correlation, channel scales and
//! the inner-domain scale.

use super::base::BaseMatrix;
use super::findings::{CodedFigures, CodedRow};
use super::options::VerifyOptions;
use super::stats::{correlation, finite, sum_squares, PairSums};
use crate::checkpoint::{Checkpoint, CodedModule};
use crate::codec::{bytes_per_tile, tile, TileDecoder, TILE_LEN};
use crate::transform::hadamard::{Square, HADAMARD_SIZE};
use anyhow::Result;
use rayon::prelude::*;

/// Sums from one 128-row output block of one expert.
#[derive(Default)]
struct BlockSums {
    pair: PairSums,
    tiles: u64,
    overlap_violations: u64,
    pruned: usize,
    /// (|sv|, base row norm) of each live row.
    rows: Vec<(f64, f64)>,
    /// Squared base column sums over this block's live rows (by input feature).
    col_sq: Vec<f32>,
    inner_sq: f64,
    inner_n: u64,
}

/// What one work unit covers: a 128-row output block of one expert, either across every input
/// feature or (when sampling) one 128×128 square of it.
#[derive(Clone, Copy)]
struct Region {
    expert: usize,
    block: usize,
    square: Option<usize>,
}

/// `E×rows×cols` or `rows×cols`.
pub fn shape_text(experts: Option<usize>, rows: usize, cols: usize) -> String {
    match experts {
        Some(e) => format!("{e}×{rows}×{cols}"),
        None => format!("{rows}×{cols}"),
    }
}

pub fn check_coded(
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
            "shape: decoded {} vs base {}",
            shape_text(m.experts, m.out_features, m.in_features),
            shape_text(base.experts, base.rows(), base.cols)
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
    let mut pooled = Vec::new();
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
        pooled.extend(blocks);
    }
    // The tensor's own figures: all experts pooled (channel correlations per expert are in
    // per_expert).
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
        for (c, &v) in col_sq.iter_mut().zip(&b.col_sq) {
            *c += v as f64;
        }
        for &(s, n) in &b.rows {
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
    let min_corr = opts.min_corr(k);
    match (f.ratio, f.corr) {
        (Some(r), Some(c)) => {
            if r < 1.0 {
                out.push(format!(
                    "shannon: ratio {r:.3} < 1.0 is impossible for an honest decode (is BASE the quantized model itself?)"
                ));
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
    let (cols, decoded, stride) = if let Some(c) = square {
        let mut d = vec![0f32; HADAMARD_SIZE * HADAMARD_SIZE];
        lin.reconstruct_square(decoder, block, c, &mut d, HADAMARD_SIZE);
        (c * HADAMARD_SIZE..(c + 1) * HADAMARD_SIZE, d, HADAMARD_SIZE)
    } else {
        let mut d = vec![0f32; HADAMARD_SIZE * m.in_padded];
        lin.reconstruct_block(decoder, block, &mut d);
        (0..m.in_padded, d, m.in_padded)
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
        let mut pair = PairSums::default();
        pair.add_slices(&decoded[r * stride..][..width], y);
        s.rows.push((sv[r0 + r].abs() as f64, pair.syy().sqrt()));
        s.pair.merge(&pair);
        for (c, &v) in s.col_sq[cols.clone()].iter_mut().zip(y) {
            *c += v * v;
        }
    }

    // Inner domain: the base pulled back through the inverse transform, one 128×128 square at a
    // time, where it is defined.
    let su = &su[cols.clone()];
    if !any_dead && su.iter().all(|&v| v != 0.0) {
        let mut sq = Square::default();
        let ones = [1f32; HADAMARD_SIZE];
        let norm = [1.0 / HADAMARD_SIZE as f32; HADAMARD_SIZE];
        let mut z = vec![0f32; HADAMARD_SIZE * HADAMARD_SIZE];
        for c0 in (0..width).step_by(HADAMARD_SIZE) {
            for r in 0..HADAMARD_SIZE {
                let y = &base_rows[r * ic + cols.start + c0..][..HADAMARD_SIZE];
                let inv_sv = 1.0 / sv[r0 + r];
                for ((dst, &v), &u) in sq.row_mut(r).iter_mut().zip(y).zip(&su[c0..c0 + HADAMARD_SIZE]) {
                    *dst = v / u * inv_sv;
                }
            }
            sq.transform_scaled(&norm, &ones, &mut z, HADAMARD_SIZE);
            s.inner_sq += sum_squares(&z);
            s.inner_n += z.len() as u64;
        }
    }
    Ok(s)
}
