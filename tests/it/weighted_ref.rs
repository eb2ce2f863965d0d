//! The importance-weighted encoders (`blocks::quantize` with an importance row) against ggml's own
//! C: `tests/c/ggml_quants_ref.c` in its weighted mode calls `quantize_<type>(…, quant_weights)`,
//! the functions llama-quantize runs with `--imatrix`, and each must write exactly the bytes ours
//! write, for random rows (Gaussian, heavy-tailed, sparse, constant, zero, tiny and large values)
//! under heavy-tailed importance rows with zeros, and for several rows of one importance row.

use crate::common::Rng;
use crate::ggml_harness::{llama_cpp_dir, Harness, WEIGHTED};
use crate::kquants_ref::random_block;
use escha_convert::block_type::BlockType;
use escha_convert::quant::blocks;

fn ggml_weighted(harness: &Harness, kind: BlockType, values: &[f32], importance: &[f32]) -> Vec<u8> {
    let mut payload: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    payload.extend_from_slice(&u32::try_from(importance.len()).unwrap().to_le_bytes());
    payload.extend(importance.iter().flat_map(|v| v.to_le_bytes()));
    harness.run(kind.ggml_type() + WEIGHTED, values.len(), &payload)
}

/// A heavy-tailed importance row as llama-imatrix's mean squares come out: log-normal over many
/// decades, some columns never seen (1, as llama-quantize fills them) or zero.
pub(crate) fn heavy_tailed_importance(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.next_u64() % 16 {
            0 => 0.0,
            1 => 1.0,
            _ => (rng.gaussian() * 2.5).exp() as f32 * 1e-2,
        })
        .collect()
}

/// Rows of `width` values: random blocks at scales a model's weights have.
fn rows(rng: &mut Rng, n_rows: usize, width: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n_rows * width);
    while v.len() < n_rows * width {
        let block = random_block(rng, 32);
        // Within what a ggml block holds (the converter refuses the rest first).
        v.extend(block.into_iter().map(|x| if x.is_finite() && x.abs() <= 6e4 { x } else { 0.5 }));
    }
    v.truncate(n_rows * width);
    v
}

#[test]
fn weighted_encoders_match_ggml_byte_for_byte() {
    let Some(llama) = llama_cpp_dir() else { return };
    let harness = Harness::build(&llama);
    let mut rng = Rng(0x1a7_41c5);
    let kinds = [
        BlockType::Q4_0,
        BlockType::Q4_1,
        BlockType::Q5_0,
        BlockType::Q5_1,
        BlockType::Q8_0,
        BlockType::Q2_K,
        BlockType::Q3_K,
        BlockType::Q4_K,
        BlockType::Q5_K,
        BlockType::Q6_K,
        BlockType::IQ4_NL,
        BlockType::IQ4_XS,
    ];
    let mut failures = Vec::new();
    let mut compared = 0usize;
    for kind in kinds {
        for (case, width, n_rows) in [("random", 512, 24), ("wide", 2048, 4), ("one block", 256, 16)] {
            let mut values = rows(&mut rng, n_rows, width);
            let mut importance = heavy_tailed_importance(&mut rng, width);
            if case == "one block" {
                // Edges: a zero row, a constant row, an all-zero importance over a block, Gaussian rows.
                values[..width].fill(0.0);
                values[width..2 * width].fill(0.25);
                importance[..32].fill(0.0);
                for v in &mut values[2 * width..] {
                    *v = rng.gaussian() as f32 * 0.02;
                }
            }
            let want = ggml_weighted(&harness, kind, &values, &importance);
            let mut got = Vec::new();
            blocks::quantize(kind, &values, Some(&importance), &mut got);
            compared += got.len() / kind.bytes();
            if got != want {
                let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
                failures.push(format!(
                    "{} {case}: first difference at byte {at} (block {})",
                    kind.name(),
                    at / kind.bytes()
                ));
            }
        }
    }
    println!("{compared} weighted blocks compared");
    assert!(failures.is_empty(), "{} mismatches with ggml:\n{}", failures.len(), failures.join("\n"));
}

/// The weighted encoders' speed against ggml's C (the harness, `-O2`, one thread, its pipe and
/// process start included), on 4 Mi values of 4096-wide rows per type. Ignored: a measurement, not
/// a check (`cargo test --test it weighted_encoder_speed -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement, not a check"]
fn weighted_encoder_speed() {
    let Some(llama) = llama_cpp_dir() else { return };
    let harness = Harness::build(&llama);
    let mut rng = Rng(0x5eed);
    let width = 4096;
    let values: Vec<f32> = (0..1 << 22).map(|_| rng.gaussian() as f32 * 0.02).collect();
    let importance = heavy_tailed_importance(&mut rng, width);
    for kind in [
        BlockType::Q4_0,
        BlockType::Q5_1,
        BlockType::Q2_K,
        BlockType::Q3_K,
        BlockType::Q4_K,
        BlockType::Q6_K,
        BlockType::IQ4_XS,
    ] {
        let t = std::time::Instant::now();
        let theirs = ggml_weighted(&harness, kind, &values, &importance);
        let c = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let mut ours = Vec::new();
        blocks::quantize(kind, &values, Some(&importance), &mut ours);
        let rust = t.elapsed().as_secs_f64();
        assert_eq!(ours, theirs);
        println!("{}: ours {:.3} s, ggml's C {:.3} s ({:.2}x)", kind.name(), rust, c, rust / c);
    }
}
