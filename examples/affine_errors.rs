//! Benchmark helper: the error MLX affine quantization adds to every coded linear of a dense
//! checkpoint, at every width MLX offers, measured exactly and estimated from the group ranges.
//!
//!     affine_errors CHECKPOINT [GROUP_SIZE]        (default group size 64)
//!
//! Each linear is reconstructed one 128-row block at a time, rounded to the model dtype (the
//! dtype of the scales, as `--format mlx` does it), quantized and dequantized at 2, 3, 4, 5, 6
//! and 8 bits (`WidthErrors::add_exact`) and estimated (`WidthErrors::add_estimate`). Prints one
//! JSON object per line: `module`, `k`, `weights`, and `exact` and `estimate`, each mapping a
//! width to `‖deq(Q_b(W)) − W‖ / ‖W‖` over the live rows. Stacks of experts are refused (the
//! conversion zeroes their dead `down_proj` columns first, which this does not).

use anyhow::{bail, Context, Result};
use escha_convert::checkpoint::{catalog, Checkpoint};
use escha_convert::codec::best_decoder;
use escha_convert::layout::mlx::model_dtype;
use escha_convert::quant::affine::{round_slice, BITS};
use escha_convert::quant::affine_error::WidthErrors;
use escha_convert::transform::hadamard::HADAMARD_SIZE;
use rayon::prelude::*;
use serde_json::{json, Map, Value};
use std::path::Path;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, gs) = match args.as_slice() {
        [input] => (input, 64),
        [input, gs] => (input, gs.parse().context("GROUP_SIZE must be 32, 64 or 128")?),
        _ => bail!("usage: affine_errors CHECKPOINT [GROUP_SIZE]"),
    };
    let ck = Checkpoint::open(Path::new(input))?;
    let cat = catalog(&ck)?;
    let dtype = model_dtype(ck.config.as_ref());
    let decoder = best_decoder();
    for m in &cat.coded {
        if m.experts.is_some() {
            bail!("{}: a stack of experts (only single linears are measured)", m.path);
        }
        let (ic, ic_p) = (m.in_features, m.in_padded);
        if ic % gs != 0 {
            bail!("{}: {ic} input features are not a multiple of the group size {gs}", m.path);
        }
        let expert = m.expert(&ck, 0)?;
        let linear = expert.linear();
        let none = || (WidthErrors::default(), WidthErrors::default());
        let (exact, estimate) = (0..linear.blocks())
            .into_par_iter()
            .map_init(Vec::new, |block, b| {
                // The true rows and columns only (padding rows and columns are not output).
                let rows = HADAMARD_SIZE.min(m.out_features.saturating_sub(b * HADAMARD_SIZE));
                if rows == 0 {
                    return none();
                }
                block.resize(HADAMARD_SIZE * ic_p, 0.0);
                linear.reconstruct_block(decoder, b, block);
                if ic < ic_p {
                    for r in 0..rows {
                        block.copy_within(r * ic_p..r * ic_p + ic, r * ic);
                    }
                }
                let values = &mut block[..rows * ic];
                round_slice(values, dtype);
                let (mut exact, mut estimate) = none();
                exact.add_exact(values, ic, gs, dtype);
                estimate.add_estimate(values, ic, gs);
                (exact, estimate)
            })
            .reduce(none, |a, b| (a.0.merge(b.0), a.1.merge(b.1)));
        let widths = |e: &WidthErrors| -> Value {
            BITS.iter().map(|&b| (b.to_string(), json!(e.relative(b)))).collect::<Map<_, _>>().into()
        };
        let line = json!({
            "module": m.path,
            "k": m.k,
            "weights": m.weights_per_expert(),
            "exact": widths(&exact),
            "estimate": widths(&estimate),
        });
        println!("{line}");
        ck.release_all(m.leaves.values().filter_map(|name| ck.entry(name).ok()));
    }
    Ok(())
}
