//! Plain float values a client can compute with.

use super::expected::is_any_float;
use crate::checkpoint::input::Checkpoint;
use crate::checkpoint::modules::Catalog;
use crate::checkpoint::tensor::scan_chunks;
use crate::quant::dense::first_non_finite;
use anyhow::{bail, Result};

/// Refuses NaN or infinite values in a plain float tensor, by name: passed through, they poison
/// every activation they touch.
pub(super) fn check_finite_plain(ck: &Checkpoint, cat: &Catalog) -> Result<()> {
    for p in &cat.plain {
        let e = &ck.tensors[&p.name];
        if !is_any_float(e.dtype) {
            continue;
        }
        let el = e.dtype.bitsize() / 8;
        let bytes = ck.bytes(e);
        for chunk in scan_chunks(e.numel()) {
            if let Some(i) = first_non_finite(&bytes[chunk.start * el..chunk.end * el], e.dtype) {
                bail!(
                    "{}: tensor {}: a non-finite value (NaN or infinity) at index {}; no client computes with it",
                    ck.file_of(e).display(),
                    p.name,
                    chunk.start + i
                );
            }
        }
        ck.release(e);
    }
    Ok(())
}
