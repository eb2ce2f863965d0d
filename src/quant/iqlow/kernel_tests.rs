//! Every kernel against the scalar reference, byte for byte, for the five types with and without
//! an importance: random rows at every scale, hostile rows (zeros, constants, huge, tiny,
//! subnormal, NaN), and proptest rows with many exact ties.

use super::*;
use crate::quant::test_rows::{element, random_block};
use crate::rng::SplitMix64;
use proptest::prelude::*;

/// The kernels checked against the reference (all but the reference itself).
fn fast_kernels() -> Vec<Kernel> {
    Kernel::available().into_iter().filter(|&k| k != Kernel::Reference).collect()
}

/// `kernel`'s encoding of `values`, appended after a few bytes already there.
fn run(kernel: Kernel, kind: BlockType, values: &[f32], importance: Option<&[f32]>) -> Vec<u8> {
    let mut out = vec![0xA5; 3];
    quantize_row_with(kernel, kind, values, importance, &mut out);
    out
}

/// Every fast kernel gives the reference's bytes for `values` (whole super-blocks) under
/// `importance`, for every type.
fn assert_same(values: &[f32], importance: Option<&[f32]>, what: &str) {
    for kind in TYPES {
        let want = run(Kernel::Reference, kind, values, importance);
        assert_eq!(want.len(), 3 + values.len() / QK_K * kind.bytes());
        for kernel in fast_kernels() {
            let got = run(kernel, kind, values, importance);
            assert_eq!(got.len(), want.len(), "{} {}: {what}: lengths", kernel.name(), kind.name());
            if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
                let block = (i - 3) / kind.bytes();
                panic!(
                    "{} {}: {what}: byte {} of block {block} is {:#04x}, the reference's {:#04x}",
                    kernel.name(),
                    kind.name(),
                    (i - 3) % kind.bytes(),
                    got[i],
                    want[i]
                );
            }
        }
    }
}

/// The importances each row is checked under: none, and per value as llama-quantize passes them.
fn importances(rng: &mut SplitMix64, n: usize) -> Vec<(&'static str, Option<Vec<f32>>)> {
    vec![
        ("none", None),
        ("uniform", Some((0..n).map(|_| rng.uniform() as f32).collect())),
        ("heavy-tailed", Some((0..n).map(|_| (rng.gaussian() * 2.0).exp() as f32).collect())),
        ("sparse", Some((0..n).map(|i| if i % 7 == 0 { (1.0 + rng.uniform() * 100.0) as f32 } else { 0.0 }).collect())),
        ("decades", Some((0..n).map(|_| 10f64.powf(rng.uniform() * 8.0 - 4.0) as f32).collect())),
        ("zeros", Some(vec![0.0; n])),
        ("huge", Some(vec![3e38; n])),
        ("subnormal", Some(vec![1e-45; n])),
    ]
}

#[test]
fn a_simd_kernel_is_chosen_where_the_cpu_has_one() {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        assert_eq!(Kernel::best().name(), "avx2");
    }
    #[cfg(target_arch = "aarch64")]
    assert_eq!(Kernel::best().name(), "neon");
}

#[test]
fn kernels_match_the_reference_on_random_rows() {
    let mut rng = SplitMix64(0x1a10_1a7e);
    for group in [16, 32] {
        let values: Vec<f32> = (0..24).flat_map(|_| random_block(&mut rng, group)).collect();
        for (name, w) in importances(&mut rng, values.len()) {
            assert_same(&values, w.as_deref(), &format!("random blocks (groups of {group}), importance {name}"));
        }
    }
    // Ordinary weights: most cells fall off the grid, so the neighbour scans decide the bytes.
    let values: Vec<f32> = (0..16 * QK_K).map(|_| (rng.gaussian() * 0.02) as f32).collect();
    for (name, w) in importances(&mut rng, values.len()) {
        assert_same(&values, w.as_deref(), &format!("gaussian weights, importance {name}"));
    }
}

#[test]
fn kernels_match_the_reference_on_hostile_rows() {
    let n = QK_K;
    let mut rng = SplitMix64(0x05_7113);
    let mut rows: Vec<(&str, Vec<f32>)> = vec![
        ("zeros", vec![0.0; n]),
        ("negative zeros", vec![-0.0; n]),
        ("constant", vec![0.37; n]),
        ("negative constant", vec![-2.5; n]),
        ("f16 bound", (0..n).map(|i| if i % 2 == 0 { 65504.0 } else { -65504.0 }).collect()),
        ("huge", (0..n).map(|i| if i % 2 == 0 { 3e38 } else { -3e38 }).collect()),
        ("subnormals", (0..n).map(|i| f32::from_bits(i as u32 + 1)).collect()),
        ("smallest subnormal", vec![1e-45; n]),
        ("tiny", (0..n).map(|_| (rng.gaussian() * 1e-9) as f32).collect()),
        ("ties", (0..n).map(|i| ((i * 7 % 9) as f32 - 4.0) * 0.5).collect()),
        ("two levels", (0..n).map(|i| if (i / 3) % 2 == 0 { 0.25 } else { -0.75 }).collect()),
    ];
    let mut one = vec![0.0f32; n];
    one[77] = 1000.0;
    one[200] = -3.0;
    rows.push(("one value", one));
    let mut nan: Vec<f32> = (0..n).map(|_| rng.gaussian() as f32).collect();
    nan[40] = f32::NAN;
    rows.push(("one NaN", nan));
    rows.push(("NaN", vec![f32::NAN; n]));
    let mut inf: Vec<f32> = (0..n).map(|_| rng.gaussian() as f32).collect();
    inf[100] = f32::INFINITY;
    rows.push(("one infinity", inf));
    for (name, x) in &rows {
        for (wname, w) in importances(&mut rng, n) {
            assert_same(x, w.as_deref(), &format!("{name}, importance {wname}"));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn kernels_match_the_reference_on_any_row(
        values in prop::collection::vec(element(), QK_K),
        weights in prop::option::of(prop::collection::vec(prop_oneof![3 => 0.0f32..10.0, 1 => Just(0.0f32)], QK_K)),
    ) {
        assert_same(&values, weights.as_deref(), "proptest row");
    }
}
