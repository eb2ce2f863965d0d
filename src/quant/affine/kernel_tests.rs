//! Every kernel against the scalar reference, byte for byte (packed codes, scales, biases), for
//! every bit width, group size and scale dtype, on adversarial and random data.

use super::*;
use crate::rng::SplitMix64;
use proptest::prelude::*;

const DTYPES: [Dtype; 3] = [Dtype::BF16, Dtype::F16, Dtype::F32];

/// The kernels checked against the reference (all but the reference itself).
fn fast_kernels() -> Vec<Kernel> {
    Kernel::available().into_iter().filter(|&k| k != Kernel::Reference).collect()
}

/// Packed bytes, scales and biases from `kernel`, appended after a few bytes already there.
fn run(kernel: Kernel, values: &[f32], cols: usize, spec: AffineSpec, dtype: Dtype) -> [Vec<u8>; 3] {
    let (mut p, mut s, mut b) = (vec![0xA5; 3], vec![0x5A; 1], vec![7; 2]);
    quantize_rows_with(
        kernel,
        values,
        cols,
        spec,
        dtype,
        &mut AffineOut { packed: &mut p, scales: &mut s, biases: &mut b },
    );
    [p, s, b]
}

/// First difference between two byte strings, for a readable failure.
fn first_difference(a: &[u8], b: &[u8]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("lengths {} and {}", a.len(), b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y).map(|i| format!("byte {i}: {:#04x} vs {:#04x}", a[i], b[i]))
}

/// Every fast kernel gives the reference's bytes for `values` (rows of `cols`) at this setting.
fn assert_same(values: &[f32], cols: usize, bits: u32, group_size: usize, dtype: Dtype) {
    let spec = AffineSpec::new(bits, group_size).unwrap();
    let want = run(Kernel::Reference, values, cols, spec, dtype);
    for kernel in fast_kernels() {
        let got = run(kernel, values, cols, spec, dtype);
        for (what, (g, w)) in ["packed", "scales", "biases"].iter().zip(got.iter().zip(&want)) {
            if let Some(d) = first_difference(g, w) {
                panic!("{} {what}, bits {bits}, group {group_size}, {dtype:?}: {d}", kernel.name());
            }
        }
    }
}

/// [`assert_same`] at every bit width, every group size dividing `cols` and every scale dtype.
fn assert_same_everywhere(values: &[f32], cols: usize) {
    for bits in BITS {
        for gs in GROUP_SIZES.into_iter().filter(|gs| cols.is_multiple_of(*gs)) {
            for dtype in DTYPES {
                assert_same(values, cols, bits, gs, dtype);
            }
        }
    }
}

#[test]
fn a_simd_kernel_is_chosen_where_the_cpu_has_one() {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        assert_eq!(Kernel::best().name(), "avx2");
    }
    #[cfg(target_arch = "aarch64")]
    assert_eq!(Kernel::best().name(), "neon");
    assert_eq!(Kernel::available()[0], Kernel::Reference);
}

/// Per setting, what the adversarial groups exercise: `(x − bias)/scale` exactly halfway between
/// two codes, above `n_bins + ½` (clamped), or negative (rounded to −0, clamped to 0).
#[derive(Default, Debug)]
struct Coverage {
    ties: usize,
    clamped_high: usize,
    negative: usize,
}

fn coverage(values: &[f32], group_size: usize, bits: u32) -> Coverage {
    let n_bins = ((1u32 << bits) - 1) as f32;
    let mut c = Coverage::default();
    let mut codes = vec![0; group_size];
    for g in values.chunks_exact(group_size) {
        let (scale, bias) = quantize_group(g, bits, &mut codes);
        for &x in g {
            let v = (x - bias) / scale;
            c.ties += (v.abs() <= n_bins && (v - v.trunc()).abs() == 0.5) as usize;
            c.clamped_high += (v > n_bins + 0.5) as usize;
            c.negative += (v < 0.0) as usize;
        }
    }
    c
}

/// Groups of `gs` values built to hit every branch and edge of the algorithm at `bits`.
fn adversarial_groups(gs: usize, bits: u32, rng: &mut SplitMix64) -> Vec<Vec<f32>> {
    let n = (1u32 << bits) - 1;
    let nf = n as f32;
    let mut groups: Vec<Vec<f32>> = Vec::new();
    let mut uniform = |lo: f32, hi: f32| lo + (hi - lo) * rng.uniform() as f32;
    let fill = |f: &mut dyn FnMut(usize) -> f32| -> Vec<f32> { (0..gs).map(f).collect() };

    // Exact ties: with min = −n·s, max ≤ 0 (or min ≥ 0, max = n·s), the scale is s and the bias
    // the edge, exactly, so edge ± (k + ½)·s is a tie. Several steps s and offsets of the far end.
    for s in [1.0f32, 0.0625, 0.75 * 0.125, 3.0 / 1024.0, 1.5e-3] {
        for below in [n, n - n / 3, n / 2 + 1] {
            let (lo, hi) = (-(below as f32) * s, (n - below) as f32 * s);
            groups.push(fill(&mut |i| match i {
                0 => lo,
                1 => hi,
                _ => lo + ((i as u32 % n) as f32 + 0.5) * s,
            }));
            groups.push(fill(&mut |i| match i {
                0 => -lo,
                1 => -hi,
                _ => -lo - ((i as u32 % n) as f32 + 0.5) * s,
            }));
        }
    }
    // Constant groups, all-zero, −0.0 and mixed zeros.
    for c in [0.25f32, -0.25, 1.0, -3.0, 1e-3, 7.0e-8, -7.0e-8, 0.0, -0.0] {
        groups.push(vec![c; gs]);
    }
    groups.push(fill(&mut |i| if i % 3 == 0 { -0.0 } else { 0.0 }));
    groups.push(fill(&mut |i| if i % 2 == 0 { -0.0 } else { 1.0 }));
    groups.push(fill(&mut |i| if i % 2 == 0 { -0.0 } else { -1.0 }));
    // Mixed signs, and |min| == |max| (the max is the edge).
    groups.push(fill(&mut |_| uniform(-1.0, 1.0)));
    groups.push(fill(&mut |_| uniform(-0.3, 0.1)));
    for a in [0.5f32, 1.0, 3.0e-3, 65504.0] {
        groups.push(fill(&mut |i| match i % 7 {
            0 => a,
            3 => -a,
            _ => uniform(-a, a),
        }));
    }
    // Ranges below eps·n_bins: a few ulps around a value, and tiny values around zero (the edge
    // rounds to code 0, so the bias is 0 and some quotients are negative).
    for base in [0.5f32, 1.0, -1.0, 1e-3, -2.5e-5] {
        groups.push(fill(&mut |i| f32::from_bits(base.to_bits() + (i % 5) as u32)));
    }
    groups.push(fill(&mut |i| [1e-8f32, -1e-8, 5e-9, -2e-9, 0.0][i % 5]));
    groups.push(fill(&mut |i| [-1e-8f32, 0.7e-8, 3e-9, -0.0][i % 4]));
    groups.push(fill(&mut |_| uniform(-4e-8, 4e-8)));
    // Huge values: the f16 range, and ranges that overflow f32 (an infinite scale).
    groups.push(fill(&mut |i| [65504.0f32, -65504.0, 1.0, -0.5][i % 4]));
    groups.push(fill(&mut |i| [65504.0f32, 60000.0, 65000.0][i % 3]));
    groups.push(fill(&mut |i| [3e38f32, -3e38, 1.0, 0.0][i % 4]));
    groups.push(fill(&mut |i| [f32::MAX, f32::MIN, -1e38][i % 3]));
    groups.push(fill(&mut |i| if i == 5 { 3e38 } else { uniform(-1.0, 1.0) }));
    groups.push(fill(&mut |i| if i == 9 { -3e38 } else { uniform(-1.0, 1.0) }));
    groups.push(fill(&mut |i| [2e38f32, -1.3e38, 5e37][i % 3]));
    // Subnormals, alone, with zeros and with normal values.
    groups.push(fill(&mut |i| f32::from_bits(1 + i as u32 * 1000)));
    groups.push(fill(&mut |i| [1e-40f32, -1e-40, 0.0, -1e-45, 1e-45][i % 5]));
    groups.push(fill(&mut |i| if i % 4 == 0 { 1e-39 } else { uniform(-1e-3, 1e-3) }));
    groups.push(fill(&mut |i| -f32::from_bits((i as u32 * 77_777) % 0x0080_0000)));
    // Clamped at the far end: one value just beyond where the realigned scale reaches n_bins.
    for (lo, hi) in [(-0.64f32, 0.86f32), (0.1, 0.9), (-1.0, -0.1), (-0.9, 0.6)] {
        groups.push(fill(&mut |i| match i {
            0 => hi,
            1 => lo,
            _ => uniform(lo, hi),
        }));
    }
    // Codes that reach both 0 and n_bins: an evenly spaced ramp that realigns the scale.
    groups.push(fill(&mut |i| 0.1 + 0.8 * (i % 32) as f32 / 31.0));
    groups.push(fill(&mut |i| -(i as f32) / nf));
    // Not finite: NaN (ignored by the min/max, code 0) and infinities.
    groups.push(fill(&mut |i| if i == 3 { f32::NAN } else { uniform(-1.0, 1.0) }));
    groups.push(fill(&mut |i| if i % 8 == 0 { f32::NAN } else { -(i as f32) }));
    groups.push(fill(&mut |i| if i + 8 >= gs && i % 2 == 1 { f32::NAN } else { uniform(-1.0, 1.0) }));
    groups.push(vec![f32::NAN; gs]);
    groups.push(fill(&mut |i| if i == 7 { f32::INFINITY } else { uniform(-1.0, 1.0) }));
    groups.push(fill(&mut |i| if i == 2 { f32::NEG_INFINITY } else { uniform(-1.0, 1.0) }));
    groups.push(fill(&mut |i| [f32::INFINITY, f32::NEG_INFINITY, 0.0][i % 3]));
    groups.push(vec![f32::INFINITY; gs]);
    groups
}

#[test]
fn adversarial_groups_match_the_reference() {
    let mut rng = SplitMix64(0xADE5_A71A);
    for bits in BITS {
        for gs in GROUP_SIZES {
            let values: Vec<f32> = adversarial_groups(gs, bits, &mut rng).concat();
            let c = coverage(&values, gs, bits);
            assert!(c.ties >= gs && c.clamped_high > 0 && c.negative > 0, "bits {bits}, group {gs}: {c:?}");
            // One row of all the groups, and rows of four groups.
            for cols in [values.len(), 4 * gs] {
                let whole = values.len() / cols * cols;
                for dtype in DTYPES {
                    assert_same(&values[..whole], cols, bits, gs, dtype);
                }
            }
            // The same groups after rounding to the scale dtype, as the conversion feeds them.
            for dtype in DTYPES {
                let mut rounded = values.clone();
                round_slice(&mut rounded, dtype);
                assert_same(&rounded, values.len(), bits, gs, dtype);
            }
        }
    }
}

#[test]
fn every_tie_rounds_to_even_in_every_kernel() {
    // Group −n..0 plus k + ½ steps: scale 1, bias −n, so element i ≥ 2 is a tie at (i − 2) + ½.
    for bits in BITS {
        let n = (1u32 << bits) - 1;
        let mut g: Vec<f32> = (0..128u32).map(|i| -(n as f32) + ((i.max(2) - 2) % n) as f32 + 0.5).collect();
        g[0] = -(n as f32);
        g[1] = 0.0;
        for kernel in Kernel::available() {
            let [p, s, b] = run(kernel, &g, 128, AffineSpec::new(bits, 128).unwrap(), Dtype::F32);
            assert_eq!((&s[1..], &b[2..]), (&1f32.to_le_bytes()[..], &(-(n as f32)).to_le_bytes()[..]));
            let codes = unpack_row(&p[3..], 128, bits);
            for (i, &c) in codes.iter().enumerate().skip(2) {
                let k = (i as u32 - 2) % n;
                assert_eq!(c, if k.is_multiple_of(2) { k } else { k + 1 }, "{} bits {bits} element {i}", kernel.name());
            }
        }
    }
}

/// Gaussian-like values (sum of four uniforms), rounded to bf16 as the conversion feeds them.
fn gaussian_bf16(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    let mut v: Vec<f32> = (0..n).map(|_| ((0..4).map(|_| rng.uniform()).sum::<f64>() - 2.0) as f32 * 0.02).collect();
    round_slice(&mut v, Dtype::BF16);
    v
}

#[test]
fn a_block_of_gaussian_weights_matches_the_reference() {
    let cols = 5120;
    assert_same_everywhere(&gaussian_bf16(8 * cols, 5), cols);
}

#[test]
fn rounding_row_by_row_equals_rounding_then_quantizing() {
    let cols = 640;
    let mut rng = SplitMix64(11);
    let raw: Vec<f32> = (0..3 * cols).map(|_| (rng.uniform() as f32 - 0.5) * 0.1).collect();
    for dtype in DTYPES {
        for bits in BITS {
            let spec = AffineSpec::new(bits, 128).unwrap();
            let mut rounded = raw.clone();
            round_slice(&mut rounded, dtype);
            let want = run(Kernel::Reference, &rounded, cols, spec, dtype);
            let mut values = raw.clone();
            let (mut p, mut s, mut b) = (vec![0xA5; 3], vec![0x5A; 1], vec![7; 2]);
            let out = &mut AffineOut { packed: &mut p, scales: &mut s, biases: &mut b };
            round_and_quantize_rows(&mut values, cols, spec, dtype, out);
            assert_eq!([p, s, b], want, "bits {bits}, {dtype:?}");
            assert_eq!(values, rounded);
        }
    }
}

/// An element: mostly ordinary weights, often exact multiples of ⅛ (many ties), sometimes any bit
/// pattern at all (NaN, infinities, subnormals) or a signed zero.
fn element() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -1.0f32..1.0,
        3 => (-24i32..24).prop_map(|i| i as f32 / 8.0),
        1 => any::<u32>().prop_map(f32::from_bits),
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_rows_match_the_reference(
        (cols, rows) in (prop::sample::select(vec![128usize, 384, 640]), 1usize..4),
        scale in prop::sample::select(vec![1.0f32, 1e-3, 3e-8, 65504.0, 1e30]),
        seed in any::<u64>(),
        pattern in prop::collection::vec(element(), 64),
    ) {
        // A row-sized pattern: proptest's elements, spread by a seeded shuffle, times the scale.
        let mut rng = SplitMix64(seed);
        let values: Vec<f32> =
            (0..rows * cols).map(|_| pattern[(rng.next_u64() % 64) as usize] * scale).collect();
        assert_same_everywhere(&values, cols);
        let mut rounded = values.clone();
        round_slice(&mut rounded, Dtype::BF16);
        assert_same_everywhere(&rounded, cols);
    }

    #[test]
    fn random_bit_patterns_match_the_reference(values in prop::collection::vec(any::<u32>().prop_map(f32::from_bits), 256)) {
        assert_same_everywhere(&values, 128);
    }
}
