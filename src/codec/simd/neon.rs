//! NEON tile decoder for aarch64, where NEON is part of the base instruction set.
//!
//! The window extraction is the AVX2 decoder's on 128-bit vectors. Eight consecutive positions
//! span 8K stream bits, exactly K bytes, so one 16-byte load covers all eight windows; two table
//! lookups (`tbl`) put each window's (up to) three big-endian bytes into a 32-bit lane of one of
//! two vectors (windows 0–3 and 4–7), and a per-lane shift (`ushl` with negative counts, i.e. a
//! right shift) aligns it. Load offsets, lookup tables and shifts are the AVX2 decoder's
//! (`windows.rs`); no load passes the end of a tile and the wrap-around is one `ext`, so nothing is copied.
//!
//! Codebooks, four states per vector:
//! - 3INST/MCG: the masked hash *is* a pair of fp16 values, so `fcvtl`/`fcvtl2` widen both halves
//!   of every lane to f32 (exactly), one pairwise add (`faddp`) sums each state's two halves
//!   (exactly: the exponents are 12..15), and `fcvtn` + `fcvtl` round once to fp16 and back.
//! - MUL1: the byte sum is two pairwise widening adds (`uaddlp`); `(1024 + b)·S + B` is computed as
//!   one fused `b·S + (1024·S + B)`. Both forms round once, to the same value: `b·S`, `(1024+b)·S`
//!   and `1024·S + B` are exact in f32, so both are the f32 rounding of the same real number.
//!
//! The fp16 conversions are written as inline assembly because their intrinsics need the unstable
//! `f16` type. They are base `AArch64` instructions and round to nearest, ties to even, under the
//! default FPCR, which Rust code may assume.

use super::windows::{check_sizes, GROUPS, LAYOUTS};
use crate::codec::codebook::{
    Codebook, HALVES_MASK, HALVES_XOR, INST_ADD, INST_MUL, MCG_MUL, MUL1_BIAS, MUL1_MUL, MUL1_SCALE,
};
use crate::codec::decoder::TileDecoder;
use crate::codec::tile::{bytes_per_tile, TILE_LEN};
#[allow(clippy::wildcard_imports)] // the intrinsics
use std::arch::aarch64::*;
use std::arch::asm;

/// The NEON decoder; available on every aarch64 CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct NeonDecoder;

impl TileDecoder for NeonDecoder {
    fn name(&self) -> &'static str {
        "neon"
    }

    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        let tiles = check_sizes(bytes, k, out.len());
        // SAFETY: sizes were checked: every load stays inside one of the `tiles` tiles of `bytes`
        // and every store inside the first `tiles · 256` values of `out`. NEON is always present.
        unsafe {
            match cb {
                Codebook::ThreeInst => {
                    for_each_tile(bytes, k, tiles, |t, g, w| store_values(out, t, g, inst_values(w)));
                }
                Codebook::Mcg => for_each_tile(bytes, k, tiles, |t, g, w| store_values(out, t, g, mcg_values(w))),
                Codebook::Mul1 => for_each_tile(bytes, k, tiles, |t, g, w| store_values(out, t, g, mul1_values(w))),
            }
        }
    }

    fn states(&self, bytes: &[u8], k: u32, out: &mut [u16]) {
        let tiles = check_sizes(bytes, k, out.len());
        // SAFETY: as in `decode_tiles`.
        unsafe { for_each_tile(bytes, k, tiles, |t, g, w| store_states(out, t, g, w)) }
    }
}

/// The eight raw windows of one group: lanes hold the window in their low 16 bits and stray bits
/// of the window's first byte above.
#[derive(Clone, Copy)]
struct Windows([uint32x4_t; 2]);

/// Calls `emit(tile, group, windows)` for each group of 8 states of every tile, in order.
///
/// Safety: `bytes` must hold at least `tiles` tiles of `k` bits per weight.
#[inline(always)]
unsafe fn for_each_tile(bytes: &[u8], k: u32, tiles: usize, emit: impl FnMut(usize, usize, Windows)) {
    unsafe {
        debug_assert!(bytes.len() >= tiles * bytes_per_tile(k));
        match k {
            1 => tiles_k::<1>(bytes, tiles, emit),
            2 => tiles_k::<2>(bytes, tiles, emit),
            3 => tiles_k::<3>(bytes, tiles, emit),
            4 => tiles_k::<4>(bytes, tiles, emit),
            5 => tiles_k::<5>(bytes, tiles, emit),
            6 => tiles_k::<6>(bytes, tiles, emit),
            7 => tiles_k::<7>(bytes, tiles, emit),
            8 => tiles_k::<8>(bytes, tiles, emit),
            _ => unreachable!("K checked by the caller"),
        }
    }
}

/// [`for_each_tile`] for one K, so that the tile size and the shifts are compile-time constants.
#[inline(always)]
unsafe fn tiles_k<const K: usize>(bytes: &[u8], tiles: usize, mut emit: impl FnMut(usize, usize, Windows)) {
    unsafe {
        let n = bytes_per_tile(K as u32);
        let lay = &LAYOUTS[K - 1];
        // `ushl` shifts right by a negative count.
        let shift = [vnegq_s32(vld1q_s32(lay.shift.as_ptr())), vnegq_s32(vld1q_s32(lay.shift.as_ptr().add(4)))];
        for t in 0..tiles {
            let tile = bytes.as_ptr().add(t * n);
            let wrapped = vextq_u8::<12>(vld1q_u8(tile.add(n - 16)), vld1q_u8(tile));
            // Only the first two groups can wrap around.
            for g in 0..2 {
                let v = if lay.base[g] < 0 { wrapped } else { vld1q_u8(tile.offset(lay.base[g])) };
                emit(t, g, windows(v, &lay.shuffle[g], shift));
            }
            for g in 2..GROUPS {
                emit(t, g, windows(vld1q_u8(tile.offset(lay.base[g])), &lay.shuffle[g], shift));
            }
        }
    }
}

/// Eight 16-bit windows from 16 stream bytes.
#[inline(always)]
unsafe fn windows(v: uint8x16_t, tbl: &[u8; 32], shift: [int32x4_t; 2]) -> Windows {
    unsafe {
        let lanes = |half: usize| {
            let w = vreinterpretq_u32_u8(vqtbl1q_u8(v, vld1q_u8(tbl.as_ptr().add(16 * half))));
            vshlq_u32(w, shift[half])
        };
        Windows([lanes(0), lanes(1)])
    }
}

/// The eight states of a group, zero-extended to 32-bit lanes.
#[inline(always)]
unsafe fn states32(w: Windows) -> [uint32x4_t; 2] {
    unsafe {
        let mask = vdupq_n_u32(0xFFFF);
        [vandq_u32(w.0[0], mask), vandq_u32(w.0[1], mask)]
    }
}

#[inline(always)]
unsafe fn store_values(out: &mut [f32], tile: usize, group: usize, v: [float32x4_t; 2]) {
    unsafe {
        let p = out.as_mut_ptr().add(tile * TILE_LEN + 8 * group);
        vst1q_f32(p, v[0]);
        vst1q_f32(p.add(4), v[1]);
    }
}

#[inline(always)]
unsafe fn store_states(out: &mut [u16], tile: usize, group: usize, w: Windows) {
    unsafe {
        // The low halves of the 32-bit lanes are the states.
        let s = vuzp1q_u16(vreinterpretq_u16_u32(w.0[0]), vreinterpretq_u16_u32(w.0[1]));
        vst1q_u16(out.as_mut_ptr().add(tile * TILE_LEN + 8 * group), s);
    }
}

#[inline(always)]
unsafe fn inst_values(w: Windows) -> [float32x4_t; 2] {
    unsafe {
        let (mul, add) = (vdupq_n_u32(INST_MUL), vdupq_n_u32(INST_ADD));
        let s = states32(w);
        round_to_f16([halves_sum(vmlaq_u32(add, s[0], mul)), halves_sum(vmlaq_u32(add, s[1], mul))])
    }
}

#[inline(always)]
unsafe fn mcg_values(w: Windows) -> [float32x4_t; 2] {
    unsafe {
        let mul = vdupq_n_u32(MCG_MUL);
        let s = states32(w);
        round_to_f16([halves_sum(vmulq_u32(s[0], mul)), halves_sum(vmulq_u32(s[1], mul))])
    }
}

/// 3INST/MCG tail before the rounding: mask and xor make each 32-bit lane two fp16 values, both
/// are widened to f32 and each lane's pair is added (exact). The same sum as the reference,
/// whose operands are `lo + hi`; IEEE addition is commutative.
#[inline(always)]
unsafe fn halves_sum(y: uint32x4_t) -> float32x4_t {
    unsafe {
        let h = veorq_u32(vandq_u32(y, vdupq_n_u32(HALVES_MASK)), vdupq_n_u32(HALVES_XOR));
        let (a, b) = widen_f16(h);
        vpaddq_f32(a, b)
    }
}

/// MUL1: byte sum of the hash, then `(1024 + b)·S + B` as one fused `b·S + C` (module comment).
#[inline(always)]
unsafe fn mul1_values(w: Windows) -> [float32x4_t; 2] {
    unsafe {
        const C: f32 = 1024.0 * MUL1_SCALE + MUL1_BIAS;
        let value = |s: uint32x4_t| {
            let y = vmulq_u32(s, vdupq_n_u32(MUL1_MUL));
            let b = vpaddlq_u16(vpaddlq_u8(vreinterpretq_u8_u32(y)));
            vfmaq_f32(vdupq_n_f32(C), vcvtq_f32_u32(b), vdupq_n_f32(MUL1_SCALE))
        };
        let s = states32(w);
        round_to_f16([value(s[0]), value(s[1])])
    }
}

/// The eight fp16 values of `h`'s lanes (low half first) as f32: lanes 0–1 of `h`, then 2–3.
#[inline(always)]
unsafe fn widen_f16(h: uint32x4_t) -> (float32x4_t, float32x4_t) {
    unsafe {
        let (a, b): (float32x4_t, float32x4_t);
        asm!(
            "fcvtl {a:v}.4s, {h:v}.4h",
            "fcvtl2 {b:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            a = out(vreg) a,
            b = out(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
        (a, b)
    }
}

/// Rounds to fp16 (to nearest, ties to even) and widens back, eight values at a time.
#[inline(always)]
unsafe fn round_to_f16(v: [float32x4_t; 2]) -> [float32x4_t; 2] {
    unsafe {
        let (lo, hi): (float32x4_t, float32x4_t);
        asm!(
            "fcvtn {t:v}.4h, {a:v}.4s",
            "fcvtn2 {t:v}.8h, {b:v}.4s",
            "fcvtl {lo:v}.4s, {t:v}.4h",
            "fcvtl2 {hi:v}.4s, {t:v}.8h",
            a = in(vreg) v[0],
            b = in(vreg) v[1],
            t = out(vreg) _,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags),
        );
        [lo, hi]
    }
}
