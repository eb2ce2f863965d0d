//! Every kernel against the scalar reference, byte for byte, for every K-quant type it searches, on
//! rows built to hit the edges of the scale searches and on random rows.

use super::low::{make_q3_quants, q2_k_header, q3_k_header, q3_k_scale};
use super::reference::{
    fit_affine, make_qkx2_quants, make_qx_quants, q6_k_header, scale_min_header, ErrorNorm, GridSearch,
};
use super::*;
use crate::quant::test_rows::{element, random_block};
use crate::rng::SplitMix64;
use proptest::prelude::*;

/// The kernels checked against the reference (all but the reference itself).
fn fast_kernels() -> Vec<Kernel> {
    Kernel::available().into_iter().filter(|&k| k != Kernel::Reference).collect()
}

/// `kernel`'s encoding of `values`, appended after a few bytes already there.
fn run(kernel: Kernel, kind: BlockType, values: &[f32]) -> Vec<u8> {
    let mut out = vec![0xA5; 3];
    quantize_row_with(kernel, kind, values, &mut out);
    out
}

/// Every fast kernel gives the reference's bytes for `values` (whole blocks), for every type.
fn assert_same(values: &[f32], what: &str) {
    for kind in SEARCHED {
        let want = run(Kernel::Reference, kind, values);
        assert_eq!(want.len(), 3 + values.len() / QK_K * kind.bytes());
        for kernel in fast_kernels() {
            let got = run(kernel, kind, values);
            assert_eq!(got.len(), want.len(), "{} {}: {what}: lengths", kernel.name(), kind.name());
            if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
                let block = (i - 3) / kind.bytes();
                let x = &values[block * QK_K..(block + 1) * QK_K];
                panic!(
                    "{} {}: {what}: byte {} of block {block} is {:#04x}, the reference's {:#04x}; block values {x:?}",
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

fn gaussian(rng: &mut SplitMix64) -> f32 {
    rng.gaussian() as f32
}

#[test]
fn the_kernels_search_every_k_quant() {
    assert_eq!(SEARCHED, BlockType::K_QUANTS);
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
    assert_eq!(Kernel::Reference.name(), "reference");
}

/// What edge rows exercise, per type: re-quantized values exactly halfway between two quants, and
/// groups whose stored scale is zero but whose own fit was not (their quants are the fit's).
#[derive(Default, Debug)]
struct Coverage {
    ties: usize,
    kept: usize,
}

/// The steps the reference re-quantizes each group of a block with, `(dj, dm)` (`dm` zero for
/// `Q6_K` and `Q3_K`), and whether the group's own fit has non-zero quants (kept when `dj` is
/// zero).
fn group_steps(kind: BlockType, x: &[f32]) -> Vec<(f32, f32, bool)> {
    let mut l = [0u8; QK_K];
    let nonzero = |l: &[u8; QK_K], j: usize| l[16 * j..16 * j + 16].iter().any(|&q| q != 0);
    if kind == BlockType::Q2_K {
        let (mut scales, mut mins, mut weights) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
        let search = GridSearch { rmin: -0.5, rdelta: 0.1, nstep: 15 };
        for j in 0..16 {
            let sub = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(sub) {
                *w = v.abs();
            }
            (scales[j], mins[j]) = fit_affine(3, sub, &weights, &mut l[16 * j..], search, ErrorNorm::Absolute);
        }
        let (d, dmin, packed) = q2_k_header(&scales, &mins);
        let (d_f, dmin_f) = (f16::from_bits(d).to_f32(), f16::from_bits(dmin).to_f32());
        (0..16).map(|j| (d_f * (packed[j] & 0xF) as f32, dmin_f * (packed[j] >> 4) as f32, nonzero(&l, j))).collect()
    } else if kind == BlockType::Q3_K {
        let mut scales = [0.0f32; 16];
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..]);
        }
        let (d, packed) = q3_k_header(&scales);
        let d_f = f16::from_bits(d).to_f32();
        (0..16).map(|j| (d_f * q3_k_scale(j, &packed) as f32, 0.0, nonzero(&l, j))).collect()
    } else if kind == BlockType::Q6_K {
        let mut scales = [0.0f32; 16];
        for ib in 0..16 {
            scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..]);
        }
        let Some((d, sc)) = q6_k_header(&scales) else { return Vec::new() };
        let d_f = f16::from_bits(d).to_f32();
        (0..16).map(|j| (d_f * sc[j] as f32, 0.0, l[16 * j..16 * j + 16].iter().any(|&q| q != 0))).collect()
    } else {
        let (nmax, rmin, nstep) = if kind == BlockType::Q4_K { (15, -1.0, 20) } else { (31, -0.5, 15) };
        let (mut scales, mut mins, mut weights) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 32]);
        for j in 0..8 {
            let sub = &x[32 * j..32 * j + 32];
            let av_x = (sub.iter().fold(0.0f32, |s, &v| s + v * v) / 32.0).sqrt();
            for (w, &v) in weights.iter_mut().zip(sub) {
                *w = av_x + v.abs();
            }
            (scales[j], mins[j]) = make_qkx2_quants(nmax, sub, &weights, &mut l[32 * j..], rmin, 0.1, nstep);
        }
        let (d, dmin, packed) = scale_min_header(&scales, &mins);
        let (d_f, dmin_f) = (f16::from_bits(d).to_f32(), f16::from_bits(dmin).to_f32());
        (0..8)
            .map(|j| {
                let (sc, m) = scale_min_k4(j, &packed);
                (d_f * sc as f32, dmin_f * m as f32, l[32 * j..32 * j + 32].iter().any(|&q| q != 0))
            })
            .collect()
    }
}

/// [`Coverage`] of `values` for `kind`, following the reference's steps.
fn coverage(kind: BlockType, values: &[f32]) -> Coverage {
    let mut c = Coverage::default();
    for x in values.chunks_exact(QK_K) {
        let steps = group_steps(kind, x);
        let n = QK_K / steps.len().max(1);
        for (xs, &(dj, dm, nonzero)) in x.chunks_exact(n).zip(&steps) {
            if dj == 0.0 {
                c.kept += nonzero as usize;
            } else {
                c.ties += xs.iter().map(|&v| (v + dm) / dj).filter(|v| (v - v.floor()) == 0.5).count();
            }
        }
    }
    c
}

/// Blocks built so that `kind`'s re-quantization meets exact ties: Gaussian blocks in which the
/// three values of each group nearest a midpoint between two quants (of the steps the reference
/// finds) are moved onto it, a few times over (moving values can move the fits).
fn tie_blocks(kind: BlockType, rng: &mut SplitMix64) -> Vec<f32> {
    let mut v = Vec::new();
    for s in [1.0f32, 1e-3, 7.0, 0.02, 3e5, 1e-12] {
        let mut x: Vec<f32> = (0..QK_K).map(|_| gaussian(rng) * s).collect();
        for _ in 0..8 {
            let steps = group_steps(kind, &x);
            let n = QK_K / steps.len().max(1);
            for (xs, &(dj, dm, _)) in x.chunks_exact_mut(n).zip(&steps) {
                if dj == 0.0 {
                    continue;
                }
                // The three values nearest a midpoint move, the least of a shift.
                let off = |v: f32| ((v + dm) / dj - ((v + dm) / dj).floor() - 0.5).abs();
                let mut order: Vec<usize> = (0..n).collect();
                order.sort_by(|&a, &b| off(xs[a]).total_cmp(&off(xs[b])));
                for &i in &order[..3] {
                    if off(xs[i]) < 0.1 {
                        xs[i] = (((xs[i] + dm) / dj).floor() + 0.5) * dj - dm;
                    }
                }
            }
        }
        v.extend(x);
    }
    v
}

/// Blocks that exercise every edge the searches have, plus random blocks at many scales.
fn edge_blocks(rng: &mut SplitMix64) -> Vec<Vec<f32>> {
    let mut blocks: Vec<Vec<f32>> = Vec::new();
    let fill = |f: &mut dyn FnMut(usize) -> f32| -> Vec<f32> { (0..QK_K).map(f).collect() };
    // Zeros of both signs, mixed, and zero groups among others.
    blocks.push(vec![0.0; QK_K]);
    blocks.push(vec![-0.0; QK_K]);
    blocks.push(fill(&mut |i| if i % 3 == 0 { -0.0 } else { 0.0 }));
    blocks.push(fill(&mut |i| if i % 2 == 0 { -0.0 } else { 1.0 }));
    blocks.push(fill(&mut |i| if i % 2 == 0 { -0.0 } else { -1.0 }));
    blocks.push(fill(&mut |i| if i / 32 % 2 == 0 { 0.0 } else { 0.25 * (i % 7) as f32 - 0.5 }));
    blocks.push(fill(&mut |i| if i / 16 % 3 == 1 { -0.0 } else { (i % 11) as f32 - 5.0 }));
    // Constants, whole blocks and per group.
    for c in [1.0f32, -1.0, 0.37, -1234.5, 1e-3, 7e-8, -7e-8, 1e-20, 3e30, -3e30] {
        blocks.push(vec![c; QK_K]);
    }
    blocks.push(fill(&mut |i| [0.5f32, -2.0, 3.0, 0.0, -0.0, 1e-3, 7.0, -7.0][i / 32]));
    blocks.push(fill(&mut |i| (i / 16) as f32 - 8.0));
    // One dominant value: in the block, in a group, negative and positive.
    for (at, big) in [(5usize, 100.0f32), (200, -1000.0), (31, 1e6), (128, -1e4), (17, 1e30), (250, -3e-3)] {
        let mut b = fill(&mut |_| gaussian(rng) * 0.01);
        b[at] = big;
        blocks.push(b);
    }
    // One group far larger than the rest: the others' stored scales round to zero.
    for big in [1e3f32, 1e5, -1e4, 3e7] {
        blocks.push(fill(&mut |i| gaussian(rng) * if i / 32 == 2 { big } else { 1.0 }));
        blocks.push(fill(&mut |i| gaussian(rng) * if i / 16 == 13 { big } else { 1.0 }));
        blocks.push(fill(&mut |i| gaussian(rng).abs() * if i / 32 == 6 { big } else { 1.0 } + 0.5));
    }
    // Subnormals: alone, with zeros, with normal values.
    blocks.push(fill(&mut |i| f32::from_bits(1 + i as u32 * 1000)));
    blocks.push(fill(&mut |i| [1e-40f32, -1e-40, 0.0, -1e-45, 1e-45][i % 5]));
    blocks.push(fill(&mut |i| if i % 4 == 0 { 1e-39 } else { gaussian(rng) * 1e-3 }));
    blocks.push(fill(&mut |i| -f32::from_bits((i as u32 * 77_777) % 0x0080_0000)));
    blocks.push(fill(&mut |i| f32::from_bits((rng.next_u64() as u32 & 0x807F_FFFF) | (i as u32 % 3) << 23)));
    // Huge: near f32::MAX/8 (sums of squares overflow), mixed with ordinary values.
    let huge = f32::MAX / 8.0;
    blocks.push(fill(&mut |i| [huge, -huge, 1.0, 0.0][i % 4]));
    blocks.push(fill(&mut |_| huge * (rng.uniform() as f32 * 2.0 - 1.0)));
    blocks.push(fill(&mut |i| if i % 37 == 0 { huge } else { gaussian(rng) }));
    blocks.push(fill(&mut |i| if i / 32 == 4 { -huge } else { gaussian(rng) * 1e30 }));
    blocks.push(fill(&mut |i| [f32::MAX, f32::MIN, -1e38, 3e38][i % 4]));
    // Ramps and grids.
    blocks.push(fill(&mut |i| i as f32));
    blocks.push(fill(&mut |i| -(i as f32) / 255.0));
    blocks.push(fill(&mut |i| (i % 32) as f32 / 31.0 - 0.25));
    blocks.push(fill(&mut |i| ((i * 37) % 64) as f32 - 32.0));
    for kind in SEARCHED {
        blocks.push(tie_blocks(kind, rng));
    }
    // Gaussian rows at every scale from 1e-30 to 1e30, and positive- and negative-only.
    for e in (-30..=30).step_by(3) {
        let s = 10f32.powi(e);
        blocks.push(fill(&mut |_| gaussian(rng) * s));
        blocks.push(fill(&mut |_| (gaussian(rng) * s).abs()));
        blocks.push(fill(&mut |_| -(gaussian(rng) * s).abs() - s));
    }
    blocks
}

#[test]
fn edge_rows_match_the_reference() {
    let mut rng = SplitMix64(0xC0FF_EE11);
    let blocks = edge_blocks(&mut rng);
    for b in &blocks {
        assert_eq!(b.len() % QK_K, 0);
    }
    let all = blocks.concat();
    // One row of everything, and every block alone, and in odd and even runs (the kernels pair
    // blocks up).
    assert_same(&all, "all edge blocks");
    for (i, b) in blocks.iter().enumerate() {
        assert_same(b, &format!("edge block {i}"));
    }
    for n in [3, 5] {
        for (i, w) in all.chunks(n * QK_K).enumerate() {
            assert_same(w, &format!("edge run {i} of {n}"));
        }
    }
}

#[test]
fn edge_rows_reach_ties_and_zero_scales() {
    let mut rng = SplitMix64(0xC0FF_EE11);
    let all = edge_blocks(&mut rng).concat();
    for kind in SEARCHED {
        let c = coverage(kind, &all);
        assert!(c.ties >= 20 && c.kept >= 8, "{}: {c:?}", kind.name());
    }
}

#[test]
fn tie_blocks_tie() {
    let mut rng = SplitMix64(0x71E5);
    for kind in SEARCHED {
        let ties = tie_blocks(kind, &mut rng);
        let c = coverage(kind, &ties);
        assert!(c.ties >= 25, "{}: {c:?}", kind.name());
        assert_same(&ties, &format!("{} tie blocks", kind.name()));
    }
}

#[test]
fn thousands_of_random_blocks_match_the_reference() {
    let mut rng = SplitMix64(0x0005_EED5);
    let blocks: Vec<f32> = (0..3000).flat_map(|_| random_block(&mut rng, 16)).collect();
    assert_same(&blocks, "random blocks");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_rows_match_the_reference(
        blocks in 1usize..5,
        scale in prop::sample::select(vec![1.0f32, 1e-30, 1e-20, 1e-10, 1e-3, 3e-8, 65504.0, 1e10, 1e20, 1e30]),
        seed in any::<u64>(),
        pattern in prop::collection::vec(element(), 64),
    ) {
        // A row-sized pattern: proptest's elements, spread by a seeded shuffle, times the scale.
        let mut rng = SplitMix64(seed);
        let values: Vec<f32> =
            (0..blocks * QK_K).map(|_| pattern[(rng.next_u64() % 64) as usize] * scale).collect();
        assert_same(&values, "proptest row");
    }

    #[test]
    fn random_finite_bit_patterns_match_the_reference(
        values in prop::collection::vec(any::<u32>().prop_map(f32::from_bits).prop_filter("finite", |v| v.is_finite()), 2 * QK_K),
    ) {
        assert_same(&values, "random bit patterns");
    }
}

#[test]
fn non_finite_values_match_the_reference() {
    // Not an input ggml expects, but the kernels make the reference's comparisons, so NaN and
    // infinities go the same way too.
    let mut rng = SplitMix64(3);
    let mut blocks = Vec::new();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for at in [0usize, 7, 31, 100, 255] {
            let mut b: Vec<f32> = (0..QK_K).map(|_| gaussian(&mut rng)).collect();
            b[at] = bad;
            blocks.extend(b);
        }
        blocks.extend(vec![bad; QK_K]);
    }
    assert_same(&blocks, "non-finite values");
}

/// The rows above reach every way the SIMD kernel rounds a pass, in both searches: the exact bit
/// arithmetic (non-finite and huge values) and round-to-nearest-even with each combination of
/// clamps.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
fn edge_and_random_rows_reach_every_simd_rounding() {
    #[cfg(target_arch = "x86_64")]
    if !crate::cpu::has_avx2() {
        return;
    }
    let mut rng = SplitMix64(0xC0FF_EE11);
    let mut rows = edge_blocks(&mut rng);
    rows.extend((0..300).map(|_| random_block(&mut rng, 16)));
    let mut bad = Vec::new();
    for bad_value in [f32::NAN, f32::INFINITY] {
        let mut b: Vec<f32> = (0..QK_K).map(|_| gaussian(&mut rng)).collect();
        b[9] = bad_value;
        bad.extend(b);
    }
    rows.push(bad);
    for row in &rows {
        assert_same(row, "coverage row");
    }
    let names = ["exact", "round", "round, clamp below", "round, clamp above", "round, clamp both"];
    for (search, counts) in ["Q4_K/Q5_K", "Q6_K", "Q2_K"].iter().zip(&super::PASSES) {
        for (name, n) in names.iter().zip(counts) {
            let n = n.load(std::sync::atomic::Ordering::Relaxed);
            eprintln!("{search}: {name}: {n} passes");
            assert!(n > 0, "{search}: no pass rounded as \"{name}\"");
        }
    }
}

/// The rows above make the lane-wise `Q3_K` search run every number of sweeps the reference can,
/// the fifth included: lanes that stopped earlier then sweep on with the rest.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
fn edge_and_random_rows_reach_every_q3_k_sweep() {
    #[cfg(target_arch = "x86_64")]
    if !crate::cpu::has_avx2() {
        return;
    }
    let mut rng = SplitMix64(0x5EE9);
    let mut rows = edge_blocks(&mut rng);
    rows.extend((0..300).map(|_| random_block(&mut rng, 16)));
    for row in &rows {
        let want = run(Kernel::Reference, BlockType::Q3_K, row);
        for kernel in fast_kernels() {
            assert!(run(kernel, BlockType::Q3_K, row) == want, "{}: Q3_K sweep row", kernel.name());
        }
    }
    for sweep in 1..=5 {
        let n = super::search::Q3_SWEEPS[sweep].load(std::sync::atomic::Ordering::Relaxed);
        eprintln!("Q3_K: sweep {sweep} ran {n} times");
        assert!(n > 0, "no Q3_K search ran sweep {sweep}");
    }
}
