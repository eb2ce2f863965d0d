//! llama-imatrix's GGUF file: keys `imatrix.datasets` (strings), `imatrix.chunk_count` and
//! `imatrix.chunk_size` (u32), all three required as llama-quantize requires them, and per matrix
//! two F32 tensors, `<name>.in_sum2` (the sums of squared activations, `[columns, experts]`) and
//! `<name>.counts` (tokens per expert). Other keys and tensors are skipped, as there.

use super::{Cursor, Raw};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;

/// GGUF value types: the size of each fixed-size one, strings (8) and arrays (9) apart.
fn fixed_size(t: u32) -> Option<usize> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

const STRING: u32 = 8;
const ARRAY: u32 = 9;
const U32: u32 = 4;
const F32_TENSOR: u32 = 0;
/// Dimensions a ggml tensor has at most.
const MAX_DIMS: u32 = 4;

fn string(c: &mut Cursor) -> Result<String> {
    let len = c.u64()?;
    let len =
        usize::try_from(len).ok().filter(|&n| n <= c.left()).with_context(|| format!("a string of {len} bytes"))?;
    Ok(String::from_utf8_lossy(c.take(len)?).into_owned())
}

/// A key's value, kept only where it is one of the three this reads.
enum Value {
    U32(u32),
    Strings(Vec<String>),
    Other,
}

fn value(c: &mut Cursor, t: u32) -> Result<Value> {
    if let Some(size) = fixed_size(t) {
        let bytes = c.take(size)?;
        return Ok(if t == U32 { Value::U32(u32::from_le_bytes(bytes.try_into().unwrap())) } else { Value::Other });
    }
    match t {
        STRING => string(c).map(|_| Value::Other),
        ARRAY => {
            let item = c.u32()?;
            let n = c.u64()?;
            // Every item takes a byte at least (a string its 8-byte length): bounded by the file.
            let n =
                usize::try_from(n).ok().filter(|&n| n <= c.left()).with_context(|| format!("an array of {n} items"))?;
            if item == STRING {
                let mut items = Vec::new();
                for _ in 0..n {
                    items.push(string(c)?);
                }
                return Ok(Value::Strings(items));
            }
            let size = fixed_size(item).with_context(|| format!("an array of value type {item}"))?;
            c.take(n.checked_mul(size).context("array length overflows")?)?;
            Ok(Value::Other)
        }
        other => bail!("value type {other} is not GGUF's"),
    }
}

struct Info {
    name: String,
    elements: usize,
    ggml_type: u32,
    offset: u64,
}

pub(super) fn read(bytes: &[u8]) -> Result<Raw> {
    let mut c = Cursor::new(bytes);
    c.take(4)?;
    let version = c.u32()?;
    if !(2..=3).contains(&version) {
        bail!("GGUF version {version} (2 or 3 expected)");
    }
    let n_tensors = c.u64()?;
    let n_kv = c.u64()?;
    // A key takes 12 bytes at least, a tensor info 24.
    if n_kv > (c.left() / 12) as u64 || n_tensors > (c.left() / 24) as u64 {
        bail!("{n_kv} keys and {n_tensors} tensors do not fit in the file");
    }
    let (mut datasets, mut chunk_count, mut chunk_size, mut alignment) = (None, None, None, 32u64);
    for _ in 0..n_kv {
        let key = string(&mut c)?;
        let t = c.u32()?;
        let v = value(&mut c, t).with_context(|| format!("key {key}"))?;
        match (key.as_str(), v) {
            ("imatrix.datasets", Value::Strings(s)) => datasets = Some(s),
            ("imatrix.chunk_count", Value::U32(n)) => chunk_count = Some(n),
            ("imatrix.chunk_size", Value::U32(n)) => chunk_size = Some(n),
            ("general.alignment", Value::U32(n)) if n > 0 && n.is_power_of_two() => alignment = u64::from(n),
            ("imatrix.datasets" | "imatrix.chunk_count" | "imatrix.chunk_size" | "general.alignment", _) => {
                bail!("key {key} has the wrong type")
            }
            _ => {}
        }
    }
    let (Some(datasets), Some(chunk_count), Some(chunk_size)) = (datasets, chunk_count, chunk_size) else {
        bail!("missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size), as llama-quantize refuses it");
    };
    let mut infos = Vec::new();
    for _ in 0..n_tensors {
        let name = string(&mut c)?;
        let n_dims = c.u32()?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            bail!("tensor {name}: {n_dims} dimensions");
        }
        let mut elements = 1usize;
        for _ in 0..n_dims {
            let d = c.u64()?;
            elements = usize::try_from(d)
                .ok()
                .and_then(|d| elements.checked_mul(d))
                .filter(|&n| n <= bytes.len() / 4)
                .with_context(|| format!("tensor {name}: more elements than the file holds"))?;
        }
        let ggml_type = c.u32()?;
        let offset = c.u64()?;
        infos.push(Info { name, elements, ggml_type, offset });
    }
    let data = (c.at as u64).div_ceil(alignment) * alignment;
    let mut halves: BTreeMap<String, [Option<Vec<f32>>; 2]> = BTreeMap::new();
    // Tensors that share their data would each be read: no more values in all than the file holds.
    let mut read_values = 0usize;
    for info in infos {
        let (base, half) = if let Some(b) = info.name.strip_suffix(".in_sum2") {
            (b, 0)
        } else if let Some(b) = info.name.strip_suffix(".counts") {
            (b, 1)
        } else {
            continue;
        };
        if info.ggml_type != F32_TENSOR {
            bail!("tensor {}: type {} (sums and counts are F32)", info.name, info.ggml_type);
        }
        let start = data.checked_add(info.offset).filter(|&s| s <= bytes.len() as u64);
        let Some(start) = start else {
            bail!("tensor {}: its data lies beyond the end of the file", info.name);
        };
        read_values += info.elements;
        if read_values > bytes.len() / 4 {
            bail!("tensor {}: the tensors hold more values than the file", info.name);
        }
        let mut at = Cursor { bytes, at: start as usize };
        let values = at.f32s(info.elements).with_context(|| format!("tensor {}", info.name))?;
        halves.entry(base.to_string()).or_default()[half] = Some(values);
    }
    let mut entries = BTreeMap::new();
    for (name, [sums, counts]) in halves {
        let (Some(sums), Some(counts)) = (sums, counts) else {
            bail!("entry {name}: its sums (.in_sum2) and counts (.counts) do not come in a pair");
        };
        entries.insert(name, (sums, counts));
    }
    Ok(Raw { entries, datasets, chunk_count, chunk_size: Some(chunk_size) })
}
