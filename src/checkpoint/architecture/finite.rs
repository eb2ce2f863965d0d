//! Plain float values a client can compute with: finite, within f32's range (an F64 tensor is
//! written as F32), and, where a client exponentiates a value, small enough that what it computes
//! from it stays finite in f32.

use super::expected::is_any_float;
use crate::checkpoint::input::Checkpoint;
use crate::checkpoint::modules::Catalog;
use crate::checkpoint::tensor::{scan_chunks, to_f32_vec};
use crate::quant::dense::first_non_finite;
use anyhow::{bail, Result};
use safetensors::Dtype;

/// The linear-attention decay is `g = −exp(A_log) · softplus(a + dt_bias)` per token, summed over
/// chunks of 64 tokens (transformers, mlx-lm, llama.cpp; llama.cpp's converter stores
/// `−exp(A_log)` itself). With `exp(A_log) ≤ e^32` (a decay that already erases the state in one
/// token of any real step) and `|dt_bias| ≤ 65504`, `g` stays below 2^69 with room for the
/// activations; beyond them `exp` overflows to infinity and the logits turn NaN.
const A_LOG_MAX: f32 = 32.0;
const DT_BIAS_MAX: f32 = 65504.0;

/// Refuses, by name, a plain float tensor holding NaN or infinity (passed through, they poison
/// every activation they touch), an F64 value past f32's range, or an `A_log` / `dt_bias` value whose
/// exponential a client cannot compute with.
pub(super) fn check_finite_plain(ck: &Checkpoint, cat: &Catalog) -> Result<()> {
    for p in &cat.plain {
        let e = &ck.tensors[&p.name];
        if !is_any_float(e.dtype) {
            continue;
        }
        let el = e.dtype.bitsize() / 8;
        let bytes = ck.bytes(e);
        let file = ck.file_of(e);
        for chunk in scan_chunks(e.numel()) {
            let bytes = &bytes[chunk.start * el..chunk.end * el];
            if let Some(i) = first_non_finite(bytes, e.dtype) {
                bail!(
                    "{}: tensor {}: a non-finite value (NaN or infinity) at index {}; no client computes with it",
                    file.display(),
                    p.name,
                    chunk.start + i
                );
            }
            let bound = if p.name.ends_with("linear_attn.A_log") {
                Some((f64::from(A_LOG_MAX), "its exponential, the linear-attention decay rate, overflows", false))
            } else if p.name.ends_with("linear_attn.dt_bias") {
                Some((
                    f64::from(DT_BIAS_MAX),
                    "the decay it scales, −exp(A_log)·softplus(a + dt_bias), overflows",
                    true,
                ))
            } else if e.dtype == Dtype::F64 {
                Some((f64::from(f32::MAX), "read as the nearest f32, as every output writes it, it is infinite", true))
            } else {
                None
            };
            let Some((limit, why, both_signs)) = bound else { continue };
            let values = to_f32_vec(bytes, e.dtype)?;
            let over = |x: f64| if both_signs { x.abs() > limit } else { x > limit };
            // F64 is read as the nearest f32: a value past f32's range is infinite here, and refused.
            if let Some(i) = values.iter().position(|&x| over(f64::from(x))) {
                bail!(
                    "{}: tensor {}: value {} at index {}, beyond {}{}: {why} in the clients' f32 arithmetic",
                    file.display(),
                    p.name,
                    number(f64::from(values[i])),
                    chunk.start + i,
                    if both_signs { "±" } else { "" },
                    number(limit)
                );
            }
        }
        ck.release(e);
    }
    Ok(())
}

/// A number for a message: plain, or in exponent form when long.
fn number(x: f64) -> String {
    if x.is_finite() && x.abs() < 1e6 {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}
