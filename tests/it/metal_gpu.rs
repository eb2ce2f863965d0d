//! The Metal backend on a real GPU (macOS, `--features metal`): bit-identical to the scalar decoder
//! on golden tiles, random tiles for every K × codebook, every codebook state, large multi-chunk
//! calls, unaligned inputs (the copy path), concurrent callers, and a whole reconstructed linear.
//!
//! On Linux, scripts/check-metal-on-linux.sh type-checks this file (cfg `escha_metal_typecheck`).
#![cfg(all(feature = "metal", any(target_os = "macos", escha_metal_typecheck)))]

use crate::kernel_cases::{self, TileSet};
use escha_convert::backend::metal::CHUNK_TILES;
use escha_convert::backend::{Backend, BackendKind, MetalDecoder};
use escha_convert::codec::{bytes_per_tile, Codebook, ScalarDecoder, TileDecoder, TILE_LEN};
use escha_convert::transform::CodedLinear;
use rayon::prelude::*;

/// Every call goes to the GPU, however small.
fn gpu() -> MetalDecoder {
    MetalDecoder::new().expect("this test needs a Metal GPU").with_min_gpu_tiles(1)
}

fn decode(d: &dyn TileDecoder, set: &TileSet) -> Vec<f32> {
    let mut out = vec![f32::NAN; set.tiles() * TILE_LEN];
    d.decode_tiles(&set.bytes, set.k, set.cb, &mut out);
    out
}

#[test]
fn metal_backend_is_selected_by_name() {
    let b = Backend::new(BackendKind::Metal).expect("a Metal GPU");
    assert_eq!(b.name(), "metal");
    eprintln!("Metal device: {:?}", b);
}

#[test]
fn golden_tiles_decode_bit_exactly_on_the_gpu() {
    let m = gpu();
    for set in kernel_cases::golden() {
        kernel_cases::assert_bit_exact(&set, &decode(&m, &set), "metal");
    }
    assert!(m.gpu_ok());
}

#[test]
fn random_tiles_decode_bit_exactly_for_every_k_and_codebook() {
    let m = gpu();
    for set in kernel_cases::random(300) {
        kernel_cases::assert_bit_exact(&set, &decode(&m, &set), "metal");
    }
    assert!(m.gpu_ok());
}

#[test]
fn every_state_of_every_codebook_decodes_bit_exactly() {
    let m = gpu();
    for set in kernel_cases::all_states().into_iter().chain(kernel_cases::constant_tiles()) {
        kernel_cases::assert_bit_exact(&set, &decode(&m, &set), "metal");
    }
    assert!(m.gpu_ok());
}

#[test]
fn calls_larger_than_one_dispatch_are_split_and_stay_exact() {
    let m = gpu();
    for (k, cb) in [(2, Codebook::Mcg), (3, Codebook::Mul1), (8, Codebook::ThreeInst)] {
        let mut set = kernel_cases::random(1).into_iter().find(|s| s.k == k && s.cb == cb).unwrap();
        let one = set.bytes.clone();
        // 2.5 dispatches' worth: several chunks in flight, and a short last one.
        let tiles = 2 * CHUNK_TILES + CHUNK_TILES / 2 + 3;
        set.bytes = (0..tiles)
            .flat_map(|i| one.iter().enumerate().map(move |(j, &b)| b ^ (i as u8).wrapping_mul(31) ^ (j as u8)))
            .collect();
        kernel_cases::assert_bit_exact(&set, &decode(&m, &set), "metal, multi-chunk");
    }
    assert!(m.gpu_ok());
}

#[test]
fn unaligned_and_offset_inputs_stay_exact() {
    let m = gpu();
    for set in kernel_cases::random(37).into_iter().filter(|s| s.cb == Codebook::Mcg) {
        let want = set.reference();
        for shift in [0usize, 1, 2, 3, 4, 8, 4096 + 4] {
            let mut buf = vec![0xEEu8; set.bytes.len() + shift + 16];
            buf[shift..shift + set.bytes.len()].copy_from_slice(&set.bytes);
            let mut got = vec![f32::NAN; want.len()];
            m.decode_tiles(&buf[shift..shift + set.bytes.len()], set.k, set.cb, &mut got);
            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "metal: {} shifted by {shift} bytes", set.label);
        }
    }
    assert!(m.gpu_ok());
}

#[test]
fn concurrent_callers_share_one_decoder() {
    let m = gpu();
    let sets = kernel_cases::random(64);
    sets.par_iter().for_each(|set| {
        for _ in 0..4 {
            kernel_cases::assert_bit_exact(set, &decode(&m, set), "metal, concurrent");
        }
    });
    assert!(m.gpu_ok());
}

#[test]
fn small_calls_below_the_threshold_are_exact_too() {
    let m = MetalDecoder::new().expect("a Metal GPU"); // default threshold: small calls on the CPU
    for set in kernel_cases::golden() {
        kernel_cases::assert_bit_exact(&set, &decode(&m, &set), "metal (CPU below threshold)");
    }
}

#[test]
fn a_reconstructed_linear_is_identical_with_the_gpu() {
    let m = gpu();
    let (ic, oc, k) = (256usize, 384usize, 2u32);
    let set =
        kernel_cases::random((ic / 16) * (oc / 16)).into_iter().find(|s| s.k == k && s.cb == Codebook::Mcg).unwrap();
    assert_eq!(set.bytes.len(), (ic / 16) * (oc / 16) * bytes_per_tile(k));
    let su: Vec<f32> = (0..ic).map(|i| if i % 3 == 0 { -0.01 } else { 0.02 }).collect();
    let sv: Vec<f32> = (0..oc).map(|i| 0.5 + (i % 7) as f32 * 0.125).collect();
    let lin = CodedLinear { code: &set.bytes, k, codebook: Codebook::Mcg, su: &su, sv: &sv };
    let want = lin.reconstruct(&ScalarDecoder, oc, ic);
    let got = lin.reconstruct(&m, oc, ic);
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(m.gpu_ok());
}
