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

/// The version of the `--json` contract (`docs/escha-convert.schema.json`), carried by every
/// document as `schema_version`. It goes up when a key is removed or changes type; a key added
/// leaves it as it is.
pub const SCHEMA_VERSION: u64 = 1;

/// `value` (a report) as a `--json` document: `schema_version` first, then its own keys.
pub fn document(value: &impl Serialize) -> serde_json::Result<Value> {
    let mut doc = serde_json::Map::new();
    doc.insert("schema_version".into(), SCHEMA_VERSION.into());
    let Value::Object(fields) = serde_json::to_value(value)? else {
        return Err(serde::ser::Error::custom("a --json document is an object"));
    };
    doc.extend(fields);
    Ok(Value::Object(doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_starts_with_its_version() {
        #[derive(Serialize)]
        struct R {
            a: u8,
        }
        let doc = document(&R { a: 3 }).unwrap();
        assert_eq!(serde_json::to_string(&doc).unwrap(), r#"{"schema_version":1,"a":3}"#);
        assert!(document(&3).is_err());
    }
}
