//! [`Lanes`] for NEON (aarch64): four f32 lanes in a `float32x4_t`, four u32 lanes in a
//! `uint32x4_t`.
//!
//! The binary16 conversions are inline assembly because their intrinsics need the unstable `f16`
//! type. They are base aarch64 instructions and round to nearest, ties to even, under the default
//! FPCR, which Rust code may assume.

use super::{Lanes, Mask, Vector, Words};
#[allow(clippy::wildcard_imports)] // the intrinsics
use std::arch::aarch64::*;
use std::arch::asm;
use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Sub};

/// Proof that this CPU has NEON (every aarch64 CPU does; it is detected all the same, so that the
/// token means one thing everywhere): made only by [`Neon::detect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Neon(());

impl Neon {
    /// The token, if this CPU has NEON (every aarch64 CPU that Linux and macOS run on does). The
    /// one place that asks the CPU.
    pub fn detect() -> Option<Neon> {
        std::arch::is_aarch64_feature_detected!("neon").then_some(Neon(()))
    }
}

/// Four f32 lanes; made only through a [`Neon`] token.
#[derive(Clone, Copy, Debug)]
pub struct NeonF32(float32x4_t);

/// Four u32 lanes; made only through a [`Neon`] token.
#[derive(Clone, Copy, Debug)]
pub struct NeonU32(uint32x4_t);

/// Sixteen bytes.
#[derive(Clone, Copy, Debug)]
pub struct NeonBytes(uint8x16_t);

/// Eight left-shift counts, negative (`ushl` shifts right by a negative count).
#[derive(Clone, Copy, Debug)]
pub struct NeonShifts([int32x4_t; 2]);

/// Four lane conditions of a [`NeonF32`].
#[derive(Clone, Copy, Debug)]
pub struct NeonMask(uint32x4_t);

/// 32 byte codes in order, 16 per register.
#[derive(Clone, Copy, Debug)]
pub struct NeonCodes([uint8x16_t; 2]);

// SAFETY (every `unsafe` block below): a token or a vector exists, so NEON was detected (see the
// module documentation of `simd`); memory is reached through slices whose length is checked first.

impl Lanes for Neon {
    const LANES: usize = 4;
    type F32 = NeonF32;
    type U32 = NeonU32;
    type U32x8 = [NeonU32; 2];
    type Bytes = NeonBytes;
    type Shifts = NeonShifts;

    #[inline(always)]
    fn splat_u32(self, v: u32) -> NeonU32 {
        NeonU32(unsafe { vdupq_n_u32(v) })
    }

    #[inline(always)]
    fn load_bytes(self, x: &[u8; 16]) -> NeonBytes {
        NeonBytes(unsafe { vld1q_u8(x.as_ptr()) })
    }

    #[inline(always)]
    fn join_bytes(self, end: NeonBytes, start: NeonBytes) -> NeonBytes {
        NeonBytes(unsafe { vextq_u8::<12>(end.0, start.0) })
    }

    #[inline(always)]
    fn shifts(self, right: &[u32; 8]) -> NeonShifts {
        let left = |at: usize| unsafe { vnegq_s32(vreinterpretq_s32_u32(vld1q_u32(right[at..].as_ptr()))) };
        NeonShifts([left(0), left(4)])
    }

    #[inline(always)]
    fn gather_u32x8(self, v: NeonBytes, table: &[u8; 32], shift: NeonShifts) -> [NeonU32; 2] {
        let half = |h: usize| unsafe {
            let w = vqtbl1q_u8(v.0, vld1q_u8(table[16 * h..].as_ptr()));
            NeonU32(vshlq_u32(vreinterpretq_u32_u8(w), shift.0[h]))
        };
        [half(0), half(1)]
    }

    #[inline(always)]
    fn splat(self, v: f32) -> NeonF32 {
        NeonF32(unsafe { vdupq_n_f32(v) })
    }

    #[inline(always)]
    fn load(self, x: &[f32]) -> NeonF32 {
        let x = &x[..4];
        NeonF32(unsafe { vld1q_f32(x.as_ptr()) })
    }

    #[inline(always)]
    fn load_columns(self, x: &[f32], stride: usize, out: &mut [NeonF32]) {
        let mut r = [unsafe { vdupq_n_f32(0.0) }; 4];
        for (j, row) in r.iter_mut().enumerate() {
            *row = self.load(&x[j * stride..]).0;
        }
        let out = &mut out[..4];
        unsafe {
            let t0 = vreinterpretq_f64_f32(vtrn1q_f32(r[0], r[1]));
            let t1 = vreinterpretq_f64_f32(vtrn2q_f32(r[0], r[1]));
            let t2 = vreinterpretq_f64_f32(vtrn1q_f32(r[2], r[3]));
            let t3 = vreinterpretq_f64_f32(vtrn2q_f32(r[2], r[3]));
            out[0] = NeonF32(vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)));
            out[1] = NeonF32(vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)));
            out[2] = NeonF32(vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)));
            out[3] = NeonF32(vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)));
        }
    }

    type Codes = NeonCodes;

    // `fcvtnu` rounds to nearest even and saturates to u32 (negatives and NaN give 0); after the
    // `min` every code fits a byte, so the narrowing keeps the low halves.
    #[inline(always)]
    fn round_to_codes(self, v: &[NeonF32], max: u32) -> NeonCodes {
        let v = &v[..8];
        unsafe {
            let max = vdupq_n_u32(max);
            let code = |x: NeonF32| vreinterpretq_u16_u32(vminq_u32(vcvtnq_u32_f32(x.0), max));
            let halves = |i: usize| vreinterpretq_u8_u16(vuzp1q_u16(code(v[i]), code(v[i + 1])));
            let bytes = |i: usize| vuzp1q_u8(halves(i), halves(i + 2));
            NeonCodes([bytes(0), bytes(4)])
        }
    }

    // Three shift-ors (`u16`, `u32`, `u64`) leave 8 consecutive codes in the low `b` bytes of each
    // u64, and a table lookup closes the gaps: the `2·b` bytes of 16 codes, first.
    #[inline(always)]
    fn pack_codes<const BITS: u32>(self, codes: NeonCodes, to: &mut [u8]) {
        let to = &mut to[..2 * BITS as usize + 16];
        let [low, high] = codes.0;
        unsafe {
            if BITS == 8 {
                vst1q_u8(to.as_mut_ptr(), low);
                vst1q_u8(to[16..].as_mut_ptr(), high);
                return;
            }
            let ctrl = vld1q_u8(COMPACT[BITS as usize].as_ptr());
            let b = BITS as i16;
            let (sh16, sh32, sh64) = (vdupq_n_s16(b), vdupq_n_s32(2 * b as i32), vdupq_n_s64(4 * b as i64));
            let pack16 = |v: uint8x16_t| {
                let x = vreinterpretq_u16_u8(v);
                let x = vorrq_u16(vandq_u16(x, vdupq_n_u16(0xFF)), vshlq_u16(vshrq_n_u16::<8>(x), sh16));
                let x = vreinterpretq_u32_u16(x);
                let x = vorrq_u32(vandq_u32(x, vdupq_n_u32(0xFFFF)), vshlq_u32(vshrq_n_u32::<16>(x), sh32));
                let x = vreinterpretq_u64_u32(x);
                let x = vorrq_u64(vandq_u64(x, vdupq_n_u64(0xFFFF_FFFF)), vshlq_u64(vshrq_n_u64::<32>(x), sh64));
                vqtbl1q_u8(vreinterpretq_u8_u64(x), ctrl)
            };
            // The second store overwrites the first one's zeros past `2·BITS` bytes.
            vst1q_u8(to.as_mut_ptr(), pack16(low));
            vst1q_u8(to[2 * BITS as usize..].as_mut_ptr(), pack16(high));
        }
    }

    // `ld2` loads `x0..x3, y0..y3` as `[x0 x2 y0 y2]`, `[x1 x3 y1 y3]`, so stride 1 is one add and
    // one subtract of whole vectors; `uzp1`/`uzp2` pair the stride-2 operands the same way, and a
    // last `uzp1`/`uzp2` restores the natural order.
    #[inline(always)]
    fn load_hadamard_pair(self, x: &[f32]) -> [NeonF32; 2] {
        let x = &x[..8];
        unsafe {
            let v = vld2q_f32(x.as_ptr());
            // Stride 1: s = [x'0 x'2 y'0 y'2], d = [x'1 x'3 y'1 y'3].
            let (s, d) = (vaddq_f32(v.0, v.1), vsubq_f32(v.0, v.1));
            // Stride 2: p = [x''0 y''0 x''1 y''1], q = [x''2 y''2 x''3 y''3].
            let (e, o) = (vuzp1q_f32(s, d), vuzp2q_f32(s, d));
            let (p, q) = (vaddq_f32(e, o), vsubq_f32(e, o));
            [NeonF32(vuzp1q_f32(p, q)), NeonF32(vuzp2q_f32(p, q))]
        }
    }

    #[inline(always)]
    fn mask_words(self, mask: NeonMask) -> NeonU32 {
        NeonU32(mask.0)
    }

    #[inline(always)]
    fn lookup8(self, table: &[f32; 8], NeonU32(index): NeonU32) -> NeonF32 {
        unsafe {
            // Byte b of lane j reads byte 4·index + b of the 32-byte table.
            let bytes = vmlaq_u32(vdupq_n_u32(0x0302_0100), index, vdupq_n_u32(0x0404_0404));
            let table = vld1q_u8_x2(table.as_ptr().cast());
            NeonF32(vreinterpretq_f32_u8(vqtbl2q_u8(table, vreinterpretq_u8_u32(bytes))))
        }
    }
}

/// Table lookups that keep the low `b` bytes of each u64: bytes `0..b` then `8..8 + b`, zeros
/// (index 255) after. Indexed by `b`.
static COMPACT: [[u8; 16]; 9] = {
    let mut t = [[255u8; 16]; 9];
    let mut b = 0;
    while b <= 8 {
        let mut j = 0;
        while j < b {
            t[b][j] = j as u8;
            t[b][b + j] = (8 + j) as u8;
            j += 1;
        }
        b += 1;
    }
    t
};

macro_rules! binary_op {
    ($trait:ident, $method:ident, $intrinsic:ident) => {
        impl $trait for NeonF32 {
            type Output = NeonF32;
            #[inline(always)]
            fn $method(self, other: NeonF32) -> NeonF32 {
                NeonF32(unsafe { $intrinsic(self.0, other.0) })
            }
        }
    };
}

binary_op!(Add, add, vaddq_f32);
binary_op!(Sub, sub, vsubq_f32);
binary_op!(Mul, mul, vmulq_f32);
binary_op!(Div, div, vdivq_f32);

impl Neg for NeonF32 {
    type Output = NeonF32;
    #[inline(always)]
    fn neg(self) -> NeonF32 {
        NeonF32(unsafe { vnegq_f32(self.0) })
    }
}

impl Vector for NeonF32 {
    type Mask = NeonMask;

    #[inline(always)]
    fn store(self, to: &mut [f32]) {
        let to = &mut to[..4];
        unsafe { vst1q_f32(to.as_mut_ptr(), self.0) }
    }

    #[inline(always)]
    fn sqrt(self) -> NeonF32 {
        NeonF32(unsafe { vsqrtq_f32(self.0) })
    }

    #[inline(always)]
    fn abs(self) -> NeonF32 {
        NeonF32(unsafe { vabsq_f32(self.0) })
    }

    // `fmin`/`fmax` differ from C's comparisons on NaN and on the sign of zero: compare and select.
    #[inline(always)]
    fn min(self, other: NeonF32) -> NeonF32 {
        other.replaced_where(self.lt(other), self)
    }

    #[inline(always)]
    fn max(self, other: NeonF32) -> NeonF32 {
        other.replaced_where(self.gt(other), self)
    }

    #[inline(always)]
    fn min_num(self, other: NeonF32) -> NeonF32 {
        NeonF32(unsafe { vminq_f32(self.0, other.0) })
    }

    #[inline(always)]
    fn max_num(self, other: NeonF32) -> NeonF32 {
        NeonF32(unsafe { vmaxq_f32(self.0, other.0) })
    }

    #[inline(always)]
    fn lt(self, other: NeonF32) -> NeonMask {
        NeonMask(unsafe { vcltq_f32(self.0, other.0) })
    }

    #[inline(always)]
    fn gt(self, other: NeonF32) -> NeonMask {
        NeonMask(unsafe { vcgtq_f32(self.0, other.0) })
    }

    #[inline(always)]
    fn ge(self, other: NeonF32) -> NeonMask {
        NeonMask(unsafe { vcgeq_f32(self.0, other.0) })
    }

    #[inline(always)]
    fn eq(self, other: NeonF32) -> NeonMask {
        NeonMask(unsafe { vceqq_f32(self.0, other.0) })
    }

    #[inline(always)]
    fn abs_lt(self, other: NeonF32) -> NeonMask {
        NeonMask(unsafe { vcaltq_f32(self.0, other.0) })
    }

    #[inline(always)]
    fn replaced_where(self, mask: NeonMask, by: NeonF32) -> NeonF32 {
        NeonF32(unsafe { vbslq_f32(mask.0, by.0, self.0) })
    }

    #[inline(always)]
    fn zero_where(self, mask: NeonMask) -> NeonF32 {
        NeonF32(unsafe { vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(self.0), mask.0)) })
    }

    #[inline(always)]
    fn round_ties_even(self) -> NeonF32 {
        NeonF32(unsafe { vrndnq_f32(self.0) })
    }

    #[inline(always)]
    fn round_half_away(self) -> NeonF32 {
        NeonF32(unsafe { vrndaq_f32(self.0) })
    }

    #[inline(always)]
    fn max_lane_num(self) -> f32 {
        unsafe { vmaxvq_f32(self.0) }
    }

    #[inline(always)]
    fn min_lane_num(self) -> f32 {
        unsafe { vminvq_f32(self.0) }
    }

    #[inline(always)]
    fn store_i8(self, to: &mut [u8]) {
        let to = &mut to[..4];
        unsafe {
            let halves = vqmovn_s32(vcvtq_s32_f32(self.0));
            let bytes = vqmovn_s16(vcombine_s16(halves, halves));
            let mut eight = [0i8; 8];
            vst1_s8(eight.as_mut_ptr(), bytes);
            for (t, &b) in to.iter_mut().zip(&eight) {
                *t = b as u8;
            }
        }
    }

    #[inline(always)]
    fn nearest_int_clamped(self, lo: i32, hi: i32) -> NeonF32 {
        unsafe {
            let bits = vreinterpretq_s32_f32(vaddq_f32(self.0, vdupq_n_f32(12_582_912.0)));
            let q = vsubq_s32(vandq_s32(bits, vdupq_n_s32(0x007f_ffff)), vdupq_n_s32(0x0040_0000));
            NeonF32(vcvtq_f32_s32(vminq_s32(vmaxq_s32(q, vdupq_n_s32(lo)), vdupq_n_s32(hi))))
        }
    }

    #[inline(always)]
    fn trunc(self) -> NeonF32 {
        NeonF32(unsafe { vrndq_f32(self.0) })
    }

    #[inline(always)]
    fn store_u8(self, to: &mut [u8]) {
        let to = &mut to[..4];
        unsafe {
            let halves = vqmovn_u32(vcvtq_u32_f32(self.0));
            let bytes = vqmovn_u16(vcombine_u16(halves, halves));
            let mut eight = [0u8; 8];
            vst1_u8(eight.as_mut_ptr(), bytes);
            to.copy_from_slice(&eight[..4]);
        }
    }

    #[inline(always)]
    fn round_to_f16(self) -> NeonF32 {
        let rounded: float32x4_t;
        unsafe {
            asm!(
                "fcvtn {h:v}.4h, {x:v}.4s",
                "fcvtl {r:v}.4s, {h:v}.4h",
                x = in(vreg) self.0,
                h = out(vreg) _,
                r = out(vreg) rounded,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        NeonF32(rounded)
    }

    #[inline(always)]
    fn mul_add_exact(self, by: NeonF32, plus: NeonF32) -> NeonF32 {
        NeonF32(unsafe { vfmaq_f32(plus.0, self.0, by.0) })
    }
}

impl BitAnd for NeonMask {
    type Output = NeonMask;
    #[inline(always)]
    fn bitand(self, other: NeonMask) -> NeonMask {
        NeonMask(unsafe { vandq_u32(self.0, other.0) })
    }
}

impl BitOr for NeonMask {
    type Output = NeonMask;
    #[inline(always)]
    fn bitor(self, other: NeonMask) -> NeonMask {
        NeonMask(unsafe { vorrq_u32(self.0, other.0) })
    }
}

impl Not for NeonMask {
    type Output = NeonMask;
    #[inline(always)]
    fn not(self) -> NeonMask {
        NeonMask(unsafe { vmvnq_u32(self.0) })
    }
}

impl Mask for NeonMask {
    #[inline(always)]
    fn any(self) -> bool {
        unsafe { vmaxvq_u32(self.0) != 0 }
    }

    #[inline(always)]
    fn all(self) -> bool {
        unsafe { vminvq_u32(self.0) == u32::MAX }
    }

    #[inline(always)]
    fn store(self, to: &mut [u32]) {
        let to = &mut to[..4];
        unsafe { vst1q_u32(to.as_mut_ptr(), self.0) }
    }

    #[inline(always)]
    fn to_bits(self) -> u32 {
        unsafe { vaddvq_u32(vandq_u32(self.0, vld1q_u32([1, 2, 4, 8].as_ptr()))) }
    }
}

macro_rules! words_op {
    ($trait:ident, $method:ident, $intrinsic:ident) => {
        impl $trait for NeonU32 {
            type Output = NeonU32;
            #[inline(always)]
            fn $method(self, other: NeonU32) -> NeonU32 {
                NeonU32(unsafe { $intrinsic(self.0, other.0) })
            }
        }
    };
}

words_op!(Add, add, vaddq_u32);
words_op!(Mul, mul, vmulq_u32);
words_op!(BitAnd, bitand, vandq_u32);
words_op!(BitXor, bitxor, veorq_u32);

impl Words for NeonU32 {
    type F32 = NeonF32;

    // Two pairwise widening adds.
    #[inline(always)]
    fn byte_sum(self) -> NeonU32 {
        NeonU32(unsafe { vpaddlq_u16(vpaddlq_u8(vreinterpretq_u8_u32(self.0))) })
    }

    #[inline(always)]
    fn to_f32(self) -> NeonF32 {
        NeonF32(unsafe { vcvtq_f32_u32(self.0) })
    }

    // One bit select sets the exponents' top bits, `fcvtl`/`fcvtl2` widen the eight halves exactly
    // (lanes 0–1, then 2–3, low half first) and one pairwise add sums each lane's two.
    #[inline(always)]
    fn f16_pair_sum(self) -> NeonF32 {
        let (a, b): (float32x4_t, float32x4_t);
        unsafe {
            let h = vbslq_u32(vdupq_n_u32(0x8FFF_8FFF), self.0, vdupq_n_u32(0x3000_3000));
            asm!(
                "fcvtl {a:v}.4s, {h:v}.4h",
                "fcvtl2 {b:v}.4s, {h:v}.8h",
                h = in(vreg) h,
                a = out(vreg) a,
                b = out(vreg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
            NeonF32(vpaddq_f32(a, b))
        }
    }

    #[inline(always)]
    fn store_u16(self, to: &mut [u16]) {
        let to = &mut to[..4];
        unsafe { vst1_u16(to.as_mut_ptr(), vmovn_u32(self.0)) }
    }
}
