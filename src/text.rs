//! How things are written in messages and text reports: one unit system for sizes, one way to
//! print shapes, names with their control characters escaped.

use std::borrow::Cow;
use std::fmt::Write;

/// `s` with control characters (newlines, escapes, …) written as Rust escapes, so a name from a
/// hostile file cannot rewrite the terminal or forge lines of output.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// At most `max` characters of `s`, quoted, control characters escaped, `…` after the quote when
/// cut: how a message shows text read from a file that may be hostile or huge.
pub fn excerpt(s: &str, max: usize) -> String {
    let cut = s.char_indices().nth(max).map(|(i, _)| i);
    let head = &s[..cut.unwrap_or(s.len())];
    format!("\"{}\"{}", escape_controls(head), if cut.is_some() { "…" } else { "" })
}

/// `s` as one word of a POSIX shell command: as it is when it holds only characters no shell
/// treats specially, else single-quoted (a `'` inside written as `'\''`).
pub fn shell_word(s: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "._/-+=,:@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(format!("'{}'", s.replace('\'', r"'\''")))
    }
}

/// Bytes in decimal units (kB, MB, GB, as disks and the Hub count them).
pub fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1_000_000_000 => format!("{:.2} GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.2} MB", b as f64 / 1e6),
        b if b >= 1_000 => format!("{:.1} kB", b as f64 / 1e3),
        b => format!("{b} B"),
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes.iter().flat_map(|b| [DIGITS[usize::from(b >> 4)] as char, DIGITS[usize::from(b & 15)] as char]).collect()
}

/// A shape as `3×256×128` (a scalar as `scalar`).
pub fn shape(dims: &[usize]) -> String {
    if dims.is_empty() {
        return "scalar".into();
    }
    let mut s = String::new();
    for (i, d) in dims.iter().enumerate() {
        let _ = write!(s, "{}{d}", if i == 0 { "" } else { "×" });
    }
    s
}

/// `1 shard`, `3 shards`.
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped() {
        assert_eq!(escape_controls("a.b"), "a.b");
        assert_eq!(escape_controls("a\nFAKE\u{1b}[2J"), "a\\nFAKE\\u{1b}[2J");
        assert_eq!(excerpt("abc", 3), "\"abc\"");
        assert_eq!(excerpt("ab\ncd", 3), "\"ab\\n\"…");
        assert_eq!(excerpt(&"é".repeat(5000), 2), "\"éé\"…");
    }

    #[test]
    fn units_shapes_counts() {
        assert_eq!(human_bytes(1_500_000), "1.50 MB");
        assert_eq!(shape(&[3, 256, 128]), "3×256×128");
        assert_eq!((count(1, "shard"), count(2, "shard")), ("1 shard".to_string(), "2 shards".to_string()));
    }
}
