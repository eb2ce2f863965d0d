//! MLX affine quantization, bit-exact with `mx.quantize(w, group_size, bits)` on MLX's CPU
//! backend (`mlx/backend/cpu/quantized.cpp`), and the exact int8 → 8-bit affine repack.
//!
//! Per group of `group_size` consecutive values of a row, all in f32 (see `mlx-affine.md` §1.2):
//!
//! ```text
//! n_bins = 2^bits − 1;  eps = 1e-7
//! hi = max(g); lo = min(g); use_min = |lo| > |hi|
//! s = max((hi − lo) / n_bins, eps);  if !use_min { s = −s }     // negative when the edge is max
//! edge = use_min ? lo : hi;  q0 = rint(edge / s)
//! if q0 != 0 { s = edge / q0; bias = edge } else { bias = 0 }
//! q = clamp(rint((x − bias) / s), 0, n_bins)                   // true division, ties to even
//! ```
//!
//! The codes use the unrounded f32 scale and bias; only the stored copies are rounded (RNE) to
//! the scale dtype. Codes are packed as one little-endian, LSB-first bit stream per row (so 3-,
//! 5- and 6-bit codes straddle U32 words), written as U32 little-endian bytes.
//!
//! [`quantize_group`] and [`pack_row`] are the scalar reference. [`quantize_rows`] runs the
//! fastest [`Kernel`] this CPU has (AVX2 on `x86_64`, NEON on aarch64, chosen once per process),
//! each bit-identical to the reference for every input, NaN and infinities included.

use super::dense::bf16_bits;
pub use crate::cpu::Kernel;
use half::f16;
use safetensors::Dtype;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod kernel;
#[cfg(test)]
mod kernel_tests;

/// Bit widths MLX's affine mode accepts.
pub const BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes MLX's affine mode accepts.
pub const GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// One affine quantization setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AffineSpec {
    pub bits: u32,
    pub group_size: usize,
}

impl AffineSpec {
    /// A validated spec: `bits` in [`BITS`], `group_size` in [`GROUP_SIZES`].
    pub fn new(bits: u32, group_size: usize) -> Result<AffineSpec, String> {
        if !BITS.contains(&bits) {
            return Err(format!("MLX affine quantization supports bits {BITS:?}, not {bits}"));
        }
        if !GROUP_SIZES.contains(&group_size) {
            return Err(format!("MLX affine quantization supports group sizes {GROUP_SIZES:?}, not {group_size}"));
        }
        Ok(AffineSpec { bits, group_size })
    }

    /// Whether a row of `cols` values can be quantized with this group size.
    pub fn fits(&self, cols: usize) -> bool {
        cols > 0 && cols.is_multiple_of(self.group_size)
    }

    /// U32 words per packed row of `cols` values.
    /// Bits per weight with the group's scale and bias, stored as `scale_dtype`.
    pub fn bits_per_weight(&self, scale_dtype: Dtype) -> f64 {
        f64::from(self.bits) + 2.0 * scale_dtype.bitsize() as f64 / self.group_size as f64
    }

    pub fn packed_cols(&self, cols: usize) -> usize {
        cols * self.bits as usize / 32
    }

    /// Groups (scales, biases) per row of `cols` values.
    pub fn groups(&self, cols: usize) -> usize {
        cols / self.group_size
    }

    pub fn n_bins(&self) -> f32 {
        ((1u32 << self.bits) - 1) as f32
    }
}

/// The f32 scale and bias MLX computes for one group, and its codes (written to `codes`).
///
/// The scalar reference every [`Kernel`] is checked against. The scale and bias do not depend on
/// the signs of a zero maximum or minimum, so neither do they on the order the lanes are folded in.
pub fn quantize_group(group: &[f32], bits: u32, codes: &mut [u32]) -> (f32, f32) {
    debug_assert_eq!(group.len(), codes.len());
    // std::max(w_max, x) / std::min(w_min, x) as MLX writes them, in eight independent lanes
    // (max and min of finite values do not depend on the order).
    let (mut his, mut los) = ([f32::NEG_INFINITY; 8], [f32::INFINITY; 8]);
    let mut lanes = group.chunks_exact(8);
    for chunk in &mut lanes {
        for i in 0..8 {
            his[i] = if his[i] < chunk[i] { chunk[i] } else { his[i] };
            los[i] = if chunk[i] < los[i] { chunk[i] } else { los[i] };
        }
    }
    for &x in lanes.remainder() {
        his[0] = if his[0] < x { x } else { his[0] };
        los[0] = if x < los[0] { x } else { los[0] };
    }
    let hi = his.iter().fold(f32::NEG_INFINITY, |m, &x| if m < x { x } else { m });
    let lo = los.iter().fold(f32::INFINITY, |m, &x| if x < m { x } else { m });
    let (scale, bias) = scale_and_bias(lo, hi, bits);
    for (c, &x) in codes.iter_mut().zip(group) {
        *c = code(x, scale, bias, bits);
    }
    (scale, bias)
}

/// The f32 scale and bias MLX computes for a group whose smallest value is `lo` and largest `hi`.
pub(crate) fn scale_and_bias(lo: f32, hi: f32, bits: u32) -> (f32, f32) {
    let n_bins = ((1u32 << bits) - 1) as f32;
    let eps = 1e-7f32;
    let use_min = lo.abs() > hi.abs();
    let mut scale = ((hi - lo) / n_bins).max(eps);
    if !use_min {
        scale = -scale;
    }
    let edge = if use_min { lo } else { hi };
    let q0 = (edge / scale).round_ties_even();
    let mut bias = 0.0f32;
    if q0 != 0.0 {
        scale = edge / q0;
        bias = edge;
    }
    (scale, bias)
}

/// The code of `x` in a group of `scale` and `bias` at `bits`.
#[inline]
fn code(x: f32, scale: f32, bias: f32, bits: u32) -> u32 {
    // Clamped to [0, n_bins] first, so the integer conversion is exact.
    level(x, scale, bias, ((1u32 << bits) - 1) as f32) as i32 as u32
}

/// The code of `x` in a group of `scale` and `bias` with `n_bins` steps, as a float.
#[inline]
pub(crate) fn level(x: f32, scale: f32, bias: f32, n_bins: f32) -> f32 {
    rint_clamped((x - bias) / scale).max(0.0).min(n_bins)
}

/// `rint(v)` (ties to even) for every value the code clamp can tell apart: adding and removing
/// 1.5·2^23 rounds to an integer in the current (nearest-even) mode, exactly, for |v| ≤ 2^22;
/// values beyond clamp to the same code either way. Inline arithmetic instead of a libm call.
#[inline]
fn rint_clamped(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    let c = v.clamp(-4_194_304.0, 4_194_304.0);
    (c + MAGIC) - MAGIC
}

/// Appends every value rounded (RNE) to `dtype` (BF16, F16 or F32), little-endian.
fn extend_floats(values: &[f32], dtype: Dtype, out: &mut Vec<u8>) {
    match dtype {
        Dtype::BF16 => out.extend(values.iter().flat_map(|&v| bf16_bits(v).to_le_bytes())),
        Dtype::F16 => out.extend(values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes())),
        Dtype::F32 => out.extend(values.iter().flat_map(|&v| v.to_le_bytes())),
        other => panic!("scales cannot be stored as {other:?}"),
    }
}

/// Where quantized rows are appended, as little-endian bytes: the packed U32 words, and one
/// scale and one bias per group in the scales' dtype.
pub struct AffineOut<'a> {
    pub packed: &'a mut Vec<u8>,
    pub scales: &'a mut Vec<u8>,
    pub biases: &'a mut Vec<u8>,
}

/// `v` rounded (RNE) to `dtype` and widened back to f32.
pub fn round_to(v: f32, dtype: Dtype) -> f32 {
    match dtype {
        Dtype::BF16 => f32::from_bits((bf16_bits(v) as u32) << 16),
        Dtype::F16 => f16::from_f32(v).to_f32(),
        Dtype::F32 => v,
        other => panic!("cannot round to {other:?}"),
    }
}

/// Rounds every value to `dtype` in place (one dtype match, a loop the compiler vectorises).
pub fn round_slice(values: &mut [f32], dtype: Dtype) {
    match dtype {
        Dtype::BF16 => values.iter_mut().for_each(|v| *v = f32::from_bits((bf16_bits(*v) as u32) << 16)),
        Dtype::F32 => {}
        _ => values.iter_mut().for_each(|v| *v = round_to(*v, dtype)),
    }
}

/// Packs the codes of one row as an LSB-first bit stream of `bits`-wide fields, appending the
/// U32 words as little-endian bytes.
pub fn pack_row(codes: &[u32], bits: u32, out: &mut Vec<u8>) {
    if 32 % bits == 0 {
        // Whole fields per word (2, 4, 8 bits): a loop over words the compiler vectorises.
        for word in codes.chunks_exact((32 / bits) as usize) {
            let w = word.iter().enumerate().fold(0u32, |w, (i, &q)| w | q << (i as u32 * bits));
            out.extend_from_slice(&w.to_le_bytes());
        }
        return;
    }
    let mut acc = 0u64;
    let mut nacc = 0u32;
    for &q in codes {
        acc |= (q as u64) << nacc;
        nacc += bits;
        while nacc >= 32 {
            out.extend_from_slice(&(acc as u32).to_le_bytes());
            acc >>= 32;
            nacc -= 32;
        }
    }
    debug_assert_eq!(nacc, 0, "a row of whole groups fills whole words");
}

/// Quantizes `values` (`rows × cols`, row-major) as `mx.quantize(values, group_size, bits)`
/// does on the CPU, appending the packed words, the scales and the biases (in `scale_dtype`) to
/// `out`. `cols` must be a multiple of the group size.
///
/// `values` are the inputs as MLX would see them: for a bf16 model, pass bf16 values widened to
/// f32 (see [`round_to`]). Runs [`Kernel::best`].
pub fn quantize_rows(values: &[f32], cols: usize, spec: AffineSpec, scale_dtype: Dtype, out: &mut AffineOut) {
    quantize_rows_with(Kernel::best(), values, cols, spec, scale_dtype, out);
}

/// [`quantize_rows`] on a given kernel; every kernel appends the same bytes.
pub fn quantize_rows_with(
    kernel: Kernel,
    values: &[f32],
    cols: usize,
    spec: AffineSpec,
    scale_dtype: Dtype,
    out: &mut AffineOut,
) {
    let AffineOut { packed, scales, biases } = out;
    assert!(spec.fits(cols), "row length {cols} is not a multiple of group size {}", spec.group_size);
    assert_eq!(values.len() % cols, 0, "values are not whole rows of {cols}");
    let rows = values.len() / cols;
    let el = scale_dtype.bitsize() / 8;
    let groups = rows * spec.groups(cols);
    scales.reserve(groups * el);
    biases.reserve(groups * el);
    if kernel == Kernel::Reference {
        packed.reserve(rows * spec.packed_cols(cols) * 4);
        let mut codes = vec![0u32; cols];
        for row in values.chunks_exact(cols) {
            for (g, c) in row.chunks_exact(spec.group_size).zip(codes.chunks_exact_mut(spec.group_size)) {
                let (s, b) = quantize_group(g, spec.bits, c);
                extend_floats(&[s], scale_dtype, scales);
                extend_floats(&[b], scale_dtype, biases);
            }
            pack_row(&codes, spec.bits, packed);
        }
        return;
    }
    // A group of `group_size` (a multiple of 32) codes fills whole U32 words, so a row's packed
    // words are its groups' words one after another, and the rows are one run of groups.
    let start = packed.len();
    let len = rows * spec.packed_cols(cols) * 4;
    packed.resize(start + len + PACK_SLACK, 0);
    let (mut s, mut b) = ([0f32; GROUPS_PER_CALL], [0f32; GROUPS_PER_CALL]);
    let (gs, bits) = (spec.group_size, spec.bits);
    for (k, chunk) in values.chunks(GROUPS_PER_CALL * gs).enumerate() {
        let n = chunk.len() / gs;
        let (s, b) = (&mut s[..n], &mut b[..n]);
        let out = &mut packed[start + k * GROUPS_PER_CALL * gs * bits as usize / 8..];
        match kernel {
            Kernel::Reference => unreachable!(),
            // SAFETY: the token proves AVX2.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2(lanes) => unsafe { kernel::quantize_groups_avx2(lanes, chunk, gs, bits, out, s, b) },
            // SAFETY: the token proves NEON.
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon(lanes) => unsafe { kernel::quantize_groups_neon(lanes, chunk, gs, bits, out, s, b) },
        }
        extend_floats(s, scale_dtype, scales);
        extend_floats(b, scale_dtype, biases);
    }
    packed.truncate(start + len);
}

/// [`round_slice`] to `scale_dtype` (the values MLX sees for a model in that dtype), then
/// [`quantize_rows`], a row at a time so that each row is quantized while still in cache.
pub fn round_and_quantize_rows(
    values: &mut [f32],
    cols: usize,
    spec: AffineSpec,
    scale_dtype: Dtype,
    out: &mut AffineOut,
) {
    assert!(cols > 0 && values.len().is_multiple_of(cols), "values are not whole rows of {cols}");
    let kernel = Kernel::best();
    for row in values.chunks_exact_mut(cols) {
        round_slice(row, scale_dtype);
        quantize_rows_with(kernel, row, cols, spec, scale_dtype, out);
    }
}

/// Groups per kernel call: their scales and biases stay on the stack.
const GROUPS_PER_CALL: usize = 64;

/// Bytes past the packed output that a kernel may overwrite (and [`quantize_rows_with`] drops).
const PACK_SLACK: usize = 16;

/// The largest group size MLX accepts that divides `cols` (the exact int8 repack works at any).
pub fn int8_group_size(cols: usize) -> Option<usize> {
    GROUP_SIZES.iter().rev().copied().find(|g| cols.is_multiple_of(*g))
}

/// Exact repack of int8 rows with one scale per row into 8-bit affine (`mlx-affine.md` §4):
/// `q = w8 + 128`, packed four per U32 (the byte row XOR 0x80), `scale` repeated over the row's
/// groups and `bias = −128·scale`. The bias is computed from the *stored* scale, so
/// `scale·q + bias = w8·scale` holds for the stored values whatever `scale_dtype` is; with F32
/// (or F16 for F16 row scales) the stored scale is the row scale exactly.
pub fn repack_int8_rows(
    w8: &[u8],
    row_scales: &[f32],
    cols: usize,
    group_size: usize,
    scale_dtype: Dtype,
    out: &mut AffineOut,
) {
    let AffineOut { packed, scales, biases } = out;
    assert!(
        cols > 0 && cols.is_multiple_of(group_size),
        "row length {cols} is not a multiple of group size {group_size}"
    );
    assert_eq!(w8.len(), row_scales.len() * cols, "one scale per row of {cols} bytes");
    packed.extend(w8.iter().map(|&b| b ^ 0x80));
    for &s in row_scales {
        let stored = round_to(s, scale_dtype);
        for _ in 0..cols / group_size {
            extend_floats(&[stored], scale_dtype, scales);
            extend_floats(&[-128.0 * stored], scale_dtype, biases);
        }
    }
}

/// The codes of a packed row, in order: `bits` at a time from the low end of each little-endian
/// U32 word, a code that straddles two words taking its high bits from the second.
fn codes(packed: &[u8], bits: u32) -> impl Iterator<Item = u32> + '_ {
    let mask = (1u64 << bits) - 1;
    let mut words = packed.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    let (mut acc, mut nacc) = (0u64, 0u32);
    std::iter::from_fn(move || {
        if nacc < bits {
            acc |= u64::from(words.next()?) << nacc;
            nacc += 32;
        }
        let q = (acc & mask) as u32;
        acc >>= bits;
        nacc -= bits;
        Some(q)
    })
}

/// Reads the codes of one packed row (`cols` values) back from its little-endian U32 bytes.
pub fn unpack_row(packed: &[u8], cols: usize, bits: u32) -> Vec<u32> {
    let out: Vec<u32> = codes(packed, bits).take(cols).collect();
    assert_eq!(out.len(), cols, "too few packed words for {cols} codes");
    out
}

/// Dequantizes rows (for tests and checks) into `out`: `scale·q + bias` in f32 from the stored
/// scales and biases (`scale_dtype` bytes).
pub fn dequantize_rows(
    packed: &[u8],
    scales: &[u8],
    biases: &[u8],
    cols: usize,
    spec: AffineSpec,
    scale_dtype: Dtype,
    out: &mut Vec<f32>,
) {
    let read = |bytes| {
        let mut v = Vec::new();
        assert!(super::dense::decode(bytes, scale_dtype, &mut v), "scales of a float dtype");
        v
    };
    let (s, b) = (read(scales), read(biases));
    let row_bytes = spec.packed_cols(cols) * 4;
    out.clear();
    out.reserve(packed.len() / row_bytes * cols);
    let mut group = s.iter().zip(&b);
    for row in packed.chunks_exact(row_bytes) {
        let mut q = codes(row, spec.bits);
        for _ in 0..spec.groups(cols) {
            let (&scale, &bias) = group.next().expect("a scale and a bias per group");
            out.extend(q.by_ref().take(spec.group_size).map(|q| scale * q as f32 + bias));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(bytes: &[u8]) -> Vec<u32> {
        bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect()
    }

    fn quantize_f32(values: &[f32], cols: usize, bits: u32, gs: usize) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
        let (mut p, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
        let spec = AffineSpec::new(bits, gs).unwrap();
        quantize_rows(
            values,
            cols,
            spec,
            Dtype::F32,
            &mut AffineOut { packed: &mut p, scales: &mut s, biases: &mut b },
        );
        let f = |v: &[u8]| v.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        (words(&p), f(&s), f(&b))
    }

    #[test]
    fn evenly_spaced_group_realigns_the_scale() {
        // 32 values over 0.1…0.9 at 4 bits: scale −0.05294117 (not −0.05333), bias 0.9, and 0.1
        // maps to 15.11, stored as 15.
        let g: Vec<f32> = (0..32).map(|i| 0.1 + 0.8 * i as f32 / 31.0).collect();
        let mut codes = vec![0; 32];
        let (s, b) = quantize_group(&g, 4, &mut codes);
        assert!((s - -0.052_941_17).abs() < 1e-7, "{s}");
        assert_eq!(b, g[31]);
        assert_eq!(codes[0], 15);
        assert_eq!(codes[31], 0);
    }

    #[test]
    fn far_end_is_clamped() {
        let mut g = vec![0.1f32; 32];
        g[0] = 0.86;
        g[1] = -0.64;
        let mut codes = vec![0; 32];
        let (s, b) = quantize_group(&g, 4, &mut codes);
        assert!((s - -0.095_555_56).abs() < 1e-7, "{s}");
        assert_eq!(b, 0.86);
        // (−0.64 − 0.86)/s = 15.70 → 16 → clamped to 15.
        assert_eq!(codes[1], 15);
        assert_eq!(codes[0], 0);
    }

    #[test]
    fn all_negative_group_measures_from_its_minimum() {
        let g: Vec<f32> = (0..32).map(|i| -0.1 - 0.8 * i as f32 / 31.0).collect();
        let mut codes = vec![0; 32];
        let (s, b) = quantize_group(&g, 4, &mut codes);
        assert!((s - 0.052_941_2).abs() < 1e-6, "{s}");
        assert_eq!(b, g[31]);
        assert_eq!(codes[31], 0);
    }

    #[test]
    fn zero_and_constant_groups() {
        let mut codes = vec![7; 64];
        let (s, b) = quantize_group(&[0.0; 64], 4, &mut codes);
        assert_eq!((s, b), (-1e-7, 0.0));
        assert!(codes.iter().all(|&c| c == 0));
        let (s, b) = quantize_group(&[0.25; 64], 4, &mut codes);
        assert_eq!(b, 0.25);
        assert!(s < 0.0 && s > -2e-7, "{s}");
        assert!(codes.iter().all(|&c| c == 0));
    }

    #[test]
    fn ties_round_to_even() {
        // Group −15..0 step 1 plus values at k + ½: scale 1, bias −15 (|min| > |max|).
        let mut g: Vec<f32> = (0..32).map(|i| -15.0 + (i % 16) as f32).collect();
        g[0] = -15.0;
        g[5] = -15.0 + 2.5; // (x − bias)/s = 2.5 → 2
        g[6] = -15.0 + 3.5; // 3.5 → 4
        let mut codes = vec![0; 32];
        let (s, b) = quantize_group(&g, 4, &mut codes);
        assert_eq!((s, b), (1.0, -15.0));
        assert_eq!((codes[5], codes[6]), (2, 4));
    }

    #[test]
    fn packing_matches_the_worked_words() {
        // A group from −n_bins up to 0 gives scale 1, bias −n_bins and q_i = i mod 2^bits.
        let cases: &[(u32, usize, &[u32])] = &[
            (2, 32, &[0xe4e4e4e4, 0xe4e4e4e4]),
            (3, 32, &[0x88fac688, 0xc688fac6, 0xfac688fa]),
            (4, 32, &[0x76543210, 0xfedcba98, 0x76543210, 0xfedcba98]),
            (5, 32, &[0x8a418820, 0xc5a92839, 0xca307b9a, 0x38bdab49, 0xffbbcdeb]),
            (6, 64, &[0x440c2040, 0xa2481c61, 0x3ce34c2c, 0x544d2450, 0xa6585d65, 0x7de75c6d]),
        ];
        for &(bits, gs, want) in cases {
            let n = (1u32 << bits) as usize;
            let mut g: Vec<f32> = (0..gs).map(|i| (i % n) as f32 - (n - 1) as f32).collect();
            g[gs - 1] = 0.0; // keep the max at 0 and the min at −n_bins
            g[0] = -((n - 1) as f32);
            let (p, s, b) = quantize_f32(&g, gs, bits, gs);
            assert_eq!((s[0], b[0]), (1.0, -((n - 1) as f32)), "bits {bits}");
            // Element gs−1 was forced to 0 ⇒ code n−1; the first words are untouched by it.
            assert_eq!(&p[..want.len().min(p.len() - 1)], &want[..want.len().min(p.len() - 1)], "bits {bits}");
            let codes = unpack_row(&p.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<_>>(), gs, bits);
            for (i, &c) in codes.iter().enumerate().take(gs - 1) {
                assert_eq!(c as usize, i % n, "bits {bits} element {i}");
            }
        }
    }

    #[test]
    fn straddling_fields() {
        // 3-bit element 10 occupies bits 30–31 of word 0 and bit 0 of word 1.
        let mut codes = vec![0u32; 32];
        codes[10] = 0b111;
        let mut out = Vec::new();
        pack_row(&codes, 3, &mut out);
        let w = words(&out);
        assert_eq!((w[0], w[1]), (0xC000_0000, 1));
        // 6-bit element 5: bits 30–31 of word 0 and bits 0–3 of word 1.
        let mut codes = vec![0u32; 32];
        codes[5] = 0b111111;
        out.clear();
        pack_row(&codes, 6, &mut out);
        let w = words(&out);
        assert_eq!((w[0], w[1]), (0xC000_0000, 0xF));
        assert_eq!(unpack_row(&out, 32, 6), codes);
    }

    #[test]
    fn dequantize_round_trip_within_half_a_step() {
        let mut x = 0x1234_5678u64;
        let vals: Vec<f32> = (0..4 * 256)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect();
        for bits in BITS {
            for gs in GROUP_SIZES {
                let spec = AffineSpec::new(bits, gs).unwrap();
                let (mut p, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
                quantize_rows(
                    &vals,
                    256,
                    spec,
                    Dtype::F32,
                    &mut AffineOut { packed: &mut p, scales: &mut s, biases: &mut b },
                );
                assert_eq!(p.len(), 4 * spec.packed_cols(256) * 4);
                let mut back = Vec::new();
                dequantize_rows(&p, &s, &b, 256, spec, Dtype::F32, &mut back);
                let sf: Vec<f32> = s.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                for (i, (&a, &v)) in back.iter().zip(&vals).enumerate() {
                    let step = sf[i / gs].abs();
                    // Clamping at the far end can cost up to one step; elsewhere half a step.
                    assert!((a - v).abs() <= step * 1.0001 + 1e-6, "bits {bits} gs {gs} i {i}: {a} vs {v}");
                }
            }
        }
    }

    #[test]
    fn int8_repack_is_exact() {
        let cols = 256;
        let w8: Vec<u8> = (0..2 * cols).map(|i| (i * 37 % 256) as u8).collect();
        let row_scales = [f16::from_f32(0.0123).to_f32(), f16::from_f32(-3.5e-4).to_f32()];
        let gs = int8_group_size(cols).unwrap();
        assert_eq!(gs, 128);
        let (mut p, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
        repack_int8_rows(
            &w8,
            &row_scales,
            cols,
            gs,
            Dtype::F32,
            &mut AffineOut { packed: &mut p, scales: &mut s, biases: &mut b },
        );
        let mut back = Vec::new();
        dequantize_rows(&p, &s, &b, cols, AffineSpec::new(8, gs).unwrap(), Dtype::F32, &mut back);
        for (i, (&got, &q)) in back.iter().zip(&w8).enumerate() {
            assert_eq!(got, q as i8 as f32 * row_scales[i / cols], "element {i}");
        }
        assert_eq!(int8_group_size(96), Some(32));
        assert_eq!(int8_group_size(100), None);
    }

    #[test]
    fn specs_are_validated() {
        assert!(AffineSpec::new(7, 64).is_err());
        assert!(AffineSpec::new(4, 16).is_err());
        let s = AffineSpec::new(3, 128).unwrap();
        assert_eq!((s.packed_cols(512), s.groups(512)), (48, 4));
    }
}
