//! Where the SIMD decoders find each state's 16-bit window, as compile-time tables per K.
//!
//! Eight consecutive trellis positions span 8K stream bits, exactly K bytes, so one 16-byte load
//! covers the eight windows of a group. A byte gather ([`crate::simd::Lanes::gather_u32x8`]) then
//! puts each window's (up to) three big-endian bytes into a 32-bit lane, and a per-lane right
//! shift drops the bits behind the window. The tables say where each group's load starts, which
//! loaded byte goes where, and how far each lane shifts.

use crate::codec::tile::{bytes_per_tile, K_RANGE, TILE_LEN};
use crate::simd::ZERO_BYTE;

/// Groups of 8 states per tile.
pub(super) const GROUPS: usize = TILE_LEN / 8;

/// The tables of one K.
pub(super) struct WindowLayout {
    /// Tile byte offset of each group's 16-byte load, word-aligned and never past the tile's end;
    /// −4 means the tile's last word followed by its first 12 bytes (the wrap-around).
    pub base: [isize; GROUPS],
    /// Each group's shuffle of the loaded bytes, windows 0–3 in the first 16 entries and 4–7 in
    /// the rest: byte `2 − d` of lane `j` takes byte `d` of window `j`; the other bytes are zero.
    pub shuffle: [[u8; 32]; GROUPS],
    /// Right shift of lane `j` that drops the bits behind its window (the same for every group).
    pub shift: [u32; 8],
}

const fn layout(k: usize) -> WindowLayout {
    let k = k as isize;
    let n = 32 * k;
    let mut l = WindowLayout { base: [0; GROUPS], shuffle: [[ZERO_BYTE; 32]; GROUPS], shift: [0; 8] };
    let mut g = 0;
    while g < GROUPS as isize {
        // Window j of group g covers stream bits [start, start + 16), start = 8gK + (j+1)K − 16,
        // that is stream bytes start/8 .. start/8 + 2 (the third only if start is not a multiple
        // of 8). The load begins at the word holding the group's first byte, or ends at the
        // tile's last byte where it would otherwise read past it.
        let first = (8 * g * k + k - 16).div_euclid(8);
        let aligned = 4 * first.div_euclid(4);
        let base = if aligned < n - 16 { aligned } else { n - 16 };
        l.base[g as usize] = base;
        let mut j = 0;
        while j < 8 {
            let start = 8 * g * k + (j + 1) * k - 16;
            let bytes = if start.rem_euclid(8) == 0 { 2 } else { 3 };
            let mut d = 0;
            while d < bytes {
                // Stream byte q is tile byte q ^ 3 (little-endian u32 words, MSB-first stream);
                // `base` is a multiple of 4, so this holds relative to it too.
                let pos = (start.div_euclid(8) + d - base) ^ 3;
                assert!(pos >= 0 && pos < 16);
                l.shuffle[g as usize][(4 * j + 2 - d) as usize] = pos as u8;
                d += 1;
            }
            l.shift[j as usize] = 8 - start.rem_euclid(8) as u32;
            j += 1;
        }
        g += 1;
    }
    l
}

/// The tables for K = 1 … 8.
pub(super) static LAYOUTS: [WindowLayout; 8] =
    [layout(1), layout(2), layout(3), layout(4), layout(5), layout(6), layout(7), layout(8)];

/// Number of whole tiles in `bytes`, after checking K and that `out_len` values have room for
/// all of them.
pub(super) fn check_sizes(bytes: &[u8], k: u32, out_len: usize) -> usize {
    assert!(K_RANGE.contains(&k), "K={k} out of range");
    let tiles = bytes.len() / bytes_per_tile(k);
    assert!(out_len >= tiles * TILE_LEN, "output too short");
    tiles
}
