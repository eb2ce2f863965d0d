//! f32 vector lanes for kernels written once: a search is a generic `#[inline(always)]` body over
//! [`Lanes`], and each architecture enters it through one `#[target_feature]` function, which is
//! where the body is compiled for that CPU. Today's implementations are [`Avx2`] (`x86_64`, eight
//! lanes) and [`Neon`] (aarch64, four lanes). It sits outside `quant/` because nothing in it is
//! about quantization: the trellis decoders can use it as well.
//!
//! The one convention for `unsafe`: a token ([`Avx2`], [`Neon`]) can only be made by detecting its
//! CPU features at run time, and a vector ([`Lanes::F32`]) only from a token or from other vectors.
//! Holding either therefore proves the features are there, and every method calls its intrinsics
//! in an `unsafe` block on that ground alone (plus bounds checked by slices). The methods are
//! `#[inline(always)]` so that they land in the caller's `#[target_feature]` function and compile
//! to single instructions there.
//!
//! Every operation is one IEEE operation per lane, as written: no fused multiply-add, no
//! reassociation. Comparisons are ordered (false when either side is NaN). Where the instructions
//! of two CPUs differ on NaN or on the sign of zero, the method says which answer it gives; the
//! answer is the same on every implementation.

use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Sub};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(target_arch = "x86_64")]
pub use avx2::Avx2;
#[cfg(target_arch = "aarch64")]
pub use neon::Neon;

/// A CPU's f32 vectors, as a token whose existence proves the CPU runs them (see the module
/// documentation).
pub trait Lanes: Copy {
    /// f32 values per vector.
    const LANES: usize;
    type F32: Vector;
    /// u32 lanes, as many as the f32 ones.
    type U32: Words<F32 = Self::F32>;
    /// Eight u32 lanes: `8 / LANES` vectors, lanes 0… first.
    type U32x8: Copy + AsRef<[Self::U32]>;
    /// Sixteen bytes in a register.
    type Bytes: Copy;
    /// Eight right-shift counts, prepared for [`Lanes::gather_u32x8`].
    type Shifts: Copy;

    /// `v` in every u32 lane.
    fn splat_u32(self, v: u32) -> Self::U32;

    fn load_bytes(self, x: &[u8; 16]) -> Self::Bytes;

    /// The last four bytes of `end` followed by the first twelve of `start`.
    fn join_bytes(self, end: Self::Bytes, start: Self::Bytes) -> Self::Bytes;

    /// `right[j]` (below 32) for lane `j` of [`Lanes::gather_u32x8`].
    fn shifts(self, right: &[u32; 8]) -> Self::Shifts;

    /// Eight u32 lanes built from the bytes of `v`, then each shifted right by its count: byte `b`
    /// (from the lowest) of lane `j` is byte `table[4j + b]` of `v`, or zero where that index is
    /// [`ZERO_BYTE`]; every other index is below 16.
    fn gather_u32x8(self, v: Self::Bytes, table: &[u8; 32], shift: Self::Shifts) -> Self::U32x8;

    /// `v` in every lane.
    fn splat(self, v: f32) -> Self::F32;

    /// The first [`Lanes::LANES`] values of `x`.
    fn load(self, x: &[f32]) -> Self::F32;

    /// `out[i]` (for `i` below [`Lanes::LANES`]) holds in lane `j` the value `x[j·stride + i]`: a
    /// square of rows `stride` apart, loaded as columns.
    fn load_columns(self, x: &[f32], stride: usize, out: &mut [Self::F32]);

    /// [`PACKED_CODES`] byte-sized codes in registers, in an order of the implementation's own:
    /// made by [`Lanes::round_to_codes`], read only by [`Lanes::pack_codes`].
    type Codes: Copy;

    /// The [`PACKED_CODES`] lanes of `v` (`PACKED_CODES / LANES` vectors) rounded to the nearest
    /// integer, ties to even, and clamped to `0..=max` (`max` at most 255); NaN gives 0.
    fn round_to_codes(self, v: &[Self::F32], max: u32) -> Self::Codes;

    /// Writes `codes` (each below `2^BITS`, `BITS` at most 8) as one stream of `BITS`-bit fields,
    /// the first code in the lowest bits of the first byte: the stream's `4·BITS` bytes to the
    /// start of `to`, and anything to the bytes after them, up to `2·BITS + 16` bytes in all
    /// (`to` must hold that many).
    fn pack_codes<const BITS: u32>(self, codes: Self::Codes, to: &mut [u8]);

    /// The first `2·LANES` values of `x` as two vectors, each put through the butterfly stages of
    /// strides 1, 2, …, `LANES/2` inside it (lanes `i` and `i + h`, `i` below `h` in its run of
    /// `2h`, become `x[i] + x[i + h]` and `x[i] − x[i + h]`): the unnormalised natural-order
    /// Walsh–Hadamard transform of each vector. Every lane is exactly the sum or difference the
    /// scalar butterflies give (a NaN stays a NaN, its sign and payload unspecified).
    fn load_hadamard_pair(self, x: &[f32]) -> [Self::F32; 2];

    /// `mask` as u32 lanes: `u32::MAX` where true, 0 where false, so that adding masks to a
    /// count subtracts one for each true lane.
    fn mask_words(self, mask: <Self::F32 as Vector>::Mask) -> Self::U32;

    /// Lane by lane, `table[index]` (every index below 8): the entry's bits as they are.
    fn lookup8(self, table: &[f32; 8], index: Self::U32) -> Self::F32;
}

/// Codes per [`Lanes::pack_codes`]: 32 fields of any width fill whole bytes, so such runs pack
/// independently.
pub const PACKED_CODES: usize = 32;

/// The index of [`Lanes::gather_u32x8`]'s table that gives a zero byte (`pshufb` zeroes on its high
/// bit, `tbl` on any index past the table).
pub const ZERO_BYTE: u8 = 0xFF;

/// One vector of f32 lanes. The arithmetic operators are one IEEE operation per lane.
pub trait Vector:
    Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> + Neg<Output = Self>
{
    /// A lane-wise condition: all ones where true, all zeros where false.
    type Mask: Mask;

    /// Writes the lanes to the start of `to`.
    fn store(self, to: &mut [f32]);
    fn sqrt(self) -> Self;
    /// `|self|`: the sign bit cleared.
    fn abs(self) -> Self;

    /// `self < other ? self : other`, operand for operand as ggml's `if (x < min) min = x` written
    /// `min = x.min(min)`: NaN and the sign of zero as that C gives them.
    fn min(self, other: Self) -> Self;
    /// `self > other ? self : other`, as [`Vector::min`].
    fn max(self, other: Self) -> Self;
    /// The lesser of two values neither of which is NaN, a zero of either sign beside a zero of
    /// the other giving either: the cheapest instruction, for clamps.
    fn min_num(self, other: Self) -> Self;
    /// The greater, as [`Vector::min_num`].
    fn max_num(self, other: Self) -> Self;

    fn lt(self, other: Self) -> Self::Mask;
    fn gt(self, other: Self) -> Self::Mask;
    fn ge(self, other: Self) -> Self::Mask;
    fn eq(self, other: Self) -> Self::Mask;
    /// `|self| < other`.
    fn abs_lt(self, other: Self) -> Self::Mask;

    /// `mask ? by : self`, lane by lane.
    fn replaced_where(self, mask: Self::Mask, by: Self) -> Self;
    /// `mask ? +0 : self`, lane by lane.
    fn zero_where(self, mask: Self::Mask) -> Self;

    /// Rounded to the nearest integer, ties to even (`vroundps`, `frintn`).
    fn round_ties_even(self) -> Self;
    /// Rounded to the nearest integer, ties away from zero (C's `roundf`, Rust's `f32::round`).
    fn round_half_away(self) -> Self;
    /// ggml's `nearest_int(v)` clamped to `lo..=hi`, as f32: adding 1.5·2²³ and reading the low
    /// mantissa bits, so any value (NaN and infinities included) gives what the C code gives.
    fn nearest_int_clamped(self, lo: i32, hi: i32) -> Self;

    /// The greatest lane, of lanes none of which is NaN.
    fn max_lane_num(self) -> f32;
    /// The least lane, as [`Vector::max_lane_num`].
    fn min_lane_num(self) -> f32;
    /// Writes the lanes, whole numbers in `-128..=127`, to the start of `to` as int8 bytes.
    fn store_i8(self, to: &mut [u8]);
    /// Rounded toward zero (C's float to integer conversion, for values that fit).
    fn trunc(self) -> Self;
    /// Writes the lanes, whole numbers in `0..=255` (or −0), to the start of `to` as bytes.
    fn store_u8(self, to: &mut [u8]);
    /// Rounded to binary16 (to nearest, ties to even) and widened back to f32, exactly.
    fn round_to_f16(self) -> Self;
    /// `self·by + plus`, fused or not, whichever the CPU does faster. Only for operands whose
    /// product is exact in f32, where the two agree.
    fn mul_add_exact(self, by: Self, plus: Self) -> Self;
}

/// One vector of u32 lanes. `+` and `*` wrap, as [`u32::wrapping_add`] and [`u32::wrapping_mul`].
pub trait Words:
    Copy + Add<Output = Self> + Mul<Output = Self> + BitAnd<Output = Self> + BitXor<Output = Self>
{
    /// The f32 vector of as many lanes.
    type F32: Vector;

    /// The sum of each lane's four bytes.
    fn byte_sum(self) -> Self;
    /// The lanes, each below 2²⁴, as f32 (exactly).
    fn to_f32(self) -> Self::F32;
    /// The sum, exact in f32, of the two binary16 values in each lane (bits 0–15 and 16–31), each
    /// read with the top three bits of its exponent field as `0b011` whatever they hold: normal
    /// values with magnitudes in [2⁻³, 2), as the trellis codebooks make them.
    fn f16_pair_sum(self) -> Self::F32;
    /// Writes the lanes, each below 2¹⁶, to the start of `to` as u16.
    fn store_u16(self, to: &mut [u16]);
}

/// A lane-wise condition of a [`Vector`].
pub trait Mask: Copy + BitAnd<Output = Self> + BitOr<Output = Self> + Not<Output = Self> {
    /// Whether any lane is true.
    fn any(self) -> bool;
    /// Whether every lane is true.
    fn all(self) -> bool;
    /// Writes the lanes (`u32::MAX` or 0) to the start of `to`.
    fn store(self, to: &mut [u32]);
    /// Lane `i`'s condition as bit `i`.
    fn to_bits(self) -> u32;
}
