//! The decoder for every target without a dedicated SIMD path (`x86_64` without AVX2, targets other
//! than `x86_64` and aarch64).
//!
//! Plain integer code with no table lookups, so that the compiler can vectorise the codebook loop
//! (NEON on aarch64, SSE2 on `x86_64`). It is built and tested on every target.

use crate::codec::codebook::{Codebook, HALVES_XOR, INST_ADD, INST_MUL, MCG_MUL, MUL1_BIAS, MUL1_MUL, MUL1_SCALE};
use crate::codec::decoder::TileDecoder;
use crate::codec::tile::{bytes_per_tile, TILE_LEN};

/// Branch-free state extraction and codebook arithmetic; bit-identical to the scalar reference.
#[derive(Clone, Copy, Debug, Default)]
pub struct PortableDecoder;

impl TileDecoder for PortableDecoder {
    fn name(&self) -> &'static str {
        "portable"
    }

    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        let mut states = [0u16; TILE_LEN];
        for (tile, values) in bytes.chunks_exact(bytes_per_tile(k)).zip(out.chunks_exact_mut(TILE_LEN)) {
            extract_states(tile, k, &mut states);
            // One monomorphic loop per codebook, so each vectorises on its own.
            match cb {
                Codebook::ThreeInst => {
                    map(&states, values, |x| halves_sum(x.wrapping_mul(INST_MUL).wrapping_add(INST_ADD)));
                }
                Codebook::Mcg => map(&states, values, |x| halves_sum(x.wrapping_mul(MCG_MUL))),
                Codebook::Mul1 => map(&states, values, mul1_value),
            }
        }
    }

    fn states(&self, bytes: &[u8], k: u32, out: &mut [u16]) {
        for (tile, states) in bytes.chunks_exact(bytes_per_tile(k)).zip(out.chunks_exact_mut(TILE_LEN)) {
            extract_states(tile, k, states.try_into().unwrap());
        }
    }
}

#[inline(always)]
fn map(states: &[u16; TILE_LEN], values: &mut [f32], f: impl Fn(u32) -> f32) {
    for (v, &s) in values[..TILE_LEN].iter_mut().zip(states) {
        *v = f(s as u32);
    }
}

/// All 256 states of one tile.
///
/// The stream is laid out as big-endian bytes behind a copy of its last two bytes; in that buffer
/// the window of position `t` (stream bits `[(t+1)K − 16, (t+1)K)`) starts at bit `(t+1)K`, so
/// every window is read from three bytes without wrapping.
fn extract_states(tile: &[u8], k: u32, out: &mut [u16; TILE_LEN]) {
    let n = bytes_per_tile(k);
    // 2 wrapped bytes + at most 256 stream bytes + 1 byte read (and shifted out) by the last window.
    let mut e = [0u8; 2 + 256 + 1];
    for (dst, src) in e[2..2 + n].chunks_exact_mut(4).zip(tile[..n].chunks_exact(4)) {
        dst.copy_from_slice(&[src[3], src[2], src[1], src[0]]);
    }
    e[0] = e[n];
    e[1] = e[n + 1];
    let k = k as usize;
    for (t, s) in out.iter_mut().enumerate() {
        let p = (t + 1) * k;
        let b = p >> 3;
        let w = (e[b] as u32) << 16 | (e[b + 1] as u32) << 8 | e[b + 2] as u32;
        *s = (w >> (8 - (p & 7))) as u16;
    }
}

/// f32 sign bit.
const SIGN: u32 = 0x8000_0000;
/// A half's low two exponent bits and its mantissa, moved to their f32 places.
const HALF_LOW_BITS: u32 = 0x01FF_E000;
/// The f32 exponent bits every half shares: after the codebook's mask and xor each half has
/// exponent field `0b011ab`, i.e. f32 exponent `0b0111_11ab`.
const HALF_HIGH_EXP: u32 = 0x3E00_0000;

/// 3INST/MCG tail without lookups: both halves widened to f32 by moving bits, summed exactly,
/// rounded once to fp16.
#[inline(always)]
fn halves_sum(y: u32) -> f32 {
    // The codebook's mask only clears bits that are rebuilt from HALF_HIGH_EXP; the xor matters.
    let y = y ^ HALVES_XOR;
    let hi = (y & SIGN) | ((y >> 3) & HALF_LOW_BITS) | HALF_HIGH_EXP;
    let lo = ((y << 16) & SIGN) | ((y << 13) & HALF_LOW_BITS) | HALF_HIGH_EXP;
    round_to_f16(f32::from_bits(lo) + f32::from_bits(hi))
}

/// MUL1: byte sum of the hash, one exact multiply-add in f32, rounded once to fp16.
#[inline(always)]
fn mul1_value(x: u32) -> f32 {
    let y = x.wrapping_mul(MUL1_MUL);
    let b = (y & 0xFF) + ((y >> 8) & 0xFF) + ((y >> 16) & 0xFF) + (y >> 24);
    round_to_f16((1024 + b) as f32 * MUL1_SCALE + MUL1_BIAS)
}

/// Rounds to 11 significant bits, ties to even: fp16 RNE for values in fp16's normal range (all
/// codebook sums are, or zero), done on the f32 bits.
#[inline(always)]
fn round_to_f16(v: f32) -> f32 {
    let b = v.to_bits();
    f32::from_bits((b + 0x0FFF + ((b >> 13) & 1)) & !0x1FFF)
}
