//! The checks of one coded linear (or of every expert of a stack) against its base weight:
//! overlap rule, error ratio to the Shannon bound, element-wise correlation, channel scales and
//! the inner-domain scale.
//!
//! Each work unit reconstructs its 128-row block one 128×128 square at a time (the conversion's
//! own reconstruction) and compares every square with the stored base rows while it is in cache,
//! all sums of a row in one pass. Units run in parallel in chunks; their sums merge in unit order,
//! so reports do not depend on the thread count. The base rows of a unit are released when it is
//! done, an expert's codes when its last unit is.

use super::base::{BaseMatrix, BaseRow};
use super::findings::{CodedFigures, CodedRow, ExpertRow};
use super::options::VerifyOptions;
use super::stats::{correlation, finite, Bf16Bytes, PairSums, RowSums};
use crate::checkpoint::{Checkpoint, CodedModule, ExpertLinear, Leaf};
use crate::codec::{bytes_per_tile, tile, TileDecoder, TILE_LEN};
use crate::transform::hadamard::HADAMARD_SIZE;
use anyhow::Result;
use rayon::prelude::*;
use std::collections::btree_map::{BTreeMap, Entry};
use std::ops::Range;

/// Sums from one 128-row output block of one expert.
#[derive(Default)]
struct BlockSums {
    pair: PairSums,
    tiles: u64,
    overlap_violations: u64,
    pruned: usize,
    /// (|sv|, base row norm) of each live row.
    rows: Vec<(f64, f64)>,
    /// The input features compared.
    cols: Range<usize>,
    /// Squared base column sums over this block's live rows, one per column of `cols`.
    col_sq: Vec<f32>,
    inner_sq: f64,
    inner_n: u64,
}

/// Block sums merged in unit order: one expert's, or (without the channel lists) a stack's.
struct Sums {
    pair: PairSums,
    tiles: u64,
    overlap_violations: u64,
    pruned: usize,
    live: usize,
    rows: Vec<(f64, f64)>,
    col_sq: Vec<f64>,
    inner_sq: f64,
    inner_n: u64,
    /// Whether `rows` and `col_sq` are kept (the channel correlations are per expert).
    channels: bool,
}

impl Sums {
    fn new(in_features: usize, channels: bool) -> Sums {
        Sums {
            pair: PairSums::default(),
            tiles: 0,
            overlap_violations: 0,
            pruned: 0,
            live: 0,
            rows: Vec::new(),
            col_sq: if channels { vec![0.0; in_features] } else { Vec::new() },
            inner_sq: 0.0,
            inner_n: 0,
            channels,
        }
    }

    fn add(&mut self, b: &BlockSums) {
        self.pair.merge(&b.pair);
        self.tiles += b.tiles;
        self.overlap_violations += b.overlap_violations;
        self.pruned += b.pruned;
        self.live += b.rows.len();
        if self.channels {
            for (c, &v) in self.col_sq[b.cols.clone()].iter_mut().zip(&b.col_sq) {
                *c += v as f64;
            }
            self.rows.extend_from_slice(&b.rows);
        }
        self.inner_sq += b.inner_sq;
        self.inner_n += b.inner_n;
    }
}

/// One expert's codes and folded scales, with the inner-domain column weights `1/su²`.
struct Expert<'a> {
    linear: ExpertLinear<'a>,
    inv_su_sq: Vec<f32>,
}

impl<'a> Expert<'a> {
    fn new(linear: ExpertLinear<'a>) -> Expert<'a> {
        let inv_su_sq = linear.su.iter().map(|&u| (1.0 / (u as f64 * u as f64)) as f32).collect();
        Expert { linear, inv_su_sq }
    }
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
    // Chunks of units run in parallel and merge in order: per expert, and pooled for a stack.
    let chunk = (8 * rayon::current_num_threads()).max(64);
    let mut cache: BTreeMap<usize, Expert> = BTreeMap::new();
    let mut current: Option<(usize, Sums)> = None;
    let mut pooled = Sums::new(m.in_features, m.experts.is_none());
    for units in units.chunks(chunk) {
        for u in units {
            if let Entry::Vacant(slot) = cache.entry(u.expert) {
                slot.insert(Expert::new(m.expert(ck, u.expert)?));
            }
        }
        let sums: Vec<Result<BlockSums>> =
            units.par_iter().map(|&u| check_block(m, &cache[&u.expert], base, u, decoder)).collect();
        for (u, s) in units.iter().zip(sums) {
            let s = s?;
            if m.experts.is_some() {
                if current.as_ref().is_some_and(|(e, _)| *e != u.expert) {
                    let (e, sums) = current.take().unwrap();
                    close_expert(ck, m, e, &sums, &cache.remove(&e).unwrap(), opts, &mut row)?;
                }
                current.get_or_insert_with(|| (u.expert, Sums::new(m.in_features, true))).1.add(&s);
            }
            pooled.add(&s);
        }
    }
    if let Some((e, sums)) = current {
        close_expert(ck, m, e, &sums, &cache.remove(&e).unwrap(), opts, &mut row)?;
    }
    // The tensor's own figures: for a stack, all experts pooled (channel correlations are per
    // expert).
    if m.experts.is_some() {
        row.figures = figures(m, &pooled, &[], shannon_bound);
        row.figures.corr_rin_col_norm = None;
        row.figures.corr_rout_row_norm = None;
    } else {
        row.figures = figures(m, &pooled, &m.expert(ck, 0)?.su, shannon_bound);
        row.failures = failures(&row.figures, m.k, opts);
    }
    row.failures.dedup();
    Ok(row)
}

/// An expert of a stack once its last unit is merged: its figures go to `per_expert` and its
/// codes are released.
fn close_expert(
    ck: &Checkpoint,
    m: &CodedModule,
    e: usize,
    sums: &Sums,
    expert: &Expert,
    opts: &VerifyOptions,
    row: &mut CodedRow,
) -> Result<()> {
    let figures = figures(m, sums, &expert.linear.su, 2f64.powi(-(m.k as i32)));
    let failures = failures(&figures, m.k, opts);
    row.failures.extend(failures.iter().map(|f| format!("expert {e}: {f}")));
    row.per_expert.push(ExpertRow { expert: e, figures, failures });
    if let Some(code) = m.tensor(Leaf::Code) {
        let entry = ck.entry(code)?;
        let per_expert = entry.byte_len() / m.expert_count();
        ck.release_part(entry, e * per_expert..(e + 1) * per_expert);
    }
    Ok(())
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

fn figures(m: &CodedModule, s: &Sums, su: &[f32], shannon_bound: f64) -> CodedFigures {
    let mut f = empty_figures(m, shannon_bound);
    let pair = s.pair;
    f.tiles_checked = s.tiles;
    f.overlap_violations = s.overlap_violations;
    f.pruned_channels = s.pruned;
    f.live_channels = s.live;
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
    let (rout, row_norm): (Vec<f64>, Vec<f64>) = s.rows.iter().copied().unzip();
    f.corr_rout_row_norm = finite(correlation(&rout, &row_norm));
    // Over the input features the checked regions covered.
    let (rin, col_norm): (Vec<f64>, Vec<f64>) =
        s.col_sq.iter().zip(su).filter(|(&c, _)| c > 0.0).map(|(&c, &u)| (u.abs() as f64, c.sqrt())).unzip();
    f.corr_rin_col_norm = finite(correlation(&rin, &col_norm));
    f.inner_std = (s.inner_n > 0).then(|| (s.inner_sq / s.inner_n as f64).sqrt());
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
    m: &CodedModule,
    expert: &Expert,
    base: &BaseMatrix,
    region: Region,
    decoder: &dyn TileDecoder,
) -> Result<BlockSums> {
    let Region { expert: e, block, square } = region;
    let lin = expert.linear.linear();
    let (code, su, sv) = (lin.code, lin.su, lin.sv);
    let squares = match square {
        Some(c) => c..c + 1,
        None => 0..m.in_padded / HADAMARD_SIZE,
    };
    let mut s = BlockSums::default();

    // Overlap rule on the states this decoder extracts, for every tile of the region.
    let tile_bytes = bytes_per_tile(m.k);
    let out_tiles = m.out_padded / 16;
    let strip_tiles = HADAMARD_SIZE / 16;
    let mut states = vec![0u16; strip_tiles * TILE_LEN];
    for i in squares.start * strip_tiles..squares.end * strip_tiles {
        let first = (i * out_tiles + block * strip_tiles) * tile_bytes;
        decoder.states(&code[first..first + strip_tiles * tile_bytes], m.k, &mut states);
        for t in states.chunks_exact(TILE_LEN) {
            s.tiles += 1;
            s.overlap_violations += u64::from(!tile::obeys_overlap(t, m.k));
        }
    }

    // Each decoded square against the base rows (padding is never compared); rows with sv = 0
    // are pruned and skipped, rows whose base is all zero are found pruned at the end.
    let r0 = block * HADAMARD_SIZE;
    let rows = (m.out_features - r0).min(HADAMARD_SIZE);
    let ic = m.in_features;
    let cols = (squares.start * HADAMARD_SIZE).min(ic)..(squares.end * HADAMARD_SIZE).min(ic);
    let base_rows = (r0..r0 + rows).map(|r| base.row(e, r)).collect::<Result<Vec<_>>>()?;
    let mut row_sums = vec![RowSums::default(); rows];
    let mut col_sq = vec![0f32; cols.len()];
    let mut y = Vec::with_capacity(HADAMARD_SIZE);
    lin.for_each_square(decoder, block, squares, |c, decoded| {
        let c0 = c * HADAMARD_SIZE;
        let width = ic.saturating_sub(c0).min(HADAMARD_SIZE);
        let (col_sq, weights) = (&mut col_sq[c0 - cols.start..][..width], &expert.inv_su_sq[c0..c0 + width]);
        for (r, (sums, base_row)) in row_sums.iter_mut().zip(&base_rows).enumerate() {
            if sv[r0 + r] == 0.0 || width == 0 {
                continue;
            }
            let x = &decoded[r * HADAMARD_SIZE..][..width];
            match base_row {
                BaseRow::Bf16(bytes) => {
                    // The next square's part of the row, while this square's is compared and the
                    // next one reconstructed: 128 rows far apart are more streams than the
                    // hardware prefetcher follows.
                    prefetch(bytes.get(2 * (c0 + HADAMARD_SIZE)..).unwrap_or_default(), 2 * HADAMARD_SIZE);
                    sums.add(x, &Bf16Bytes(&bytes[2 * c0..2 * (c0 + width)]), col_sq, weights);
                }
                other => {
                    other.values(c0..c0 + width, &mut y);
                    sums.add(x, &y.as_slice(), col_sq, weights);
                }
            }
        }
    });
    base.release_rows(e, r0..r0 + rows);

    let mut any_dead = rows < HADAMARD_SIZE || cols.len() < HADAMARD_SIZE || ic != m.in_padded;
    let mut weighted = 0f64;
    for (r, sums) in row_sums.iter().enumerate() {
        let v = sv[r0 + r];
        if v == 0.0 || !sums.nonzero {
            s.pruned += 1;
            any_dead = true;
            continue;
        }
        s.rows.push((v.abs() as f64, sums.pair.syy().sqrt()));
        s.pair.merge(&sums.pair);
        weighted += sums.weighted / (v as f64 * v as f64);
    }
    s.cols = cols.clone();
    s.col_sq = col_sq;

    // Inner domain: the base pulled back through the inverse transform, `Hn·diag(1/sv)·Y·
    // diag(1/su)·Hn` square by square, where it is defined. `Hn` is orthogonal, so the sum of
    // squares is that of `diag(1/sv)·Y·diag(1/su)`: the rows' weighted norms over sv².
    if !any_dead && su[cols.clone()].iter().all(|&v| v != 0.0) {
        s.inner_sq = weighted;
        s.inner_n = (rows * cols.len()) as u64;
    }
    Ok(s)
}

/// Asks for the first `len` bytes of `bytes` (or all of it) to be brought into cache.
fn prefetch(bytes: &[u8], len: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes[..len.min(bytes.len())].chunks(64) {
        // SAFETY: a prefetch of a valid address has no effect but on the cache (SSE, part of
        // x86_64).
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (bytes, len);
}
