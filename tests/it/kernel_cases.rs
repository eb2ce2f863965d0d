//! Tile sets that every tile-decode backend must get bit-exactly right: the golden tiles, random
//! tiles for every K and codebook, and K=8 tiles that reach all 65536 states of each codebook.
//! Shared by the kernel tests (`metal_kernel_shim.rs` on the CPU, `metal_gpu.rs` on a Mac).
#![allow(dead_code)]

use escha_convert::codec::{
    bytes_per_tile, tile, Codebook, ScalarDecoder, TileDecoder, ALL_CODEBOOKS, K_RANGE, PERM, TILE_LEN,
};
use serde_json::Value;
use std::path::PathBuf;

/// Consecutive tiles of one K and codebook, as stored bytes.
pub struct TileSet {
    pub label: String,
    pub k: u32,
    pub cb: Codebook,
    pub bytes: Vec<u8>,
    /// Expected fp16 bits per tile in row-major order, when an independent source gives them.
    pub expected_rowmajor_bits: Option<Vec<Vec<u16>>>,
}

impl TileSet {
    pub fn tiles(&self) -> usize {
        self.bytes.len() / bytes_per_tile(self.k)
    }

    /// The scalar reference decode, trellis order.
    pub fn reference(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.tiles() * TILE_LEN];
        ScalarDecoder.decode_tiles(&self.bytes, self.k, self.cb, &mut out);
        out
    }
}

fn words_to_bytes(words: &[u16]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Every tile of `fixtures/golden/*.json`, one set per file.
pub fn golden() -> Vec<TileSet> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no golden files in {}", dir.display());
    let list = |v: &Value| -> Vec<u16> {
        v.as_array().unwrap().iter().map(|x| (x.as_i64().unwrap() & 0xFFFF) as u16).collect()
    };
    files
        .iter()
        .map(|path| {
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            let k = doc["K"].as_u64().unwrap() as u32;
            let cb = Codebook::from_id(doc["cb"].as_i64().unwrap()).unwrap();
            let mut bytes = Vec::new();
            let mut expected = Vec::new();
            for t in doc["tiles"].as_array().unwrap() {
                bytes.extend(words_to_bytes(&list(&t["words_i16"])));
                expected.push(list(&t["values_f16_bits_rowmajor"]));
            }
            TileSet {
                label: path.file_name().unwrap().to_string_lossy().into_owned(),
                k,
                cb,
                bytes,
                expected_rowmajor_bits: Some(expected),
            }
        })
        .collect()
}

/// `tiles` random tiles for every K in 1..=8 and every codebook (`SplitMix64`, fixed seed).
pub fn random(tiles: usize) -> Vec<TileSet> {
    let mut state = 0x5EED_0F7E_1115_u64;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut sets = Vec::new();
    for k in K_RANGE {
        for cb in ALL_CODEBOOKS {
            let bytes = (0..tiles * bytes_per_tile(k)).map(|_| next() as u8).collect();
            sets.push(TileSet {
                label: format!("random K={k} {}", cb.name()),
                k,
                cb,
                bytes,
                expected_rowmajor_bits: None,
            });
        }
    }
    sets
}

/// K=8 tiles whose states, taken together, are all 65536 values, for every codebook: so the kernel's
/// codebook arithmetic is checked on the whole table, not a sample.
pub fn all_states() -> Vec<TileSet> {
    // At K=8, state(t) = sym(t-1) << 8 | sym(t). Symbols h, j0, h, j1, … give the states
    // (h, j) at odd positions; 128 values of j per tile, so two tiles per h.
    let mut bytes = Vec::new();
    let mut syms = [0u16; TILE_LEN];
    let mut packed = vec![0u8; bytes_per_tile(8)];
    for h in 0..256u16 {
        for half in 0..2u16 {
            for (t, s) in syms.iter_mut().enumerate() {
                *s = if t % 2 == 0 { h } else { 128 * half + (t as u16) / 2 };
            }
            tile::pack_states(&syms, 8, &mut packed);
            bytes.extend_from_slice(&packed);
        }
    }
    ALL_CODEBOOKS
        .iter()
        .map(|&cb| TileSet {
            label: format!("all states K=8 {}", cb.name()),
            k: 8,
            cb,
            bytes: bytes.clone(),
            expected_rowmajor_bits: None,
        })
        .collect()
}

/// All-zero and all-one tiles for every K and codebook (the extreme windows).
pub fn constant_tiles() -> Vec<TileSet> {
    let mut sets = Vec::new();
    for k in K_RANGE {
        for cb in ALL_CODEBOOKS {
            let mut bytes = vec![0u8; bytes_per_tile(k)];
            bytes.extend(vec![0xFFu8; bytes_per_tile(k)]);
            sets.push(TileSet {
                label: format!("constant K={k} {}", cb.name()),
                k,
                cb,
                bytes,
                expected_rowmajor_bits: None,
            });
        }
    }
    sets
}

/// Checks that `got` (trellis order, as a backend produced it) is bit-identical to the scalar
/// reference and, where the set has them, to the independently published fp16 values.
pub fn assert_bit_exact(set: &TileSet, got: &[f32], who: &str) {
    let want = set.reference();
    assert_eq!(got.len(), want.len(), "{who}: {}: length", set.label);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{who}: {}: tile {} position {}: got {g} ({:#010x}), scalar decoder gives {w} ({:#010x})",
            set.label,
            i / TILE_LEN,
            i % TILE_LEN,
            g.to_bits(),
            w.to_bits()
        );
    }
    if let Some(expected) = &set.expected_rowmajor_bits {
        for (n, (tile_vals, bits)) in got.chunks_exact(TILE_LEN).zip(expected).enumerate() {
            for (t, v) in tile_vals.iter().enumerate() {
                let want = half::f16::from_bits(bits[PERM[t] as usize]).to_f32();
                assert_eq!(v.to_bits(), want.to_bits(), "{who}: {}: golden tile {n} position {t}", set.label);
            }
        }
    }
}

/// The sets every backend test runs: golden, random (all K × codebook), all states, constants.
pub fn all_sets(random_tiles: usize) -> Vec<TileSet> {
    let mut sets = golden();
    sets.extend(random(random_tiles));
    sets.extend(all_states());
    sets.extend(constant_tiles());
    sets
}
