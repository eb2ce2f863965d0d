//! One super-block of each type: the weights, the sign folding and the first guess of each group,
//! the shared [`search`], and the bytes as ggml lays them out (`block_iq2_xxs` … `block_iq3_s`).

use super::search::{fold_signs, make_qp_scale, max_of, scale_code, search, Replace, Search, EPS, EPS_COARSE};
use super::{tables, QK_K};
use crate::block_type::BlockType;
use crate::cpu::Kernel;
use crate::quant::kquants::to_f16_bits;

/// What differs between the five encoders, besides the layout.
struct Spec {
    /// Values sharing one scale.
    group: usize,
    /// Whether an odd count of negative values is evened (the 8th sign bit is then implied).
    even: bool,
    /// A group whose largest folded value is below this is stored as zero; `None`: only zero is.
    eps: Option<f32>,
    /// `σ²` is `2·Σx²/256` (rather than `Σx²/256`).
    twice: bool,
    /// The factor the super-block scale is stored with.
    fudge: Option<f32>,
    search: Search,
}

fn spec(kind: BlockType, kernel: Kernel) -> Spec {
    let (group, even, eps, twice, fudge) = match kind {
        BlockType::IQ2_XXS => (32, true, Some(EPS), false, None),
        BlockType::IQ2_XS => (16, true, Some(EPS), false, None),
        BlockType::IQ2_S => (16, false, Some(EPS_COARSE), true, Some(0.9875)),
        BlockType::IQ3_XXS => (32, true, Some(EPS_COARSE), true, Some(1.0125)),
        BlockType::IQ3_S => (32, false, None, true, Some(1.033)),
        other => unreachable!("{} is not an IQ2/IQ3 type", other.name()),
    };
    let search = match kind {
        BlockType::IQ2_XXS => Search { kernel, table: tables::iq2_xxs(), tries: 6, step: 0.1, replace: Replace::All },
        BlockType::IQ2_XS => Search { kernel, table: tables::iq2_xs(), tries: 9, step: 0.1, replace: Replace::Moved },
        BlockType::IQ2_S => Search { kernel, table: tables::iq2_s(), tries: 9, step: 0.1, replace: Replace::Moved },
        BlockType::IQ3_XXS => {
            Search { kernel, table: tables::iq3_xxs(), tries: 15, step: 0.2, replace: Replace::Moved }
        }
        _ => Search { kernel, table: tables::iq3_s(), tries: 9, step: 0.2, replace: Replace::AllIfMoved },
    };
    Spec { group, even, eps, twice, fudge, search }
}

/// One group's outcome: its scale (0 for a zero group) and, where it was searched, its cells' grid
/// indexes and its sign bytes.
struct Group {
    scale: f32,
    cells: Option<([u16; 8], [u8; 4])>,
}

/// Encodes the super-block `x` with importance `qw` (`None`: the type's own weights) into `out`
/// (exactly one block's bytes), the nearest grid points found by `kernel`.
pub(super) fn block(kernel: Kernel, kind: BlockType, x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let s = spec(kind, kernel);
    let sumx2 = x.iter().fold(0.0f32, |acc, &v| acc + v * v);
    let sigma2 = if s.twice { 2.0 * sumx2 / QK_K as f32 } else { sumx2 / QK_K as f32 };
    let groups: Vec<Group> =
        (0..QK_K / s.group).map(|ib| group(kind, &s, &x[ib * s.group..][..s.group], qw, ib, sigma2)).collect();
    let max_scale = groups.iter().fold(0.0f32, |m, g| if m > g.scale { m } else { g.scale });
    out.fill(0);
    // ggml keeps the cells of a block whose scales are all zero for IQ2_S and IQ3_S only.
    let keep_cells = max_scale != 0.0 || matches!(kind, BlockType::IQ2_S | BlockType::IQ3_S);
    if keep_cells {
        // IQ3_S's cells and signs go to the next free slot: ggml's pointers into them advance only
        // past a group it encodes, so a zero group's slot is taken by the next group's (the 9th
        // bits go by group).
        let mut slot = 0;
        for (ib, g) in groups.iter().enumerate() {
            if let Some((cells, signs)) = &g.cells {
                put_cells(kind, ib, slot, cells, *signs, out);
                slot += 1;
            }
        }
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    let stored = match s.fudge {
        Some(f) => d * f,
        None => d,
    };
    out[..2].copy_from_slice(&to_f16_bits(stored).to_le_bytes());
    let id = 1.0 / d;
    for (ib, g) in groups.iter().enumerate() {
        put_scale(kind, ib, scale_code(id, g.scale), out);
    }
}

fn group(kind: BlockType, s: &Spec, xb: &[f32], qw: Option<&[f32]>, ib: usize, sigma2: f32) -> Group {
    let n = s.group;
    let (mut weight, mut waux, mut xval) = ([0.0f32; 32], [0.0f32; 32], [0.0f32; 32]);
    let (weight, waux, xval) = (&mut weight[..n], &mut waux[..n], &mut xval[..n]);
    for i in 0..n {
        weight[i] = match qw {
            Some(qw) => qw[ib * n + i] * (sigma2 + xb[i] * xb[i]).sqrt(),
            None => match kind {
                BlockType::IQ2_S => 0.25 * sigma2 + xb[i] * xb[i],
                BlockType::IQ3_XXS | BlockType::IQ3_S => xb[i] * xb[i],
                // ggml requires an importance for IQ2_XXS and IQ2_XS: without one, each counts 1.
                _ => (sigma2 + xb[i] * xb[i]).sqrt(),
            },
        };
        waux[i] = weight[i].sqrt();
    }
    let mut signs = [0u8; 4];
    fold_signs(xb, weight, s.even, xval, &mut signs[..n / 8]);
    let max = max_of(xval);
    let zero = Group { scale: 0.0, cells: None };
    let small = match s.eps {
        Some(eps) => max < eps,
        None => max == 0.0,
    };
    if small {
        return zero;
    }
    let kmax = s.search.table.levels;
    let (scale, over) = if kind == BlockType::IQ2_XXS {
        let scale = make_qp_scale(kmax + 1, xval, weight);
        let eff_max = scale * kmax as f32;
        if eff_max <= 0.0 {
            return zero;
        }
        (scale, eff_max)
    } else {
        (max / (2 * kmax - 1) as f32, max)
    };
    let mut l = [0i8; 32];
    let l = &mut l[..n];
    let mut scale = search(&s.search, xval, weight, waux, over, scale, l);
    if scale < 0.0 {
        scale = -scale;
        let mask = if s.even { 127 } else { 255 };
        for b in &mut signs {
            *b = !*b & mask;
        }
    }
    if scale.is_nan() {
        // ggml aborts here; the group is stored as zero instead.
        return zero;
    }
    let t = s.search.table;
    let mut cells = [0u16; 8];
    for (c, levels) in cells.iter_mut().zip(l.chunks_exact(t.cell)) {
        // The search returns levels on the grid only.
        *c = t.index_of(levels).unwrap_or(0) as u16;
    }
    Group { scale, cells: Some((cells, signs)) }
}

/// Writes group `ib`'s grid indexes and signs where `kind` keeps them (`slot`: its place among
/// the groups encoded so far, which `IQ3_S` packs by).
fn put_cells(kind: BlockType, ib: usize, slot: usize, cells: &[u16; 8], signs: [u8; 4], out: &mut [u8]) {
    match kind {
        BlockType::IQ2_XXS => {
            let q = &mut out[2 + 8 * ib..2 + 8 * ib + 8];
            for k in 0..4 {
                q[k] = cells[k] as u8;
            }
            let bits = (0..4).fold(0u32, |a, k| a | u32::from(signs[k] & 127) << (7 * k));
            q[4..8].copy_from_slice(&bits.to_le_bytes());
        }
        BlockType::IQ2_XS => {
            for k in 0..2 {
                let v = cells[k] | u16::from(signs[k] & 127) << 9;
                out[2 + 2 * (2 * ib + k)..][..2].copy_from_slice(&v.to_le_bytes());
            }
        }
        BlockType::IQ2_S => {
            for k in 0..2 {
                let i8 = 2 * ib + k;
                out[2 + i8] = cells[k] as u8;
                out[66 + i8 / 4] |= ((cells[k] >> 8) << (2 * (i8 % 4))) as u8;
                out[2 + 32 + i8] = signs[k];
            }
        }
        BlockType::IQ3_XXS => {
            for k in 0..8 {
                out[2 + 8 * ib + k] = cells[k] as u8;
            }
            let bits = (0..4).fold(0u32, |a, k| a | u32::from(signs[k] & 127) << (7 * k));
            out[2 + 64 + 4 * ib..][..4].copy_from_slice(&bits.to_le_bytes());
        }
        _ => {
            for k in 0..8 {
                out[2 + 8 * slot + k] = cells[k] as u8;
                out[2 + 64 + ib] |= ((cells[k] >> 8) << k) as u8;
            }
            out[2 + 72 + 4 * slot..][..4].copy_from_slice(&signs);
        }
    }
}

/// Writes group `ib`'s 4-bit scale `code`.
fn put_scale(kind: BlockType, ib: usize, code: u8, out: &mut [u8]) {
    let nibble = |out: &mut [u8], at: usize| out[at + ib / 2] |= code << (4 * (ib % 2));
    match kind {
        BlockType::IQ2_XXS => out[2 + 8 * ib + 7] |= code << 4,
        BlockType::IQ2_XS => nibble(out, 66),
        BlockType::IQ2_S => nibble(out, 74),
        BlockType::IQ3_XXS => out[2 + 64 + 4 * ib + 3] |= code << 4,
        _ => nibble(out, 106),
    }
}
