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
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were detected.
            unsafe { avx2::transform_scaled(self, row_scale, col_scale, out, stride) };
            return;
        }
        self.transform_scaled_portable(row_scale, col_scale, out, stride);
    }

    /// [`Self::transform_scaled`] for CPUs without AVX2 and FMA.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sylvester(i: usize, j: usize) -> f32 {
        if (i & j).count_ones() % 2 == 0 {
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
        assert_eq!(bits(&dispatched), bits(&portable), "fast path differs from the portable one");

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
