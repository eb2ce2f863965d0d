//! The 128-point Sylvester (natural-order) Walsh–Hadamard transform, unnormalised.
//!
//! `H[i, j] = (−1)^popcount(i & j)`. The in-place butterfly at strides 1, 2, …, 64 computes exactly
//! this matrix; normalisation (`1/√128` per side) is applied by the caller, once, as `2^−7` for the
//! two sides together.

/// Length of one Hadamard block.
pub const HADAMARD_SIZE: usize = 128;

/// Transforms every consecutive 128-block of `x` in place (`x.len()` a multiple of 128).
pub fn fwht_blocks(x: &mut [f32]) {
    debug_assert_eq!(x.len() % HADAMARD_SIZE, 0);
    for block in x.chunks_exact_mut(HADAMARD_SIZE) {
        fwht128(block.try_into().unwrap());
    }
}

/// One 128-point transform. Written over fixed-size arrays so the compiler vectorises each stage.
#[inline]
pub fn fwht128(x: &mut [f32; HADAMARD_SIZE]) {
    let mut h = 1;
    while h < HADAMARD_SIZE {
        for base in (0..HADAMARD_SIZE).step_by(2 * h) {
            for i in base..base + h {
                let (a, b) = (x[i], x[i + h]);
                x[i] = a + b;
                x[i + h] = a - b;
            }
        }
        h *= 2;
    }
}

/// Applies the transform across rows: for each group of 128 consecutive rows of a row-major
/// `[rows, width]` matrix, row `r` becomes `Σ_s H[r, s]·row s`. Each butterfly adds whole rows,
/// which vectorises along the row.
pub fn fwht_across_rows(x: &mut [f32], width: usize) {
    let block = HADAMARD_SIZE * width;
    debug_assert_eq!(x.len() % block, 0);
    for rows in x.chunks_exact_mut(block) {
        let mut h = 1;
        while h < HADAMARD_SIZE {
            for base in (0..HADAMARD_SIZE).step_by(2 * h) {
                for i in base..base + h {
                    let (top, bottom) = rows.split_at_mut((i + h) * width);
                    let a = &mut top[i * width..(i + 1) * width];
                    let b = &mut bottom[..width];
                    for (p, q) in a.iter_mut().zip(b.iter_mut()) {
                        let (u, v) = (*p, *q);
                        *p = u + v;
                        *q = u - v;
                    }
                }
            }
            h *= 2;
        }
    }
}

/// Row stride of a [`Square`]. The 8 floats of padding keep rows that are 8 apart (as the column
/// butterflies load them) out of the same L1 cache set.
pub(crate) const SQUARE_STRIDE: usize = HADAMARD_SIZE + 8;

/// A 128×128 block of f32 in row-major order, rows [`SQUARE_STRIDE`] apart.
#[derive(Clone)]
pub(crate) struct Square(Box<[f32; HADAMARD_SIZE * SQUARE_STRIDE]>);

impl Default for Square {
    fn default() -> Self {
        Square(vec![0f32; HADAMARD_SIZE * SQUARE_STRIDE].try_into().unwrap())
    }
}

impl Square {
    /// Row `r` (128 values).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.0[r * SQUARE_STRIDE..][..HADAMARD_SIZE]
    }

    /// Row `r` (128 values), mutable.
    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.0[r * SQUARE_STRIDE..][..HADAMARD_SIZE]
    }

    /// Transforms the square along each row, then along each column (the order of
    /// [`fwht_blocks`] followed by [`fwht_across_rows`], so the result is bit-identical to them),
    /// and writes `out[r·stride + c] = y[r][c] · row_scale[r] · col_scale[c]`. The square is
    /// left holding `y`, unscaled.
    pub fn transform_scaled(
        &mut self,
        row_scale: &[f32; HADAMARD_SIZE],
        col_scale: &[f32; HADAMARD_SIZE],
        out: &mut [f32],
        stride: usize,
    ) {
        assert!(stride >= HADAMARD_SIZE && out.len() >= (HADAMARD_SIZE - 1) * stride + HADAMARD_SIZE);
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx2_fma() {
            // SAFETY: the features were detected.
            unsafe { avx2::transform_scaled(self, row_scale, col_scale, out, stride) };
            return;
        }
        #[cfg(target_arch = "aarch64")]
        neon::transform_scaled(self, row_scale, col_scale, out, stride);
        #[cfg(not(target_arch = "aarch64"))]
        self.transform_scaled_portable(row_scale, col_scale, out, stride);
    }

    /// [`Self::transform_scaled`] for `x86_64` CPUs without AVX2 and FMA and for targets other
    /// than `x86_64` and aarch64; on aarch64 only the tests use it, as the reference for NEON.
    // Not inlined, so that scripts/mca-aarch64.sh finds it (one call per square).
    #[cfg_attr(all(target_arch = "aarch64", not(test)), allow(dead_code))]
    #[inline(never)]
    fn transform_scaled_portable(
        &mut self,
        row_scale: &[f32; HADAMARD_SIZE],
        col_scale: &[f32; HADAMARD_SIZE],
        out: &mut [f32],
        stride: usize,
    ) {
        for r in 0..HADAMARD_SIZE {
            fwht128(self.row_mut(r).try_into().unwrap());
        }
        fwht_across_rows(&mut self.0[..], SQUARE_STRIDE); // the padding columns just come along
        self.scale_into(row_scale, col_scale, out, stride);
    }

    #[inline(always)]
    fn scale_into(
        &self,
        row_scale: &[f32; HADAMARD_SIZE],
        col_scale: &[f32; HADAMARD_SIZE],
        out: &mut [f32],
        stride: usize,
    ) {
        for (r, (&rs, dst)) in row_scale.iter().zip(out.chunks_mut(stride)).enumerate() {
            for ((w, &v), &cs) in dst.iter_mut().zip(self.row(r)).zip(col_scale) {
                *w = v * rs * cs;
            }
        }
    }
}

/// The square transform with 8-wide vectors. Butterflies between vectors are plain adds and
/// subtracts; within a vector (strides 1, 2, 4 along a row) each is `a ± b` as one FMA with a ±1
/// factor, which is exact. Rows are done eight at a time, together with the first three column
/// stages while those rows are in L1.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Square, HADAMARD_SIZE, SQUARE_STRIDE};
    #[allow(clippy::wildcard_imports)] // the intrinsics
    use std::arch::x86_64::*;

    /// 8-float vectors per 128-float row.
    const VECS: usize = HADAMARD_SIZE / 8;

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn transform_scaled(
        square: &mut Square,
        row_scale: &[f32; HADAMARD_SIZE],
        col_scale: &[f32; HADAMARD_SIZE],
        out: &mut [f32],
        stride: usize,
    ) {
        unsafe {
            transform(&mut square.0);
            square.scale_into(row_scale, col_scale, out, stride); // inlined, so vectorised with AVX2
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn transform(x: &mut [f32; HADAMARD_SIZE * SQUARE_STRIDE]) {
        unsafe {
            let x = x.as_mut_ptr();
            let at = |r: usize, c: usize| x.add(r * SQUARE_STRIDE + c);
            for rows in (0..HADAMARD_SIZE).step_by(8) {
                for r in rows..rows + 8 {
                    let mut v: [__m256; VECS] = std::array::from_fn(|i| _mm256_loadu_ps(at(r, 8 * i)));
                    for w in &mut v {
                        *w = within_vector(*w);
                    }
                    butterflies(&mut v);
                    for (i, w) in v.iter().enumerate() {
                        _mm256_storeu_ps(at(r, 8 * i), *w);
                    }
                }
                for c in (0..HADAMARD_SIZE).step_by(8) {
                    let mut v: [__m256; 8] = std::array::from_fn(|m| _mm256_loadu_ps(at(rows + m, c)));
                    butterflies(&mut v);
                    for (m, w) in v.iter().enumerate() {
                        _mm256_storeu_ps(at(rows + m, c), *w);
                    }
                }
            }
            // Column stages of strides 8 … 64.
            for r0 in 0..8 {
                for c in (0..HADAMARD_SIZE).step_by(8) {
                    let mut v: [__m256; VECS] = std::array::from_fn(|m| _mm256_loadu_ps(at(r0 + 8 * m, c)));
                    butterflies(&mut v);
                    for (m, w) in v.iter().enumerate() {
                        _mm256_storeu_ps(at(r0 + 8 * m, c), *w);
                    }
                }
            }
        }
    }

    /// The butterfly stages between the vectors of `v`, strides 1, 2, 4, … (in vectors).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn butterflies<const N: usize>(v: &mut [__m256; N]) {
        {
            let mut h = 1;
            while h < N {
                for base in (0..N).step_by(2 * h) {
                    for i in base..base + h {
                        let (a, b) = (v[i], v[i + h]);
                        v[i] = _mm256_add_ps(a, b);
                        v[i + h] = _mm256_sub_ps(a, b);
                    }
                }
                h *= 2;
            }
        }
    }

    /// The stages of strides 1, 2 and 4 inside one vector: `lower ± upper` as `fma(upper, ±1, lower)`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn within_vector(x: __m256) -> __m256 {
        {
            let x = _mm256_fmadd_ps(
                _mm256_movehdup_ps(x),
                _mm256_setr_ps(1., -1., 1., -1., 1., -1., 1., -1.),
                _mm256_moveldup_ps(x),
            );
            let x = _mm256_fmadd_ps(
                _mm256_shuffle_ps::<0b11_10_11_10>(x, x),
                _mm256_setr_ps(1., 1., -1., -1., 1., 1., -1., -1.),
                _mm256_shuffle_ps::<0b01_00_01_00>(x, x),
            );
            _mm256_fmadd_ps(
                _mm256_permute2f128_ps::<0x11>(x, x),
                _mm256_setr_ps(1., 1., 1., 1., -1., -1., -1., -1.),
                _mm256_permute2f128_ps::<0x00>(x, x),
            )
        }
    }
}

/// The square transform with 4-wide NEON vectors (aarch64, where NEON is always present).
///
/// Every output is the same `a + b` or `a − b` of the same operands as in the portable code, and
/// the scaling the same `(y · row_scale) · col_scale` (two multiplies, no fused multiply-add), so
/// the result is bit-identical. Three passes over the square, each small enough to stay in
/// registers (32 vectors):
/// 1. each row, one 64-float half at a time: the row stages of strides 1 … 32. The two stages
///    inside a vector (strides 1 and 2) work on pairs of vectors: `ld2` splits 8 floats into even
///    and odd lanes, so stride 1 is one add and one subtract; `uzp1`/`uzp2` pair up the stride-2
///    operands the same way, and a last `uzp1`/`uzp2` restores the natural order;
/// 2. per group of 8 rows and column vector, that column and the one 64 floats on: the row stage
///    of stride 64, then the column stages of strides 1, 2 and 4 (the rows are still in L1);
/// 3. per column vector, 16 rows 8 apart: the column stages of strides 8 … 64, then the scaling.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{Square, HADAMARD_SIZE, SQUARE_STRIDE};
    #[allow(clippy::wildcard_imports)] // the intrinsics
    use std::arch::aarch64::*;

    /// Half a row, in 4-float vectors.
    const HALF_VECS: usize = HADAMARD_SIZE / 8;

    pub fn transform_scaled(
        square: &mut Square,
        row_scale: &[f32; HADAMARD_SIZE],
        col_scale: &[f32; HADAMARD_SIZE],
        out: &mut [f32],
        stride: usize,
    ) {
        assert!(stride >= HADAMARD_SIZE && out.len() >= (HADAMARD_SIZE - 1) * stride + HADAMARD_SIZE);
        // SAFETY: NEON is part of the aarch64 base ISA; every access is inside the square, the
        // scales or `out` (whose size was checked above).
        unsafe { transform(&mut square.0, row_scale, col_scale, out.as_mut_ptr(), stride) };
    }

    #[inline]
    unsafe fn transform(
        x: &mut [f32; HADAMARD_SIZE * SQUARE_STRIDE],
        row_scale: &[f32; HADAMARD_SIZE],
        col_scale: &[f32; HADAMARD_SIZE],
        out: *mut f32,
        stride: usize,
    ) {
        const HALF: usize = HADAMARD_SIZE / 2;
        unsafe {
            let x = x.as_mut_ptr();
            let at = |r: usize, c: usize| x.add(r * SQUARE_STRIDE + c);
            for rows in (0..HADAMARD_SIZE).step_by(8) {
                // Pass 1.
                for r in rows..rows + 8 {
                    row_half(at(r, 0));
                    row_half(at(r, HALF));
                }
                // Pass 2.
                for c in (0..HALF).step_by(4) {
                    let mut a: [float32x4_t; 8] = std::array::from_fn(|m| vld1q_f32(at(rows + m, c)));
                    let mut b: [float32x4_t; 8] = std::array::from_fn(|m| vld1q_f32(at(rows + m, c + HALF)));
                    for (p, q) in a.iter_mut().zip(b.iter_mut()) {
                        (*p, *q) = (vaddq_f32(*p, *q), vsubq_f32(*p, *q));
                    }
                    butterflies(&mut a);
                    butterflies(&mut b);
                    for m in 0..8 {
                        vst1q_f32(at(rows + m, c), a[m]);
                        vst1q_f32(at(rows + m, c + HALF), b[m]);
                    }
                }
            }
            // Pass 3: rows r0, r0 + 8, …, r0 + 120.
            for r0 in 0..8 {
                for c in (0..HADAMARD_SIZE).step_by(4) {
                    let mut v: [float32x4_t; 16] = std::array::from_fn(|m| vld1q_f32(at(r0 + 8 * m, c)));
                    butterflies(&mut v);
                    let cs = vld1q_f32(col_scale.as_ptr().add(c));
                    for (m, w) in v.iter().enumerate() {
                        let r = r0 + 8 * m;
                        vst1q_f32(at(r, c), *w);
                        vst1q_f32(out.add(r * stride + c), vmulq_f32(vmulq_n_f32(*w, row_scale[r]), cs));
                    }
                }
            }
        }
    }

    /// Pass 1 on 64 consecutive floats: the row stages of strides 1 … 32.
    #[inline(always)]
    unsafe fn row_half(p: *mut f32) {
        unsafe {
            let mut v = [vdupq_n_f32(0.0); HALF_VECS];
            for i in 0..HALF_VECS / 2 {
                (v[2 * i], v[2 * i + 1]) = within_pair(vld2q_f32(p.add(8 * i)));
            }
            butterflies(&mut v);
            for (i, w) in v.iter().enumerate() {
                vst1q_f32(p.add(4 * i), *w);
            }
        }
    }

    /// The butterfly stages between the vectors of `v`, strides 1, 2, 4, … (in vectors).
    #[inline(always)]
    unsafe fn butterflies<const N: usize>(v: &mut [float32x4_t; N]) {
        unsafe {
            let mut h = 1;
            while h < N {
                for base in (0..N).step_by(2 * h) {
                    for i in base..base + h {
                        let (a, b) = (v[i], v[i + h]);
                        v[i] = vaddq_f32(a, b);
                        v[i + h] = vsubq_f32(a, b);
                    }
                }
                h *= 2;
            }
        }
    }

    /// Stages of strides 1 and 2 of 8 consecutive floats `x0..x3, y0..y3`, given as `ld2` loads
    /// them (`[x0 x2 y0 y2]`, `[x1 x3 y1 y3]`); returns the two vectors in natural order.
    #[inline(always)]
    unsafe fn within_pair(v: float32x4x2_t) -> (float32x4_t, float32x4_t) {
        unsafe {
            // Stride 1: s = [x'0 x'2 y'0 y'2], d = [x'1 x'3 y'1 y'3].
            let s = vaddq_f32(v.0, v.1);
            let d = vsubq_f32(v.0, v.1);
            // Stride 2: p = [x''0 y''0 x''1 y''1], q = [x''2 y''2 x''3 y''3].
            let (e, o) = (vuzp1q_f32(s, d), vuzp2q_f32(s, d));
            let p = vaddq_f32(e, o);
            let q = vsubq_f32(e, o);
            (vuzp1q_f32(p, q), vuzp2q_f32(p, q))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sylvester(i: usize, j: usize) -> f32 {
        if (i & j).count_ones().is_multiple_of(2) {
            1.0
        } else {
            -1.0
        }
    }

    #[test]
    fn matches_the_natural_order_matrix_column_by_column() {
        // Transforming unit vectors reads off the matrix; a wrongly ordered butterfly (also
        // self-inverse) would fail here but not in a round trip.
        for j in 0..HADAMARD_SIZE {
            let mut e = [0f32; HADAMARD_SIZE];
            e[j] = 1.0;
            fwht128(&mut e);
            for (i, &v) in e.iter().enumerate() {
                assert_eq!(v, sylvester(i, j), "H[{i}, {j}]");
            }
        }
    }

    #[test]
    fn across_rows_equals_the_transform_of_each_column() {
        let width = 3;
        let mut m: Vec<f32> = (0..2 * HADAMARD_SIZE * width).map(|v| ((v * 37) % 101) as f32 - 50.0).collect();
        let mut cols: Vec<Vec<f32>> =
            (0..width).map(|c| (0..2 * HADAMARD_SIZE).map(|r| m[r * width + c]).collect()).collect();
        fwht_across_rows(&mut m, width);
        for (c, col) in cols.iter_mut().enumerate() {
            fwht_blocks(col);
            for (r, &v) in col.iter().enumerate() {
                assert_eq!(m[r * width + c], v);
            }
        }
    }

    #[test]
    fn square_transform_is_the_scaled_two_sided_transform_on_every_path() {
        let value = |i: usize| ((i * 7919 + 13) % 2003) as f32 / 1001.0 - 1.0;
        let mut square = Square::default();
        for r in 0..HADAMARD_SIZE {
            for (c, v) in square.row_mut(r).iter_mut().enumerate() {
                *v = value(r * HADAMARD_SIZE + c);
            }
        }
        let row_scale: [f32; HADAMARD_SIZE] = std::array::from_fn(|r| value(3 * r + 1) / 128.0);
        let col_scale: [f32; HADAMARD_SIZE] = std::array::from_fn(|c| value(5 * c + 2));
        let stride = 3 * HADAMARD_SIZE;
        let mut portable = vec![0f32; HADAMARD_SIZE * stride];
        square.clone().transform_scaled_portable(&row_scale, &col_scale, &mut portable, stride);
        let mut dispatched = vec![0f32; HADAMARD_SIZE * stride];
        square.clone().transform_scaled(&row_scale, &col_scale, &mut dispatched, stride);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // The dispatched path is AVX2 on x86_64 where present and NEON on aarch64.
        assert_eq!(bits(&dispatched), bits(&portable), "fast path differs from the portable one");
        #[cfg(target_arch = "aarch64")]
        {
            let mut neon = vec![0f32; HADAMARD_SIZE * stride];
            let mut y = square.clone();
            neon::transform_scaled(&mut y, &row_scale, &col_scale, &mut neon, stride);
            assert_eq!(bits(&neon), bits(&portable), "NEON path differs from the portable one");
            let mut y_portable = square.clone();
            y_portable.transform_scaled_portable(&row_scale, &col_scale, &mut portable, stride);
            for r in 0..HADAMARD_SIZE {
                assert_eq!(bits(y.row(r)), bits(y_portable.row(r)), "NEON leaves another row {r}");
            }
        }

        // Against H·X·H by definition, in f64.
        let x: Vec<f64> = (0..HADAMARD_SIZE * HADAMARD_SIZE).map(|i| value(i) as f64).collect();
        let h = |i: usize, j: usize| sylvester(i, j) as f64;
        for r in (0..HADAMARD_SIZE).step_by(17) {
            for c in (0..HADAMARD_SIZE).step_by(13) {
                let mut y = 0.0;
                for a in 0..HADAMARD_SIZE {
                    for b in 0..HADAMARD_SIZE {
                        y += h(r, a) * x[a * HADAMARD_SIZE + b] * h(b, c);
                    }
                }
                let want = y * row_scale[r] as f64 * col_scale[c] as f64;
                assert!((portable[r * stride + c] as f64 - want).abs() < 1e-4, "[{r}, {c}]");
            }
        }
    }
}
