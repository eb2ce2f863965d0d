//! What every container provides to the planner and the writer.

use crate::layout::OutputTensor;
use anyhow::Result;
use serde_json::{Map, Value};
use std::path::Path;

/// One shard file before its tensor data is written: the header bytes (written at offset 0),
/// the absolute offset of each tensor's data, and the file's final length.
#[derive(Clone, Debug)]
pub struct ShardLayout {
    pub header: Vec<u8>,
    pub offsets: Vec<u64>,
    pub len: u64,
}

pub trait Container: Sync {
    /// The file name of shard `i` of `n` (0-based `i`).
    fn shard_name(&self, i: usize, n: usize) -> String;

    /// Lays out a shard holding `tensors` in this order, tagged `tag`. Deterministic: the same
    /// tensors give the same bytes.
    fn shard_layout(&self, tensors: &[&OutputTensor], tag: &str) -> ShardLayout;

    /// The index file, if the container has one: its name and text. `weight_map` pairs every
    /// tensor name with its shard file; `metadata` is added to the container's own.
    fn index(
        &self,
        weight_map: &[(&str, &str)],
        total_size: u64,
        metadata: Map<String, Value>,
    ) -> Option<(String, String)>;

    /// Reads a written shard back and checks that it holds exactly `tensors` as laid out: a
    /// file that any reader of the container accepts.
    fn check_written(&self, path: &Path, tensors: &[&OutputTensor]) -> Result<()>;
}
