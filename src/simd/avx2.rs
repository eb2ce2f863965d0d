//! [`Lanes`] for AVX2 (`x86_64`): eight f32 lanes in a `__m256`, eight u32 lanes in a `__m256i`.
//! The token also proves FMA and F16C, which come with AVX2 on the CPUs that have it.

use super::{Lanes, Mask, Vector, Words};
#[allow(clippy::wildcard_imports)] // the intrinsics
use std::arch::x86_64::*;
use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Sub};

/// Proof that this CPU has AVX2, FMA and F16C: made only by [`Avx2::detect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Avx2(());

impl Avx2 {
    /// The token, if this CPU has AVX2, FMA and F16C (every AVX2 CPU made has both). The one place
    /// that asks the CPU for them: the standard library caches the answer.
    pub fn detect() -> Option<Avx2> {
        let has =
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        has.then_some(Avx2(()))
    }
}

/// Eight f32 lanes; made only through an [`Avx2`] token.
#[derive(Clone, Copy, Debug)]
pub struct Avx2F32(__m256);

/// Eight u32 lanes; made only through an [`Avx2`] token.
#[derive(Clone, Copy, Debug)]
pub struct Avx2U32(__m256i);

/// Sixteen bytes.
#[derive(Clone, Copy, Debug)]
pub struct Avx2Bytes(__m128i);

/// Eight lane conditions of an [`Avx2F32`].
#[derive(Clone, Copy, Debug)]
pub struct Avx2Mask(__m256);

/// 32 byte codes in the order two saturating packs leave them: per 128-bit half, dwords hold codes
/// `0..4, 8..12, 16..20, 24..28`, then `4..8, 12..16, 20..24, 28..32`.
#[derive(Clone, Copy, Debug)]
pub struct Avx2Codes(__m256i);

// SAFETY (every `unsafe` block below): a token or a vector exists, so AVX2 was detected (see the
// module documentation of `simd`); memory is reached through slices whose length is checked first.

impl Lanes for Avx2 {
    const LANES: usize = 8;
    type F32 = Avx2F32;
    type U32 = Avx2U32;
    type U32x8 = [Avx2U32; 1];
    type Bytes = Avx2Bytes;
    type Shifts = Avx2U32;

    #[inline(always)]
    fn splat_u32(self, v: u32) -> Avx2U32 {
        Avx2U32(unsafe { _mm256_set1_epi32(v as i32) })
    }

    #[inline(always)]
    fn load_bytes(self, x: &[u8; 16]) -> Avx2Bytes {
        Avx2Bytes(unsafe { _mm_loadu_si128(x.as_ptr().cast()) })
    }

    #[inline(always)]
    fn join_bytes(self, end: Avx2Bytes, start: Avx2Bytes) -> Avx2Bytes {
        Avx2Bytes(unsafe { _mm_alignr_epi8::<12>(start.0, end.0) })
    }

    #[inline(always)]
    fn shifts(self, right: &[u32; 8]) -> Avx2U32 {
        Avx2U32(unsafe { _mm256_loadu_si256(right.as_ptr().cast()) })
    }

    // The bytes are copied to both 128-bit halves, as `pshufb` reads within each half.
    #[inline(always)]
    fn gather_u32x8(self, v: Avx2Bytes, table: &[u8; 32], shift: Avx2U32) -> [Avx2U32; 1] {
        unsafe {
            let table = _mm256_loadu_si256(table.as_ptr().cast());
            let w = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(v.0), table);
            [Avx2U32(_mm256_srlv_epi32(w, shift.0))]
        }
    }

    #[inline(always)]
    fn splat(self, v: f32) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_set1_ps(v) })
    }

    #[inline(always)]
    fn load(self, x: &[f32]) -> Avx2F32 {
        let x = &x[..8];
        Avx2F32(unsafe { _mm256_loadu_ps(x.as_ptr()) })
    }

    #[inline(always)]
    fn load_columns(self, x: &[f32], stride: usize, out: &mut [Avx2F32]) {
        let mut r = [unsafe { _mm256_setzero_ps() }; 8];
        for (j, row) in r.iter_mut().enumerate() {
            *row = self.load(&x[j * stride..]).0;
        }
        let out = &mut out[..8];
        unsafe {
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            out[0] = Avx2F32(_mm256_permute2f128_ps::<0x20>(s0, s4));
            out[1] = Avx2F32(_mm256_permute2f128_ps::<0x20>(s1, s5));
            out[2] = Avx2F32(_mm256_permute2f128_ps::<0x20>(s2, s6));
            out[3] = Avx2F32(_mm256_permute2f128_ps::<0x20>(s3, s7));
            out[4] = Avx2F32(_mm256_permute2f128_ps::<0x31>(s0, s4));
            out[5] = Avx2F32(_mm256_permute2f128_ps::<0x31>(s1, s5));
            out[6] = Avx2F32(_mm256_permute2f128_ps::<0x31>(s2, s6));
            out[7] = Avx2F32(_mm256_permute2f128_ps::<0x31>(s3, s7));
        }
    }

    type Codes = Avx2Codes;

    // The clamp to `max` comes first and the rounding (in the default MXCSR mode, nearest even)
    // after: the two commute for an integer bound. NaN converts to `i32::MIN`, which the unsigned
    // saturation of the packs sends to 0 with every negative code.
    #[inline(always)]
    fn round_to_codes(self, v: &[Avx2F32], max: u32) -> Avx2Codes {
        let v = &v[..4];
        unsafe {
            let max = _mm256_set1_ps(max as f32);
            let code = |x: Avx2F32| _mm256_cvtps_epi32(_mm256_min_ps(max, x.0));
            Avx2Codes(_mm256_packus_epi16(
                _mm256_packus_epi32(code(v[0]), code(v[1])),
                _mm256_packus_epi32(code(v[2]), code(v[3])),
            ))
        }
    }

    // A multiply-add of byte pairs (`c0 + c1·2^b`), one of u16 pairs (`p0 + p1·2^2b`, below 2^24,
    // so no saturation) and a 64-bit shift-or leave 8 consecutive codes in the low `b` bytes of
    // each u64; a byte shuffle per 128-bit half closes the gaps.
    #[inline(always)]
    fn pack_codes<const BITS: u32>(self, codes: Avx2Codes, to: &mut [u8]) {
        let to = &mut to[..2 * BITS as usize + 16];
        unsafe {
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            if BITS == 8 {
                _mm256_storeu_si256(to.as_mut_ptr().cast(), _mm256_permutevar8x32_epi32(codes.0, order));
                return;
            }
            let pairs = _mm256_maddubs_epi16(codes.0, _mm256_set1_epi16((1 | 1 << (8 + BITS)) as i16));
            let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(1 | 1 << (16 + 2 * BITS)));
            let quads = _mm256_permutevar8x32_epi32(quads, order);
            let hi = _mm256_sll_epi64(_mm256_srli_epi64::<32>(quads), _mm_cvtsi32_si128(4 * BITS as i32));
            let octs = _mm256_or_si256(_mm256_and_si256(quads, _mm256_set1_epi64x(0xFFFF_FFFF)), hi);
            let packed = _mm256_shuffle_epi8(octs, _mm256_loadu_si256(COMPACT[BITS as usize].as_ptr().cast()));
            // The second half's bytes start where the first half's stream ends.
            _mm_storeu_si128(to.as_mut_ptr().cast(), _mm256_castsi256_si128(packed));
            _mm_storeu_si128(to[2 * BITS as usize..].as_mut_ptr().cast(), _mm256_extracti128_si256::<1>(packed));
        }
    }

    // Each stage is `x·(±1) + partner`, the partner one shuffle away: `lower + upper` in the lower
    // lane and `(−upper) + lower`, which is `lower − upper` exactly, in the upper one. The product
    // is exact, so a multiply and an add give what an FMA would.
    #[inline(always)]
    fn load_hadamard_pair(self, x: &[f32]) -> [Avx2F32; 2] {
        let x = &x[..16];
        [hadamard8(self.load(x)), hadamard8(self.load(&x[8..]))]
    }

    #[inline(always)]
    fn mask_words(self, mask: Avx2Mask) -> Avx2U32 {
        Avx2U32(unsafe { _mm256_castps_si256(mask.0) })
    }

    #[inline(always)]
    fn lookup8(self, table: &[f32; 8], Avx2U32(index): Avx2U32) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_permutevar8x32_ps(_mm256_loadu_ps(table.as_ptr()), index) })
    }
}

/// [`Lanes::load_hadamard_pair`] of one vector.
#[inline(always)]
fn hadamard8(Avx2F32(v): Avx2F32) -> Avx2F32 {
    unsafe {
        let v = _mm256_add_ps(
            _mm256_mul_ps(v, _mm256_setr_ps(1., -1., 1., -1., 1., -1., 1., -1.)),
            _mm256_permute_ps::<0b10_11_00_01>(v),
        );
        let v = _mm256_add_ps(
            _mm256_mul_ps(v, _mm256_setr_ps(1., 1., -1., -1., 1., 1., -1., -1.)),
            _mm256_permute_ps::<0b01_00_11_10>(v),
        );
        Avx2F32(_mm256_add_ps(
            _mm256_mul_ps(v, _mm256_setr_ps(1., 1., 1., 1., -1., -1., -1., -1.)),
            _mm256_permute2f128_ps::<0x01>(v, v),
        ))
    }
}

/// Byte shuffles (per 128-bit half) that keep the low `b` bytes of each u64: bytes `0..b` then
/// `8..8 + b`, zeros after. Indexed by `b`.
static COMPACT: [[i8; 32]; 9] = {
    let mut t = [[-128i8; 32]; 9];
    let mut b = 0;
    while b <= 8 {
        let mut j = 0;
        while j < b {
            let (lo, hi) = (j as i8, (8 + j) as i8);
            t[b][j] = lo;
            t[b][b + j] = hi;
            t[b][16 + j] = lo;
            t[b][16 + b + j] = hi;
            j += 1;
        }
        b += 1;
    }
    t
};

macro_rules! binary_op {
    ($trait:ident, $method:ident, $intrinsic:ident) => {
        impl $trait for Avx2F32 {
            type Output = Avx2F32;
            #[inline(always)]
            fn $method(self, other: Avx2F32) -> Avx2F32 {
                Avx2F32(unsafe { $intrinsic(self.0, other.0) })
            }
        }
    };
}

binary_op!(Add, add, _mm256_add_ps);
binary_op!(Sub, sub, _mm256_sub_ps);
binary_op!(Mul, mul, _mm256_mul_ps);
binary_op!(Div, div, _mm256_div_ps);

impl Neg for Avx2F32 {
    type Output = Avx2F32;
    #[inline(always)]
    fn neg(self) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_xor_ps(self.0, _mm256_set1_ps(-0.0)) })
    }
}

impl Vector for Avx2F32 {
    type Mask = Avx2Mask;

    #[inline(always)]
    fn store(self, to: &mut [f32]) {
        let to = &mut to[..8];
        unsafe { _mm256_storeu_ps(to.as_mut_ptr(), self.0) }
    }

    #[inline(always)]
    fn sqrt(self) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_sqrt_ps(self.0) })
    }

    #[inline(always)]
    fn abs(self) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), self.0) })
    }

    // `vminps`/`vmaxps` answer with the second operand unless the comparison holds: exactly C's
    // `a < b ? a : b`.
    #[inline(always)]
    fn min(self, other: Avx2F32) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_min_ps(self.0, other.0) })
    }

    #[inline(always)]
    fn max(self, other: Avx2F32) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_max_ps(self.0, other.0) })
    }

    #[inline(always)]
    fn min_num(self, other: Avx2F32) -> Avx2F32 {
        self.min(other)
    }

    #[inline(always)]
    fn max_num(self, other: Avx2F32) -> Avx2F32 {
        self.max(other)
    }

    #[inline(always)]
    fn lt(self, other: Avx2F32) -> Avx2Mask {
        Avx2Mask(unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(self.0, other.0) })
    }

    #[inline(always)]
    fn gt(self, other: Avx2F32) -> Avx2Mask {
        Avx2Mask(unsafe { _mm256_cmp_ps::<_CMP_GT_OQ>(self.0, other.0) })
    }

    #[inline(always)]
    fn ge(self, other: Avx2F32) -> Avx2Mask {
        Avx2Mask(unsafe { _mm256_cmp_ps::<_CMP_GE_OQ>(self.0, other.0) })
    }

    #[inline(always)]
    fn eq(self, other: Avx2F32) -> Avx2Mask {
        Avx2Mask(unsafe { _mm256_cmp_ps::<_CMP_EQ_OQ>(self.0, other.0) })
    }

    #[inline(always)]
    fn abs_lt(self, other: Avx2F32) -> Avx2Mask {
        self.abs().lt(other)
    }

    #[inline(always)]
    fn replaced_where(self, mask: Avx2Mask, by: Avx2F32) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_blendv_ps(self.0, by.0, mask.0) })
    }

    #[inline(always)]
    fn zero_where(self, mask: Avx2Mask) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_andnot_ps(mask.0, self.0) })
    }

    #[inline(always)]
    fn round_ties_even(self) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self.0) })
    }

    #[inline(always)]
    fn round_half_away(self) -> Avx2F32 {
        // Adding the largest float below ½, signed as the value, then truncating: a value ½ or more
        // past an integer carries to the next one, anything less does not (also where the sum rounds).
        unsafe {
            let sign = _mm256_and_ps(self.0, _mm256_set1_ps(-0.0));
            let nudge = _mm256_or_ps(sign, _mm256_set1_ps(0.5f32.next_down()));
            Avx2F32(_mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(_mm256_add_ps(self.0, nudge)))
        }
    }

    #[inline(always)]
    fn max_lane_num(self) -> f32 {
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(self.0), _mm256_extractf128_ps::<1>(self.0));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<0x55>(m, m)))
        }
    }

    #[inline(always)]
    fn min_lane_num(self) -> f32 {
        unsafe {
            let m = _mm_min_ps(_mm256_castps256_ps128(self.0), _mm256_extractf128_ps::<1>(self.0));
            let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
            _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps::<0x55>(m, m)))
        }
    }

    #[inline(always)]
    fn store_i8(self, to: &mut [u8]) {
        let to = &mut to[..8];
        unsafe {
            let i = _mm256_cvtps_epi32(self.0);
            let words = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256::<1>(i));
            _mm_storel_epi64(to.as_mut_ptr().cast(), _mm_packs_epi16(words, words));
        }
    }

    #[inline(always)]
    fn nearest_int_clamped(self, lo: i32, hi: i32) -> Avx2F32 {
        unsafe {
            let bits = _mm256_castps_si256(_mm256_add_ps(self.0, _mm256_set1_ps(12_582_912.0)));
            let q = _mm256_sub_epi32(
                _mm256_and_si256(bits, _mm256_set1_epi32(0x007f_ffff)),
                _mm256_set1_epi32(0x0040_0000),
            );
            let q = _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(lo)), _mm256_set1_epi32(hi));
            Avx2F32(_mm256_cvtepi32_ps(q))
        }
    }

    #[inline(always)]
    fn trunc(self) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(self.0) })
    }

    #[inline(always)]
    fn store_u8(self, to: &mut [u8]) {
        let to = &mut to[..8];
        unsafe {
            let i = _mm256_cvtps_epi32(self.0);
            let words = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256::<1>(i));
            _mm_storel_epi64(to.as_mut_ptr().cast(), _mm_packus_epi16(words, words));
        }
    }

    // The immediate rounding mode overrides MXCSR's.
    #[inline(always)]
    fn round_to_f16(self) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(self.0)) })
    }

    #[inline(always)]
    fn mul_add_exact(self, by: Avx2F32, plus: Avx2F32) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_fmadd_ps(self.0, by.0, plus.0) })
    }
}

impl BitAnd for Avx2Mask {
    type Output = Avx2Mask;
    #[inline(always)]
    fn bitand(self, other: Avx2Mask) -> Avx2Mask {
        Avx2Mask(unsafe { _mm256_and_ps(self.0, other.0) })
    }
}

impl BitOr for Avx2Mask {
    type Output = Avx2Mask;
    #[inline(always)]
    fn bitor(self, other: Avx2Mask) -> Avx2Mask {
        Avx2Mask(unsafe { _mm256_or_ps(self.0, other.0) })
    }
}

impl Not for Avx2Mask {
    type Output = Avx2Mask;
    #[inline(always)]
    fn not(self) -> Avx2Mask {
        Avx2Mask(unsafe { _mm256_xor_ps(self.0, _mm256_castsi256_ps(_mm256_set1_epi32(-1))) })
    }
}

impl Mask for Avx2Mask {
    #[inline(always)]
    fn any(self) -> bool {
        unsafe { _mm256_movemask_ps(self.0) != 0 }
    }

    #[inline(always)]
    fn all(self) -> bool {
        unsafe { _mm256_movemask_ps(self.0) == 0xFF }
    }

    #[inline(always)]
    fn store(self, to: &mut [u32]) {
        let to = &mut to[..8];
        unsafe { _mm256_storeu_si256(to.as_mut_ptr().cast(), _mm256_castps_si256(self.0)) }
    }

    #[inline(always)]
    fn to_bits(self) -> u32 {
        unsafe { _mm256_movemask_ps(self.0) as u32 }
    }
}

macro_rules! words_op {
    ($trait:ident, $method:ident, $intrinsic:ident) => {
        impl $trait for Avx2U32 {
            type Output = Avx2U32;
            #[inline(always)]
            fn $method(self, other: Avx2U32) -> Avx2U32 {
                Avx2U32(unsafe { $intrinsic(self.0, other.0) })
            }
        }
    };
}

words_op!(Add, add, _mm256_add_epi32);
words_op!(Mul, mul, _mm256_mullo_epi32);
words_op!(BitAnd, bitand, _mm256_and_si256);
words_op!(BitXor, bitxor, _mm256_xor_si256);

/// f32's sign bit.
const SIGN: i32 = i32::MIN;
/// A binary16's low two exponent bits and its mantissa, moved to their f32 places (3 bits up).
const HALF_LOW_BITS: i32 = 0x01FF_E000;
/// The f32 exponent bits of binary16 exponents `12..=15` (`0b011ab` → `0b0111_11ab`).
const HALF_HIGH_EXP: i32 = 0x3E00_0000;

impl Words for Avx2U32 {
    type F32 = Avx2F32;

    // Two multiply-adds: byte pairs, then u16 pairs.
    #[inline(always)]
    fn byte_sum(self) -> Avx2U32 {
        unsafe {
            let pairs = _mm256_maddubs_epi16(self.0, _mm256_set1_epi8(1));
            Avx2U32(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }

    #[inline(always)]
    fn to_f32(self) -> Avx2F32 {
        Avx2F32(unsafe { _mm256_cvtepi32_ps(self.0) })
    }

    // Each half is widened by moving bits: an arithmetic shift by 3 puts its sign, exponent and
    // mantissa in their f32 places, the copies of the sign and the exponent's top bits are masked
    // off, and the exponent bits of `0b011` are set.
    #[inline(always)]
    fn f16_pair_sum(self) -> Avx2F32 {
        unsafe {
            let widen = |shifted: __m256i| {
                let kept = _mm256_and_si256(shifted, _mm256_set1_epi32(SIGN | HALF_LOW_BITS));
                _mm256_castsi256_ps(_mm256_or_si256(kept, _mm256_set1_epi32(HALF_HIGH_EXP)))
            };
            let high = widen(_mm256_srai_epi32::<3>(self.0));
            let low = widen(_mm256_srai_epi32::<3>(_mm256_slli_epi32::<16>(self.0)));
            Avx2F32(_mm256_add_ps(low, high))
        }
    }

    #[inline(always)]
    fn store_u16(self, to: &mut [u16]) {
        let to = &mut to[..8];
        unsafe {
            let packed = _mm_packus_epi32(_mm256_castsi256_si128(self.0), _mm256_extracti128_si256::<1>(self.0));
            _mm_storeu_si128(to.as_mut_ptr().cast(), packed);
        }
    }
}
