//! Every kernel against the scalar reference, byte for byte, for `IQ4_NL` and `IQ4_XS`, on rows
//! built to hit the edges of the scale search and the level choice, and on random rows.

use super::lanes::MIDPOINTS;
use super::reference::{best_index, group_scale};
use super::*;
use crate::quant::test_rows::{element, random_block};
use crate::rng::SplitMix64;
use proptest::prelude::*;

const KINDS: [BlockType; 2] = [BlockType::IQ4_NL, BlockType::IQ4_XS];

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

/// Every fast kernel gives the reference's bytes for `values` (whole super-blocks), for both types.
fn assert_same(values: &[f32], what: &str) {
    for kind in KINDS {
        let want = run(Kernel::Reference, kind, values);
        assert_eq!(want.len(), 3 + values.len() / kind.elements() * kind.bytes());
        for kernel in fast_kernels() {
            let got = run(kernel, kind, values);
            assert_eq!(got.len(), want.len(), "{} {}: {what}: lengths", kernel.name(), kind.name());
            if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
                let block = (i - 3) / kind.bytes();
                let x = &values[block * kind.elements()..(block + 1) * kind.elements()];
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
fn a_simd_kernel_is_chosen_where_the_cpu_has_one() {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        assert_eq!(Kernel::best().name(), "avx2");
    }
    #[cfg(target_arch = "aarch64")]
    assert_eq!(Kernel::best().name(), "neon");
}

/// The first midpoint above `x` names its level, none the top one: the kernels' rule.
fn by_midpoints(x: f32) -> u8 {
    MIDPOINTS.iter().position(|&m| x < m).unwrap_or(15) as u8
}

#[test]
fn midpoints_are_halfway_between_levels() {
    for (i, &m) in MIDPOINTS.iter().enumerate() {
        assert_eq!(m, f32::midpoint(GRID[i] as f32, GRID[i + 1] as f32));
    }
}

#[test]
fn the_midpoint_rule_is_the_references_near_every_level_and_midpoint() {
    let mut xs = vec![f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-45, -1e-45];
    // Every f32 within 2¹⁴ steps of each level and midpoint, and of their tenths and thousandths.
    let centres = GRID.iter().map(|&v| v as f32).chain(MIDPOINTS);
    for c in centres {
        for s in [1.0f32, 0.1, 1e-3] {
            let (mut up, mut down) = (c * s, c * s);
            for _ in 0..1 << 14 {
                xs.extend([up, down]);
                (up, down) = (up.next_up(), down.next_down());
            }
        }
    }
    let mut rng = SplitMix64(0x3D);
    xs.extend((0..200_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
    xs.extend((0..200_000).map(|_| (rng.uniform() as f32 - 0.5) * 300.0));
    for x in xs {
        assert_eq!(by_midpoints(x), best_index(x), "{x:e} ({:#010x})", x.to_bits());
    }
}

/// The same over every f32 (about 20 s in a release build).
#[test]
#[ignore = "every f32: run with --release -- --ignored"]
fn the_midpoint_rule_is_the_references_for_every_f32() {
    for bits in 0..=u32::MAX {
        let x = f32::from_bits(bits);
        assert_eq!(by_midpoints(x), best_index(x), "{x:e} ({bits:#010x})");
    }
}

/// A group whose largest magnitude is `127·s` (times `sign`) and whose other values are the levels
/// above −127 and the midpoints times `s` (and `sign`), `s` a power of two: the first guess,
/// `127/max`, multiplies every value onto a level or a midpoint exactly.
fn on_grid_group(s: f32, sign: f32, rng: &mut SplitMix64) -> Vec<f32> {
    let mut points: Vec<f32> = GRID[1..].iter().map(|&v| v as f32).chain(MIDPOINTS).collect();
    points.push(127.0);
    while points.len() < GROUP {
        points.push(MIDPOINTS[(rng.next_u64() % 15) as usize]);
    }
    for i in (1..GROUP).rev() {
        points.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    points.iter().map(|&p| p * s * sign).collect()
}

/// Super-blocks that exercise every edge the search and the level choice have.
fn edge_blocks(rng: &mut SplitMix64) -> Vec<Vec<f32>> {
    let mut blocks: Vec<Vec<f32>> = Vec::new();
    let fill = |f: &mut dyn FnMut(usize) -> f32| -> Vec<f32> { (0..SUPER).map(f).collect() };
    // Zeros of both signs, mixed, and zero groups among others.
    blocks.push(vec![0.0; SUPER]);
    blocks.push(vec![-0.0; SUPER]);
    blocks.push(fill(&mut |i| if i % 3 == 0 { -0.0 } else { 0.0 }));
    blocks.push(fill(&mut |i| if i % 2 == 0 { -0.0 } else { 1.0 }));
    blocks.push(fill(&mut |i| if i / 32 % 2 == 0 { 0.0 } else { 0.25 * (i % 7) as f32 - 0.5 }));
    // Constants, whole blocks and per group.
    for c in [1.0f32, -1.0, 0.37, -1234.5, 1e-3, 7e-8, -7e-8, 1e-20, 3e30, -3e30] {
        blocks.push(vec![c; SUPER]);
    }
    blocks.push(fill(&mut |i| [0.5f32, -2.0, 3.0, 0.0, -0.0, 1e-3, 7.0, -7.0][i / 32]));
    // Around ggml's 1e-15 threshold: groups just below, at and above it.
    for t in [1e-15f32.next_down(), 1e-15, 1e-15f32.next_up(), 3e-15, 9.9e-16] {
        blocks.push(fill(&mut |i| if i % 32 == 5 { t } else { t * 0.25 * ((i % 9) as f32 - 4.0) / 4.0 }));
        blocks.push(fill(&mut |i| if i / 32 % 2 == 0 { -t } else { gaussian(rng) * 1e-16 }));
    }
    blocks.push(fill(&mut |i| if i / 32 == 3 { gaussian(rng) } else { gaussian(rng) * 1e-16 }));
    // Values that the first guess puts exactly on levels and midpoints; the largest magnitude
    // negative in some groups, positive in others.
    for s in [1.0f32, 0.5, 2.0f32.powi(-20), 2.0f32.powi(40), 2.0f32.powi(-120)] {
        let mut b = Vec::new();
        for g in 0..GROUPS {
            b.extend(on_grid_group(s, if g % 3 == 1 { -1.0 } else { 1.0 }, rng));
        }
        blocks.push(b);
    }
    // One dominant value: in the block, in a group, negative and positive.
    for (at, big) in [(5usize, 100.0f32), (200, -1000.0), (31, 1e6), (128, -1e4), (17, 1e30), (250, -3e-3)] {
        let mut b = fill(&mut |_| gaussian(rng) * 0.01);
        b[at] = big;
        blocks.push(b);
    }
    // Equal magnitudes of both signs: the first of them is the largest.
    blocks.push(fill(&mut |i| {
        if i % 32 == 3 {
            -2.0
        } else if i % 32 == 9 {
            2.0
        } else {
            gaussian(rng)
        }
    }));
    blocks.push(fill(&mut |i| {
        if i % 32 == 3 {
            2.0
        } else if i % 32 == 9 {
            -2.0
        } else {
            gaussian(rng)
        }
    }));
    // One group far larger than the rest: the others' stored scales round to zero.
    for big in [1e3f32, 1e5, -1e4, 3e7] {
        blocks.push(fill(&mut |i| gaussian(rng) * if i / 32 == 2 { big } else { 1.0 }));
        blocks.push(fill(&mut |i| gaussian(rng).abs() * if i / 32 == 6 { big } else { 1.0 } + 0.5));
    }
    // Subnormals: alone, with zeros, with normal values.
    blocks.push(fill(&mut |i| f32::from_bits(1 + i as u32 * 1000)));
    blocks.push(fill(&mut |i| [1e-40f32, -1e-40, 0.0, -1e-45, 1e-45][i % 5]));
    blocks.push(fill(&mut |i| if i % 4 == 0 { 1e-39 } else { gaussian(rng) * 1e-3 }));
    blocks.push(fill(&mut |i| f32::from_bits((rng.next_u64() as u32 & 0x807F_FFFF) | (i as u32 % 3) << 23)));
    // Huge: the sums overflow to infinities (and NaN scales), mixed with ordinary values.
    let huge = f32::MAX / 8.0;
    blocks.push(fill(&mut |i| [huge, -huge, 1.0, 0.0][i % 4]));
    blocks.push(fill(&mut |_| huge * (rng.uniform() as f32 * 2.0 - 1.0)));
    blocks.push(fill(&mut |i| if i % 37 == 0 { huge } else { gaussian(rng) }));
    blocks.push(fill(&mut |i| if i / 32 == 4 { -huge } else { gaussian(rng) * 1e30 }));
    blocks.push(fill(&mut |i| [f32::MAX, f32::MIN, -1e38, 3e38][i % 4]));
    blocks.push(fill(&mut |_| gaussian(rng) * 1e19));
    // Ramps.
    blocks.push(fill(&mut |i| i as f32));
    blocks.push(fill(&mut |i| -(i as f32) / 255.0));
    blocks.push(fill(&mut |i| ((i * 37) % 64) as f32 - 32.0));
    // Gaussian rows at every scale from 1e-30 to 1e30, and positive- and negative-only.
    for e in (-30..=30).step_by(3) {
        let s = 10f32.powi(e);
        blocks.push(fill(&mut |_| gaussian(rng) * s));
        blocks.push(fill(&mut |_| (gaussian(rng) * s).abs()));
        blocks.push(fill(&mut |_| -(gaussian(rng) * s).abs() - s));
    }
    blocks
}

/// Non-finite values: NaN of both signs and infinities, alone in a group, several, whole blocks.
fn non_finite_blocks(rng: &mut SplitMix64) -> Vec<Vec<f32>> {
    let mut blocks = Vec::new();
    for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for at in [0usize, 7, 31, 100, 255] {
            let mut b: Vec<f32> = (0..SUPER).map(|_| gaussian(rng)).collect();
            b[at] = bad;
            blocks.push(b);
        }
        let mut b: Vec<f32> = (0..SUPER).map(|_| gaussian(rng) * 1e30).collect();
        b[40] = bad;
        b[77] = -bad;
        blocks.push(b);
        blocks.push(vec![bad; SUPER]);
    }
    let mut b: Vec<f32> = (0..SUPER).map(|_| gaussian(rng)).collect();
    b[3] = f32::INFINITY;
    b[4] = f32::NAN;
    blocks.push(b);
    blocks
}

#[test]
fn edge_rows_match_the_reference() {
    let mut rng = SplitMix64(0x1A4_ED6E);
    let mut blocks = edge_blocks(&mut rng);
    blocks.extend(non_finite_blocks(&mut rng));
    let all = blocks.concat();
    // One row of everything, every block alone, and runs of 1 to 9 IQ4_NL blocks (the kernels
    // take 8 at a time and pad the rest).
    assert_same(&all, "all edge blocks");
    for (i, b) in blocks.iter().enumerate() {
        assert_same(b, &format!("edge block {i}"));
    }
    for n in 1..=9 {
        let cut = &all[GROUP * 3..GROUP * 3 + 5 * SUPER];
        for (i, w) in cut.chunks_exact(n * GROUP).enumerate() {
            let want = run(Kernel::Reference, BlockType::IQ4_NL, w);
            for kernel in fast_kernels() {
                assert_eq!(run(kernel, BlockType::IQ4_NL, w), want, "{}: run {i} of {n} blocks", kernel.name());
            }
        }
    }
}

/// The edge rows reach what they are there for: groups below the threshold, first guesses exactly
/// on midpoints, and NaN scales (from sums that overflow).
#[test]
fn edge_rows_reach_the_edges() {
    let mut rng = SplitMix64(0x1A4_ED6E);
    let mut blocks = edge_blocks(&mut rng);
    blocks.extend(non_finite_blocks(&mut rng));
    let (mut skipped, mut nan, mut on_midpoints) = (0, 0, 0);
    for group in blocks.concat().chunks_exact(GROUP) {
        let group: &[f32; GROUP] = group.try_into().unwrap();
        match group_scale(group) {
            None => skipped += 1,
            Some(d) if d.is_nan() => nan += 1,
            Some(_) => {}
        }
        let (max, _) = crate::quant::largest_magnitude(group);
        let id = 1.0 / (-max / GRID[0] as f32);
        on_midpoints += group.iter().filter(|&&v| MIDPOINTS.contains(&(id * v))).count();
    }
    assert!(skipped >= 20 && nan >= 4 && on_midpoints >= 200, "{skipped} {nan} {on_midpoints}");
}

#[test]
fn thousands_of_random_blocks_match_the_reference() {
    let mut rng = SplitMix64(0x1A4_5EED);
    let blocks: Vec<f32> = (0..1500).flat_map(|_| random_block(&mut rng, GROUP)).collect();
    assert_same(&blocks, "random blocks");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_rows_match_the_reference(
        blocks in 1usize..4,
        scale in prop::sample::select(vec![1.0f32, 1e-30, 1e-20, 1e-10, 1e-3, 3e-8, 65504.0, 1e10, 1e20, 1e30]),
        seed in any::<u64>(),
        pattern in prop::collection::vec(element(), 64),
    ) {
        let mut rng = SplitMix64(seed);
        let values: Vec<f32> =
            (0..blocks * SUPER).map(|_| pattern[(rng.next_u64() % 64) as usize] * scale).collect();
        assert_same(&values, "proptest row");
    }

    #[test]
    fn random_bit_patterns_match_the_reference(
        values in prop::collection::vec(any::<u32>().prop_map(f32::from_bits), SUPER),
    ) {
        assert_same(&values, "random bit patterns");
    }
}
