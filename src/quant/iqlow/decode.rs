//! ggml's `dequantize_row_iq2_xxs` … `dequantize_row_iq3_s`: each value is a group scale times a
//! grid point's level, signed. The decoders' grids (`iq2xxs_grid` … `iq3s_grid` in ggml-common.h)
//! are the encoders' grids with each level replaced by its value below.

use super::grids::{IQ2_S_GRID, IQ2_XS_GRID, IQ2_XXS_GRID, IQ3_S_GRID, IQ3_XXS_GRID};
use crate::block_type::BlockType;
use half::f16;

/// The values of the IQ2 grids' three levels.
const IQ2_LEVELS: [u8; 4] = [8, 25, 43, 0];
/// The values of `IQ3_XXS`'s eight levels.
const IQ3_XXS_LEVELS: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];
/// The values of `IQ3_S`'s eight levels.
const IQ3_S_LEVELS: [u8; 8] = [1, 3, 5, 7, 9, 11, 13, 15];

/// Value `j` of IQ2 grid point `point`.
#[inline(always)]
fn iq2(point: u16, j: usize) -> f32 {
    f32::from(IQ2_LEVELS[usize::from(point >> (2 * j)) & 3])
}

/// Value `j` of IQ3 grid point `point` with level values `levels`.
#[inline(always)]
fn iq3(levels: &[u8; 8], point: u16, j: usize) -> f32 {
    f32::from(levels[usize::from(point >> (3 * j)) & 7])
}

/// ggml's `ksigns_iq2xs`: 7 stored sign bits and the 8th that makes their count even.
#[inline(always)]
fn even_signs(seven: u32) -> u8 {
    let s = (seven & 127) as u8;
    s | ((s.count_ones() as u8 & 1) << 7)
}

#[inline(always)]
fn signed(v: f32, signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 {
        -v
    } else {
        v
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Appends the 256 values of each block of `blocks` (whole blocks of `kind`).
pub(super) fn blocks(kind: BlockType, blocks: &[u8], out: &mut Vec<f32>) {
    for b in blocks.chunks_exact(kind.bytes()) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        match kind {
            BlockType::IQ2_XXS => iq2_xxs(d, b, out),
            BlockType::IQ2_XS => iq2_xs(d, b, out),
            BlockType::IQ2_S => iq2_s(d, b, out),
            BlockType::IQ3_XXS => iq3_xxs(d, b, out),
            BlockType::IQ3_S => iq3_s(d, b, out),
            other => unreachable!("{} is not an IQ2/IQ3 type", other.name()),
        }
    }
}

fn iq2_xxs(d: f32, b: &[u8], out: &mut Vec<f32>) {
    for ib in 0..8 {
        let q = &b[2 + 8 * ib..];
        let aux = u32_at(q, 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for l in 0..4 {
            let point = IQ2_XXS_GRID[usize::from(q[l])];
            let signs = even_signs(aux >> (7 * l));
            out.extend((0..8).map(|j| signed(db * iq2(point, j), signs, j)));
        }
    }
}

fn iq2_xs(d: f32, b: &[u8], out: &mut Vec<f32>) {
    for ib in 0..8 {
        let sc = b[66 + ib];
        let db = [d * (0.5 + f32::from(sc & 0xf)) * 0.25, d * (0.5 + f32::from(sc >> 4)) * 0.25];
        for l in 0..4 {
            let at = 2 + 2 * (4 * ib + l);
            let q = u16::from_le_bytes([b[at], b[at + 1]]);
            let point = IQ2_XS_GRID[usize::from(q & 511)];
            let signs = even_signs(u32::from(q >> 9));
            out.extend((0..8).map(|j| signed(db[l / 2] * iq2(point, j), signs, j)));
        }
    }
}

fn iq2_s(d: f32, b: &[u8], out: &mut Vec<f32>) {
    for ib in 0..8 {
        let sc = b[74 + ib];
        let db = [d * (0.5 + f32::from(sc & 0xf)) * 0.25, d * (0.5 + f32::from(sc >> 4)) * 0.25];
        let qh = usize::from(b[66 + ib]);
        for l in 0..4 {
            let index = usize::from(b[2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300);
            let point = IQ2_S_GRID[index];
            let signs = b[2 + 32 + 4 * ib + l];
            out.extend((0..8).map(|j| signed(db[l / 2] * iq2(point, j), signs, j)));
        }
    }
}

fn iq3_xxs(d: f32, b: &[u8], out: &mut Vec<f32>) {
    for ib in 0..8 {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = even_signs(aux >> (7 * l));
            let first = IQ3_XXS_GRID[usize::from(b[2 + 8 * ib + 2 * l])];
            let second = IQ3_XXS_GRID[usize::from(b[2 + 8 * ib + 2 * l + 1])];
            out.extend((0..4).map(|j| signed(db * iq3(&IQ3_XXS_LEVELS, first, j), signs, j)));
            out.extend((0..4).map(|j| signed(db * iq3(&IQ3_XXS_LEVELS, second, j), signs, j + 4)));
        }
    }
}

fn iq3_s(d: f32, b: &[u8], out: &mut Vec<f32>) {
    for ib in 0..8 {
        let sc = b[106 + ib / 2];
        let code = if ib % 2 == 0 { sc & 0xf } else { sc >> 4 };
        let db = d * (1 + 2 * i32::from(code)) as f32;
        let qh = usize::from(b[66 + ib]);
        for l in 0..4 {
            let q = &b[2 + 8 * ib + 2 * l..];
            let first = IQ3_S_GRID[usize::from(q[0]) | ((qh << (8 - 2 * l)) & 256)];
            let second = IQ3_S_GRID[usize::from(q[1]) | ((qh << (7 - 2 * l)) & 256)];
            let signs = b[74 + 4 * ib + l];
            out.extend((0..4).map(|j| signed(db * iq3(&IQ3_S_LEVELS, first, j), signs, j)));
            out.extend((0..4).map(|j| signed(db * iq3(&IQ3_S_LEVELS, second, j), signs, j + 4)));
        }
    }
}
