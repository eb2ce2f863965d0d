//! GGUF (version 3), the file llama.cpp loads: a header of typed key/value metadata and tensor
//! infos, then the tensor data, each tensor aligned to `general.alignment` (32) bytes. Above the
//! shard limit the output is split as llama.cpp's `gguf-split` writes it: files
//! `model-0000i-of-0000N.gguf`, each with `split.no`, `split.count` and `split.tensors.count`, the
//! model metadata in the first; llama.cpp loads them all from the first. Metadata llama.cpp could
//! not read (a string over 1 GiB, an array over 2^30 elements) is refused when the header is laid
//! out, before any tensor is converted; the read-back accepts what llama.cpp reads.

use super::api::{Container, MetaValue, Metadata, ShardAt, ShardLayout, TensorInfo};
use crate::storage::Storage;
use anyhow::{bail, Context, Result};
use safetensors::Dtype;
use serde_json::{Map, Value};
use std::io::Read;
use std::path::Path;

const MAGIC: &[u8; 4] = b"GGUF";
const VERSION: u32 = 3;
/// Tensor data alignment (`general.alignment`'s default, which this container always uses).
pub const ALIGNMENT: u64 = 32;
/// ggml's longest tensor name, in bytes (its name buffer is 64 bytes with the terminating NUL).
const MAX_NAME: usize = 63;
/// The longest string (bytes) and the longest array (elements) llama.cpp reads
/// (`GGUF_MAX_STRING_LENGTH`, `GGUF_MAX_ARRAY_ELEMENTS` in ggml's gguf.cpp): the most this
/// container writes and its read-back accepts.
pub const MAX_STRING: u64 = 1 << 30;
pub const MAX_ARRAY: u64 = 1 << 30;
/// The split keys `gguf-split` writes.
pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// GGUF value type ids.
mod value_type {
    pub const UINT16: u32 = 2;
    pub const UINT32: u32 = 4;
    pub const INT32: u32 = 5;
    pub const FLOAT32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const UINT64: u32 = 10;
}

/// The ggml type id of a storage type, or `None` when GGUF has no such type.
pub fn ggml_type(storage: Storage) -> Option<u32> {
    Some(match storage {
        Storage::Element(Dtype::F32) => 0,
        Storage::Element(Dtype::F16) => 1,
        Storage::Block(b) => b.ggml_type(),
        Storage::Element(Dtype::I8) => 24,
        Storage::Element(Dtype::I16) => 25,
        Storage::Element(Dtype::I32) => 26,
        Storage::Element(Dtype::I64) => 27,
        Storage::Element(Dtype::F64) => 28,
        Storage::Element(Dtype::BF16) => 30,
        Storage::Element(_) => return None,
    })
}

/// The GGUF container.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gguf;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_array<T>(out: &mut Vec<u8>, kind: u32, items: &[T], mut put: impl FnMut(&mut Vec<u8>, &T)) {
    out.extend_from_slice(&value_type::ARRAY.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for item in items {
        put(out, item);
    }
}

/// Appends a value: its type id, then its bytes.
fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    let mut scalar = |kind: u32, bytes: &[u8]| {
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(bytes);
    };
    match v {
        MetaValue::U16(x) => scalar(value_type::UINT16, &x.to_le_bytes()),
        MetaValue::U32(x) => scalar(value_type::UINT32, &x.to_le_bytes()),
        MetaValue::I32(x) => scalar(value_type::INT32, &x.to_le_bytes()),
        MetaValue::U64(x) => scalar(value_type::UINT64, &x.to_le_bytes()),
        MetaValue::F32(x) => scalar(value_type::FLOAT32, &x.to_le_bytes()),
        MetaValue::Bool(x) => scalar(value_type::BOOL, &[u8::from(*x)]),
        MetaValue::Str(s) => {
            out.extend_from_slice(&value_type::STRING.to_le_bytes());
            put_str(out, s);
        }
        MetaValue::Strings(items) => put_array(out, value_type::STRING, items, |o, s| put_str(o, s)),
        MetaValue::I32s(items) => {
            put_array(out, value_type::INT32, items, |o, x| o.extend_from_slice(&x.to_le_bytes()));
        }
        MetaValue::F32s(items) => {
            put_array(out, value_type::FLOAT32, items, |o, x| o.extend_from_slice(&x.to_le_bytes()));
        }
        MetaValue::Bools(items) => put_array(out, value_type::BOOL, items, |o, x| o.push(u8::from(*x))),
    }
}

/// The metadata shard `at` carries: all of it in the first file, the split keys in every file of
/// a split output.
fn shard_metadata(metadata: &Metadata, at: ShardAt) -> Result<Metadata> {
    let mut kv: Metadata = if at.index == 0 { metadata.clone() } else { Vec::new() };
    if at.count > 1 {
        let (Ok(no), Ok(count), Ok(tensors)) =
            (u16::try_from(at.index), u16::try_from(at.count), i32::try_from(at.tensors_total))
        else {
            bail!("{} files of {} tensors: more than a GGUF split can number", at.count, at.tensors_total);
        };
        kv.push((SPLIT_NO.into(), MetaValue::U16(no)));
        kv.push((SPLIT_COUNT.into(), MetaValue::U16(count)));
        kv.push((SPLIT_TENSORS_COUNT.into(), MetaValue::I32(tensors)));
    }
    Ok(kv)
}

/// Refuses metadata llama.cpp could not read: a key, string or array longer than its limits.
fn check_metadata(kv: &Metadata) -> Result<()> {
    check_metadata_within(kv, MAX_STRING, MAX_ARRAY)
}

fn check_metadata_within(kv: &Metadata, max_string: u64, max_array: u64) -> Result<()> {
    let string = |key: &str, what: &str, s: &str| {
        if s.len() as u64 > max_string {
            bail!(
                "metadata key {key}: {what} of {} bytes; llama.cpp reads GGUF strings of at most {max_string}",
                s.len()
            );
        }
        Ok(())
    };
    for (key, value) in kv {
        string(key, "a name", key)?;
        let n = match value {
            MetaValue::Str(s) => {
                string(key, "a string", s)?;
                0
            }
            MetaValue::Strings(items) => {
                for s in items {
                    string(key, "an element", s)?;
                }
                items.len()
            }
            MetaValue::I32s(items) => items.len(),
            MetaValue::F32s(items) => items.len(),
            MetaValue::Bools(items) => items.len(),
            MetaValue::U16(_)
            | MetaValue::U32(_)
            | MetaValue::I32(_)
            | MetaValue::U64(_)
            | MetaValue::F32(_)
            | MetaValue::Bool(_) => 0,
        };
        if n as u64 > max_array {
            bail!("metadata key {key}: an array of {n} elements; llama.cpp reads GGUF arrays of at most {max_array}");
        }
    }
    Ok(())
}

fn aligned(x: u64) -> u64 {
    x.div_ceil(ALIGNMENT) * ALIGNMENT
}

impl Container for Gguf {
    /// `model.gguf`, or `gguf-split`'s names when split.
    fn shard_name(&self, i: usize, n: usize) -> String {
        if n == 1 {
            "model.gguf".into()
        } else {
            format!("model-{:05}-of-{:05}.gguf", i + 1, n)
        }
    }

    fn shard_layout(&self, tensors: &[TensorInfo], metadata: &Metadata, at: ShardAt) -> Result<ShardLayout> {
        let kv = shard_metadata(metadata, at)?;
        check_metadata(&kv)?;
        let mut header = Vec::new();
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(kv.len() as u64).to_le_bytes());
        for (key, value) in &kv {
            put_str(&mut header, key);
            put_value(&mut header, value);
        }
        let mut relative = Vec::with_capacity(tensors.len());
        let mut end = 0u64;
        for t in tensors {
            if t.name.len() > MAX_NAME {
                bail!("tensor {}: its name is {} bytes, GGUF holds at most {MAX_NAME}", t.name, t.name.len());
            }
            let kind = ggml_type(t.storage)
                .with_context(|| format!("tensor {}: GGUF has no type {}", t.name, t.storage.name()))?;
            let inner = t.shape.last().copied().unwrap_or(1);
            if inner % t.storage.block_elements() != 0 {
                bail!("tensor {}: rows of {inner} values are not whole {} blocks", t.name, t.storage.name());
            }
            put_str(&mut header, t.name);
            header.extend_from_slice(&(t.shape.len().max(1) as u32).to_le_bytes());
            // ggml counts dimensions innermost first.
            for &d in t.shape.iter().rev() {
                header.extend_from_slice(&(d as u64).to_le_bytes());
            }
            if t.shape.is_empty() {
                header.extend_from_slice(&1u64.to_le_bytes());
            }
            header.extend_from_slice(&kind.to_le_bytes());
            header.extend_from_slice(&end.to_le_bytes());
            relative.push(end);
            end = aligned(end + t.byte_len() as u64);
        }
        let data_start = aligned(header.len() as u64);
        header.resize(data_start as usize, 0);
        Ok(ShardLayout { offsets: relative.iter().map(|r| data_start + r).collect(), len: data_start + end, header })
    }

    fn index(&self, _: &[(&str, &str)], _: u64, _: Map<String, Value>) -> Option<(String, String)> {
        None
    }

    fn check_written(&self, path: &Path, tensors: &[TensorInfo], at: ShardAt) -> Result<()> {
        let bad = |what: String| anyhow::anyhow!("{}: written GGUF file is not valid: {what}", path.display());
        let file = std::fs::File::open(path).with_context(|| format!("{}: cannot reopen", path.display()))?;
        let file_len = file.metadata()?.len();
        let mut r = Reader { inner: std::io::BufReader::new(file), read: 0 };
        let read = read_header(&mut r).map_err(|e| bad(format!("{e:#}")))?;
        if read.tensors.len() != tensors.len() {
            return Err(bad(format!("{} tensors, {} planned", read.tensors.len(), tensors.len())));
        }
        let split_no = read.kv.iter().find(|(k, _)| k == SPLIT_NO).map(|(_, v)| v.clone());
        if at.count > 1 && split_no != Some(MetaValue::U16(at.index as u16)) {
            return Err(bad(format!("{SPLIT_NO} is {split_no:?}, expected {}", at.index)));
        }
        let data_start = aligned(r.read);
        let mut end = 0;
        for (t, (name, dims, kind, offset)) in tensors.iter().zip(&read.tensors) {
            let want_dims: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
            let want_dims = if want_dims.is_empty() { vec![1] } else { want_dims };
            if name != t.name || *dims != want_dims || Some(*kind) != ggml_type(t.storage) || *offset != end {
                return Err(bad(format!(
                    "tensor {name}: dims {dims:?}, type {kind}, offset {offset}; planned {} {want_dims:?} at {end}",
                    t.name
                )));
            }
            end = aligned(end + t.byte_len() as u64);
        }
        if file_len != data_start + end {
            return Err(bad(format!("file is {file_len} bytes, the header accounts for {}", data_start + end)));
        }
        Ok(())
    }
}

/// What a GGUF header holds: metadata, and per tensor its name, dims (innermost first), type and
/// offset within the data.
#[derive(Debug)]
pub struct Header {
    pub kv: Vec<(String, MetaValue)>,
    pub tensors: Vec<(String, Vec<u64>, u32, u64)>,
}

/// A reader that counts what it has read.
struct Reader<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.inner.read_exact(&mut b).context("the header ends early")?;
        self.read += N as u64;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// A count, bounded (by llama.cpp's limits where they apply), so that a damaged header cannot
    /// ask for unbounded memory.
    fn count(&mut self, limit: u64) -> Result<usize> {
        let n = self.u64()?;
        if n > limit {
            bail!("a count of {n} (at byte {})", self.read - 8);
        }
        Ok(n as usize)
    }

    /// A string of at most llama.cpp's length, its memory taken as its bytes arrive.
    fn string(&mut self) -> Result<String> {
        let n = self.count(MAX_STRING)?;
        let mut b = Vec::new();
        (&mut self.inner).take(n as u64).read_to_end(&mut b)?;
        if b.len() != n {
            bail!("the header ends early");
        }
        self.read += n as u64;
        String::from_utf8(b).context("a string that is not UTF-8")
    }

    fn value(&mut self, kind: u32) -> Result<MetaValue> {
        Ok(match kind {
            value_type::UINT16 => MetaValue::U16(u16::from_le_bytes(self.bytes()?)),
            value_type::UINT32 => MetaValue::U32(self.u32()?),
            value_type::INT32 => MetaValue::I32(i32::from_le_bytes(self.bytes()?)),
            value_type::UINT64 => MetaValue::U64(self.u64()?),
            value_type::FLOAT32 => MetaValue::F32(f32::from_le_bytes(self.bytes()?)),
            value_type::BOOL => MetaValue::Bool(self.bytes::<1>()?[0] != 0),
            value_type::STRING => MetaValue::Str(self.string()?),
            value_type::ARRAY => {
                let elem = self.u32()?;
                let n = self.count(MAX_ARRAY)?;
                match elem {
                    value_type::STRING => MetaValue::Strings((0..n).map(|_| self.string()).collect::<Result<_>>()?),
                    value_type::INT32 => {
                        MetaValue::I32s((0..n).map(|_| Ok(i32::from_le_bytes(self.bytes()?))).collect::<Result<_>>()?)
                    }
                    value_type::FLOAT32 => {
                        MetaValue::F32s((0..n).map(|_| Ok(f32::from_le_bytes(self.bytes()?))).collect::<Result<_>>()?)
                    }
                    value_type::BOOL => {
                        MetaValue::Bools((0..n).map(|_| Ok(self.bytes::<1>()?[0] != 0)).collect::<Result<_>>()?)
                    }
                    other => bail!("an array of value type {other}, which this tool never writes"),
                }
            }
            other => bail!("value type {other}, which this tool never writes"),
        })
    }
}

fn read_header<R: Read>(r: &mut Reader<R>) -> Result<Header> {
    if &r.bytes::<4>()? != MAGIC {
        bail!("no GGUF magic");
    }
    let version = r.u32()?;
    if version != VERSION {
        bail!("version {version}");
    }
    let n_tensors = r.count(1 << 24)?;
    let n_kv = r.count(1 << 24)?;
    let mut kv = Vec::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = r.string()?;
        let kind = r.u32()?;
        kv.push((key, r.value(kind)?));
    }
    let mut tensors = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name = r.string()?;
        let n_dims = r.u32()?;
        if n_dims > 4 {
            bail!("tensor {name}: {n_dims} dimensions");
        }
        let dims = (0..n_dims).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
        let kind = r.u32()?;
        let offset = r.u64()?;
        tensors.push((name, dims, kind, offset));
    }
    Ok(Header { kv, tensors })
}

/// Reads the header of a GGUF file.
#[cfg(test)]
pub fn read(path: &Path) -> Result<Header> {
    let file = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    read_header(&mut Reader { inner: std::io::BufReader::new(file), read: 0 })
        .with_context(|| format!("{}: not a GGUF file this tool reads", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_type::BlockType;

    #[test]
    fn a_laid_out_header_reads_back() {
        let shape = [2usize, 64];
        let tensors = [
            TensorInfo { name: "a", storage: Storage::Element(Dtype::BF16), shape: &shape },
            TensorInfo { name: "b", storage: Storage::Block(BlockType::Q8_0), shape: &shape },
        ];
        let kv = vec![("general.architecture".to_string(), MetaValue::Str("qwen35".into()))];
        let at = ShardAt { index: 1, count: 2, tensors_total: 4 };
        let layout = Gguf.shard_layout(&tensors, &kv, at).unwrap();
        assert_eq!(layout.offsets, vec![layout.header.len() as u64, layout.header.len() as u64 + 256]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.gguf");
        let mut bytes = layout.header.clone();
        bytes.resize(layout.len as usize, 0);
        std::fs::write(&path, bytes).unwrap();
        Gguf.check_written(&path, &tensors, at).unwrap();
        let h = read(&path).unwrap();
        assert_eq!(h.kv.len(), 3, "the second file has the split keys only");
        assert_eq!(h.tensors[1], ("b".to_string(), vec![64, 2], 8, 256));
    }

    #[test]
    fn metadata_beyond_what_llama_cpp_reads_is_refused_naming_the_key() {
        let kv = |k: &str, v: MetaValue| vec![(k.to_string(), v)];
        let ok = |kv: &Metadata| check_metadata_within(kv, 32, 3);
        let err = |kv: &Metadata| format!("{:#}", ok(kv).unwrap_err());
        let (at_most, over) = ("x".repeat(32), "x".repeat(33));
        ok(&kv("a", MetaValue::Str(at_most.clone()))).unwrap();
        ok(&kv("a", MetaValue::Strings(vec![at_most; 3]))).unwrap();
        let e = err(&kv("tokenizer.chat_template", MetaValue::Str(over.clone())));
        assert!(e.contains("tokenizer.chat_template") && e.contains("33 bytes"), "{e}");
        let e = err(&kv("tokenizer.ggml.tokens", MetaValue::Strings(vec!["x".into(), over.clone()])));
        assert!(e.contains("tokenizer.ggml.tokens") && e.contains("33 bytes"), "{e}");
        let e = err(&kv("tokenizer.ggml.token_type", MetaValue::I32s(vec![1; 4])));
        assert!(e.contains("tokenizer.ggml.token_type") && e.contains("4 elements"), "{e}");
        assert!(err(&kv(&over, MetaValue::U32(1))).contains("a name of 33 bytes"));
        assert_eq!(
            (MAX_STRING, MAX_ARRAY),
            (1 << 30, 1 << 30),
            "gguf.cpp's GGUF_MAX_STRING_LENGTH and _ARRAY_ELEMENTS"
        );
    }

    #[test]
    fn a_string_longer_than_the_old_read_back_cap_reads_back() {
        let template = "x".repeat((1 << 24) + 1);
        let kv = vec![("tokenizer.chat_template".to_string(), MetaValue::Str(template.clone()))];
        let at = ShardAt { index: 0, count: 1, tensors_total: 0 };
        let layout = Gguf.shard_layout(&[], &kv, at).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.gguf");
        std::fs::write(&path, &layout.header).unwrap();
        Gguf.check_written(&path, &[], at).unwrap();
        assert_eq!(read(&path).unwrap().kv, kv);
    }

    #[test]
    fn names_ggml_cannot_hold_are_refused() {
        let long = "x".repeat(64);
        let t = [TensorInfo { name: &long, storage: Storage::Element(Dtype::F32), shape: &[1] }];
        let e = Gguf.shard_layout(&t, &Vec::new(), ShardAt { index: 0, count: 1, tensors_total: 1 }).unwrap_err();
        assert!(format!("{e:#}").contains("64 bytes"), "{e:#}");
        let t = [TensorInfo { name: "u", storage: Storage::Element(Dtype::U8), shape: &[1] }];
        assert!(Gguf.shard_layout(&t, &Vec::new(), ShardAt { index: 0, count: 1, tensors_total: 1 }).is_err());
    }
}
