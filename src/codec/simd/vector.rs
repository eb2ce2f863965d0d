//! The vector tile decoder, written once over [`Lanes`] and compiled for each CPU by one
//! `#[target_feature]` entry: AVX2 on `x86_64` (eight lanes), NEON on aarch64 (four).
//!
//! States come eight at a time. Eight consecutive positions span 8K stream bits, exactly K bytes,
//! so one 16-byte load covers all eight windows; [`Lanes::gather_u32x8`] puts each window's (up
//! to) three big-endian bytes into its own 32-bit lane and shifts it into place (the per-K tables
//! of offsets, byte indices and shifts are in `windows.rs`). No load passes the end of a tile: the
//! wrap-around is the tile's last word joined to its first bytes, in registers.
//!
//! Codebooks, the reference's arithmetic in lanes:
//! - 3INST/MCG: the masked hash is a pair of binary16 values in each lane; their sum is exact in
//!   f32 ([`Words::f16_pair_sum`]) and is rounded once to binary16.
//! - MUL1: the byte sum `b` of the hash, then `b·S + (1024·S + B)`, rounded once to binary16.
//!   `b·S`, `(1024 + b)·S` and `1024·S + B` are all exact in f32, so this rounds the same real
//!   number as the reference's `(1024 + b)·S + B`, fused or not.

use super::windows::{check_sizes, GROUPS, LAYOUTS};
use crate::codec::codebook::{Codebook, HALVES_XOR, INST_ADD, INST_MUL, MCG_MUL, MUL1_BIAS, MUL1_MUL, MUL1_SCALE};
use crate::codec::decoder::TileDecoder;
use crate::codec::tile::{bytes_per_tile, TILE_LEN};
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2 as Token;
#[cfg(target_arch = "aarch64")]
use crate::simd::Neon as Token;
use crate::simd::{Lanes, Vector, Words};

/// The decoder over this CPU's vectors; it can only be had where they were detected.
#[derive(Clone, Copy, Debug)]
pub struct VectorDecoder(Token);

impl VectorDecoder {
    /// The decoder, if this CPU has the vectors it is compiled for.
    pub fn detect() -> Option<VectorDecoder> {
        Token::detect().map(VectorDecoder)
    }
}

/// What a decode writes: values by a codebook, or the raw states.
enum Output<'a> {
    Values(Codebook, &'a mut [f32]),
    States(&'a mut [u16]),
}

impl TileDecoder for VectorDecoder {
    fn name(&self) -> &'static str {
        #[cfg(target_arch = "x86_64")]
        return "avx2";
        #[cfg(target_arch = "aarch64")]
        return "neon";
    }

    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        let tiles = check_sizes(bytes, k, out.len());
        // SAFETY: the token proves the entry's target features.
        unsafe { entry(self.0, &bytes[..tiles * bytes_per_tile(k)], k, Output::Values(cb, out)) }
    }

    fn states(&self, bytes: &[u8], k: u32, out: &mut [u16]) {
        let tiles = check_sizes(bytes, k, out.len());
        // SAFETY: as in `decode_tiles`.
        unsafe { entry(self.0, &bytes[..tiles * bytes_per_tile(k)], k, Output::States(out)) }
    }
}

/// [`decode`] compiled for AVX2 (with F16C for the binary16 rounding, FMA for MUL1).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn entry(lanes: Token, bytes: &[u8], k: u32, out: Output) {
    decode(lanes, bytes, k, out);
}

/// [`decode`] compiled for NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
fn entry(lanes: Token, bytes: &[u8], k: u32, out: Output) {
    decode(lanes, bytes, k, out);
}

/// Decodes the whole tiles of `bytes` (`out` has room for them).
#[inline(always)]
fn decode<L: Lanes>(l: L, bytes: &[u8], k: u32, out: Output) {
    match out {
        Output::Values(Codebook::ThreeInst, out) => {
            let sink =
                ThreeInst { mul: l.splat_u32(INST_MUL), add: l.splat_u32(INST_ADD), xor: l.splat_u32(HALVES_XOR) };
            for_k(l, bytes, k, out, &sink);
        }
        Output::Values(Codebook::Mcg, out) => {
            for_k(l, bytes, k, out, &Mcg { mul: l.splat_u32(MCG_MUL), xor: l.splat_u32(HALVES_XOR) });
        }
        Output::Values(Codebook::Mul1, out) => {
            let sink = Mul1 {
                mul: l.splat_u32(MUL1_MUL),
                scale: l.splat(MUL1_SCALE),
                offset: l.splat(1024.0 * MUL1_SCALE + MUL1_BIAS),
            };
            for_k(l, bytes, k, out, &sink);
        }
        Output::States(out) => for_k(l, bytes, k, out, &States),
    }
}

/// What a decode writes for each vector of states. Not closures: these are inlined for sure, so
/// that the lanes' instructions land in the `#[target_feature]` entry.
trait Sink<L: Lanes> {
    type Item;
    fn put(&self, states: L::U32, to: &mut [Self::Item]);
}

struct ThreeInst<L: Lanes> {
    mul: L::U32,
    add: L::U32,
    xor: L::U32,
}

impl<L: Lanes> Sink<L> for ThreeInst<L> {
    type Item = f32;
    #[inline(always)]
    fn put(&self, s: L::U32, to: &mut [f32]) {
        halves_sum(s * self.mul + self.add, self.xor).store(to);
    }
}

struct Mcg<L: Lanes> {
    mul: L::U32,
    xor: L::U32,
}

impl<L: Lanes> Sink<L> for Mcg<L> {
    type Item = f32;
    #[inline(always)]
    fn put(&self, s: L::U32, to: &mut [f32]) {
        halves_sum(s * self.mul, self.xor).store(to);
    }
}

/// 3INST/MCG: the codebook's xor (its mask is [`Words::f16_pair_sum`]'s reading of the exponents)
/// leaves two binary16 values in each lane, summed exactly and rounded once.
#[inline(always)]
fn halves_sum<W: Words>(y: W, xor: W) -> W::F32 {
    (y ^ xor).f16_pair_sum().round_to_f16()
}

struct Mul1<L: Lanes> {
    mul: L::U32,
    scale: L::F32,
    offset: L::F32,
}

impl<L: Lanes> Sink<L> for Mul1<L> {
    type Item = f32;
    #[inline(always)]
    fn put(&self, s: L::U32, to: &mut [f32]) {
        let b = (s * self.mul).byte_sum().to_f32();
        b.mul_add_exact(self.scale, self.offset).round_to_f16().store(to);
    }
}

struct States;

impl<L: Lanes> Sink<L> for States {
    type Item = u16;
    #[inline(always)]
    fn put(&self, s: L::U32, to: &mut [u16]) {
        s.store_u16(to);
    }
}

/// [`tiles`] for K, so that K's offsets and shifts are constants in each loop.
#[inline(always)]
fn for_k<L: Lanes, S: Sink<L>>(l: L, bytes: &[u8], k: u32, out: &mut [S::Item], sink: &S) {
    match k {
        1 => tiles::<L, S, 1>(l, bytes, out, sink),
        2 => tiles::<L, S, 2>(l, bytes, out, sink),
        3 => tiles::<L, S, 3>(l, bytes, out, sink),
        4 => tiles::<L, S, 4>(l, bytes, out, sink),
        5 => tiles::<L, S, 5>(l, bytes, out, sink),
        6 => tiles::<L, S, 6>(l, bytes, out, sink),
        7 => tiles::<L, S, 7>(l, bytes, out, sink),
        8 => tiles::<L, S, 8>(l, bytes, out, sink),
        _ => unreachable!("K checked by the caller"),
    }
}

/// Puts every vector of states of the tiles into `out`, in order.
#[inline(always)]
fn tiles<L: Lanes, S: Sink<L>, const K: usize>(l: L, bytes: &[u8], out: &mut [S::Item], sink: &S) {
    let n = bytes_per_tile(K as u32);
    let layout = &LAYOUTS[K - 1];
    let shifts = l.shifts(&layout.shift);
    for (tile, out) in bytes.chunks_exact(n).zip(out.chunks_exact_mut(TILE_LEN)) {
        // Only the first two groups can wrap around: their load is the tile's last word, then
        // its first 12 bytes.
        let wrapped = l.join_bytes(load(l, tile, n as isize - 16), load(l, tile, 0));
        for g in 0..2 {
            let base = layout.base[g];
            let v = if base < 0 { wrapped } else { load(l, tile, base) };
            group(l, v, &layout.shuffle[g], shifts, &mut out[8 * g..], sink);
        }
        for g in 2..GROUPS {
            group(l, load(l, tile, layout.base[g]), &layout.shuffle[g], shifts, &mut out[8 * g..], sink);
        }
    }
}

/// A group's 16-byte load: `base` is at most `tile.len() − 16` (`windows.rs`), which the `min`
/// shows the compiler.
#[inline(always)]
fn load<L: Lanes>(l: L, tile: &[u8], base: isize) -> L::Bytes {
    let at = (base as usize).min(tile.len() - 16);
    l.load_bytes(tile[at..][..16].try_into().unwrap())
}

/// One group's eight states, a vector at a time.
#[inline(always)]
fn group<L: Lanes, S: Sink<L>>(l: L, v: L::Bytes, table: &[u8; 32], shifts: L::Shifts, out: &mut [S::Item], sink: &S) {
    for (i, &w) in l.gather_u32x8(v, table, shifts).as_ref().iter().enumerate() {
        sink.put(w & l.splat_u32(0xFFFF), &mut out[i * L::LANES..]);
    }
}
