//! A fingerprint of an input checkpoint: what tells two inputs apart without reading every byte.
//! Two downloads of one model agree on it wherever they live (Hub cache or plain directory);
//! another model, another revision or a changed file disagrees (every retrain changes the sampled
//! weights). Recorded in each output's marker, so the parts of a split job made from different
//! inputs cannot be merged.

use super::input::Checkpoint;
use sha2::{Digest, Sha256};

/// Bytes sampled from each shard's data, in blocks of [`SAMPLE`] bytes evenly spread.
const SAMPLES: usize = 16;
const SAMPLE: usize = 4096;

impl Checkpoint {
    /// SHA-256 (hex) of config.json and, shard by shard in the order the index or directory gives,
    /// each shard's length, its whole header and `SAMPLES` blocks of its data.
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        let config = self.config.as_ref().map(ToString::to_string).unwrap_or_default();
        h.update((config.len() as u64).to_le_bytes());
        h.update(config.as_bytes());
        for shard in &self.shards {
            let bytes = shard.bytes();
            h.update((bytes.len() as u64).to_le_bytes());
            let header = bytes.get(..8).map_or(0, |p| u64::from_le_bytes(p.try_into().expect("8 bytes")));
            let data_start = usize::try_from(header).map_or(bytes.len(), |n| n.saturating_add(8).min(bytes.len()));
            h.update(&bytes[..data_start]);
            let data = &bytes[data_start..];
            for i in 0..SAMPLES {
                let start = data.len().saturating_sub(SAMPLE) * i / (SAMPLES - 1);
                h.update(&data[start..(start + SAMPLE).min(data.len())]);
            }
        }
        crate::text::hex(&h.finalize())
    }
}
