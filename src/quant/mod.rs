//! Output encodings of f32 values.

pub mod affine;
pub mod affine_error;
pub mod block_error;
pub mod blocks;
pub mod budget;
pub mod dense;
pub mod iq4;
pub mod iqlow;
pub mod kquants;
pub mod legacy;
pub mod q8_0;
#[cfg(test)]
mod test_rows;

/// The first value of largest magnitude in `x`, and that magnitude; `(0, 0)` for no value above
/// zero. A strict comparison, as ggml's scans make it: a NaN never wins, and of two equal
/// magnitudes the first is kept (which of `±amax` it is decides a grid's sign).
pub(crate) fn largest_magnitude(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}
