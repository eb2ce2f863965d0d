//! AVX2 (+F16C) tile decoder for `x86_64`, chosen at run time.
//!
//! States come eight at a time. Eight consecutive positions span 8K stream bits, exactly K bytes,
//! so one 16-byte load covers all eight windows; a byte shuffle puts each window's (up to) three
//! big-endian bytes into its own 32-bit lane and a per-lane shift aligns it (the per-K tables
//! of offsets, shuffles and shifts are in `windows.rs`). The codebooks are then evaluated in integer
//! and f32 lanes as in the portable decoder, with F16C doing the one fp16 rounding.

use super::portable::{HALF_HIGH_EXP, HALF_LOW_BITS, SIGN};
use super::windows::{check_sizes, GROUPS, LAYOUTS};
use crate::codec::codebook::{Codebook, HALVES_XOR, INST_ADD, INST_MUL, MCG_MUL, MUL1_BIAS, MUL1_MUL, MUL1_SCALE};
use crate::codec::decoder::TileDecoder;
use crate::codec::tile::{bytes_per_tile, TILE_LEN};
#[allow(clippy::wildcard_imports)] // the intrinsics
use std::arch::x86_64::*;

/// The AVX2 decoder. It can only be obtained on a CPU that has AVX2 and F16C.
#[derive(Debug)]
pub struct Avx2Decoder {
    _private: (),
}

static AVX2: Avx2Decoder = Avx2Decoder { _private: () };

impl Avx2Decoder {
    /// The decoder, if this CPU supports AVX2 and F16C.
    pub fn get() -> Option<&'static Avx2Decoder> {
        crate::cpu::has_avx2_f16c().then_some(&AVX2)
    }
}

impl TileDecoder for Avx2Decoder {
    fn name(&self) -> &'static str {
        "avx2"
    }

    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        let tiles = check_sizes(bytes, k, out.len());
        // SAFETY: `Avx2Decoder` exists only where AVX2 and F16C were detected; sizes were checked.
        unsafe {
            match cb {
                Codebook::ThreeInst => {
                    for_each_tile(bytes, k, tiles, |t, g, s| store_values(out, t, g, inst_values(s)));
                }
                Codebook::Mcg => for_each_tile(bytes, k, tiles, |t, g, s| store_values(out, t, g, mcg_values(s))),
                Codebook::Mul1 => for_each_tile(bytes, k, tiles, |t, g, s| store_values(out, t, g, mul1_values(s))),
            }
        }
    }

    fn states(&self, bytes: &[u8], k: u32, out: &mut [u16]) {
        let tiles = check_sizes(bytes, k, out.len());
        // SAFETY: as in `decode_tiles`.
        unsafe { for_each_tile(bytes, k, tiles, |t, g, s| store_states(out, t, g, s)) }
    }
}

/// Calls `emit(tile, group, states)` for each group of 8 states of every tile, in order.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn for_each_tile(bytes: &[u8], k: u32, tiles: usize, emit: impl FnMut(usize, usize, __m256i)) {
    unsafe {
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

/// [`for_each_tile`] for one K, so that offsets and shifts are compile-time constants.
#[target_feature(enable = "avx2,f16c")]
unsafe fn tiles_k<const K: usize>(bytes: &[u8], tiles: usize, mut emit: impl FnMut(usize, usize, __m256i)) {
    unsafe {
        let n = bytes_per_tile(K as u32);
        let lay = &LAYOUTS[K - 1];
        let shift = _mm256_loadu_si256(lay.shift.as_ptr().cast());
        for t in 0..tiles {
            let tile = bytes.as_ptr().add(t * n);
            let wrapped = _mm_alignr_epi8::<12>(load16(tile), load16(tile.add(n - 16)));
            // Only the first two groups can wrap around.
            for g in 0..2 {
                let v = if lay.base[g] < 0 { wrapped } else { load16(tile.offset(lay.base[g])) };
                emit(t, g, windows(v, load32(&lay.shuffle[g]), shift));
            }
            for g in 2..GROUPS {
                emit(t, g, windows(load16(tile.offset(lay.base[g])), load32(&lay.shuffle[g]), shift));
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load32(bytes: &[u8; 32]) -> __m256i {
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load16(p: *const u8) -> __m128i {
    unsafe { _mm_loadu_si128(p.cast()) }
}

/// Eight 16-bit windows from 16 stream bytes, one per 32-bit lane.
#[inline]
#[target_feature(enable = "avx2")]
fn windows(v: __m128i, ctrl: __m256i, shift: __m256i) -> __m256i {
    {
        let w = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(v), ctrl);
        _mm256_and_si256(_mm256_srlv_epi32(w, shift), splat(0xFFFF))
    }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_values(out: &mut [f32], tile: usize, group: usize, v: __m256) {
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr().add(tile * TILE_LEN + 8 * group), v);
    }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_states(out: &mut [u16], tile: usize, group: usize, s: __m256i) {
    unsafe {
        let packed = _mm_packus_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        _mm_storeu_si128(out.as_mut_ptr().add(tile * TILE_LEN + 8 * group).cast(), packed);
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn splat(x: u32) -> __m256i {
    {
        _mm256_set1_epi32(x as i32)
    }
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn inst_values(s: __m256i) -> __m256 {
    {
        halves_sum(_mm256_add_epi32(_mm256_mullo_epi32(s, splat(INST_MUL)), splat(INST_ADD)))
    }
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn mcg_values(s: __m256i) -> __m256 {
    {
        halves_sum(_mm256_mullo_epi32(s, splat(MCG_MUL)))
    }
}

/// 3INST/MCG tail: each half widened to f32 by moving bits, exact f32 sum, one fp16 rounding.
///
/// An arithmetic shift moves a half's sign, exponent and mantissa to their f32 places; the copies
/// of the sign and the exponent bits the codebook forces anyway are then overwritten.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn halves_sum(y: __m256i) -> __m256 {
    {
        let y = _mm256_xor_si256(y, splat(HALVES_XOR));
        let to_f32 = |shifted: __m256i, keep: u32| {
            _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(shifted, splat(keep)), splat(HALF_HIGH_EXP)))
        };
        let hi = to_f32(_mm256_srai_epi32::<3>(y), SIGN | HALF_LOW_BITS);
        let lo = to_f32(_mm256_srai_epi32::<3>(_mm256_slli_epi32::<16>(y)), SIGN | HALF_LOW_BITS);
        round_to_f16(_mm256_add_ps(lo, hi))
    }
}

/// MUL1: byte sum by two multiply-adds, then the exact f32 multiply-add, one fp16 rounding.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn mul1_values(s: __m256i) -> __m256 {
    {
        let y = _mm256_mullo_epi32(s, splat(MUL1_MUL));
        let pairs = _mm256_maddubs_epi16(y, _mm256_set1_epi8(1));
        let sum = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        let h = _mm256_cvtepi32_ps(_mm256_add_epi32(sum, splat(1024)));
        round_to_f16(_mm256_add_ps(_mm256_mul_ps(h, _mm256_set1_ps(MUL1_SCALE)), _mm256_set1_ps(MUL1_BIAS)))
    }
}

/// Rounds to fp16 (to nearest, ties to even, whatever MXCSR says) and widens back.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn round_to_f16(v: __m256) -> __m256 {
    {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }
}
