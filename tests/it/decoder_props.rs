//! Every fast decoder against the scalar reference, bit for bit, on random and exhaustive tiles.

use crate::common::Rng;
use escha_convert::codec::simd::PortableDecoder;
use escha_convert::codec::{
    self, bytes_per_tile, tile, Codebook, ScalarDecoder, TileDecoder, ALL_CODEBOOKS, K_RANGE, TILE_LEN,
};
use half::f16;
use proptest::prelude::*;

/// Every decoder that can run here, other than the reference, each once. The portable decoder is
/// the one shipped on `x86_64` without AVX2 and on other targets, so it is tested everywhere.
fn fast_decoders() -> Vec<&'static dyn TileDecoder> {
    let mut v: Vec<&'static dyn TileDecoder> = vec![&PortableDecoder];
    let best = codec::best_decoder();
    if !v.iter().any(|d| d.name() == best.name()) {
        v.push(best);
    }
    v
}

fn decode(d: &dyn TileDecoder, bytes: &[u8], k: u32, cb: Codebook) -> Vec<u32> {
    let mut out = vec![f32::NAN; bytes.len() / bytes_per_tile(k) * TILE_LEN];
    d.decode_tiles(bytes, k, cb, &mut out);
    out.iter().map(|v| v.to_bits()).collect()
}

fn states(d: &dyn TileDecoder, bytes: &[u8], k: u32) -> Vec<u16> {
    let mut out = vec![0u16; bytes.len() / bytes_per_tile(k) * TILE_LEN];
    d.states(bytes, k, &mut out);
    out
}

/// Values and states of every fast decoder equal the reference's, on one run of tiles.
fn assert_same_as_scalar(bytes: &[u8], k: u32, cb: Codebook) {
    let want_values = decode(&ScalarDecoder, bytes, k, cb);
    let want_states = states(&ScalarDecoder, bytes, k);
    for d in fast_decoders() {
        assert_eq!(decode(d, bytes, k, cb), want_values, "{} values, K={k} {}", d.name(), cb.name());
        assert_eq!(states(d, bytes, k), want_states, "{} states, K={k}", d.name());
    }
}

#[test]
fn random_runs_of_tiles_match_the_reference_for_every_k_and_codebook() {
    let mut rng = Rng(0x5EED);
    for k in K_RANGE {
        for cb in ALL_CODEBOOKS {
            for tiles in [1, 2, 3, 8, 9] {
                let bytes = rng.bytes(tiles * bytes_per_tile(k));
                assert_same_as_scalar(&bytes, k, cb);
            }
        }
    }
}

#[test]
fn states_obey_the_overlap_rule_and_repack_to_the_stored_bytes() {
    let mut rng = Rng(7);
    for k in K_RANGE {
        let bytes = rng.bytes(8 * bytes_per_tile(k));
        for d in std::iter::once(&ScalarDecoder as &dyn TileDecoder).chain(fast_decoders()) {
            let all = states(d, &bytes, k);
            for (tile_bytes, s) in bytes.chunks_exact(bytes_per_tile(k)).zip(all.chunks_exact(TILE_LEN)) {
                assert_eq!(tile::overlap_violations(s, k), 0, "{} K={k}", d.name());
                let mut packed = vec![0u8; bytes_per_tile(k)];
                tile::pack_states(s, k, &mut packed);
                assert_eq!(packed, tile_bytes, "{} K={k}: pack(unpack(words)) != words", d.name());
            }
        }
    }
}

/// K=8 tiles whose symbols alternate `hi, lo0, hi, lo1, …`: state `(hi << 8) | lo` occurs at every
/// odd position. Two tiles per `hi` cover all 65536 states.
#[test]
fn every_state_decodes_to_its_codebook_value() {
    let k = 8;
    let mut bytes = Vec::new();
    let mut expected = Vec::new(); // (position in the decoded output, state)
    for hi in 0..=255u8 {
        for half in 0..2u16 {
            let mut stream = [0u8; 256];
            for i in 0..128 {
                let lo = (half * 128 + i) as u8;
                stream[2 * i as usize] = hi;
                stream[2 * i as usize + 1] = lo;
                let tile = bytes.len() / bytes_per_tile(k);
                expected.push((tile * TILE_LEN + 2 * i as usize + 1, u16::from_be_bytes([hi, lo])));
            }
            // Stream bytes are stored as little-endian u32 words.
            for word in stream.chunks_exact(4) {
                bytes.extend([word[3], word[2], word[1], word[0]]);
            }
        }
    }
    assert_eq!(expected.len(), 65536);
    for d in std::iter::once(&ScalarDecoder as &dyn TileDecoder).chain(fast_decoders()) {
        let st = states(d, &bytes, k);
        for &(pos, s) in &expected {
            assert_eq!(st[pos], s, "{} state at {pos}", d.name());
        }
        for cb in ALL_CODEBOOKS {
            let values = decode(d, &bytes, k, cb);
            for &(pos, s) in &expected {
                let want = f16::from_bits(cb.value_bits(s)).to_f32().to_bits();
                assert_eq!(values[pos], want, "{} {} state {s:#06x}", d.name(), cb.name());
            }
        }
    }
}

fn tiles_strategy() -> impl Strategy<Value = (u32, usize, Vec<u8>)> {
    (1u32..=8, 0usize..3, 1usize..=9).prop_flat_map(|(k, cb, tiles)| {
        (Just(k), Just(cb), proptest::collection::vec(any::<u8>(), tiles * bytes_per_tile(k)))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn fast_decoders_equal_the_reference((k, cb, bytes) in tiles_strategy()) {
        assert_same_as_scalar(&bytes, k, ALL_CODEBOOKS[cb]);
    }

    #[test]
    fn pack_inverts_state_extraction((k, _cb, bytes) in tiles_strategy()) {
        for d in fast_decoders() {
            let all = states(d, &bytes, k);
            for (tile_bytes, s) in bytes.chunks_exact(bytes_per_tile(k)).zip(all.chunks_exact(TILE_LEN)) {
                prop_assert_eq!(tile::overlap_violations(s, k), 0);
                let mut packed = vec![0u8; bytes_per_tile(k)];
                tile::pack_states(s, k, &mut packed);
                prop_assert_eq!(&packed[..], tile_bytes);
            }
        }
    }
}
