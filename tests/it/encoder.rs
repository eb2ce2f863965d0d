//! The Viterbi tile encoder and the whole-weight encoder, checked through the decoders.
//!
//! The MSE bounds come from the format document (§15): on Gaussian tiles the trellis lands about
//! 1.08–1.13× above the Shannon bound `2^−2K` at K = 2 and 3. A decoder with a layout error
//! lands nowhere near it, which the deliberately broken decoders below confirm.

use crate::common::Rng;
use escha_convert::codec::tile::{self, pack_states, stream_words, tile_states, INV_PERM};
use escha_convert::codec::{self, bytes_per_tile, Codebook, ScalarDecoder, TileDecoder, ALL_CODEBOOKS, PERM, TILE_LEN};
use escha_convert::encode::TileEncoder;
use escha_convert::encode::{encode_linear, EncodedLinear};
use escha_convert::transform::CodedLinear;
use std::sync::OnceLock;

/// Gaussian tiles with the codebook's RMS, and their codes.
struct Coded {
    k: u32,
    cb: Codebook,
    targets: Vec<[f32; TILE_LEN]>,
    /// `targets.len()` tiles, stored back to back: an `[n, 1]` tile grid.
    code: Vec<u8>,
    /// The encoder's reported squared error per tile.
    sse: Vec<f64>,
}

fn gaussian_tile(rng: &mut Rng, rms: f32) -> [f32; TILE_LEN] {
    std::array::from_fn(|_| rng.gaussian() as f32 * rms)
}

fn encode_gaussian(k: u32, cb: Codebook, tiles: usize, seed: u64) -> Coded {
    let mut rng = Rng(seed);
    let mut encoder = TileEncoder::new(k, cb);
    let targets: Vec<_> = (0..tiles).map(|_| gaussian_tile(&mut rng, cb.rms())).collect();
    let mut code = vec![0u8; tiles * bytes_per_tile(k)];
    let sse = targets
        .iter()
        .zip(code.chunks_exact_mut(bytes_per_tile(k)))
        .map(|(t, out)| encoder.encode_tile(t, out))
        .collect();
    Coded { k, cb, targets, code, sse }
}

/// Squared error of each decoded tile against its target, summed in tile element order.
fn decoded_sse(decoder: &dyn TileDecoder, c: &Coded) -> Vec<f64> {
    let decoded = codec::decode_inner(decoder, &c.code, c.targets.len(), 1, c.k, c.cb);
    decoded
        .chunks_exact(TILE_LEN)
        .zip(&c.targets)
        .map(|(d, t)| d.iter().zip(t).map(|(&d, &t)| (d as f64 - t as f64).powi(2)).sum())
        .collect()
}

/// Round-trip MSE per unit variance, as a multiple of the Shannon bound `2^−2K`.
fn mse_over_bound(decoder: &dyn TileDecoder, c: &Coded) -> f64 {
    let n = (c.targets.len() * TILE_LEN) as f64;
    let mse = decoded_sse(decoder, c).iter().sum::<f64>() / n / (c.cb.rms() as f64).powi(2);
    mse / 2f64.powi(-2 * c.k as i32)
}

fn assert_near_bound(c: &Coded, hi: f64) {
    let ratio = mse_over_bound(&ScalarDecoder, c);
    assert!(
        (1.0..=hi).contains(&ratio),
        "{} K={}: MSE is {ratio:.4}× the bound, expected within [1, {hi}]",
        c.cb.name(),
        c.k
    );
}

fn mcg_k2() -> &'static Coded {
    static CODED: OnceLock<Coded> = OnceLock::new();
    CODED.get_or_init(|| encode_gaussian(2, Codebook::Mcg, 64, 0x5EED_0002))
}

#[test]
fn mcg_round_trip_mse_is_near_the_trellis_figures() {
    assert_near_bound(mcg_k2(), 1.15);
    assert_near_bound(&encode_gaussian(3, Codebook::Mcg, 64, 0x5EED_0003), 1.25);
}

#[test]
fn three_inst_and_mul1_round_trip_mse_is_near_the_trellis_figures_at_k2() {
    assert_near_bound(&encode_gaussian(2, Codebook::ThreeInst, 64, 0x5EED_1002), 1.15);
    assert_near_bound(&encode_gaussian(2, Codebook::Mul1, 64, 0x5EED_2002), 1.15);
}

#[test]
fn reported_error_is_the_decoded_error_and_the_path_is_a_valid_trellis_at_every_k() {
    let mut rng = Rng(0xC0DE);
    for k in 1..=8 {
        for cb in ALL_CODEBOOKS {
            let tiles = if k == 8 { 1 } else { 2 };
            let c = encode_gaussian(k, cb, tiles, rng.next_u64());
            assert_eq!(decoded_sse(&ScalarDecoder, &c), c.sse, "{} K={k}: reported error", cb.name());
            let mut states = [0u16; TILE_LEN];
            for tile_bytes in c.code.chunks_exact(bytes_per_tile(k)) {
                tile_states(tile_bytes, k, &mut states);
                assert_eq!(tile::overlap_violations(&states, k), 0, "{} K={k}: overlap rule", cb.name());
                let mut repacked = vec![0u8; bytes_per_tile(k)];
                pack_states(&states, k, &mut repacked);
                assert_eq!(repacked, tile_bytes, "{} K={k}: pack/unpack", cb.name());
            }
        }
    }
}

#[test]
fn extreme_tiles_still_give_valid_codes() {
    let mut encoder = TileEncoder::new(2, Codebook::Mcg);
    let mut out = vec![0u8; bytes_per_tile(2)];
    // All zero, far outside the codebook's range, and overflowing the f32 squared error.
    for fill in [0.0f32, 100.0, -1e30] {
        let tile = [fill; TILE_LEN];
        let sse = encoder.encode_tile(&tile, &mut out);
        let decoded = codec::decode_inner(&ScalarDecoder, &out, 1, 1, 2, Codebook::Mcg);
        let want: f64 = decoded.iter().map(|&d| (d as f64 - fill as f64).powi(2)).sum();
        assert_eq!(sse, want, "fill {fill}");
        let mut states = [0u16; TILE_LEN];
        tile_states(&out, 2, &mut states);
        assert_eq!(tile::overlap_violations(&states, 2), 0, "fill {fill}");
    }
}

/// Reads the window that *starts* at stream bit `tK` instead of ending at `(t+1)K`.
struct WindowStartsAtTk;

impl TileDecoder for WindowStartsAtTk {
    fn name(&self) -> &'static str {
        "window-starts-at-tK"
    }

    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        let (words, total_bits) = (8 * k as usize, 256 * k as usize);
        for (tile_bytes, values) in bytes.chunks_exact(bytes_per_tile(k)).zip(out.chunks_exact_mut(TILE_LEN)) {
            let u = stream_words(tile_bytes, k);
            for (t, v) in values.iter_mut().enumerate() {
                let start = (t * k as usize) % total_bits;
                let (a, off) = (start >> 5, start & 31);
                let x = ((u[a] as u64) << 32) | u[(a + 1) % words] as u64;
                *v = cb.value(((x >> (48 - off)) & 0xFFFF) as u16);
            }
        }
    }
}

/// Scatters value `t` to tile element `INV_PERM[t]` instead of `PERM[t]`.
struct ScattersWithInvPerm;

impl TileDecoder for ScattersWithInvPerm {
    fn name(&self) -> &'static str {
        "scatters-with-INV_PERM"
    }

    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        ScalarDecoder.decode_tiles(bytes, k, cb, out);
        for values in out.chunks_exact_mut(TILE_LEN) {
            let mut tile = [0f32; TILE_LEN];
            for (t, &v) in values.iter().enumerate() {
                tile[INV_PERM[t] as usize] = v;
            }
            // decode_inner scatters output s to element PERM[s]: hand it the broken tile that way.
            for (s, v) in values.iter_mut().enumerate() {
                *v = tile[PERM[s] as usize];
            }
        }
    }
}

#[test]
fn broken_decoders_land_far_from_the_bound() {
    let c = mcg_k2();
    for decoder in [&WindowStartsAtTk as &dyn TileDecoder, &ScattersWithInvPerm] {
        let ratio = mse_over_bound(decoder, c);
        assert!(ratio > 1.5, "{}: MSE only {ratio:.3}× the bound", decoder.name());
    }
}

fn gaussian_weight(rng: &mut Rng, out_features: usize, in_features: usize) -> Vec<f32> {
    (0..out_features * in_features).map(|_| rng.gaussian() as f32 * 0.02).collect()
}

fn reconstruct(w: &EncodedLinear, k: u32, oc: usize, ic: usize) -> Vec<f32> {
    let su: Vec<f32> = w.rin.iter().map(|v| v.to_f32()).collect();
    let sv: Vec<f32> = w.rout.iter().map(|v| v.to_f32()).collect();
    let lin = CodedLinear { code: &w.code, k, codebook: Codebook::Mcg, su: &su, sv: &sv };
    lin.reconstruct(codec::best_decoder(), oc, ic)
}

#[test]
fn encoded_linear_reconstructs_within_the_trellis_bound() {
    let (oc, ic) = (256, 384);
    let w = gaussian_weight(&mut Rng(0x11_2233), oc, ic);
    for (k, hi) in [(2, 1.15), (3, 1.25)] {
        let enc = encode_linear(&w, oc, ic, k, Codebook::Mcg, 7);
        assert_eq!(enc.code.len(), ic / 16 * oc / 16 * bytes_per_tile(k));
        assert_eq!((enc.rin.len(), enc.rout.len()), (ic, oc));
        let got = reconstruct(&enc, k, oc, ic);
        let err: f64 = got.iter().zip(&w).map(|(&g, &x)| (g as f64 - x as f64).powi(2)).sum();
        let norm: f64 = w.iter().map(|&x| (x as f64).powi(2)).sum();
        let ratio = (err / norm).sqrt() / 2f64.powi(-(k as i32));
        assert!((1.0..=hi).contains(&ratio), "K={k}: relative error {ratio:.4}× 2^-K, expected within [1, {hi}]");
    }
}

#[test]
fn zero_output_channel_is_pruned_and_encoding_is_deterministic() {
    let (oc, ic, dead) = (128, 128, 37);
    let mut w = gaussian_weight(&mut Rng(0x44_5566), oc, ic);
    w[dead * ic..(dead + 1) * ic].fill(0.0);
    let enc = encode_linear(&w, oc, ic, 2, Codebook::Mcg, 11);
    assert_eq!(enc.rout[dead].to_bits(), 0, "rout of the dead channel");
    assert!(enc.rout.iter().enumerate().all(|(o, v)| o == dead || v.to_f32() != 0.0));
    let got = reconstruct(&enc, 2, oc, ic);
    assert!(got[dead * ic..(dead + 1) * ic].iter().all(|&v| v == 0.0), "dead row must decode to exactly zero");

    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let again = one_thread.install(|| encode_linear(&w, oc, ic, 2, Codebook::Mcg, 11));
    assert!(again == enc, "same seed, one thread: identical output");
    let other = encode_linear(&w, oc, ic, 2, Codebook::Mcg, 12);
    assert_ne!(other.code, enc.code, "another seed flips other signs");
}
