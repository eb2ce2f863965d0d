//! Worker threads: the rayon pool a command runs in, with `-j` kept to a sane bound.

use crate::warning::{Warning, WarningCode};
use anyhow::Result;

/// Threads per core beyond which `-j` only costs memory.
const MAX_PER_CORE: usize = 4;

/// A pool of `requested` threads (one per core when `None` or 0), capped at 4 per core with a
/// note in `notes`.
pub fn pool(requested: Option<usize>, notes: &mut Vec<Warning>) -> Result<rayon::ThreadPool> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let cap = MAX_PER_CORE * cores;
    let threads = match requested.filter(|&n| n > 0) {
        Some(n) if n > cap => {
            notes.push(Warning::new(
                WarningCode::ThreadsCapped,
                format!("-j {n} is more than {MAX_PER_CORE} per core: using {cap} threads"),
            ));
            cap
        }
        Some(n) => n,
        None => cores,
    };
    Ok(rayon::ThreadPoolBuilder::new().num_threads(threads).build()?)
}
