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
        let mut cols: Vec<Vec<f32>> = (0..width)
            .map(|c| (0..2 * HADAMARD_SIZE).map(|r| m[r * width + c]).collect())
            .collect();
        fwht_across_rows(&mut m, width);
        for (c, col) in cols.iter_mut().enumerate() {
            fwht_blocks(col);
            for (r, &v) in col.iter().enumerate() {
                assert_eq!(m[r * width + c], v);
            }
        }
    }
}
