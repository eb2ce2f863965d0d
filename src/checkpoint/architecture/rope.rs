//! The rotary settings every client runs.

use super::keys::{excerpt, positive, MAX_DIM};
use anyhow::{bail, Result};
use serde_json::{Map, Value};

/// The rotary settings every client runs: the default rotation, a positive base, a partial factor
/// in (0, 1] and a multimodal section of whole numbers.
pub(super) fn rope_parameters(r: &Map<String, Value>, at: &str) -> Result<()> {
    match r.get("rope_type").or_else(|| r.get("type")) {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "default" => {}
        Some(v) => bail!("config.json: {at}.rope_type is {}; the clients of this family run \"default\"", excerpt(v)),
    }
    if let Some(theta) = r.get("rope_theta") {
        positive(theta, &format!("{at}.rope_theta"))?;
    }
    if let Some(f) = r.get("partial_rotary_factor") {
        if !f.as_f64().is_some_and(|f| f > 0.0 && f <= 1.0) {
            bail!("config.json: {at}.partial_rotary_factor is {}, not a number in (0, 1]", excerpt(f));
        }
    }
    if let Some(m) = r.get("mrope_section") {
        if !m.as_array().is_some_and(|a| a.len() <= 8 && a.iter().all(|x| x.as_u64().is_some_and(|n| n <= MAX_DIM))) {
            bail!("config.json: {at}.mrope_section is {}, not a short list of whole numbers", excerpt(m));
        }
    }
    Ok(())
}
