//! The check of an int8 pair against its base weight.

use super::base::BaseMatrix;
use super::coded::shape_text;
use super::findings::Int8Row;
use super::options::INT8_MIN_CORR;
use super::stats::{finite, PairSums};
use crate::checkpoint::{Checkpoint, Int8Module};
use anyhow::Result;

/// Rows dequantized and compared at a time.
const ROWS_PER_STEP: usize = 1024;

pub fn check_int8(ck: &Checkpoint, m: &Int8Module, name: &str, base: &BaseMatrix) -> Result<Int8Row> {
    let (rows, cols) = (m.shape[0], m.shape[1]);
    let mut row = Int8Row { tensor: name.to_string(), corr: None, rel_err: None, failures: Vec::new() };
    if base.rows() != rows || base.cols != cols || base.experts.is_some() {
        row.failures.push(format!(
            "shape: int8 {} vs base {}",
            shape_text(None, rows, cols),
            shape_text(base.experts, base.rows(), base.cols)
        ));
        return Ok(row);
    }
    let mut pair = PairSums::default();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let weight = ck.entry(&m.weight)?;
    for r0 in (0..rows).step_by(ROWS_PER_STEP) {
        let r1 = (r0 + ROWS_PER_STEP).min(rows);
        x.clear();
        m.dequantize_rows(ck, r0..r1, 0..m.shape[1], &mut x)?;
        base.read_rows(0, r0..r1, &mut y)?;
        pair.add_slices(&x, &y);
        // Memory stays flat however large the weight (an embedding, a head).
        ck.release_part(weight, r0 * cols..r1 * cols);
        base.release_rows(0, r0..r1);
    }
    row.corr = finite(pair.corr());
    row.rel_err = finite(pair.rel_err());
    match row.corr {
        Some(c) if c >= INT8_MIN_CORR => {}
        Some(c) => row.failures.push(format!("corr: {c:.4} < {INT8_MIN_CORR}")),
        None => row.failures.push("corr: undefined (a constant weight)".into()),
    }
    Ok(row)
}
