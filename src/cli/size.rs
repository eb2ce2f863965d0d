//! Byte sizes on the command line.

/// The units [`parse_size`] takes, for messages.
const UNITS: &str =
    "use a byte count or K/KB, M/MB, G/GB, T/TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)";

/// Parses "5GB" or "5G" (10^9, as llama.cpp's --split-max-size), "2GiB" (2^30), "500MB", "64KiB"
/// or a plain byte count.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid size {s:?}; {UNITS}"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        other => return Err(format!("unknown size unit {other:?} in {s:?}; {UNITS}")),
    };
    let v = n * mult;
    if v < 1.0 {
        return Err(format!("size {s:?} must be at least one byte"));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("5G"), Ok(5_000_000_000));
        assert_eq!(parse_size("500M"), Ok(500_000_000));
        assert!(parse_size("5Q").unwrap_err().contains("GiB"));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5MB"), Ok(1_500_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("5XB").is_err());
        assert!(parse_size("0").is_err());
    }
}
