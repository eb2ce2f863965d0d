//! The K-quant encoders of `src/quant/kquants/`, the legacy ones of `src/quant/legacy.rs`, `Q8_0`
//! (`src/quant/q8_0.rs`) and the IQ4 ones (`src/quant/iq4/`) against ggml's own C:
//! `tests/c/ggml_quants_ref.c` (run by `ggml_harness.rs`): `quantize_row_q{2,3,4,5,6}_K_ref` /
//! `quantize_row_q{4,5}_{0,1}_ref` / `quantize_iq4_{nl,xs}` must write exactly the bytes
//! `quantize_row` writes, for random rows and for every edge the scale search has (zeros,
//! constants, huge, tiny and subnormal values, outliers, exact ties); ggml's dequantization of
//! those blocks must equal `dequantize_row` bit for bit.

use crate::common::Rng;
use crate::ggml_harness::{llama_cpp_dir, Harness};
use escha_convert::block_type::BlockType;
use escha_convert::quant::kquants::{self, QK_K};
use escha_convert::quant::legacy::{self, QK};
use escha_convert::quant::{blocks, iq4, q8_0};

/// The legacy types, those `legacy::quantize_row` encodes.
const LEGACY: [BlockType; 4] = [BlockType::Q4_0, BlockType::Q4_1, BlockType::Q5_0, BlockType::Q5_1];

/// `kind`'s reference encoding of `values`: the scalar one, which the vector kernels are held to
/// separately.
fn quantize_reference(kind: BlockType, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    if kind.is_k_quant() {
        kquants::quantize_row_with(kquants::Kernel::Reference, kind, values, &mut out);
    } else if kind == BlockType::Q8_0 {
        q8_0::quantize_row_reference(values, &mut out);
    } else if matches!(kind, BlockType::IQ4_NL | BlockType::IQ4_XS) {
        iq4::quantize_row(kind, values, &mut out);
    } else {
        legacy::quantize_row_reference(kind, values, &mut out);
    }
    out
}

fn dequantize(kind: BlockType, data: &[u8]) -> Vec<f32> {
    let mut out = Vec::new();
    blocks::dequantize(kind, data, &mut out);
    out
}

/// A named input row of whole blocks.
struct Case {
    name: String,
    values: Vec<f32>,
}

fn case(name: impl Into<String>, values: Vec<f32>) -> Case {
    assert_eq!(values.len() % QK_K, 0);
    Case { name: name.into(), values }
}

fn normal(rng: &mut Rng, blocks: usize, sigma: f64) -> Vec<f32> {
    (0..blocks * QK_K).map(|_| (rng.gaussian() * sigma) as f32).collect()
}

fn uniform(rng: &mut Rng, blocks: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..blocks * QK_K).map(|_| (lo + (hi - lo) * rng.uniform()) as f32).collect()
}

/// 10^u for u uniform in [lo, hi).
fn log_uniform(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    10f64.powf(lo + (hi - lo) * rng.uniform())
}

fn random_sign(rng: &mut Rng) -> f32 {
    if rng.next_u64() & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// Blocks each holding `values(block index)` for every value.
fn per_block(blocks: usize, mut value: impl FnMut(usize, usize) -> f32) -> Vec<f32> {
    (0..blocks * QK_K).map(|i| value(i / QK_K, i % QK_K)).collect()
}

/// One random block of `n` values: a random shape (normal, uniform, one-signed, sparse,
/// heavy-tailed, integer grid, offset) at a random scale over many decades.
pub(crate) fn random_block(rng: &mut Rng, n: usize) -> Vec<f32> {
    let scale = log_uniform(rng, -12.0, 12.0);
    let shape = rng.next_u64() % 8;
    let offset = if rng.next_u64().is_multiple_of(4) { rng.gaussian() * scale * 4.0 } else { 0.0 };
    let sparsity = rng.uniform();
    (0..n)
        .map(|_| {
            let v = match shape {
                0 => rng.gaussian(),
                1 => 2.0 * rng.uniform() - 1.0,
                2 => rng.uniform(),
                3 => -rng.uniform(),
                4 => {
                    if rng.uniform() < sparsity {
                        0.0
                    } else {
                        rng.gaussian()
                    }
                }
                5 => (std::f64::consts::PI * (rng.uniform() - 0.5)).tan(), // Cauchy
                6 => ((rng.next_u64() % 33) as f64 - 16.0) / 4.0,
                _ => rng.gaussian() * (rng.gaussian() * 2.0).exp(),
            };
            (v * scale + offset) as f32
        })
        .collect()
}

/// Blocks built so that `Q6_K`'s final step `x / (d·sc)` lands exactly on halves: group 0 lies on
/// the grid k/8 with −4 as its extreme (scale 1/8, so d = −1/1024 and its sc = −128), each other
/// group mostly on multiples of some step s = sc/1024 up to ±31·s (its sc then comes out as that,
/// the fit being dominated by the large values), plus a few
/// small values at (n + ½)·s, which round to even in ggml and would not under half-away rounding.
fn q6_ties(rng: &mut Rng, blocks: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(blocks * QK_K);
    for _ in 0..blocks {
        v.push(-4.0);
        v.extend((1..16).map(|_| ((rng.next_u64() % 63) as f32 - 31.0) / 8.0));
        for _ in 1..16 {
            let step = (40 + rng.next_u64() % 80) as f32 / 1024.0;
            for i in 0..16 {
                let n = if i == 0 {
                    31.0 * random_sign(rng)
                } else if i < 12 {
                    (16 + rng.next_u64() % 16) as f32 * random_sign(rng)
                } else {
                    (rng.next_u64() % 9) as f32 - 4.0 + 0.5
                };
                v.push(n * step);
            }
        }
    }
    v
}

fn cases() -> Vec<Case> {
    let mut rng = Rng(0x6767_6d6c_4b71);
    let mut cases = Vec::new();

    for sigma in [1.0, 0.02, 1e-3, 1e3, 1e-8, 1e8] {
        cases.push(case(format!("normal sigma={sigma:e}"), normal(&mut rng, 32, sigma)));
    }
    for (lo, hi) in [(-1.0, 1.0), (0.0, 1.0), (-5.0, 0.0), (1e4, 1e4 + 1.0), (-3e-6, 1e-6)] {
        cases.push(case(format!("uniform [{lo:e}, {hi:e})"), uniform(&mut rng, 32, lo, hi)));
    }

    // Zeros: most values, whole groups of 16 or 32, all but one value.
    let mut v = normal(&mut rng, 32, 1.0);
    for x in &mut v {
        if rng.uniform() < 0.9 {
            *x = 0.0;
        }
    }
    cases.push(case("90% zeros", v));
    let mut v = normal(&mut rng, 32, 0.5);
    for group in v.chunks_exact_mut(16) {
        if !rng.next_u64().is_multiple_of(3) {
            group.fill(if rng.next_u64() & 1 == 0 { 0.0 } else { -0.0 });
        }
    }
    cases.push(case("zero groups", v));
    cases.push(case(
        "one non-zero per block",
        per_block(16, |b, i| if i == (b * 37) % QK_K { (b as f32 - 7.5) * 0.3 } else { 0.0 }),
    ));
    cases.push(case("all zero", vec![0.0; 4 * QK_K]));
    cases.push(case("all -0", vec![-0.0; 4 * QK_K]));

    // Constants, one per block, both signs and across magnitudes (f16 overflow of the scales
    // included).
    let constants = [1.0f32, 0.37, 1e-3, 7.0, 15.0, 65504.0, 1e5, 1e8, 1e-8, 1e-20, 1e30, 3e38];
    cases.push(case("constant positive", per_block(constants.len(), |b, _| constants[b])));
    cases.push(case("constant negative", per_block(constants.len(), |b, _| -constants[b])));

    // Huge: x² overflows from ~1.8e19, max − min and the f16 scales long before.
    for sigma in [1e7, 3e7, 1e8, 3e8, 1e18, 1e19, 1e20, 1e30, 1e37] {
        cases.push(case(format!("huge normal sigma={sigma:e}"), normal(&mut rng, 8, sigma)));
    }
    cases.push(case("uniform ±f32::MAX", uniform(&mut rng, 8, -f64::from(f32::MAX), f64::from(f32::MAX))));
    cases.push(case("mixed ±1e37", per_block(8, |_, i| if i % 3 == 0 { -1e37 } else { 1e37 * (i as f32 / 256.0) })));
    cases.push(case("near f32::MAX", per_block(8, |b, i| f32::MAX * (1.0 - (b * QK_K + i) as f32 * 1e-4))));

    // Tiny: f16 underflow of the scales, the 1e-15 "all zero" threshold, subnormals.
    for sigma in [1e-5, 1e-6, 1e-7, 1e-12, 1e-15, 1e-16, 1e-30, 1e-38] {
        cases.push(case(format!("tiny normal sigma={sigma:e}"), normal(&mut rng, 8, sigma)));
    }
    let subnormals: Vec<f32> =
        (0..8 * QK_K).map(|_| f32::from_bits(((rng.next_u64() as u32) & 0x807F_FFFF) | 1)).collect();
    cases.push(case("subnormals", subnormals));
    cases.push(case("1e-45 with signs", per_block(4, |b, i| if (i + b) % 5 == 0 { -1e-45 } else { 1e-45 })));

    // Mixed signs over many decades.
    let v: Vec<f32> =
        (0..16 * QK_K).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 } * log_uniform(&mut rng, -6.0, 6.0) as f32).collect();
    cases.push(case("alternating signs, 1e-6..1e6", v));
    let v: Vec<f32> =
        (0..16 * QK_K).map(|_| random_sign(&mut rng) * log_uniform(&mut rng, -38.0, 38.0) as f32).collect();
    cases.push(case("random signs, 1e-38..1e38", v));

    // One value dominates: per block, per group, and by a huge factor.
    let mut v = normal(&mut rng, 16, 1.0);
    for (b, block) in v.chunks_exact_mut(QK_K).enumerate() {
        block[(b * 53) % QK_K] *= 1e3;
    }
    cases.push(case("one outlier per block x1e3", v));
    let mut v = normal(&mut rng, 8, 0.1);
    for (g, group) in v.chunks_exact_mut(16).enumerate() {
        group[g % 16] = if g % 2 == 0 { 10.0 } else { -10.0 };
    }
    cases.push(case("one outlier per group", v));
    let mut v = normal(&mut rng, 8, 1e-3);
    for block in v.chunks_exact_mut(QK_K) {
        block[100] = -1e6;
    }
    cases.push(case("one value dominates 1e9", v));

    // Exact ties and grids, where rounding halfway cases decides the bytes.
    cases.push(case("integers -16..16", per_block(8, |b, i| ((i * 7 + b * 3) % 33) as f32 - 16.0)));
    cases.push(case("halves", per_block(8, |b, i| ((i * 5 + b) % 31) as f32 * 0.5 - 7.5)));
    cases.push(case("fifteenths", per_block(8, |b, i| ((i + b) % 16) as f32 / 15.0)));
    cases.push(case("two levels", per_block(8, |b, i| if (i >> (b % 5)) & 1 == 0 { 0.25 } else { -0.75 })));

    cases.push(case("exact halves against the Q6_K step", q6_ties(&mut rng, 16)));

    // Thousands of random blocks.
    let random: Vec<f32> = (0..4096).flat_map(|_| random_block(&mut rng, QK_K)).collect();
    cases.push(case("random blocks", random));
    cases
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Encodes every case with ggml and with us, compares the bytes block by block, and compares
/// ggml's decoding of ggml's blocks with ours. `tolerated(block index in the case, values of the
/// block)` says a differing block is acceptable (only for what C leaves undefined off x86-64).
/// Returns the number of blocks compared and the number of differing blocks tolerated.
fn compare(
    harness: &Harness,
    kind: BlockType,
    cases: &[Case],
    tolerated: impl Fn(&[f32]) -> bool,
    failures: &mut Vec<String>,
) -> (usize, usize) {
    let size = kind.bytes();
    let per = kind.elements();
    let mut blocks = 0;
    let mut excused = 0;
    for c in cases {
        let want = harness.quantize(kind, &c.values);
        let got = quantize_reference(kind, &c.values);
        assert_eq!(got.len(), want.len());
        if kind == BlockType::Q8_0 || LEGACY.contains(&kind) {
            // The vectors the conversion uses write the reference's bytes too.
            let mut vectors = Vec::new();
            blocks::quantize(kind, &c.values, None, &mut vectors);
            assert!(vectors == got, "{} case {:?}: the vectors differ from the reference", kind.name(), c.name);
        }
        if kind.is_k_quant() {
            // The kernel the conversion uses writes the reference's bytes too.
            let mut best = Vec::new();
            kquants::quantize_row(kind, &c.values, &mut best);
            assert!(
                best == got,
                "{} case {:?}: the {} kernel differs from the reference",
                kind.name(),
                c.name,
                kquants::Kernel::best().name()
            );
        }
        let differ: Vec<usize> = (0..want.len() / size)
            .filter(|&b| got[b * size..(b + 1) * size] != want[b * size..(b + 1) * size])
            .collect();
        let (ok, bad): (Vec<usize>, Vec<usize>) =
            differ.into_iter().partition(|&b| tolerated(&c.values[b * per..(b + 1) * per]));
        excused += ok.len();
        if let Some(&b) = bad.first() {
            let (g, w) = (&got[b * size..(b + 1) * size], &want[b * size..(b + 1) * size]);
            let at = first_difference(g, w).unwrap();
            failures.push(format!(
                "{} case {:?}: {} of {} blocks differ; first block {b}, first differing byte {at} (ours {:#04x}, \
                 ggml {:#04x})",
                kind.name(),
                c.name,
                bad.len(),
                want.len() / size,
                g[at],
                w[at]
            ));
        }

        // ggml's decoding of ggml's blocks, against ours.
        let want_values = harness.dequantize(kind, &want);
        let got_values = dequantize(kind, &want);
        assert_eq!(got_values.len(), want_values.len());
        // Bit for bit, but a NaN's sign and payload are the CPU's (an aarch64 build of the same
        // expression gives another NaN than an x86 one): any NaN matches any NaN.
        let differs = |g: &f32, w: &f32| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan());
        if let Some(i) = got_values.iter().zip(&want_values).position(|(g, w)| differs(g, w)) {
            failures.push(format!(
                "{} case {:?}: dequantized value {i} (block {}) is {:e}, ggml says {:e}",
                kind.name(),
                c.name,
                i / per,
                got_values[i],
                want_values[i]
            ));
        }
        blocks += want.len() / size;
    }
    (blocks, excused)
}

#[test]
fn kquant_encoders_match_ggml_byte_for_byte() {
    let Some(llama) = llama_cpp_dir() else { return };
    let harness = Harness::build(&llama);
    let cases = cases();
    let mut failures = Vec::new();
    // IQ4_XS shares the K-quants' 256-value super-blocks.
    for kind in BlockType::K_QUANTS.into_iter().chain([BlockType::IQ4_XS]) {
        let (blocks, _) = compare(&harness, kind, &cases, |_| false, &mut failures);
        assert!(blocks > 4096);
        println!("{}: {} cases, {blocks} blocks compared", kind.name(), cases.len());
    }
    assert!(failures.is_empty(), "{} mismatches with ggml:\n{}", failures.len(), failures.join("\n"));
}

// ---- The legacy types ----

/// The values C converts to an 8-bit integer for each of a legacy block's quants, computed as
/// `quantize_row_q{4,5}_{0,1}_ref` computes them (`x·id + 8.5` for `Q4_0`, `(x − min)·id + 0.5`
/// for `Q4_1`, …), and the open interval the conversion is defined on (`int8_t`: (−129, 128);
/// `Q5_1`'s `uint8_t`: (−1, 256)).
fn legacy_cast_arguments(kind: BlockType, x: &[f32]) -> (Vec<f32>, f32, f32) {
    let inverse = |d: f32| if d == 0.0 { 0.0 } else { 1.0 / d };
    match kind {
        BlockType::Q4_0 | BlockType::Q5_0 => {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in x {
                if amax < v.abs() {
                    amax = v.abs();
                    max = v;
                }
            }
            let (levels, offset) = if kind == BlockType::Q4_0 { (-8.0, 8.5) } else { (-16.0, 16.5) };
            let id = inverse(max / levels);
            (x.iter().map(|&v| v * id + offset).collect(), -129.0, 128.0)
        }
        BlockType::Q4_1 | BlockType::Q5_1 => {
            let (mut min, mut max) = (f32::MAX, -f32::MAX);
            for &v in x {
                if v < min {
                    min = v;
                }
                if v > max {
                    max = v;
                }
            }
            let (levels, lo, hi) = if kind == BlockType::Q4_1 { (15.0, -129.0, 128.0) } else { (31.0, -1.0, 256.0) };
            let id = inverse((max - min) / levels);
            (x.iter().map(|&v| (v - min) * id + 0.5).collect(), lo, hi)
        }
        other => panic!("{} is not a legacy type", other.name()),
    }
}

/// Whether C's float → 8-bit conversion is undefined for some value of the block (NaN or out of
/// range), where its bytes depend on the target: x86-64 gives the low byte of the 32-bit
/// truncation or of `0x8000_0000`, aarch64 saturates.
fn legacy_cast_undefined(kind: BlockType, x: &[f32]) -> bool {
    let (args, lo, hi) = legacy_cast_arguments(kind, x);
    args.iter().any(|&a| !(a > lo && a < hi))
}

fn legacy_case(name: impl Into<String>, values: Vec<f32>) -> Case {
    assert_eq!(values.len() % QK, 0);
    Case { name: name.into(), values }
}

/// Blocks on which the legacy encoders' `x·id + offset` lands exactly on integers (the conversion
/// truncates, so these are the boundaries), and a quarter of the values one ulp to either side:
/// power-of-two steps s with the extreme at ±8s, ±16s (symmetric types) or a grid from an offset
/// a = k·s to a + 15s, a + 31s (affine types), the other values at half steps.
fn legacy_ties(rng: &mut Rng, blocks: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(blocks * QK);
    for b in 0..blocks {
        let s = 2f32.powi((rng.next_u64() % 61) as i32 - 30);
        let pattern = b % 4;
        let sign = random_sign(rng);
        // The affine grids' origin, a multiple of s.
        let origin = ((rng.next_u64() % 41) as f32 - 30.0) * s;
        let mut block: Vec<f32> = match pattern {
            0 | 1 => {
                let half = if pattern == 0 { 8 } else { 16 };
                (0..QK).map(|_| ((rng.next_u64() % (2 * half)) as f32 - half as f32 + 0.5) * s).collect()
            }
            _ => {
                let top = if pattern == 2 { 15 } else { 31 };
                (0..QK).map(|_| origin + ((rng.next_u64() % top) as f32 + 0.5) * s).collect()
            }
        };
        for x in &mut block {
            match rng.next_u64() % 8 {
                0 => *x = x.next_up(),
                1 => *x = x.next_down(),
                _ => {}
            }
        }
        // The extremes, exact, at two different random places.
        let i = (rng.next_u64() % QK as u64) as usize;
        let j = (i + 1 + (rng.next_u64() % (QK as u64 - 1)) as usize) % QK;
        match pattern {
            0 | 1 => {
                // The extreme maps to q = 0; its negation (in half the blocks) to the clamped top.
                block[i] = if pattern == 0 { 8.0 } else { 16.0 } * s * sign;
                if b % 8 < 2 {
                    block[j] = -block[i];
                }
            }
            _ => {
                let top = if pattern == 2 { 15.0 } else { 31.0 };
                block[i] = origin;
                block[j] = origin + top * s;
            }
        }
        v.extend(block);
    }
    v
}

fn legacy_cases(rng: &mut Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    cases.push(legacy_case("exact ties", legacy_ties(rng, 2048)));

    // Symmetric grids at non-power-of-two steps: d and 1/d rounded, products near halves.
    for s in [0.1f32, 0.3, 1.0 / 3.0, 1e-3, 7.0, 1e4] {
        let v = (0..64 * QK)
            .map(|i| if i % QK == 0 { -8.0 * s } else { ((rng.next_u64() % 33) as f32 * 0.5 - 8.0) * s })
            .collect();
        cases.push(legacy_case(format!("half steps of {s:e}"), v));
    }

    // Constant blocks, both signs, many magnitudes; and blocks of a value and its negation (the
    // first of equal magnitudes sets the sign of d).
    let constants = [1.0f32, 0.37, 8.0, 16.0, 1e-3, 65504.0, 65520.0, 1e5, 1e-8, 1e-30, 3e38, 1e-40, 1e-45];
    cases.push(legacy_case("constant blocks", per_legacy_block(constants.len(), |b, _| constants[b])));
    cases.push(legacy_case("negative constant blocks", per_legacy_block(constants.len(), |b, _| -constants[b])));
    cases.push(legacy_case(
        "±v, first sign wins",
        per_legacy_block(64, |b, i| {
            let c = constants[b % constants.len()];
            if (i * 7 + b) % 3 == 0 {
                -c
            } else if b % 2 == 0 {
                c
            } else {
                c * 0.25
            }
        }),
    ));
    cases.push(legacy_case(
        "zeros of mixed sign",
        per_legacy_block(16, |b, i| if (i + b) % 3 == 0 { -0.0 } else { 0.0 }),
    ));

    // Where 1/d overflows: the largest magnitude (or the range) near 2^-125 / 2^-124 and smaller,
    // the smallest subnormals, and blocks of a subnormal maximum over subnormal values.
    let mut v = Vec::new();
    for centre in [2f32.powi(-125), 2f32.powi(-124), 15.0 * 2f32.powi(-128), 31.0 * 2f32.powi(-128)] {
        for k in -24i32..24 {
            let m = f32::from_bits((centre.to_bits() as i32 + k) as u32);
            v.push(m * random_sign(rng));
            v.extend((1..QK).map(|_| m * (rng.uniform() as f32 * 2.0 - 1.0)));
        }
    }
    cases.push(legacy_case("1/d near overflow", v));
    let v: Vec<f32> = (0..256 * QK)
        .map(|i| {
            let top = (i / QK) as u32 % 64 + 1;
            let bits = if i % QK == 0 { top } else { (rng.next_u64() as u32) % (top + 1) };
            f32::from_bits(bits | if rng.next_u64() & 1 == 0 { 0 } else { 0x8000_0000 })
        })
        .collect();
    cases.push(legacy_case("tiny subnormals", v));

    // Ranges that overflow f32 (max − min = inf) and ones just short of it.
    cases.push(legacy_case(
        "range overflow",
        per_legacy_block(16, |b, i| match i {
            0 => -f32::MAX / (1.0 + b as f32 * 0.05),
            1 => f32::MAX / (1.0 + b as f32 * 0.07),
            _ => f32::MAX * ((i as f32 / QK as f32) * 2.0 - 1.0),
        }),
    ));

    // Non-finite input (the encoders document finite input; x86-64 is still deterministic).
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN];
    let v = per_legacy_block(24, |b, i| match b % 6 {
        0 => specials[b / 6 % 4],
        1 => {
            if i == b % QK {
                specials[(b / 6) % 4]
            } else {
                (i as f32 - 15.5) * 0.1
            }
        }
        2 => {
            if i % 2 == 0 {
                f32::INFINITY
            } else {
                f32::NEG_INFINITY
            }
        }
        3 => {
            if i % 5 == 0 {
                f32::NAN
            } else {
                i as f32
            }
        }
        4 => {
            if i == 3 {
                f32::INFINITY
            } else {
                -(i as f32)
            }
        }
        _ => {
            if i == 7 {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        }
    });
    cases.push(legacy_case("non-finite", v));

    // Thousands of random 32-value blocks, each its own shape and scale.
    let random: Vec<f32> = (0..8192).flat_map(|_| random_block(rng, QK)).collect();
    cases.push(legacy_case("random legacy blocks", random));
    cases
}

/// Legacy blocks each holding `value(block index, index in block)`.
fn per_legacy_block(blocks: usize, mut value: impl FnMut(usize, usize) -> f32) -> Vec<f32> {
    (0..blocks * QK).map(|i| value(i / QK, i % QK)).collect()
}

#[test]
fn legacy_encoders_match_ggml_byte_for_byte() {
    let Some(llama) = llama_cpp_dir() else { return };
    let harness = Harness::build(&llama);
    // The K-quant cases (whole multiples of 32 too) and the legacy ones.
    let mut cases = cases();
    cases.extend(legacy_cases(&mut Rng(0x6c65_6761_6379)));
    let x86_64 = cfg!(target_arch = "x86_64");
    let mut failures = Vec::new();
    for kind in LEGACY {
        // On x86-64 every block must match; elsewhere C's undefined conversions may differ.
        let (blocks, excused) =
            compare(&harness, kind, &cases, |x| !x86_64 && legacy_cast_undefined(kind, x), &mut failures);
        assert!(blocks > 8192);
        let (mut ties, mut undefined) = (0usize, 0usize);
        for c in &cases {
            for block in c.values.chunks_exact(QK) {
                let (args, lo, hi) = legacy_cast_arguments(kind, block);
                ties += args.iter().filter(|a| a.is_finite() && a.fract() == 0.0).count();
                undefined += usize::from(args.iter().any(|&a| !(a > lo && a < hi)));
            }
        }
        assert!(ties > 10_000, "{}: only {ties} exact integer arguments", kind.name());
        assert!(undefined > 100, "{}: only {undefined} blocks with undefined conversions", kind.name());
        println!(
            "{}: {} cases, {blocks} blocks compared ({undefined} with conversions C leaves undefined, {excused} of \
             them differing and excused off x86-64); {ties} values exactly on integers before truncation",
            kind.name(),
            cases.len()
        );
    }
    assert!(failures.is_empty(), "{} mismatches with ggml:\n{}", failures.len(), failures.join("\n"));
}

/// C converts `roundf(x·id)` to `int8_t`, undefined where it does not fit: for a non-finite value
/// in the block (`id` is then 0 or NaN, or NaN slips past `MAX`) and where `1/d` overflows.
fn q8_0_cast_undefined(x: &[f32]) -> bool {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    x.iter().any(|v| !v.is_finite()) || (amax != 0.0 && !(127.0 / amax).is_finite())
}

#[test]
fn q8_0_encoder_matches_ggml_byte_for_byte() {
    let Some(llama) = llama_cpp_dir() else { return };
    let harness = Harness::build(&llama);
    // The K-quant cases (whole multiples of 32 too) and the legacy ones.
    let mut cases = cases();
    cases.extend(legacy_cases(&mut Rng(0x0808_0808)));
    let mut failures = Vec::new();
    let (blocks, excused) = compare(&harness, BlockType::Q8_0, &cases, q8_0_cast_undefined, &mut failures);
    println!("q8_0: {blocks} blocks, {excused} where C's conversion is undefined");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn iq4_nl_encoder_matches_ggml_byte_for_byte() {
    let Some(llama) = llama_cpp_dir() else { return };
    let harness = Harness::build(&llama);
    // The K-quant cases (whole multiples of 32 too) and the legacy ones, non-finite values included:
    // no step of the IQ4 search converts a float to an integer the way C leaves undefined.
    let mut cases = cases();
    cases.extend(legacy_cases(&mut Rng(0x1a4_0a1)));
    let mut failures = Vec::new();
    // Where the search's sums overflow (a term w·q·x is x²·127·x at most), the scale is a NaN the
    // CPU makes (inf − inf, inf/inf): its sign is the CPU's (negative on x86-64, positive on
    // aarch64), and the harness runs ggml on the host.
    let nan_scale =
        |x: &[f32]| !cfg!(target_arch = "x86_64") && x.iter().any(|v| !(v * v * v.abs() * 127.0).is_finite());
    let (blocks, _) = compare(&harness, BlockType::IQ4_NL, &cases, nan_scale, &mut failures);
    assert!(blocks > 8192);
    println!("iq4_nl: {} cases, {blocks} blocks compared", cases.len());
    assert!(failures.is_empty(), "{} mismatches with ggml:\n{}", failures.len(), failures.join("\n"));
}
