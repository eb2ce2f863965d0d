//! The IQ2/IQ3 encoders of `src/quant/iqlow/` against ggml's own C, through the harness of
//! `kquants_ref.rs` (`tests/c/ggml_quants_ref.c`): for each of `IQ2_XXS`, `IQ2_XS`, `IQ2_S`,
//! `IQ3_XXS` and `IQ3_S`, `iqlow::quantize_row` must write exactly the bytes llama-quantize's entry
//! points `quantize_iq*(src, dst, 1, n, imatrix)` write, for random rows of several lengths under
//! random, heavy-tailed, sparse and absent importances, and for edge rows (zeros, one huge value,
//! ties, subnormals, the f16 bound); ggml's dequantization of those blocks must equal
//! `iqlow::dequantize_row` bit for bit.

use crate::common::Rng;
use crate::ggml_harness::{llama_cpp_dir, Harness, DECODE, TIMED, WEIGHTED};
use crate::kquants_ref::random_block;
use escha_convert::block_type::BlockType;
use escha_convert::quant::iqlow::{self, QK_K};

fn ggml_encode(h: &Harness, kind: BlockType, x: &[f32], w: Option<&[f32]>) -> Vec<u8> {
    let mut payload: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut mode = kind.ggml_type();
    if let Some(w) = w {
        payload.extend_from_slice(&u32::try_from(w.len()).unwrap().to_le_bytes());
        payload.extend(w.iter().flat_map(|v| v.to_le_bytes()));
        mode += WEIGHTED;
    }
    let out = h.run(mode, x.len(), &payload);
    assert_eq!(out.len(), x.len() / QK_K * kind.bytes());
    out
}

/// A row and how its importance is drawn.
struct Case {
    name: String,
    values: Vec<f32>,
}

fn normal(rng: &mut Rng, n: usize, sigma: f64) -> Vec<f32> {
    (0..n).map(|_| (rng.gaussian() * sigma) as f32).collect()
}

fn rows(rng: &mut Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut push = |name: &str, values: Vec<f32>| {
        assert_eq!(values.len() % QK_K, 0);
        cases.push(Case { name: name.to_string(), values });
    };
    // Several row lengths, as tensors have them.
    for (blocks, sigma) in [(1, 1.0), (2, 0.02), (16, 1e-3), (20, 30.0)] {
        push(&format!("normal x{blocks} sigma={sigma:e}"), normal(rng, blocks * QK_K, sigma));
    }
    // Heavy tails: a few values far beyond the rest.
    let heavy: Vec<f32> = (0..8 * QK_K).map(|_| (rng.gaussian() * (rng.gaussian() * 1.5).exp()) as f32).collect();
    push("heavy-tailed", heavy);
    let random: Vec<f32> = (0..256).flat_map(|_| random_block(rng, QK_K)).map(|v| v.clamp(-65504.0, 65504.0)).collect();
    push("random blocks", random);
    // Edges.
    push("zeros", vec![0.0; 2 * QK_K]);
    push("negative zeros", vec![-0.0; QK_K]);
    let mut one = vec![0.0f32; 2 * QK_K];
    one[77] = 1000.0;
    one[300] = -3.0;
    push("one value", one);
    let mut huge = normal(rng, 4 * QK_K, 0.01);
    for (b, block) in huge.chunks_exact_mut(QK_K).enumerate() {
        block[(b * 97) % QK_K] = if b % 2 == 0 { 65504.0 } else { -4000.0 };
    }
    push("one huge value per block", huge);
    push("constant", vec![0.37; QK_K]);
    push("negative constant", vec![-2.5; QK_K]);
    push("ties", (0..4 * QK_K).map(|i| ((i * 7 % 9) as f32 - 4.0) * 0.5).collect());
    push("two levels", (0..2 * QK_K).map(|i| if (i / 3) % 2 == 0 { 0.25 } else { -0.75 }).collect());
    push(
        "subnormals",
        (0..2 * QK_K).map(|i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761) & 0x807F_FFFF | 1)).collect(),
    );
    push("tiny", normal(rng, 2 * QK_K, 1e-9));
    push("f16 bound", (0..QK_K).map(|i| if i % 2 == 0 { 65504.0 } else { -65504.0 }).collect());
    push(
        "alternating decades",
        (0..2 * QK_K).map(|i| if i % 2 == 0 { 1.0 } else { -1e-4 } * (1 + i % 5) as f32).collect(),
    );
    cases
}

/// The importances each row is encoded under: per column, as llama-quantize passes them.
fn importances(rng: &mut Rng, n: usize) -> Vec<(&'static str, Vec<f32>)> {
    vec![
        ("uniform", (0..n).map(|_| rng.uniform() as f32).collect()),
        ("heavy-tailed", (0..n).map(|_| (rng.gaussian() * 2.0).exp() as f32).collect()),
        ("sparse", (0..n).map(|i| if i % 7 == 0 { (1.0 + rng.uniform() * 100.0) as f32 } else { 0.0 }).collect()),
        ("ones", vec![1.0; n]),
        ("zeros", vec![0.0; n]),
        ("decades", (0..n).map(|_| 10f64.powf(rng.uniform() * 8.0 - 4.0) as f32).collect()),
    ]
}

/// Rows encoded in one call: their names and lengths, the values, the importances if any.
type Run = (Vec<String>, Vec<usize>, Vec<f32>, Option<Vec<f32>>);

#[test]
fn iq_encoders_match_ggml_byte_for_byte() {
    let Some(llama) = llama_cpp_dir() else { return };
    let harness = Harness::build(&llama);
    let mut rng = Rng(0x1a23_0002);
    let cases = rows(&mut rng);
    // Every row under every importance, as segments of one long row per type (ggml's encoders
    // read the importance block by block, so a segment's bytes are what the row alone gives):
    // ggml builds its neighbour tables once per run.
    let mut weighted: Vec<(String, &[f32], Vec<f32>)> = Vec::new();
    for c in &cases {
        for (wname, w) in importances(&mut rng, c.values.len()) {
            weighted.push((format!("{:?} importance {wname}", c.name), &c.values, w));
        }
    }
    let mut failures = Vec::new();
    for kind in iqlow::TYPES {
        let size = kind.bytes();
        let mut runs: Vec<Run> = Vec::new();
        let names = weighted.iter().map(|(n, _, _)| n.clone()).collect();
        let lengths = weighted.iter().map(|(_, x, _)| x.len()).collect();
        let x: Vec<f32> = weighted.iter().flat_map(|(_, x, _)| x.iter().copied()).collect();
        let w: Vec<f32> = weighted.iter().flat_map(|(_, _, w)| w.iter().copied()).collect();
        runs.push((names, lengths, x, Some(w)));
        if !iqlow::requires_importance(kind) {
            let names = cases.iter().map(|c| format!("{:?} without importance", c.name)).collect();
            let lengths = cases.iter().map(|c| c.values.len()).collect();
            let x = cases.iter().flat_map(|c| c.values.iter().copied()).collect();
            runs.push((names, lengths, x, None));
        }
        let mut blocks = 0;
        for (names, lengths, x, w) in &runs {
            let want = ggml_encode(&harness, kind, x, w.as_deref());
            let (mut at, mut got) = (0, Vec::new());
            for (name, &n) in names.iter().zip(lengths) {
                let (b0, b1) = (at / QK_K * size, (at + n) / QK_K * size);
                let mut ours = Vec::new();
                iqlow::quantize_row(kind, &x[at..at + n], w.as_ref().map(|w| &w[at..at + n]), &mut ours);
                let theirs = &want[b0..b1];
                if let Some(b) = (0..n / QK_K).find(|&b| ours[b * size..][..size] != theirs[b * size..][..size]) {
                    let i = (0..size).find(|&i| ours[b * size + i] != theirs[b * size + i]).unwrap();
                    failures.push(format!(
                        "{} {name}: block {b} differs first at byte {i} (ours {:#04x}, ggml {:#04x})",
                        kind.name(),
                        ours[b * size + i],
                        theirs[b * size + i]
                    ));
                }
                got.extend(ours);
                at += n;
            }
            assert_eq!(got.len(), want.len());
            // ggml's decoding of its blocks, against ours.
            let raw = harness.run(kind.ggml_type() + DECODE, x.len(), &want);
            let theirs: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            let mut ours = Vec::new();
            iqlow::dequantize_row(kind, &want, &mut ours);
            let differs = |g: &f32, w: &f32| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan());
            if let Some(i) = ours.iter().zip(&theirs).position(|(g, w)| differs(g, w)) {
                failures.push(format!(
                    "{}: decoded value {i} is {:e}, ggml says {:e}",
                    kind.name(),
                    ours[i],
                    theirs[i]
                ));
            }
            blocks += want.len() / size;
        }
        assert!(blocks > 1000);
        println!("{}: {} rows, {blocks} blocks compared", kind.name(), cases.len());
    }
    assert!(failures.is_empty(), "{} mismatches with ggml:\n{}", failures.len(), failures.join("\n"));
}

/// Random blocks (finite scales) decode as ggml decodes them: 512 blocks of each type hold every
/// grid point, scale code and sign pattern with near certainty.
#[test]
fn iq_decoders_match_ggml_on_every_grid_point() {
    let Some(llama) = llama_cpp_dir() else { return };
    let harness = Harness::build(&llama);
    let mut rng = Rng(0x1a23_de60);
    for kind in iqlow::TYPES {
        let mut blocks = Vec::new();
        for _ in 0..512 {
            let mut b: Vec<u8> = (0..kind.bytes()).map(|_| rng.next_u64() as u8).collect();
            // A finite, normal f16 scale.
            let d = half::f16::from_f32((rng.uniform() * 2.0 - 1.0) as f32);
            b[..2].copy_from_slice(&d.to_le_bytes());
            blocks.extend(b);
        }
        let n = blocks.len() / kind.bytes() * QK_K;
        let raw = harness.run(kind.ggml_type() + DECODE, n, &blocks);
        let theirs: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let mut ours = Vec::new();
        iqlow::dequantize_row(kind, &blocks, &mut ours);
        assert_eq!(ours.len(), theirs.len());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(&ours) == bits(&theirs), "{}: decoding differs from ggml's", kind.name());
    }
}

/// ns per weight of ggml's C (`-O2`, as the harness builds it) and of ours (this test binary's
/// profile) on the same 16 rows of 5120 with a heavy-tailed per-column importance; the best of 3.
/// `cargo test --test it iq_ref::iq_encoder_speed -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn iq_encoder_speed_against_ggml() {
    let Some(llama) = llama_cpp_dir() else { return };
    let harness = Harness::build(&llama);
    let (rows, cols) = (16, 5120);
    let mut rng = Rng(0x5eed);
    let x: Vec<f32> = (0..rows * cols).map(|_| (rng.gaussian() * 0.02) as f32).collect();
    let column: Vec<f32> = (0..cols).map(|_| (rng.gaussian() * 1.5).exp() as f32).collect();
    for kind in iqlow::TYPES {
        let mut payload: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        payload.extend_from_slice(&u32::try_from(cols).unwrap().to_le_bytes());
        payload.extend(column.iter().flat_map(|v| v.to_le_bytes()));
        let ggml = (0..3)
            .map(|_| {
                let out = harness.run(kind.ggml_type() + WEIGHTED + TIMED, x.len(), &payload);
                u64::from_le_bytes(out[..8].try_into().unwrap())
            })
            .min()
            .unwrap();
        let ours = (0..3)
            .map(|_| {
                let start = std::time::Instant::now();
                let mut out = Vec::new();
                for row in x.chunks_exact(cols) {
                    iqlow::quantize_row(kind, row, Some(&column), &mut out);
                }
                std::hint::black_box(&out);
                start.elapsed().as_nanos() as u64
            })
            .min()
            .unwrap();
        let per = |ns: u64| ns as f64 / x.len() as f64;
        println!(
            "{:>8}: ggml {:7.1} ns/weight, ours {:7.1} ns/weight ({:.2}×)",
            kind.name(),
            per(ggml),
            per(ours),
            per(ours) / per(ggml)
        );
    }
}
