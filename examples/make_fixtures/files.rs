//! Tensors and how they are written: safetensors files, JSON, sharded checkpoints, tensor order.

use anyhow::{ensure, Context, Result};
use escha_convert::layout::natural_key;
use half::{bf16, f16};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    pub fn new(name: &str, dtype: &'static str, shape: &[usize], data: Vec<u8>) -> Self {
        let width = match dtype {
            "F32" | "I32" => 4,
            "F16" | "BF16" | "I16" => 2,
            "I8" | "F8_E4M3" => 1,
            other => panic!("dtype {other}"),
        };
        assert_eq!(shape.iter().product::<usize>() * width, data.len(), "{name}: shape {shape:?} vs bytes");
        Tensor { name: name.to_string(), dtype, shape: shape.to_vec(), data }
    }
    pub fn bf16(name: &str, shape: &[usize], v: &[f32]) -> Self {
        Self::new(name, "BF16", shape, v.iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect())
    }
    pub fn f16(name: &str, shape: &[usize], v: &[f32]) -> Self {
        Self::new(name, "F16", shape, v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect())
    }
    pub fn f16h(name: &str, shape: &[usize], v: &[f16]) -> Self {
        Self::new(name, "F16", shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    pub fn f32(name: &str, shape: &[usize], v: &[f32]) -> Self {
        Self::new(name, "F32", shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    pub fn i32(name: &str, shape: &[usize], v: &[i32]) -> Self {
        Self::new(name, "I32", shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    pub fn i8(name: &str, shape: &[usize], v: &[i8]) -> Self {
        Self::new(name, "I8", shape, v.iter().map(|&x| x as u8).collect())
    }
}

/// Writes a safetensors file with the tensors in the given order (data and header alike).
pub fn write_safetensors(path: &Path, tensors: &[Tensor]) -> Result<()> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for t in tensors {
        let end = offset + t.data.len();
        header.insert(t.name.clone(), json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end]}));
        offset = end;
    }
    let mut h = serde_json::to_vec(&Value::Object(header))?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for t in tensors {
        out.extend_from_slice(&t.data);
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

pub fn write_json(path: &Path, v: &Value) -> Result<()> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

/// Writes shards plus `model.safetensors.index.json`.
pub fn write_sharded(dir: &Path, shards: &[Vec<Tensor>]) -> Result<()> {
    let n = shards.len();
    let mut map = BTreeMap::new();
    let mut total = 0usize;
    for (i, tensors) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        write_safetensors(&dir.join(&file), tensors)?;
        for t in tensors {
            total += t.data.len();
            ensure!(map.insert(t.name.clone(), file.clone()).is_none(), "duplicate tensor {}", t.name);
        }
    }
    let weight_map: Map<String, Value> = map.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
    )
}

/// Orders tensors like the real dense export: grouped by leaf name (all `escha_s_in` first, …,
/// the codes last), by module within a group.
pub fn leaf_grouped(mut v: Vec<Tensor>) -> Vec<Tensor> {
    let rank = |name: &str| match name.rsplit_once('.').map_or(name, |x| x.1) {
        "escha_s_in" => 0,
        "escha_s_out" => 1,
        "escha_rin" => 2,
        "escha_rout" => 3,
        "escha_config" => 4,
        "bias" => 5,
        "weight_int8" | "weight_scale" => 7,
        "escha_code" => 8,
        _ => 6,
    };
    v.sort_by_cached_key(|t| (rank(&t.name), natural_key(&t.name)));
    v
}

pub fn natural_sorted(mut v: Vec<Tensor>) -> Vec<Tensor> {
    v.sort_by_cached_key(|t| natural_key(&t.name));
    v
}
