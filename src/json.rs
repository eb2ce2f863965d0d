//! JSON files as this tool writes them: pretty-printed with a given indent and a final newline.

use serde::Serialize;
use serde_json::Value;

/// `value` pretty-printed with `indent` spaces per level, ending in a newline.
pub fn to_text(value: &Value, indent: usize) -> String {
    let pad = vec![b' '; indent];
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&pad));
    value.serialize(&mut ser).expect("a JSON value serialises");
    let mut text = String::from_utf8(out).expect("JSON is UTF-8");
    text.push('\n');
    text
}
