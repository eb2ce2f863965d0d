//! The keys of config.json's text part as the checks read them: each one typed and bounded, and
//! named in a message as the user wrote it (`text_config.…` or at the top).

use anyhow::{bail, Result};
use serde_json::{Map, Value};

/// Bounds on the sizes a config may claim: far above any released model, low enough that no
/// product of two overflows and no loop over layers or experts runs away.
pub(super) const MAX_DIM: u64 = 1 << 20;
pub(super) const MAX_LAYERS: u64 = 4096;
pub(super) const MAX_HEADS: u64 = 1 << 14;
pub(super) const MAX_EXPERTS: u64 = 1 << 14;
pub(super) const MAX_VOCAB: u64 = 1 << 24;
pub(super) const MAX_CONV_KERNEL: u64 = 64;

/// Position counts a client may build tables for without an absurd allocation.
pub(super) const MAX_POSITIONS: u64 = 1 << 24;

/// The keys of the text part of config.json (`text_config`, or the top level of a flat config),
/// with the name a message gives each.
pub(super) struct Keys<'a> {
    pub(super) text: &'a Map<String, Value>,
    pub(super) top: &'a Map<String, Value>,
    pub(super) nested: bool,
}

impl<'a> Keys<'a> {
    pub(super) fn path(&self, key: &str) -> String {
        if self.nested {
            format!("text_config.{key}")
        } else {
            key.to_string()
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.text.get(key).filter(|v| !v.is_null())
    }

    /// A whole number in `min..=max` the model needs.
    pub(super) fn count(&self, key: &str, min: u64, max: u64) -> Result<u64> {
        match self.get(key) {
            Some(v) => self.in_range(key, v, min, max),
            None => bail!("config.json has no {}, which the model's tensors are sized by", self.path(key)),
        }
    }

    /// A whole number in `min..=max`, `default` when absent.
    pub(super) fn count_or(&self, key: &str, default: u64, min: u64, max: u64) -> Result<u64> {
        self.get(key).map_or(Ok(default), |v| self.in_range(key, v, min, max))
    }

    pub(super) fn in_range(&self, key: &str, v: &Value, min: u64, max: u64) -> Result<u64> {
        match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(n),
            _ => bail!("config.json: {} is {v}, not a whole number from {min} to {max}", self.path(key)),
        }
    }

    pub(super) fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => bail!("config.json: {} is {v}, not true or false", self.path(key)),
        }
    }
}

/// A JSON value for a message: at most a short prefix.
pub(super) fn excerpt(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(48) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

pub(super) fn positive(v: &Value, at: &str) -> Result<()> {
    if !v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0) {
        bail!("config.json: {at} is {}, not a finite number > 0", excerpt(v));
    }
    Ok(())
}
