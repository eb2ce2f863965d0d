//! Benchmark helper: how close `--max-size`'s sampled estimate comes to reading every row. Plans
//! `--format FORMAT --max-size SIZE` (nothing written) with 2, 4, 8 (the default) and 16 sampled
//! work units per tensor and with every unit, and prints for each: how many tensors chose as the
//! full pass did, the largest relative difference of a chosen option's predicted ratio from the
//! full pass's (on the tensors that chose alike), the largest ratio of a coded linear, and the
//! wall time.
//!
//!     fit_sampling CHECKPOINT FORMAT SIZE        (FORMAT mlx or gguf; SIZE in bytes; GGUF
//!                                                 without a vocabulary)

use anyhow::{bail, Context, Result};
use escha_convert::codec::best_decoder;
use escha_convert::convert::{planned_tensor_bytes, ConvertOptions};
use escha_convert::layout::{GgufOptions, GgufType, MlxOptions, OutputFormat, WidthChoice};
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, format, size] = args.as_slice() else { bail!("usage: fit_sampling CHECKPOINT FORMAT SIZE") };
    let format = match format.as_str() {
        "mlx" => OutputFormat::Mlx(MlxOptions { fitted: true, ..MlxOptions::DEFAULT }),
        "gguf" => {
            OutputFormat::Gguf(GgufOptions { ty: GgufType::Auto, fitted: true, vocab: false, ..GgufOptions::DEFAULT })
        }
        other => bail!("FORMAT {other}: mlx or gguf"),
    };
    let opts = ConvertOptions {
        format,
        max_size: Some(size.parse().context("SIZE in bytes")?),
        ..ConvertOptions::new(input.into(), "/nonexistent".into())
    };
    let decoder = best_decoder();
    let plan = |sample: usize| -> Result<(Vec<WidthChoice>, f64)> {
        let started = Instant::now();
        let (_, widths) = planned_tensor_bytes(&opts, decoder, Some(sample))?;
        Ok((widths, started.elapsed().as_secs_f64()))
    };
    let largest = |w: &[WidthChoice]| w.iter().filter_map(|c| c.ratio.filter(|_| c.k != 8)).fold(0.0, f64::max);
    let (full, full_s) = plan(usize::MAX)?;
    println!("| sampled units | same choice | largest ratio difference | largest ratio | wall |");
    println!("|---|---|---|---|---|");
    for sample in [2, 4, 8, 16] {
        let (w, s) = plan(sample)?;
        let same: Vec<_> =
            w.iter().zip(&full).filter(|(a, b)| a.chosen == b.chosen && a.group_size == b.group_size).collect();
        let diff = same
            .iter()
            .filter_map(|(a, b)| Some((a.ratio?, b.ratio?)))
            .filter(|(_, b)| *b > 0.0)
            .map(|(a, b)| (a / b - 1.0).abs())
            .fold(0.0, f64::max);
        println!("| {sample} | {}/{} | {diff:.4} | {:.4} | {s:.1} s |", same.len(), full.len(), largest(&w));
    }
    println!("| all | {n}/{n} | 0 | {:.4} | {full_s:.1} s |", largest(&full), n = full.len());
    Ok(())
}
