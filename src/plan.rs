//! The output plan: every output tensor placed in a shard at a fixed byte offset, so the whole
//! output header is known before any weight is decoded and workers write straight into place.

use crate::layout::OutputTensor;
use serde_json::{json, Map, Value};

/// A tensor with its place in the output.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub tensor: OutputTensor,
    pub shard: usize,
    /// Absolute offset of its first byte in the shard file.
    pub offset: u64,
}

/// One output file: its name, full header (length prefix included) and final length.
#[derive(Clone, Debug)]
pub struct ShardPlan {
    pub file_name: String,
    pub header: Vec<u8>,
    pub len: u64,
    pub tensor_count: usize,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub tensors: Vec<PlannedTensor>,
    pub shards: Vec<ShardPlan>,
    /// Sum of tensor bytes (headers excluded), as `model.safetensors.index.json` reports it.
    pub total_size: u64,
}

/// Shard file name in the Hugging Face convention (1-based, five digits).
pub fn shard_file_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
}

impl Plan {
    /// Places `tensors` (already in output order) greedily into shards of at most `max_shard_size`
    /// tensor bytes; a tensor larger than the limit gets a shard of its own.
    pub fn new(tensors: Vec<OutputTensor>, max_shard_size: u64, format: &str) -> Plan {
        let mut groups: Vec<Vec<OutputTensor>> = Vec::new();
        let mut current = 0u64;
        for t in tensors {
            let size = t.byte_len() as u64;
            match groups.last_mut() {
                Some(g) if current + size <= max_shard_size => g.push(t),
                _ => {
                    groups.push(vec![t]);
                    current = 0;
                }
            }
            current += size;
        }
        let n = groups.len();
        let mut planned = Vec::new();
        let mut shards = Vec::new();
        let mut total_size = 0;
        for (i, group) in groups.into_iter().enumerate() {
            let header = header_bytes(&group, format);
            let mut offset = header.len() as u64;
            let tensor_count = group.len();
            for t in group {
                let len = t.byte_len() as u64;
                planned.push(PlannedTensor { tensor: t, shard: i, offset });
                offset += len;
                total_size += len;
            }
            shards.push(ShardPlan { file_name: shard_file_name(i, n), header, len: offset, tensor_count });
        }
        Plan { tensors: planned, shards, total_size }
    }

    /// `model.safetensors.index.json`: total size and a weight map sorted by name.
    pub fn index_json(&self) -> Value {
        let mut names: Vec<(&str, &str)> =
            self.tensors.iter().map(|p| (p.tensor.name.as_str(), self.shards[p.shard].file_name.as_str())).collect();
        names.sort();
        let map: Map<String, Value> = names.into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        json!({ "metadata": { "total_size": self.total_size }, "weight_map": map })
    }
}

/// A safetensors header in a fixed key order (metadata first, then tensors in data order),
/// padded with spaces to a multiple of 8 bytes, with its 8-byte length prefix.
fn header_bytes(tensors: &[OutputTensor], format: &str) -> Vec<u8> {
    let mut map = Map::new();
    map.insert("__metadata__".into(), json!({ "format": format }));
    let mut offset = 0usize;
    for t in tensors {
        let end = offset + t.byte_len();
        map.insert(
            t.name.clone(),
            json!({ "dtype": format!("{:?}", t.dtype), "shape": t.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut text = serde_json::to_string(&Value::Object(map)).expect("a JSON map serialises");
    while (8 + text.len()) % 8 != 0 {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out
}
