//! llama-imatrix's legacy `.dat` file: an `i32` entry count, then per entry an `i32` name length,
//! the name, an `i32` call count, an `i32` value count and the values (f32); then, optionally, the
//! `i32` chunk count and an `i32`-length dataset name. All little-endian.

use super::{Cursor, Raw};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;

pub(super) fn read(bytes: &[u8]) -> Result<Raw> {
    let mut c = Cursor::new(bytes);
    let n = c.i32()?;
    // An entry takes 16 bytes at least.
    if n < 1 || n as usize > c.left() / 16 {
        bail!("{n} entries: not an importance matrix (neither GGUF nor llama-imatrix's .dat)");
    }
    let mut entries = BTreeMap::new();
    for i in 0..n {
        let len = c.i32()?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= c.left())
            .with_context(|| format!("entry {i}: a name of {len} bytes"))?;
        let name = String::from_utf8_lossy(c.take(len)?).into_owned();
        let ncall = c.i32()?;
        let nval = c.i32()?;
        let nval =
            usize::try_from(nval).ok().filter(|&v| v >= 1).with_context(|| format!("entry {name}: {nval} values"))?;
        let sums = c.f32s(nval).with_context(|| format!("entry {name}"))?;
        if entries.insert(name.clone(), (sums, vec![ncall as f32])).is_some() {
            bail!("entry {name} comes twice");
        }
    }
    let (mut chunk_count, mut datasets) = (0u32, Vec::new());
    if c.left() >= 4 {
        let calls = c.i32()?;
        chunk_count = u32::try_from(calls).with_context(|| format!("a chunk count of {calls}"))?;
        if c.left() >= 4 {
            let len = c.i32()?;
            if len > 0 {
                let len =
                    usize::try_from(len).ok().filter(|&l| l <= c.left()).context("a dataset name past the end")?;
                datasets.push(String::from_utf8_lossy(c.take(len)?).into_owned());
            }
        }
    }
    Ok(Raw { entries, datasets, chunk_count, chunk_size: None })
}
