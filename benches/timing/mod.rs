//! Timing shared by the benchmarks: ns per weight over repeated runs, median and minimum.

use std::time::Instant;

/// Median and minimum of repeated wall-clock timings; the minimum shows what other load on the
/// machine hides.
#[derive(Clone, Copy)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
}

impl std::fmt::Display for Stat {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{:6.3} (min {:6.3})", self.median, self.min)
    }
}

/// Times `reps` runs of `f` (after one warm-up run: page faults, lazily built tables, thread pool
/// start), in ns per weight.
pub fn ns_per_weight(reps: usize, weights: usize, mut f: impl FnMut()) -> Stat {
    f();
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e9 / weights as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    Stat { median: times[reps / 2], min: times[0] }
}
