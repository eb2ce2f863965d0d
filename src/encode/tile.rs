//! Tail-biting Viterbi encoder for one 16×16 tile: plain squared error, no Hessian.
//!
//! Consecutive trellis states overlap in `16−K` bits, so the search runs over *edges*, the
//! `2^(16−K)` possible overlaps. `cost_t[e]` is the least squared error of a path whose state at
//! position `t` has low bits `e`. That state is one of the `2^K` values `hi << (16−K) | e`, and
//! its predecessor edge is the state shifted right by K (its high `16−K` bits).
//!
//! The stream is circular, so the path must wrap: `state(0) >> K == state(255) & (2^(16−K)−1)`.
//! As in exllamav3's quantizer, two passes enforce it. The first runs freely over the sequence
//! rotated by half a tile, so its best path crosses the wrap mid-sequence, where the choice is
//! well informed; that path fixes the wrap edge. The second runs over the plain sequence, starting
//! from that edge and forced to end on it.
//!
//! Each step evaluates all 65536 states (`2^(16−K)` edges × `2^K` high bits). The loops run over
//! fixed-size chunks of edges so that the compiler vectorises them; the same code is compiled a
//! second time for AVX2 and chosen at run time. Running costs keep 23−K mantissa bits (the low K
//! bits carry the argmin, see `step_edges`); exllamav3 searches with fp16 costs, far coarser.
//! The error this returns is computed exactly from the chosen path.

use crate::codec::tile::{bytes_per_tile, pack_states, K_RANGE, PERM, STATE_BITS, TILE_LEN};
use crate::codec::Codebook;
use half::f16;

/// Edges evaluated together: a power of two, so a chunk never straddles a group of edges that share
/// a predecessor, and no more than the 256 edges of K=8. 64 measured fastest (wide enough to hide
/// latencies, small enough for the running minima to stay in registers).
const LANES: usize = 64;
/// Rotation of the first pass.
const HALF_TILE: usize = TILE_LEN / 2;

/// Encodes tiles at one bit width and codebook; holds the codebook as f32 and the search scratch.
pub struct TileEncoder {
    k: u32,
    /// Codebook value of every state.
    values: Vec<f32>,
    /// Two cost vectors (previous and current position), `2^(16−K)` edges each.
    cost: Vec<f32>,
    /// Per step and edge, the high K bits of the best state: `TILE_LEN × 2^(16−K)`.
    back: Vec<u8>,
}

impl TileEncoder {
    pub fn new(k: u32, cb: Codebook) -> Self {
        assert!(K_RANGE.contains(&k), "K = {k} is outside 1..=8");
        let values = cb.table().iter().map(|&b| f16::from_bits(b).to_f32()).collect();
        let edges = 1usize << (STATE_BITS - k);
        Self { k, values, cost: vec![0.0; 2 * edges], back: vec![0; TILE_LEN * edges] }
    }

    /// Codes 256 target values given in tile element order (index `16·row + col`, row = input-feature
    /// offset, the order `codec::decode_inner` yields) and writes the stored tile bytes (`16K`
    /// little-endian int16 words) to `out`. Returns the sum of squared errors of the decoded tile.
    pub fn encode_tile(&mut self, tile: &[f32; TILE_LEN], out: &mut [u8]) -> f64 {
        assert_eq!(out.len(), bytes_per_tile(self.k), "output size");
        assert!(tile.iter().all(|v| v.is_finite()), "tile targets must be finite");
        let targets: [f32; TILE_LEN] = std::array::from_fn(|t| tile[PERM[t] as usize]);
        let states = self.search(&targets);
        pack_states(&states, self.k, out);
        // Summed in tile element order, so a caller recomputing it from a decode gets the same bits.
        let mut decoded = [0f32; TILE_LEN];
        for (t, &s) in states.iter().enumerate() {
            decoded[PERM[t] as usize] = self.values[s as usize];
        }
        decoded.iter().zip(tile).map(|(&d, &w)| (d as f64 - w as f64).powi(2)).sum()
    }

    /// The best tail-biting path for targets in trellis order.
    fn search(&mut self, targets: &[f32; TILE_LEN]) -> [u16; TILE_LEN] {
        match self.k {
            1 => self.search_k::<1>(targets),
            2 => self.search_k::<2>(targets),
            3 => self.search_k::<3>(targets),
            4 => self.search_k::<4>(targets),
            5 => self.search_k::<5>(targets),
            6 => self.search_k::<6>(targets),
            7 => self.search_k::<7>(targets),
            8 => self.search_k::<8>(targets),
            _ => unreachable!("K checked in new"),
        }
    }

    fn search_k<const K: u32>(&mut self, targets: &[f32; TILE_LEN]) -> [u16; TILE_LEN] {
        let edge_bits = STATE_BITS - K;
        let edges = 1usize << edge_bits;
        let state_of = |hi: u8, e: usize| ((hi as usize) << edge_bits) | e;

        // Pass 1: rotated, free start. Trace back from the best end to sequence position 0 only.
        self.cost[..edges].fill(0.0);
        forward::<K>(&self.values, targets, HALF_TILE, &mut self.cost, &mut self.back);
        let final_cost = &self.cost[..edges];
        let mut e = (0..edges).fold(0, |b, i| if final_cost[i] < final_cost[b] { i } else { b });
        for step in (HALF_TILE..TILE_LEN).rev() {
            e = state_of(self.back[step * edges + e], e) >> K;
        }
        let wrap = e;

        // Pass 2: the path leaves edge `wrap` before position 0 and ends on it at position 255.
        self.cost[..edges].fill(f32::INFINITY);
        self.cost[wrap] = 0.0;
        forward::<K>(&self.values, targets, 0, &mut self.cost, &mut self.back);
        let mut states = [0u16; TILE_LEN];
        let mut e = wrap;
        for (step, s) in states.iter_mut().enumerate().rev() {
            let state = state_of(self.back[step * edges + e], e);
            *s = state as u16;
            e = state >> K;
        }
        debug_assert_eq!(e, wrap, "the path must wrap");
        states
    }
}

/// Runs the 256 steps of one pass, position `(step + roll) mod 256` at step `step`. Costs start
/// in `cost[..edges]` and end there (the two halves alternate, and the step count is even).
fn forward<const K: u32>(values: &[f32], targets: &[f32; TILE_LEN], roll: usize, cost: &mut [f32], back: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { forward_avx2::<K>(values, targets, roll, cost, back) };
    }
    forward_generic::<K>(values, targets, roll, cost, back);
}

/// The same code compiled for AVX2, whose 8-wide vectors (and unsigned min) the baseline lacks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn forward_avx2<const K: u32>(
    values: &[f32],
    targets: &[f32; TILE_LEN],
    roll: usize,
    cost: &mut [f32],
    back: &mut [u8],
) {
    forward_generic::<K>(values, targets, roll, cost, back);
}

#[inline(always)]
fn forward_generic<const K: u32>(
    values: &[f32],
    targets: &[f32; TILE_LEN],
    roll: usize,
    cost: &mut [f32],
    back: &mut [u8],
) {
    let edges = 1usize << (STATE_BITS - K);
    let (a, b) = cost.split_at_mut(edges);
    for (step, back) in back.chunks_exact_mut(edges).enumerate() {
        let w = targets[(step + roll) % TILE_LEN];
        if step % 2 == 0 {
            step_edges::<K>(values, w, a, b, back);
        } else {
            step_edges::<K>(values, w, b, a, back);
        }
    }
}

/// One trellis step: `next[e] = min over hi of prev[state >> K] + (value[state] − w)²` with
/// `state = hi << (16−K) | e`, and the minimising `hi` (the smallest, on ties) in `back[e]`.
#[inline(always)]
fn step_edges<const K: u32>(values: &[f32], w: f32, prev: &[f32], next: &mut [f32], back: &mut [u8]) {
    let edge_bits = (STATE_BITS - K) as usize;
    let fan_in = 1usize << K;
    // Predecessor edges of the states with one `hi` form a block of this length.
    let prev_block = 1usize << (edge_bits - K as usize);
    let hi_mask = (1u32 << K) - 1;
    for chunk in 0..next.len() / LANES {
        let e0 = chunk * LANES;
        let mut best = [u32::MAX; LANES];
        for hi in 0..fan_in {
            let v: &[f32; LANES] = values[(hi << edge_bits) + e0..][..LANES].try_into().unwrap();
            let p0 = hi * prev_block + (e0 >> K);
            // Each predecessor serves 2^K consecutive edges; at K ≥ 6 one serves the whole chunk
            // (a splat; spelled out because the general form then compiles to scalar stores).
            let p: [f32; LANES] = if 1 << K >= LANES {
                [prev[p0]; LANES]
            } else {
                let p = &prev[p0..p0 + (LANES >> K)];
                std::array::from_fn(|l| p[l >> K])
            };
            for l in 0..LANES {
                let d = v[l] - w;
                let c = p[l] + d * d;
                // Costs are never negative, so their bits order like the values. Putting `hi` in the
                // low mantissa bits makes one integer min yield both the cost and its argument.
                let key = (c.to_bits() & !hi_mask) | hi as u32;
                best[l] = best[l].min(key);
            }
        }
        for l in 0..LANES {
            next[e0 + l] = f32::from_bits(best[l] & !hi_mask);
            back[e0 + l] = (best[l] & hi_mask) as u8;
        }
    }
}
