//! A GGUF reader of the tests' own, from the format's specification (ggml/docs/gguf.md), not the
//! crate's, so that a writer bug cannot hide behind a reader with the same bug; and
//! [`check_layout`], what llama.cpp's loader requires of a file's header, alignment and data.

use std::collections::BTreeSet;
use std::path::Path;

/// A metadata value: integers of every width as `Int` with their GGUF type id.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Val {
    Int(u32, i128),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Arr(u32, Vec<Val>),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorInfo {
    pub(crate) name: String,
    /// Innermost first, as ggml counts them.
    pub(crate) dims: Vec<u64>,
    pub(crate) ty: u32,
    /// Within the data section.
    offset: u64,
}

pub(crate) struct GgufFile {
    version: u32,
    /// In file order.
    kv: Vec<(String, Val)>,
    pub(crate) tensors: Vec<TensorInfo>,
    data_start: u64,
    bytes: Vec<u8>,
}

impl TensorInfo {
    /// gguf-py's name of its ggml type (`Q4_K`).
    pub(crate) fn type_name(&self) -> &'static str {
        ggml_type(self.ty).0
    }
}

impl GgufFile {
    pub(crate) fn get(&self, key: &str) -> Option<&Val> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(crate) fn keys(&self) -> Vec<&str> {
        self.kv.iter().map(|(k, _)| k.as_str()).collect()
    }

    /// The data bytes of tensor `t` (one of this file's).
    pub(crate) fn data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_start + t.offset) as usize;
        &self.bytes[start..start + tensor_bytes(t) as usize]
    }
}

struct Cursor<'a>(&'a [u8], usize);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        assert!(self.1 + n <= self.0.len(), "the header runs past the end of the file at byte {}", self.1);
        self.1 += n;
        &self.0[self.1 - n..self.1]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8(self.take(n).to_vec()).expect("GGUF strings are UTF-8")
    }
    fn value(&mut self, ty: u32) -> Val {
        let int = |c: &mut Self, n: usize, signed: bool| {
            let b = c.take(n);
            let mut v = [0u8; 16];
            v[..n].copy_from_slice(b);
            if signed && b[n - 1] & 0x80 != 0 {
                v[n..].fill(0xff);
            }
            i128::from_le_bytes(v)
        };
        match ty {
            0 | 2 | 4 | 10 => Val::Int(ty, int(self, [1, 0, 2, 0, 4, 0, 0, 0, 0, 0, 8][ty as usize], false)),
            1 | 3 | 5 | 11 => Val::Int(ty, int(self, [0, 1, 0, 2, 0, 4, 0, 0, 0, 0, 0, 8][ty as usize], true)),
            6 => Val::F32(f32::from_le_bytes(self.take(4).try_into().unwrap())),
            12 => Val::F64(f64::from_le_bytes(self.take(8).try_into().unwrap())),
            7 => {
                let b = self.take(1)[0];
                assert!(b <= 1, "a bool of {b}");
                Val::Bool(b == 1)
            }
            8 => Val::Str(self.string()),
            9 => {
                let elem = self.u32();
                let n = self.u64();
                Val::Arr(elem, (0..n).map(|_| self.value(elem)).collect())
            }
            other => panic!("GGUF value type {other}"),
        }
    }
}

fn parse(path: &Path) -> GgufFile {
    let bytes = std::fs::read(path).unwrap();
    let mut c = Cursor(&bytes, 0);
    assert_eq!(c.take(4), b"GGUF", "{}: magic", path.display());
    let version = c.u32();
    let n_tensors = c.u64();
    let n_kv = c.u64();
    let kv = (0..n_kv)
        .map(|_| {
            let key = c.string();
            let ty = c.u32();
            (key, c.value(ty))
        })
        .collect();
    let tensors = (0..n_tensors)
        .map(|_| {
            let name = c.string();
            let n_dims = c.u32();
            assert!((1..=4).contains(&n_dims), "{name}: {n_dims} dimensions");
            let dims = (0..n_dims).map(|_| c.u64()).collect();
            TensorInfo { name, dims, ty: c.u32(), offset: c.u64() }
        })
        .collect();
    let data_start = (c.1 as u64).div_ceil(ALIGN) * ALIGN;
    GgufFile { version, kv, tensors, data_start, bytes }
}

const ALIGN: u64 = 32;

/// (name, values per block, bytes per block) of a ggml type id.
pub(crate) fn ggml_type(ty: u32) -> (&'static str, u64, u64) {
    match ty {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        30 => ("BF16", 1, 2),
        other => panic!("ggml type {other}, not one this tool writes"),
    }
}

pub(crate) fn tensor_bytes(t: &TensorInfo) -> u64 {
    let (name, block, size) = ggml_type(t.ty);
    assert!(t.dims[0].is_multiple_of(block), "{}: rows of {} values are not whole {name} blocks", t.name, t.dims[0]);
    t.dims.iter().product::<u64>() / block * size
}

/// Checks everything llama.cpp's loader (gguf.cpp and llama-model-loader) checks of the layout,
/// and returns the parsed file.
pub(crate) fn check_layout(path: &Path) -> GgufFile {
    let f = parse(path);
    let what = path.display();
    assert_eq!(f.version, 3, "{what}: version");
    match f.get("general.alignment") {
        None | Some(Val::Int(4, 32)) => {}
        Some(other) => panic!("{what}: general.alignment {other:?}, expected absent or u32 32"),
    }
    let mut keys = BTreeSet::new();
    for k in f.keys() {
        assert!(keys.insert(k), "{what}: key {k} twice");
    }
    assert_eq!(f.data_start % ALIGN, 0);
    assert!(f.data_start <= f.bytes.len() as u64, "{what}: the data section starts past the end of the file");
    // gguf.cpp requires each tensor at the padded end of the one before it, and reads the data
    // section as the sum of the padded sizes, the last tensor's padding included.
    let mut names = BTreeSet::new();
    let mut end = 0;
    for t in &f.tensors {
        assert!(t.name.len() <= 63, "{what}: tensor name {} is {} bytes, ggml holds 63", t.name, t.name.len());
        assert!(names.insert(t.name.as_str()), "{what}: tensor {} twice", t.name);
        assert_eq!(t.offset % ALIGN, 0, "{what}: {} at offset {}", t.name, t.offset);
        assert_eq!(t.offset, end, "{what}: {} is not at the padded end of the tensor before it", t.name);
        end = (t.offset + tensor_bytes(t)).div_ceil(ALIGN) * ALIGN;
    }
    let last = f.tensors.last().expect("tensors");
    assert_eq!(
        f.bytes.len() as u64,
        f.data_start + end,
        "{what}: file length against data start {} + last offset {} + last size {} (padded to {ALIGN})",
        f.data_start,
        last.offset,
        tensor_bytes(last)
    );
    f
}
