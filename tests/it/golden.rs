//! Bit-exact decoding of the independently produced golden tiles and of the documented vectors.

// Literals below are exact decimal expansions of fp16 values, hence their many digits.
#![allow(clippy::excessive_precision)]

use crate::common::{fixture, words_to_bytes};
use escha_convert::codec::{self, tile, Codebook, ScalarDecoder, TileDecoder, PERM, TILE_LEN};
use half::f16;
use serde_json::Value;

struct GoldenTile {
    k: u32,
    cb: Codebook,
    words: Vec<u16>,
    states: Vec<u16>,
    values_rowmajor_bits: Vec<u16>,
}

fn golden_tiles() -> Vec<GoldenTile> {
    let mut files: Vec<_> = std::fs::read_dir(fixture("golden"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 10, "expected the ten golden files");
    let mut tiles = Vec::new();
    for path in files {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let k = doc["K"].as_u64().unwrap() as u32;
        let cb = Codebook::from_id(doc["cb"].as_i64().unwrap()).unwrap();
        let perm: Vec<u8> =
            doc["tensor_core_perm"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u8).collect();
        assert_eq!(perm, PERM.to_vec(), "{}: permutation", path.display());
        let list = |v: &Value| -> Vec<u16> {
            v.as_array().unwrap().iter().map(|x| (x.as_i64().unwrap() & 0xFFFF) as u16).collect()
        };
        for t in doc["tiles"].as_array().unwrap() {
            tiles.push(GoldenTile {
                k,
                cb,
                words: list(&t["words_i16"]),
                states: list(&t["states_u16_trellis_order"]),
                values_rowmajor_bits: list(&t["values_f16_bits_rowmajor"]),
            });
        }
    }
    tiles
}

/// The reference, the portable decoder and the one the converter picks here (the vector decoder
/// where the CPU has vectors); each once.
fn all_decoders() -> Vec<&'static dyn TileDecoder> {
    let mut v: Vec<&'static dyn TileDecoder> = vec![&ScalarDecoder, &codec::simd::PortableDecoder];
    let best = codec::best_decoder();
    if !v.iter().any(|d| d.name() == best.name()) {
        v.push(best);
    }
    v
}

#[test]
fn every_golden_tile_decodes_bit_exactly_with_every_decoder() {
    let tiles = golden_tiles();
    assert_eq!(tiles.len(), 24);
    for decoder in all_decoders() {
        for (n, g) in tiles.iter().enumerate() {
            let bytes = words_to_bytes(&g.words);
            assert_eq!(bytes.len(), codec::bytes_per_tile(g.k));
            let mut states = vec![0u16; TILE_LEN];
            decoder.states(&bytes, g.k, &mut states);
            assert_eq!(states, g.states, "{} states, tile {n}, K={} {}", decoder.name(), g.k, g.cb.name());
            let inner = codec::decode_inner(decoder, &bytes, 1, 1, g.k, g.cb);
            let bits: Vec<u16> = inner.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
            assert_eq!(bits, g.values_rowmajor_bits, "{} values, tile {n}, K={} {}", decoder.name(), g.k, g.cb.name());
        }
    }
}

#[test]
fn golden_tiles_obey_the_overlap_rule_and_repack_to_their_words() {
    for g in golden_tiles() {
        assert_eq!(tile::overlap_violations(&g.states, g.k), 0);
        let mut packed = vec![0u8; codec::bytes_per_tile(g.k)];
        tile::pack_states(&g.states, g.k, &mut packed);
        assert_eq!(packed, words_to_bytes(&g.words));
    }
}

/// The real-checkpoint vector: layer 0, expert 0, `mlp.experts.gate_up_proj`, tile [0, 0], K=2, MCG.
#[test]
fn real_checkpoint_test_vector() {
    let words: [u16; 32] = [
        17306, 23673, 17721, 8298, 30284, 37780, 11190, 65313, 62638, 7569, 24420, 46439, 33879, 51555, 44741, 64370,
        7988, 27160, 22813, 57471, 57599, 33229, 54809, 28588, 45070, 5627, 62389, 10510, 41066, 20219, 12929, 50458,
    ];
    let bytes = words_to_bytes(&words);
    for decoder in all_decoders() {
        let mut states = [0u16; TILE_LEN];
        decoder.states(&bytes, 2, &mut states);
        assert_eq!(&states[..8], &[51717, 10261, 41047, 33116, 1393, 5575, 22302, 23673]);
        assert_eq!(states[0] >> 2, states[255] & 0x3FFF, "tail-biting");

        let inner = codec::decode_inner(decoder, &bytes, 1, 1, 2, Codebook::Mcg);
        let first_bits: Vec<u16> = (0..8).map(|t| f16::from_f32(inner[PERM[t] as usize]).to_bits()).collect();
        assert_eq!(first_bits, [0xBBFC, 0xBDC0, 0xB57E, 0xBEF0, 0x35F4, 0x3DB3, 0x391C, 0x3ABF]);
        let row0 = [
            -0.998046875,
            0.9609375,
            0.259765625,
            0.08837890625,
            0.50390625,
            0.55419921875,
            -1.1611328125,
            0.197265625,
            0.3720703125,
            -0.7607421875,
            0.173828125,
            -0.44921875,
            0.7392578125,
            0.161376953125,
            1.005859375,
            0.5888671875,
        ];
        assert_eq!(&inner[..16], &row0);
        let col0 = [
            -0.998046875,
            -1.4375,
            0.599609375,
            -1.3740234375,
            0.8759765625,
            1.11328125,
            0.0947265625,
            0.2890625,
            -0.34326171875,
            -1.734375,
            -1.79296875,
            0.7294921875,
            -0.80078125,
            0.68359375,
            -0.1240234375,
            -0.281982421875,
        ];
        let col: Vec<f32> = (0..16).map(|r| inner[16 * r]).collect();
        assert_eq!(col, col0);
        let sum: f64 = inner.iter().map(|&v| v as f64).sum();
        assert_eq!(sum, 5.2772216796875);
    }
}

/// The synthetic worked example: all words zero except stored word 1 = 0x1234.
#[test]
fn worked_example() {
    let mut words = vec![0u16; 48];
    words[1] = 0x1234;
    for decoder in all_decoders() {
        let mut states = [0u16; TILE_LEN];
        decoder.states(&words_to_bytes(&words[..32]), 2, &mut states);
        assert_eq!(&states[..10], &[0x0000, 0x0001, 0x0004, 0x0012, 0x0048, 0x0123, 0x048D, 0x1234, 0x48D0, 0x2340]);
        decoder.states(&words_to_bytes(&words), 3, &mut states);
        assert_eq!(&states[..8], &[0x0000, 0x0004, 0x0024, 0x0123, 0x091A, 0x48D0, 0x4680, 0x3400]);
    }
}
