//! What every container provides to the planner and the writer. A container sees tensors only as
//! names, storage types and shapes, and the file's metadata as typed key/value pairs.

use crate::storage::Storage;
use anyhow::Result;
use serde_json::{Map, Value};
use std::path::Path;

/// One tensor as a container lays it out.
#[derive(Clone, Copy, Debug)]
pub struct TensorInfo<'a> {
    pub name: &'a str,
    pub storage: Storage,
    /// Row-major, outermost first (torch order).
    pub shape: &'a [usize],
}

impl TensorInfo<'_> {
    pub fn byte_len(&self) -> usize {
        self.storage.byte_len(self.shape.iter().product())
    }
}

/// A metadata value. safetensors keeps only the top-level strings; GGUF keeps every type.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U16(u16),
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    Bool(bool),
    Str(String),
    Strings(Vec<String>),
    I32s(Vec<i32>),
    F32s(Vec<f32>),
    Bools(Vec<bool>),
}

/// File-level metadata, in the order it is written.
pub type Metadata = Vec<(String, MetaValue)>;

/// Where a shard stands in the output: shard `index` (0-based) of `count`, in an output of
/// `tensors_total` tensors.
#[derive(Clone, Copy, Debug)]
pub struct ShardAt {
    pub index: usize,
    pub count: usize,
    pub tensors_total: usize,
}

/// One shard file before its tensor data is written: the header bytes (written at offset 0),
/// the absolute offset of each tensor's data, and the file's final length.
#[derive(Clone, Debug)]
pub struct ShardLayout {
    pub header: Vec<u8>,
    pub offsets: Vec<u64>,
    pub len: u64,
}

pub trait Container: Send + Sync {
    /// The file name of shard `i` of `n` (0-based `i`).
    fn shard_name(&self, i: usize, n: usize) -> String;

    /// Lays out a shard holding `tensors` in this order, with `metadata`. Deterministic: the
    /// same tensors give the same bytes. A name, shape or type the container cannot represent is
    /// an error naming it.
    fn shard_layout(&self, tensors: &[TensorInfo], metadata: &Metadata, at: ShardAt) -> Result<ShardLayout>;

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
    fn check_written(&self, path: &Path, tensors: &[TensorInfo], at: ShardAt) -> Result<()>;
}
