//! Bit layout of one 16×16 trellis tile: stored words, trellis states, tensor-core permutation.
//!
//! A tile holds 16·K int16 words. Read as little-endian u32 words they form one circular,
//! MSB-first stream of 256·K bits; the state of trellis position `t` is the 16-bit window that
//! *ends* at stream bit `(t+1)·K`. Value `t` lands at tile element `PERM[t] = 16·row + col`,
//! where `row` is the input-feature offset and `col` the output-feature offset.

/// Weights per tile edge.
pub const TILE_EDGE: usize = 16;
/// Weights (and trellis positions) per tile.
pub const TILE_LEN: usize = 256;
/// Bits per trellis state.
pub const STATE_BITS: u32 = 16;
/// The bit widths the codec supports.
pub const K_RANGE: std::ops::RangeInclusive<u32> = 1..=8;

/// Stored int16 words per tile at `k` bits per weight.
pub const fn words_per_tile(k: u32) -> usize {
    16 * k as usize
}

/// Bytes per tile at `k` bits per weight.
pub const fn bytes_per_tile(k: u32) -> usize {
    32 * k as usize
}

/// Trellis position → tile element (`16·row + col`): the mma B-fragment order.
pub const PERM: [u8; TILE_LEN] = {
    let mut p = [0u8; TILE_LEN];
    let mut s = 0;
    while s < TILE_LEN {
        let row = 2 * ((s >> 3) & 3) + (s & 1) + 8 * ((s >> 1) & 1);
        let col = (s >> 5) + 8 * ((s >> 2) & 1);
        p[s] = (16 * row + col) as u8;
        s += 1;
    }
    p
};

/// Tile element (`16·row + col`) → trellis position; the inverse of [`PERM`].
pub const INV_PERM: [u8; TILE_LEN] = {
    let mut q = [0u8; TILE_LEN];
    let mut s = 0;
    while s < TILE_LEN {
        q[PERM[s] as usize] = s as u8;
        s += 1;
    }
    q
};

/// The tile's words paired into its `8K` little-endian u32 stream words
/// (`U[m] = W[2m] | W[2m+1] << 16`); entries past `8K` are zero.
pub fn stream_words(tile_bytes: &[u8], k: u32) -> [u32; 64] {
    let mut u = [0u32; 64];
    for (m, w) in u.iter_mut().take(8 * k as usize).enumerate() {
        let b = &tile_bytes[4 * m..4 * m + 4];
        *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    u
}

/// State of trellis position `t`, given the tile's `8K` stream words.
#[inline]
pub fn state_at(u: &[u32], k: u32, t: usize) -> u16 {
    let total_bits = 256 * k as usize;
    let n_words = 8 * k as usize;
    let start = ((t + 1) * k as usize + total_bits - STATE_BITS as usize) % total_bits;
    let (a, off) = (start >> 5, start & 31);
    let x = ((u[a] as u64) << 32) | u[(a + 1) % n_words] as u64;
    ((x >> (48 - off)) & 0xFFFF) as u16
}

/// All 256 states of one tile in trellis order.
pub fn tile_states(tile_bytes: &[u8], k: u32, out: &mut [u16]) {
    let u = stream_words(tile_bytes, k);
    let n = 8 * k as usize;
    for (t, s) in out[..TILE_LEN].iter_mut().enumerate() {
        *s = state_at(&u[..n], k, t);
    }
}

/// Writes the stored bytes of a tile whose trellis states are `states`.
///
/// Only the low K bits of each state (its symbol) are stored; the states must form a consistent
/// tail-biting path for `tile_states(pack_states(s)) == s` to hold.
pub fn pack_states(states: &[u16], k: u32, out: &mut [u8]) {
    let n_words = 8 * k as usize;
    let mut u = [0u32; 64];
    let mask = (1u32 << k) - 1;
    for (t, &s) in states[..TILE_LEN].iter().enumerate() {
        let sym = s as u32 & mask;
        for b in 0..k as usize {
            // Symbol t occupies stream bits [tK, tK+K), most significant bit first.
            let p = t * k as usize + b;
            let bit = (sym >> (k as usize - 1 - b)) & 1;
            u[p >> 5] |= bit << (31 - (p & 31));
        }
    }
    for (m, w) in u[..n_words].iter().enumerate() {
        out[4 * m..4 * m + 4].copy_from_slice(&w.to_le_bytes());
    }
}

/// The bitshift-trellis overlap rule: the low `16−K` bits of state `t` equal the high `16−K` bits
/// of state `t+1`, circularly. Returns the number of positions where it fails (0 for a valid tile).
pub fn overlap_violations(states: &[u16], k: u32) -> usize {
    let keep = STATE_BITS - k;
    let low = (1u32 << keep) - 1;
    (0..TILE_LEN)
        .filter(|&t| {
            let a = states[t] as u32 & low;
            let b = states[(t + 1) % TILE_LEN] as u32 >> k;
            a != b
        })
        .count()
}

/// Whether a tile's states obey the overlap rule at every position: `overlap_violations == 0`,
/// without a branch per position, so that it vectorises (about 40 times faster).
pub fn obeys_overlap(states: &[u16], k: u32) -> bool {
    let s: &[u16; TILE_LEN] = states[..TILE_LEN].try_into().unwrap();
    let low = ((1u32 << (STATE_BITS - k)) - 1) as u16;
    let mut differ = (s[TILE_LEN - 1] & low) ^ (s[0] >> k);
    for (&a, &b) in s[..TILE_LEN - 1].iter().zip(&s[1..]) {
        differ |= (a & low) ^ (b >> k);
    }
    differ == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn obeys_overlap_agrees_with_the_count() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for k in K_RANGE {
            let bytes: Vec<u8> = (0..bytes_per_tile(k)).map(|_| next() as u8).collect();
            let mut states = [0u16; TILE_LEN];
            tile_states(&bytes, k, &mut states);
            assert!(obeys_overlap(&states, k));
            for _ in 0..64 {
                let mut broken = states;
                let t = next() as usize % TILE_LEN;
                broken[t] ^= 1 << (next() % 16);
                assert_eq!(obeys_overlap(&broken, k), overlap_violations(&broken, k) == 0, "K={k} t={t}");
            }
        }
    }

    fn words_to_bytes(words: &[u16]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn permutation_matches_the_documented_rows() {
        assert_eq!(&PERM[..8], &[0, 16, 128, 144, 8, 24, 136, 152]);
        assert_eq!(&PERM[248..], &[103, 119, 231, 247, 111, 127, 239, 255]);
        // Inverse closed form from the format document.
        for r in 0..16 {
            for c in 0..16 {
                let s = 32 * (c & 7) + 8 * ((r >> 1) & 3) + 4 * (c >> 3) + 2 * (r >> 3) + (r & 1);
                assert_eq!(INV_PERM[16 * r + c] as usize, s);
            }
        }
    }

    #[test]
    fn k2_state_8m_plus_7_is_stored_word_m_xor_1() {
        let words: Vec<u16> = (0..32u16).map(|i| i.wrapping_mul(0x9E37) ^ 0x5A5A).collect();
        let mut states = [0u16; 256];
        tile_states(&words_to_bytes(&words), 2, &mut states);
        for m in 0..32 {
            assert_eq!(states[8 * m + 7], words[m ^ 1]);
        }
    }
}
