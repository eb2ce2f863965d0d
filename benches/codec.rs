//! Decode and reconstruction speed in ns per weight (median of several runs, and the minimum).
//!
//! `cargo bench --bench codec [-- decode | reconstruct]`. Decoding is single-threaded, 8 tiles per
//! call. The reconstruction case is a 5120×17408 (IC×OC) K=3 MCG linear with random codes: decode,
//! both Hadamards, scales and the conversion's own bf16 encoding (`quant::dense::encode`), on one
//! thread and then on two (rayon, one 128-row block per task).

use escha_convert::codec::simd::PortableDecoder;
use escha_convert::codec::{self, bytes_per_tile, Codebook, ScalarDecoder, TileDecoder, TILE_LEN};
use escha_convert::quant::dense;
use escha_convert::rng::SplitMix64;
use escha_convert::transform::CodedLinear;
use rayon::prelude::*;
use safetensors::Dtype;
use std::hint::black_box;
use timing::{ns_per_weight, Stat};

mod timing;

const IC: usize = 5120;
const OC: usize = 17408;
const K: u32 = 3;
/// Tiles per decode call, as `CodedLinear::reconstruct_block` asks for them.
const TILES_PER_CALL: usize = 8;

/// `n` bytes from the crate's seeded generator.
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(n);
    v
}

fn decode_ns(decoder: &dyn TileDecoder, code: &[u8], k: u32, cb: Codebook, reps: usize) -> Stat {
    let call_bytes = TILES_PER_CALL * bytes_per_tile(k);
    let tiles = code.len() / bytes_per_tile(k);
    let mut out = vec![0f32; TILES_PER_CALL * TILE_LEN];
    ns_per_weight(reps, tiles * TILE_LEN, || {
        for chunk in code.chunks_exact(call_bytes) {
            decoder.decode_tiles(black_box(chunk), k, cb, &mut out);
            black_box(&mut out);
        }
    })
}

/// Scale vectors of about the size of real folded `rin·s_in` values (±0.03).
fn scales(n: usize, seed: u64) -> Vec<f32> {
    random_bytes(2 * n, seed)
        .chunks_exact(2)
        .map(|b| (u16::from_le_bytes([b[0], b[1]]) as f32 - 32768.0) * 1e-6)
        .collect()
}

/// Reconstructs output block `b` of `lin` and encodes it as bf16 bytes into `out`, as a
/// conversion's work unit does.
fn reconstruct_bf16(lin: &CodedLinear, decoder: &dyn TileDecoder, block_buf: &mut [f32], b: usize, out: &mut Vec<u8>) {
    lin.reconstruct_block(decoder, b, block_buf);
    out.clear();
    dense::encode(block_buf, Dtype::BF16, out);
}

fn main() {
    // `cargo bench --bench codec -- decode` (or `reconstruct`) runs one part only.
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |part: &str| filter.is_empty() || filter.iter().any(|f| part.contains(f.as_str()));
    let simd = codec::best_decoder();
    println!("decoder: {}", simd.name());
    let code = random_bytes(IC / 16 * OC / 16 * bytes_per_tile(K), 1);

    if wanted("decode") {
        decode_benches(simd, &code);
    }
    if wanted("reconstruct") {
        reconstruct_benches(simd, &code);
    }
}

fn decode_benches(simd: &dyn TileDecoder, code: &[u8]) {
    println!("\nsingle-thread decode, K={K}, {TILES_PER_CALL} tiles per call (ns/weight, median):");
    let slice = &code[..32768 * bytes_per_tile(K)];
    let scalar = decode_ns(&ScalarDecoder, slice, K, Codebook::Mcg, 7);
    let portable = decode_ns(&PortableDecoder, slice, K, Codebook::Mcg, 7);
    println!("  scalar   MCG   {scalar}");
    println!("  portable MCG   {portable}");
    for cb in codec::ALL_CODEBOOKS {
        let t = decode_ns(simd, slice, K, cb, 15);
        println!("  {:8} {:5} {t}", simd.name(), cb.name());
    }
    let simd_mcg = decode_ns(simd, slice, K, Codebook::Mcg, 15);
    println!("  {} is {:.1}x scalar (MCG, medians)", simd.name(), scalar.median / simd_mcg.median);
    print!("  {} MCG by K, medians:", simd.name());
    for k in codec::K_RANGE {
        let codes = random_bytes(32768 * bytes_per_tile(k), 4);
        print!("  K={k} {:.3}", decode_ns(simd, &codes, k, Codebook::Mcg, 7).median);
    }
    println!();
}

fn reconstruct_benches(simd: &dyn TileDecoder, code: &[u8]) {
    let su = scales(IC, 2);
    let sv = scales(OC, 3);
    let lin = CodedLinear { code, k: K, codebook: Codebook::Mcg, su: &su, sv: &sv };
    let block_len = 128 * IC;
    let mut out: Vec<Vec<u8>> = (0..OC / 128).map(|_| Vec::with_capacity(2 * block_len)).collect();
    println!("\nfull reconstruction {IC}x{OC} (IC x OC), K={K} MCG, to bf16 (ns/weight, median):");
    let mut buf = vec![0f32; block_len];
    let single = ns_per_weight(5, IC * OC, || {
        for (b, rows) in out.iter_mut().enumerate() {
            reconstruct_bf16(&lin, simd, &mut buf, b, rows);
        }
    });
    println!("  1 thread   {single}");
    let single_out = out.clone();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let par = ns_per_weight(5, IC * OC, || {
        pool.install(|| {
            out.par_iter_mut()
                .enumerate()
                .for_each_init(|| vec![0f32; block_len], |buf, (b, rows)| reconstruct_bf16(&lin, simd, buf, b, rows));
        });
    });
    println!("  2 threads  {par}");
    println!("  per core on 2 threads: {:.3}, speed-up {:.2}x (medians)", 2.0 * par.median, single.median / par.median);
    assert!(out == single_out, "the two runs disagree");
}
