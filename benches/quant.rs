//! MLX affine, ggml K-quant, IQ4 and `Q8_0` quantization speed in ns per weight (median of several
//! runs, and the minimum).
//!
//! `cargo bench --bench quant`. One 128×5120 block (one conversion work unit of a 27B-wide
//! linear) of Gaussian-like weights rounded to bf16, single-threaded: the scalar reference and the
//! kernel `quantize_rows` / `kquants::quantize_row` / `iq4::quantize_row` dispatches to. Affine:
//! group size 64 with BF16 scales; K-quants: `Q2_K` to `Q6_K` (`kquants::SEARCHED`), a row (20
//! super-blocks) at a time; `IQ4_XS` and `IQ4_NL` a row at a time; `Q8_0` a row at a time, beside
//! the bf16 rounding of the same row (what a bf16 output costs there); the legacy types `Q4_0`,
//! `Q4_1`, `Q5_0` and `Q5_1` a row at a time; the IQ2/IQ3 types a row at a time on the first 16
//! rows, with a heavy-tailed per-column importance.
//!
//! `cargo bench --bench quant -- iqlow` (any words after `--`) runs only the sections whose names
//! hold one of them: `affine`, `kquants`, `iq4`, `q8_0`, `legacy`, `iqlow`.

use escha_convert::block_type::BlockType;
use escha_convert::quant::affine::{quantize_rows_with, round_slice, AffineOut, AffineSpec, Kernel};
use escha_convert::quant::kquants;
use escha_convert::quant::{dense, iq4, iqlow, legacy, q8_0};
use escha_convert::rng::SplitMix64;
use safetensors::Dtype;
use std::hint::black_box;
use timing::ns_per_weight;

mod timing;

const ROWS: usize = 128;
const COLS: usize = 5120;
const GROUP_SIZE: usize = 64;
const REPS: usize = 15;

/// Sums of four uniforms (a bell curve) of about the spread of real weights, rounded to bf16.
fn weights(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    let mut v: Vec<f32> = (0..n).map(|_| ((0..4).map(|_| rng.uniform()).sum::<f64>() - 2.0) as f32 * 0.02).collect();
    round_slice(&mut v, Dtype::BF16);
    v
}

fn main() {
    let values = weights(ROWS * COLS, 0x5EED);
    let words: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let run = |section: &str| words.is_empty() || words.iter().any(|w| section.contains(w.as_str()));
    if run("affine") {
        affine_section(&values);
    }
    if run("kquants") {
        kquants_section(&values);
    }
    if run("iq4") {
        iq4_section(&values);
    }
    if run("q8_0") {
        q8_0_section(&values);
    }
    if run("legacy") {
        legacy_section(&values);
    }
    if run("iqlow") {
        iqlow_section(&values);
    }
}

/// `quantize_rows` at each width: the reference against the best kernel.
fn affine_section(values: &[f32]) {
    let best = Kernel::best();
    println!("quantize_rows, {ROWS}×{COLS} block, group {GROUP_SIZE}, BF16 scales: ns/weight, median (min) of {REPS}");
    println!("{:>4}  {:>22}  {:>22}  speed-up", "bits", "reference", best.name());
    let (mut packed, mut scales, mut biases) = (Vec::new(), Vec::new(), Vec::new());
    for bits in [2, 3, 4, 5, 6, 8] {
        let spec = AffineSpec::new(bits, GROUP_SIZE).unwrap();
        let mut time = |kernel: Kernel| {
            ns_per_weight(REPS, values.len(), || {
                packed.clear();
                scales.clear();
                biases.clear();
                let out = &mut AffineOut { packed: &mut packed, scales: &mut scales, biases: &mut biases };
                quantize_rows_with(kernel, black_box(values), COLS, spec, Dtype::BF16, out);
                black_box((&packed, &scales, &biases));
            })
        };
        let reference = time(Kernel::Reference);
        let fast = time(best);
        println!("{bits:>4}  {reference}  {fast}  {:6.1}×", reference.median / fast.median);
    }
}

/// `kquants::quantize_row` for each K-quant type, row by row: the reference against the best
/// kernel, after checking that they agree.
fn kquants_section(values: &[f32]) {
    println!();
    println!("kquants::quantize_row, {ROWS}×{COLS} block, a row at a time: ns/weight, median (min) of {REPS}");
    println!("{:>4}  {:>22}  {:>22}  speed-up", "type", "reference", Kernel::best().name());
    // The types a kernel searches; the others are the reference on every kernel.
    for kind in kquants::SEARCHED {
        reference_against_best(kind.name(), 4, REPS, values.len(), |kernel, out| {
            for row in black_box(values).chunks_exact(COLS) {
                kquants::quantize_row_with(kernel, kind, row, out);
            }
        });
    }
}

/// `iq4::quantize_row` for `IQ4_XS` and `IQ4_NL`, row by row: the reference against the best
/// kernel, after checking that they agree.
fn iq4_section(values: &[f32]) {
    println!();
    println!("iq4::quantize_row, {ROWS}×{COLS} block, a row at a time: ns/weight, median (min) of {REPS}");
    println!("{:>6}  {:>22}  {:>22}  speed-up", "type", "reference", Kernel::best().name());
    for kind in [BlockType::IQ4_XS, BlockType::IQ4_NL] {
        reference_against_best(kind.name(), 6, REPS, values.len(), |kernel, out| {
            for row in black_box(values).chunks_exact(COLS) {
                iq4::quantize_row_with(kernel, kind, row, out);
            }
        });
    }
}

/// `q8_0::quantize_row`, row by row: the scalar reference against the vectors, after checking that
/// they agree; and the bf16 rounding of the same rows.
fn q8_0_section(values: &[f32]) {
    println!();
    println!(
        "q8_0::quantize_row and bf16 rounding, {ROWS}×{COLS} block, a row at a time: ns/weight, median (min) of {REPS}"
    );
    let run = |quantize: fn(&[f32], &mut Vec<u8>), out: &mut Vec<u8>| {
        out.clear();
        for row in black_box(values).chunks_exact(COLS) {
            quantize(row, out);
        }
        black_box(&*out);
    };
    let (mut want, mut out) = (Vec::new(), Vec::new());
    run(q8_0::quantize_row_reference, &mut want);
    run(q8_0::quantize_row, &mut out);
    assert!(out == want, "Q8_0 vectors differ from the reference");
    let reference = ns_per_weight(REPS, values.len(), || run(q8_0::quantize_row_reference, &mut out));
    let fast = ns_per_weight(REPS, values.len(), || run(q8_0::quantize_row, &mut out));
    let bf16 = ns_per_weight(REPS, values.len(), || {
        out.clear();
        for row in black_box(values).chunks_exact(COLS) {
            dense::encode(row, Dtype::BF16, &mut out);
        }
        black_box(&out);
    });
    println!("q8_0 reference {reference}  vectors {fast}  {:6.1}×", reference.median / fast.median);
    println!("bf16           {bf16}");
}

/// `legacy::quantize_row` for each legacy type, row by row: the scalar reference against the
/// vectors, after checking that they agree.
fn legacy_section(values: &[f32]) {
    println!();
    println!("legacy::quantize_row, {ROWS}×{COLS} block, a row at a time: ns/weight, median (min) of {REPS}");
    println!("{:>4}  {:>22}  {:>22}  speed-up", "type", "reference", "vectors");
    let mut out = Vec::new();
    for kind in [BlockType::Q4_0, BlockType::Q4_1, BlockType::Q5_0, BlockType::Q5_1] {
        let run = |quantize: fn(BlockType, &[f32], &mut Vec<u8>), out: &mut Vec<u8>| {
            out.clear();
            for row in black_box(values).chunks_exact(COLS) {
                quantize(kind, row, out);
            }
            black_box(&*out);
        };
        let mut want = Vec::new();
        run(legacy::quantize_row_reference, &mut want);
        run(legacy::quantize_row, &mut out);
        assert!(out == want, "{} vectors differ from the reference", kind.name());
        let reference = ns_per_weight(REPS, values.len(), || run(legacy::quantize_row_reference, &mut out));
        let fast = ns_per_weight(REPS, values.len(), || run(legacy::quantize_row, &mut out));
        println!("{:>4}  {reference}  {fast}  {:6.1}×", kind.name(), reference.median / fast.median);
    }
}

/// The rows the IQ2/IQ3 encoders are timed on.
const IQ_ROWS: usize = 16;
const IQ_REPS: usize = 5;

/// `iqlow::quantize_row` for each IQ2/IQ3 type, row by row, with one importance per column
/// (heavy-tailed, as llama-imatrix's are): the reference against the best kernel, after checking
/// that they agree.
fn iqlow_section(values: &[f32]) {
    let values = &values[..IQ_ROWS * COLS];
    let mut rng = SplitMix64(0x1a40);
    let importance: Vec<f32> = (0..COLS).map(|_| (rng.gaussian() * 1.5).exp() as f32).collect();
    println!();
    println!("iqlow::quantize_row, {IQ_ROWS}×{COLS} block, a row at a time: ns/weight, median (min) of {IQ_REPS}");
    println!("{:>8}  {:>22}  {:>22}  speed-up", "type", "reference", Kernel::best().name());
    for kind in iqlow::TYPES {
        reference_against_best(kind.name(), 8, IQ_REPS, values.len(), |kernel, out| {
            for row in black_box(values).chunks_exact(COLS) {
                iqlow::quantize_row_with(kernel, kind, row, Some(&importance), out);
            }
        });
    }
}

/// Runs `encode` (appending to the buffer it is given) on the reference kernel and on the best
/// one, checks that both write the same bytes, then times each and prints `name`'s line (right
/// aligned to `width`): both timings and the speed-up.
fn reference_against_best(
    name: &str,
    width: usize,
    reps: usize,
    weights: usize,
    encode: impl Fn(Kernel, &mut Vec<u8>),
) {
    let best = Kernel::best();
    let run = |kernel: Kernel, out: &mut Vec<u8>| {
        out.clear();
        encode(kernel, out);
        black_box(&*out);
    };
    let (mut want, mut out) = (Vec::new(), Vec::new());
    run(Kernel::Reference, &mut want);
    run(best, &mut out);
    assert!(out == want, "{} differs from the reference for {name}", best.name());
    let reference = ns_per_weight(reps, weights, || run(Kernel::Reference, &mut out));
    let fast = ns_per_weight(reps, weights, || run(best, &mut out));
    println!("{name:>width$}  {reference}  {fast}  {:6.1}×", reference.median / fast.median);
}
