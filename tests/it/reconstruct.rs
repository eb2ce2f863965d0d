//! Reconstruction of a coded linear against a plain f64 matrix-product reference.

use crate::common::Rng;
use escha_convert::codec::{self, bytes_per_tile, Codebook, ScalarDecoder};
use escha_convert::transform::{fold_scales, CodedLinear};

/// `W[OC, IC] = diag(sv) · Hn · W_innerᵀ · Hn · diag(su)` by explicit matrix products in f64.
fn reference(inner: &[f32], ic: usize, oc: usize, su: &[f32], sv: &[f32]) -> Vec<f64> {
    let h = |i: usize, j: usize| -> f64 {
        if i / 128 != j / 128 {
            0.0
        } else if ((i % 128) & (j % 128)).count_ones().is_multiple_of(2) {
            1.0 / (128f64).sqrt()
        } else {
            -1.0 / (128f64).sqrt()
        }
    };
    // A = Hn(OC) · W_innerᵀ  → [OC, IC]
    let mut a = vec![0f64; oc * ic];
    for o in 0..oc {
        for p in (o / 128) * 128..(o / 128 + 1) * 128 {
            let hop = h(o, p);
            for i in 0..ic {
                a[o * ic + i] += hop * inner[i * oc + p] as f64;
            }
        }
    }
    // W = A · Hn(IC), then scales.
    let mut w = vec![0f64; oc * ic];
    for o in 0..oc {
        for i in 0..ic {
            let mut acc = 0.0;
            for q in (i / 128) * 128..(i / 128 + 1) * 128 {
                acc += a[o * ic + q] * h(q, i);
            }
            w[o * ic + i] = sv[o] as f64 * acc * su[i] as f64;
        }
    }
    w
}

#[derive(Clone, Copy)]
struct Case {
    experts: usize,
    ic_p: usize,
    oc_p: usize,
    ic: usize,
    oc: usize,
    k: u32,
    with_s: bool,
}

fn check(case: Case, seed: u64) {
    let mut rng = Rng(seed);
    let (it, ot) = (case.ic_p / 16, case.oc_p / 16);
    let per_expert = it * ot * bytes_per_tile(case.k);
    let code = rng.bytes(case.experts * per_expert);
    let mut uniform = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32).collect()
    };
    let rin = uniform(case.experts * case.ic_p, -0.05, 0.05);
    let rout = uniform(case.experts * case.oc_p, -1.5, 1.5);
    let s_in = uniform(case.experts * case.ic_p, 0.98, 1.02);
    let s_out = uniform(case.experts * case.oc_p, 0.98, 1.02);
    for e in 0..case.experts {
        let (ri, ro) = (&rin[e * case.ic_p..][..case.ic_p], &rout[e * case.oc_p..][..case.oc_p]);
        let (si, so) = (&s_in[e * case.ic_p..][..case.ic_p], &s_out[e * case.oc_p..][..case.oc_p]);
        let su = fold_scales(ri, case.with_s.then_some(si));
        let sv = fold_scales(ro, case.with_s.then_some(so));
        let lin = CodedLinear {
            code: &code[e * per_expert..(e + 1) * per_expert],
            k: case.k,
            codebook: Codebook::Mcg,
            su: &su,
            sv: &sv,
        };
        let got = lin.reconstruct(codec::best_decoder(), case.oc, case.ic);
        let inner = codec::decode_inner(&ScalarDecoder, lin.code, it, ot, case.k, Codebook::Mcg);
        let want_p = reference(&inner, case.ic_p, case.oc_p, &su, &sv);
        assert_eq!(got.len(), case.oc * case.ic);
        let (mut err, mut norm) = (0f64, 0f64);
        for o in 0..case.oc {
            for i in 0..case.ic {
                let (g, w) = (got[o * case.ic + i] as f64, want_p[o * case.ic_p + i]);
                err = err.max((g - w).abs());
                norm = norm.max(w.abs());
            }
        }
        assert!(err / norm < 2e-6, "expert {e}: max error {err} relative to max {norm}");
    }
}

#[test]
fn dense_linear_matches_the_f64_reference() {
    check(Case { experts: 1, ic_p: 256, oc_p: 384, ic: 256, oc: 384, k: 2, with_s: false }, 1);
}

#[test]
fn dense_linear_with_s_in_s_out_matches_the_f64_reference() {
    check(Case { experts: 1, ic_p: 384, oc_p: 256, ic: 384, oc: 256, k: 3, with_s: true }, 2);
}

#[test]
fn stacked_experts_match_the_f64_reference_each() {
    check(Case { experts: 3, ic_p: 256, oc_p: 128, ic: 256, oc: 128, k: 3, with_s: true }, 3);
    check(Case { experts: 2, ic_p: 128, oc_p: 256, ic: 128, oc: 256, k: 2, with_s: false }, 4);
}

#[test]
fn padded_linear_is_reconstructed_whole_then_sliced() {
    check(Case { experts: 1, ic_p: 256, oc_p: 256, ic: 200, oc: 250, k: 2, with_s: true }, 5);
    check(Case { experts: 2, ic_p: 384, oc_p: 128, ic: 300, oc: 100, k: 4, with_s: false }, 6);
}

/// The fast CPU decoder, asking for whole-strip batches the way an accelerator does.
struct Batched;

impl escha_convert::codec::TileDecoder for Batched {
    fn name(&self) -> &'static str {
        "batched"
    }
    fn prefers_large_batches(&self) -> bool {
        true
    }
    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        codec::best_decoder().decode_tiles(bytes, k, cb, out);
    }
}

#[test]
fn whole_strip_batches_and_single_squares_give_the_same_bits() {
    let mut rng = Rng(7);
    let (ic, oc, k) = (384, 256, 3);
    let code = rng.bytes(ic * oc * k as usize / 8);
    let su: Vec<f32> = (0..ic).map(|i| 0.01 + (i % 7) as f32 * 0.003).collect();
    let sv: Vec<f32> = (0..oc).map(|o| 1.0 - (o % 5) as f32 * 0.1).collect();
    let lin = CodedLinear { code: &code, k, codebook: Codebook::Mcg, su: &su, sv: &sv };
    let (mut a, mut b) = (vec![0f32; 128 * ic], vec![0f32; 128 * ic]);
    for block in 0..oc / 128 {
        lin.reconstruct_block(codec::best_decoder(), block, &mut a);
        lin.reconstruct_block(&Batched, block, &mut b);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        for c in 0..ic / 128 {
            let mut square = vec![0f32; 128 * 128];
            lin.reconstruct_square(&ScalarDecoder, block, c, &mut square, 128);
            for r in 0..128 {
                let want = &a[r * ic + 128 * c..][..128];
                assert_eq!(&square[r * 128..][..128], want, "block {block} square {c} row {r}");
            }
        }
        // One square at a time, in order, from one strip decode or from eight-tile calls.
        for decoder in [codec::best_decoder(), &Batched as &dyn codec::TileDecoder] {
            for squares in [0..ic / 128, 1..ic / 128, 2..3] {
                let mut seen = Vec::new();
                lin.for_each_square(decoder, block, squares.clone(), |c, square| {
                    seen.push(c);
                    for r in 0..128 {
                        let want = &a[r * ic + 128 * c..][..128];
                        assert_eq!(&square[r * 128..][..128], want, "{} block {block} square {c}", decoder.name());
                    }
                });
                assert_eq!(seen, squares.collect::<Vec<_>>());
            }
        }
    }
}
