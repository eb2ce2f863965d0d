//! The 128-point Sylvester (natural-order) Walsh–Hadamard transform, unnormalised.
//!
//! `H[i, j] = (−1)^popcount(i & j)`. The in-place butterfly at strides 1, 2, …, 64 computes exactly
//! this matrix; normalisation (`1/√128` per side) is applied by the caller, once, as `2^−7` for the
//! two sides together.
//!
//! `Square::transform_scaled` is written once over the crate's `simd::Lanes` and entered through one
//! `#[target_feature]` function per CPU ([`Kernel::best`] chooses). Every output is exactly the `a + b`
//! or `a − b` of the same operands that the portable code computes, and the scaling the same
//! `(y · row_scale) · col_scale` (two multiplies, no fused multiply-add), so the result is
//! bit-identical. Three passes, each small enough to stay in registers, then the scaling:
//! 1. each row, in chunks of 16 vectors (the whole row with 8 lanes, half of it with 4): the row
//!    stages inside a vector from `Lanes::load_hadamard_pair`, then those between the chunk's
//!    vectors;
//! 2. per group of 8 rows and column vector of the first chunk, that column in every chunk: the
//!    row stages between chunks (none with 8 lanes), then the column stages of strides 1, 2 and 4
//!    (the rows are still in L1);
//! 3. per column vector, 16 rows 8 apart: the column stages of strides 8 … 64;
//! 4. the scaling into `out`, a row at a time.

use crate::cpu::Kernel;
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;
#[cfg(target_arch = "aarch64")]
use crate::simd::Neon;
use crate::simd::{Lanes, Vector};

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
        match Kernel::best() {
            Kernel::Reference => self.transform_scaled_portable(row_scale, col_scale, out, stride),
            // SAFETY: the token proves AVX2.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2(lanes) => unsafe { transform_scaled_avx2(lanes, self, row_scale, col_scale, out, stride) },
            // SAFETY: the token proves NEON.
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon(lanes) => unsafe { transform_scaled_neon(lanes, self, row_scale, col_scale, out, stride) },
        }
    }

    /// [`Self::transform_scaled`] with [`Kernel::Reference`]: CPUs without vector lanes, and the
    /// tests' reference for those with them.
    // Not inlined, so that scripts/mca-aarch64.sh finds it (one call per square).
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

/// [`transform_scaled_lanes`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transform_scaled_avx2(
    lanes: Avx2,
    square: &mut Square,
    row_scale: &[f32; HADAMARD_SIZE],
    col_scale: &[f32; HADAMARD_SIZE],
    out: &mut [f32],
    stride: usize,
) {
    transform_scaled_lanes(lanes, &mut square.0, row_scale, col_scale, out, stride);
}

/// [`transform_scaled_lanes`] compiled for NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
fn transform_scaled_neon(
    lanes: Neon,
    square: &mut Square,
    row_scale: &[f32; HADAMARD_SIZE],
    col_scale: &[f32; HADAMARD_SIZE],
    out: &mut [f32],
    stride: usize,
) {
    transform_scaled_lanes(lanes, &mut square.0, row_scale, col_scale, out, stride);
}

/// Vectors per row chunk of pass 1 and per column of pass 3: 16 fit the registers of AVX2 (16)
/// and of NEON (32) with room to spare.
const CHUNK_VECS: usize = 16;

/// [`Square::transform_scaled`] over `lanes`' vectors, in the passes of the module documentation.
#[inline(always)]
fn transform_scaled_lanes<L: Lanes>(
    lanes: L,
    x: &mut [f32; HADAMARD_SIZE * SQUARE_STRIDE],
    row_scale: &[f32; HADAMARD_SIZE],
    col_scale: &[f32; HADAMARD_SIZE],
    out: &mut [f32],
    stride: usize,
) {
    assert!(stride >= HADAMARD_SIZE && out.len() >= (HADAMARD_SIZE - 1) * stride + HADAMARD_SIZE);
    // Index loops rather than `step_by`, so that the compiler sees every slice in bounds.
    let n = L::LANES;
    let chunk = CHUNK_VECS * n;
    let chunks = HADAMARD_SIZE / chunk;
    for g in 0..HADAMARD_SIZE / 8 {
        let rows = 8 * g;
        // Pass 1.
        for r in rows..rows + 8 {
            for part in x[r * SQUARE_STRIDE..][..HADAMARD_SIZE].chunks_exact_mut(chunk) {
                let mut v = [lanes.splat(0.0); CHUNK_VECS];
                for i in 0..CHUNK_VECS / 2 {
                    [v[2 * i], v[2 * i + 1]] = lanes.load_hadamard_pair(&part[2 * i * n..]);
                }
                butterflies(&mut v);
                for (i, w) in v.iter().enumerate() {
                    w.store(&mut part[i * n..]);
                }
            }
        }
        // Pass 2: vector `j` is row `rows + j / chunks`, chunk `j % chunks`, so the stages between
        // chunks (the row's last) come before those between rows.
        for cv in 0..CHUNK_VECS {
            let at = |j: usize| (rows + j / chunks) * SQUARE_STRIDE + (j % chunks) * chunk + cv * n;
            match chunks {
                1 => {
                    butterflies_at::<L, 8>(lanes, x, at);
                }
                2 => {
                    butterflies_at::<L, 16>(lanes, x, at);
                }
                _ => unreachable!("no schedule for {} lanes", L::LANES),
            }
        }
    }
    // Pass 3: rows r0, r0 + 8, …, r0 + 120.
    for r0 in 0..8 {
        for cv in 0..HADAMARD_SIZE / n {
            butterflies_at::<L, 16>(lanes, x, |m| (r0 + 8 * m) * SQUARE_STRIDE + cv * n);
        }
    }
    // The scaling, a row at a time: writing 16 rows of `out` far apart at once is much slower.
    for (r, dst) in out.chunks_mut(stride).take(HADAMARD_SIZE).enumerate() {
        let (y, dst, rs) =
            (&x[r * SQUARE_STRIDE..][..HADAMARD_SIZE], &mut dst[..HADAMARD_SIZE], lanes.splat(row_scale[r]));
        for c in (0..HADAMARD_SIZE / n).map(|cv| cv * n) {
            (lanes.load(&y[c..]) * rs * lanes.load(&col_scale[c..])).store(&mut dst[c..]);
        }
    }
}

/// Loads the `N` vectors at `x[at(j)..]`, applies [`butterflies`] and stores them back.
#[inline(always)]
fn butterflies_at<L: Lanes, const N: usize>(lanes: L, x: &mut [f32], at: impl Fn(usize) -> usize) {
    let mut v: [L::F32; N] = std::array::from_fn(|j| lanes.load(&x[at(j)..]));
    butterflies(&mut v);
    for (j, w) in v.iter().enumerate() {
        w.store(&mut x[at(j)..]);
    }
}

/// The butterfly stages between the vectors of `v`, strides 1, 2, 4, … (in vectors).
#[inline(always)]
fn butterflies<V: Vector>(v: &mut [V]) {
    let mut h = 1;
    while h < v.len() {
        for base in (0..v.len()).step_by(2 * h) {
            for i in base..base + h {
                let (a, b) = (v[i], v[i + h]);
                v[i] = a + b;
                v[i + h] = a - b;
            }
        }
        h *= 2;
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
            let lanes = Neon::detect().unwrap();
            // SAFETY: the token proves NEON.
            unsafe { transform_scaled_neon(lanes, &mut y, &row_scale, &col_scale, &mut neon, stride) };
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
