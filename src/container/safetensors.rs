//! safetensors shards with a Hugging Face `model.safetensors.index.json`.
//!
//! Headers are written by hand with a fixed key order (`__metadata__` first, then tensors in data
//! order) and padded with spaces to a multiple of 8 bytes, so that output is byte-identical
//! across runs; the crate's own serializer orders keys from a hash map.

use super::api::{Container, MetaValue, Metadata, ShardAt, ShardLayout, TensorInfo};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::fmt::Write;
use std::io::Read;
use std::path::Path;

/// The index file the Hugging Face loaders look for.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// What `check_written` reads of a header entry (`__metadata__` has none of it).
#[derive(Deserialize)]
struct Entry {
    dtype: Option<String>,
    shape: Option<Vec<usize>>,
    data_offsets: Option<Vec<u64>>,
}

/// The safetensors container.
#[derive(Clone, Copy, Debug, Default)]
pub struct Safetensors;

impl Container for Safetensors {
    /// The Hugging Face convention: 1-based, five digits.
    fn shard_name(&self, i: usize, n: usize) -> String {
        format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
    }

    fn shard_layout(&self, tensors: &[TensorInfo], metadata: &Metadata, _at: ShardAt) -> Result<ShardLayout> {
        // The text serde_json writes for the map {"__metadata__": {key: value, …}, name:
        // {"dtype", "shape", "data_offsets"}, …} in this order, written directly: a map of JSON
        // values per tensor costs more than the rest of planning for a checkpoint of many tiny
        // tensors. safetensors metadata holds strings only.
        let quoted = |s: &str| serde_json::to_string(s).expect("a string serialises");
        let strings: Vec<String> = metadata
            .iter()
            .filter_map(|(k, v)| match v {
                MetaValue::Str(s) => Some(format!("{}:{}", quoted(k), quoted(s))),
                _ => None,
            })
            .collect();
        let mut text = format!("{{\"__metadata__\":{{{}}}", strings.join(","));
        let mut end = 0usize;
        let mut starts = Vec::with_capacity(tensors.len());
        for t in tensors {
            let Some(dtype) = t.storage.element() else {
                bail!("tensor {}: safetensors cannot store {}", t.name, t.storage.name());
            };
            starts.push(end as u64);
            let start = end;
            end += t.byte_len();
            let shape = t.shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
            let _ = write!(
                text,
                ",{}:{{\"dtype\":{},\"shape\":[{shape}],\"data_offsets\":[{start},{end}]}}",
                quoted(t.name),
                quoted(&format!("{dtype:?}"))
            );
        }
        text.push('}');
        while (8 + text.len()) % 8 != 0 {
            text.push(' ');
        }
        let mut header = (text.len() as u64).to_le_bytes().to_vec();
        header.extend_from_slice(text.as_bytes());
        let base = header.len() as u64;
        Ok(ShardLayout { offsets: starts.iter().map(|s| base + s).collect(), len: base + end as u64, header })
    }

    /// `model.safetensors.index.json`: total size, then `metadata`, and a weight map sorted by
    /// name.
    fn index(
        &self,
        weight_map: &[(&str, &str)],
        total_size: u64,
        metadata: Map<String, Value>,
    ) -> Option<(String, String)> {
        let mut names = weight_map.to_vec();
        names.sort_unstable();
        let map: Map<String, Value> = names.into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        let mut meta = Map::new();
        meta.insert("total_size".into(), total_size.into());
        meta.extend(metadata);
        let index = json!({ "metadata": meta, "weight_map": map });
        Some((INDEX_FILE.to_string(), crate::json::to_text(&index, 2)))
    }

    fn check_written(&self, path: &Path, tensors: &[TensorInfo], _at: ShardAt) -> Result<()> {
        let bad = |what: String| anyhow::anyhow!("{}: written shard is not valid: {what}", path.display());
        let mut file = std::fs::File::open(path).with_context(|| format!("{}: cannot reopen", path.display()))?;
        let file_len = file.metadata()?.len();
        let mut prefix = [0u8; 8];
        file.read_exact(&mut prefix).map_err(|e| bad(format!("no header length ({e})")))?;
        let n = u64::from_le_bytes(prefix);
        if n > file_len.saturating_sub(8) {
            return Err(bad(format!("header length {n} runs past the end of the file")));
        }
        let mut text = vec![0u8; n as usize];
        file.read_exact(&mut text).map_err(|e| bad(format!("header unreadable ({e})")))?;
        let header: HashMap<String, Entry> =
            serde_json::from_slice(&text).map_err(|e| bad(format!("header is not JSON ({e})")))?;
        let mut expected_start = 0u64;
        let mut found = 0usize;
        for t in tensors {
            let Some(info) = header.get(t.name) else { return Err(bad(format!("tensor {} is missing", t.name))) };
            let (offsets, shape) = (&info.data_offsets, &info.shape);
            let want = [expected_start, expected_start + t.byte_len() as u64];
            if offsets.as_deref() != Some(&want[..]) || shape.as_deref() != Some(t.shape) {
                return Err(bad(format!(
                    "tensor {}: offsets {offsets:?} / shape {shape:?}, expected {want:?} / {:?}",
                    t.name, t.shape
                )));
            }
            if info.dtype.as_deref() != Some(t.storage.name().as_str()) {
                let written = info.dtype.as_deref().unwrap_or("none");
                return Err(bad(format!("tensor {}: dtype {written:?}, expected {}", t.name, t.storage.name())));
            }
            expected_start = want[1];
            found += 1;
        }
        if header.len() != found + header.contains_key("__metadata__") as usize {
            return Err(bad(format!("{} entries in the header, {found} tensors planned", header.len())));
        }
        if file_len != 8 + n + expected_start {
            bail!(bad(format!("file is {file_len} bytes, the header accounts for {}", 8 + n + expected_start)));
        }
        Ok(())
    }
}
