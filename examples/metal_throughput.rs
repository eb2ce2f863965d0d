//! Tile-decode throughput: the SIMD CPU decoder against the Metal kernel, on the same tensor, with
//! a bit-for-bit comparison of their outputs. See docs/METAL.md.
//!
//!     cargo run --release --features metal --example metal_throughput -- [CHECKPOINT [NAME]]
//!
//! With a checkpoint, decodes the code tensor of the coded linear whose name contains NAME (or the
//! largest one). Without, a synthetic K=2 MCG tensor of 2^18 tiles (64 Mi weights). Without the
//! `metal` feature it measures the CPU only.

use escha_convert::backend::MetalDecoder;
use escha_convert::checkpoint::{catalog, Checkpoint, Leaf};
use escha_convert::codec::{best_decoder, bytes_per_tile, Codebook, TileDecoder, TILE_LEN};
use rayon::prelude::*;
use std::path::Path;
use std::time::Instant;

/// Tiles per call in the "conversion-sized calls" rows: one 128-wide output block of a
/// 4096-wide input (256 tile rows × 8 tiles).
const UNIT_TILES: usize = 2048;
const REPEATS: usize = 3;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let checkpoint = args.first().map(|p| Checkpoint::open(Path::new(p))).transpose()?;
    let synthetic_code;
    let (label, k, cb, code): (String, u32, Codebook, &[u8]) = if let Some(ck) = &checkpoint {
        // The codes stay in the memory map, as in a conversion.
        pick(ck, args.get(1).map(String::as_str))?
    } else {
        synthetic_code = synthetic(1 << 18, 2);
        ("synthetic".into(), 2, Codebook::Mcg, &synthetic_code)
    };
    let tiles = code.len() / bytes_per_tile(k);
    println!("tensor: {label}: {tiles} tiles, K={k}, {}, {:.1} MB of codes", cb.name(), code.len() as f64 / 1e6);

    let cpu = best_decoder();
    let mut reference = vec![0f32; tiles * TILE_LEN];
    let threads = rayon::current_num_threads();
    report(&format!("{} CPU, 1 thread, one call", cpu.name()), tiles, || cpu.decode_tiles(code, k, cb, &mut reference));
    let mut out = vec![0f32; tiles * TILE_LEN];
    report(&format!("{} CPU, {threads} threads, calls of {UNIT_TILES} tiles", cpu.name()), tiles, || {
        par_calls(cpu, code, k, cb, &mut out);
    });

    match MetalDecoder::new() {
        Ok(m) => {
            let m = m.with_min_gpu_tiles(1);
            println!("Metal device: {}", m.device_name());
            let mut gpu = vec![0f32; tiles * TILE_LEN];
            report("metal, one call", tiles, || m.decode_tiles(code, k, cb, &mut gpu));
            check("metal, one call", &gpu, &reference);
            gpu.fill(0.0);
            report(&format!("metal, {threads} threads, calls of {UNIT_TILES} tiles"), tiles, || {
                par_calls(&m, code, k, cb, &mut gpu);
            });
            check("metal, calls of a unit", &gpu, &reference);
            if !m.gpu_ok() {
                println!("warning: the GPU reported an error; some tiles were decoded on the CPU");
            }
        }
        Err(e) => println!("metal: not measured: {e}"),
    }
    Ok(())
}

/// Decodes `code` in calls of `UNIT_TILES` tiles, spread over the rayon pool.
fn par_calls(d: &dyn TileDecoder, code: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
    code.par_chunks(UNIT_TILES * bytes_per_tile(k))
        .zip(out.par_chunks_mut(UNIT_TILES * TILE_LEN))
        .for_each(|(c, o)| d.decode_tiles(c, k, cb, o));
}

/// Best of `REPEATS` runs, as tiles/s and weights/s.
fn report(what: &str, tiles: usize, mut run: impl FnMut()) {
    let mut best = f64::INFINITY;
    for _ in 0..REPEATS {
        let t = Instant::now();
        run();
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{what:<48} {:>9.3} ms  {:>8.2} M tiles/s  {:>7.2} G weights/s",
        best * 1e3,
        tiles as f64 / best / 1e6,
        (tiles * TILE_LEN) as f64 / best / 1e9
    );
}

fn check(what: &str, got: &[f32], want: &[f32]) {
    let diff = got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    if diff == 0 {
        println!("{what}: bit-identical to the CPU decoder");
    } else {
        println!("{what}: {diff} values DIFFER from the CPU decoder");
        std::process::exit(1);
    }
}

fn pick<'a>(ck: &'a Checkpoint, name: Option<&str>) -> anyhow::Result<(String, u32, Codebook, &'a [u8])> {
    let cat = catalog(ck)?;
    let module = cat
        .coded
        .iter()
        .filter(|m| name.is_none_or(|n| m.path.contains(n)))
        .max_by_key(|m| ck.tensors[m.tensor(Leaf::Code).expect("a code tensor")].byte_len())
        .ok_or_else(|| anyhow::anyhow!("{}: no coded linear matches", ck.root.display()))?;
    let entry = &ck.tensors[module.tensor(Leaf::Code).expect("a code tensor")];
    Ok((module.path.clone(), module.k, module.codebook, ck.bytes(entry)))
}

fn synthetic(tiles: usize, k: u32) -> Vec<u8> {
    let mut s = 0x1234_5678_9ABC_DEF0u64;
    (0..tiles * bytes_per_tile(k))
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}
