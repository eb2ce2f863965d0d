//! Codes a whole weight the simple way, so tests and fixtures can be made from known weights.
//!
//! This follows exllamav3's `regularize` without a Hessian (no LDLQ feedback, no global-scale
//! search): random signs and RMS scales per channel, a block Hadamard on both sides, then every
//! tile coded on its own by the Viterbi encoder. The inverse of what
//! [`crate::transform::CodedLinear`] computes:
//!
//! `W_inner[in, out] = Hn · diag(1/su) · Wᵀ · diag(1/sv) · Hn`, with `su = rin`, `sv = rout`.

use super::tile::TileEncoder;
use crate::codec::{bytes_per_tile, Codebook, TILE_EDGE, TILE_LEN};
use crate::rng::SplitMix64;
use crate::transform::hadamard::{fwht_across_rows, fwht_blocks, HADAMARD_SIZE};
use half::f16;
use rayon::prelude::*;

/// The stored tensors of one coded linear.
#[derive(Clone, Debug, PartialEq)]
pub struct EncodedLinear {
    /// Tile grid `[IC/16, OC/16, 16K]` as stored: little-endian int16 words.
    pub code: Vec<u8>,
    /// Input-side signs × scales, length IC.
    pub rin: Vec<f16>,
    /// Output-side signs × scales, length OC; exactly 0 for an all-zero output channel.
    pub rout: Vec<f16>,
}

/// Codes `w`, row-major `[out_features, in_features]` (nn.Linear orientation), both multiples of
/// 128, at `k` bits per weight. The same `seed` gives the same bytes, whatever the thread count.
pub fn encode_linear(
    w: &[f32],
    out_features: usize,
    in_features: usize,
    k: u32,
    cb: Codebook,
    seed: u64,
) -> EncodedLinear {
    let (oc, ic) = (out_features, in_features);
    assert!(oc % HADAMARD_SIZE == 0 && ic % HADAMARD_SIZE == 0, "dimensions must be multiples of 128");
    assert_eq!(w.len(), oc * ic, "weight size");
    assert!(w.iter().all(|v| v.is_finite()), "weights must be finite");

    let mut rng = SplitMix64(seed);
    let in_signs: Vec<f64> = (0..ic).map(|_| random_sign(&mut rng)).collect();
    let out_signs: Vec<f64> = (0..oc).map(|_| random_sign(&mut rng)).collect();

    // Output side: ±RMS / mean RMS. A zero channel gets exactly 0, which makes its reconstructed
    // row exactly zero (a prune mask).
    let out_rms: Vec<f64> = w.chunks_exact(ic).map(rms).collect();
    let mean_out = out_rms.iter().sum::<f64>() / oc as f64;
    let rout: Vec<f16> = out_rms
        .iter()
        .zip(&out_signs)
        .map(|(&r, &s)| if r == 0.0 { f16::ZERO } else { to_f16_nonzero(s * r / mean_out) })
        .collect();

    // x[i, o] = w[o, i] / sv[o]: transposed to the inner orientation, with the *rounded* scale so
    // that reconstruction multiplies back exactly what was divided out.
    let mut inner = vec![0f32; ic * oc];
    for (o, (row, sv)) in w.chunks_exact(ic).zip(&rout).enumerate() {
        let sv = sv.to_f32();
        if sv != 0.0 {
            for (i, &v) in row.iter().enumerate() {
                inner[i * oc + o] = v / sv;
            }
        }
    }

    // Input side: ±RMS of each input row, times one global factor that brings the RMS of the
    // inner matrix to the codebook's (the Hadamards preserve it).
    let in_rms: Vec<f64> = inner.chunks_exact(oc).map(rms).collect();
    let live_rows = in_rms.iter().filter(|&&r| r > 0.0).count().max(1);
    let global = cb.rms() as f64 * (ic as f64 / live_rows as f64).sqrt();
    // A dead input row has nothing to scale; the smallest live scale keeps its noise small.
    let dead_row_rms = in_rms.iter().copied().filter(|&r| r > 0.0).fold(f64::INFINITY, f64::min);
    let rin: Vec<f16> = in_rms
        .iter()
        .zip(&in_signs)
        .map(|(&r, &s)| {
            let r = if r > 0.0 {
                r
            } else if dead_row_rms.is_finite() {
                dead_row_rms
            } else {
                1.0
            };
            to_f16_nonzero(s * r / global)
        })
        .collect();
    for (row, su) in inner.chunks_exact_mut(oc).zip(&rin) {
        let su = su.to_f32();
        for v in row.iter_mut() {
            *v /= su;
        }
    }

    fwht_across_rows(&mut inner, oc); // Hn on the left: mixes input features
    fwht_blocks(&mut inner); // Hn on the right: mixes output channels
    let norm = 1.0 / HADAMARD_SIZE as f32; // both 1/√128 factors at once
    for v in &mut inner {
        *v *= norm;
    }

    let code = encode_tiles(&inner, ic, oc, k, cb);
    EncodedLinear { code, rin, rout }
}

/// Codes every tile of the inner matrix `[ic, oc]` into the stored grid `[ic/16, oc/16, 16K]`.
fn encode_tiles(inner: &[f32], ic: usize, oc: usize, k: u32, cb: Codebook) -> Vec<u8> {
    let out_tiles = oc / TILE_EDGE;
    let tile_bytes = bytes_per_tile(k);
    let mut code = vec![0u8; ic / TILE_EDGE * out_tiles * tile_bytes];
    code.par_chunks_mut(tile_bytes).enumerate().for_each_init(
        || TileEncoder::new(k, cb),
        |encoder, (index, out)| {
            let (ti, tj) = (index / out_tiles, index % out_tiles);
            let tile: [f32; TILE_LEN] = std::array::from_fn(|p| {
                let (r, c) = (p / TILE_EDGE, p % TILE_EDGE);
                inner[(TILE_EDGE * ti + r) * oc + TILE_EDGE * tj + c]
            });
            encoder.encode_tile(&tile, out);
        },
    );
    code
}

fn rms(v: &[f32]) -> f64 {
    (v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
}

/// Rounds to fp16, keeping the value finite and non-zero (it is divided by), sign included.
fn to_f16_nonzero(x: f64) -> f16 {
    let h = f16::from_f64(x.clamp(-f16::MAX.to_f64(), f16::MAX.to_f64()));
    if h.to_f64() == 0.0 {
        f16::from_f64(f16::MIN_POSITIVE_SUBNORMAL.to_f64().copysign(x))
    } else {
        h
    }
}

/// ±1 from the top bit of the next draw.
fn random_sign(rng: &mut SplitMix64) -> f64 {
    if rng.next_u64() >> 63 == 0 {
        1.0
    } else {
        -1.0
    }
}
