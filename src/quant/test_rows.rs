//! Random rows for the kernel tests of every block encoder: 256-value super-blocks at scales
//! from 1e-30 to 1e30, and proptest elements with many exact ties.

use crate::rng::SplitMix64;
use proptest::prelude::*;

/// A random 256-value super-block: a distribution, a scale from 1e-30 to 1e30, sometimes a spread
/// of scales over its groups of `group` values, an outlier, zeros.
pub fn random_block(rng: &mut SplitMix64, group: usize) -> Vec<f32> {
    const LEN: usize = 256;
    let scale = 10f32.powf(rng.uniform() as f32 * 60.0 - 30.0);
    let kind = rng.next_u64() % 6;
    let spread = rng.next_u64().is_multiple_of(3);
    let group_scales: Vec<f32> =
        (0..LEN / group).map(|_| if spread { 10f32.powf(rng.uniform() as f32 * 6.0 - 3.0) } else { 1.0 }).collect();
    let gaussian = |rng: &mut SplitMix64| rng.gaussian() as f32;
    let mut b: Vec<f32> = (0..LEN)
        .map(|i| {
            let v = match kind {
                0 | 1 => gaussian(rng),
                2 => rng.uniform() as f32 * 2.0 - 1.0,
                3 => rng.uniform() as f32,
                4 => ((rng.next_u64() % 33) as f32 - 16.0) / 8.0,
                _ => gaussian(rng) * gaussian(rng),
            };
            v * scale * group_scales[i / group]
        })
        .collect();
    if rng.next_u64().is_multiple_of(4) {
        let at = (rng.next_u64() % LEN as u64) as usize;
        b[at] *= 50.0;
    }
    if rng.next_u64().is_multiple_of(5) {
        for _ in 0..rng.next_u64() % 40 {
            let at = (rng.next_u64() % LEN as u64) as usize;
            b[at] = if rng.next_u64().is_multiple_of(2) { 0.0 } else { -0.0 };
        }
    }
    b
}

/// An element: mostly ordinary weights, often exact multiples of ⅛ (many ties), sometimes a
/// signed zero or a finite value of any magnitude.
pub fn element() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -1.0f32..1.0,
        3 => (-24i32..24).prop_map(|i| i as f32 / 8.0),
        1 => any::<u32>().prop_map(f32::from_bits).prop_filter("finite", |v| v.is_finite()),
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
    ]
}
