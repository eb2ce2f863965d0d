//! The tokenizer in GGUF form (`tokenizer.ggml.*`), from `tokenizer.json`, `tokenizer_config.json`,
//! the chat template and config.json, with the rules llama.cpp's converter applies to a byte-level
//! BPE vocabulary: ids padded to the config's vocabulary size, added tokens typed control or
//! user-defined, merges, special ids and `add_*` flags, the chat template. The pre-tokenizer name
//! is decided from the split pattern itself; a tokenizer that cannot be mapped with certainty is an
//! error naming what was found (a guessed pre-tokenizer would tokenize wrongly and silently), and so
//! is a BPE option llama.cpp has no equivalent for, a token text llama.cpp would read as another
//! token's (it reads them up to their first NUL, and aborts on a text twice), and a vocabulary
//! without merges (which llama.cpp refuses). A special token id beyond the vocabulary is skipped
//! with a warning, as the converter's `SpecialVocab` skips it. Without a vocabulary
//! (`--gguf-vocab none`) the file says so (`tokenizer.ggml.model` "none") and gives the
//! vocabulary's size, which llama.cpp needs to size the embedding.

use crate::checkpoint::{read_text, Checkpoint};
use crate::container::{MetaValue, Metadata};
use crate::warning::{Warning, WarningCode};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// llama.cpp's pre-tokenizer names, by the split pattern of the tokenizer's pre-tokenizer.
const PRE_TOKENIZERS: &[(&str, &str)] = &[
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        "qwen35",
    ),
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        "qwen2",
    ),
];

/// GGUF token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// Special token kinds, in the converter's order.
const SPECIAL: &[&str] = &["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

pub(super) fn file<'a>(ck: &'a Checkpoint, name: &str) -> Option<&'a Path> {
    ck.copied_files.iter().find(|(n, _)| n == name).map(|(_, p)| p.as_path())
}

pub(super) fn json_file(ck: &Checkpoint, name: &str) -> Result<Option<Value>> {
    let Some(path) = file(ck, name) else { return Ok(None) };
    let text = read_text(path)?;
    serde_json::from_str(&text).map(Some).with_context(|| format!("{}: not valid JSON", path.display()))
}

/// Unused ids the token list may be padded with (Qwen3.5 pads 243; a count far beyond any real
/// one would only allocate).
const MAX_PADDING: u64 = 1 << 20;

/// The keys of a file without a vocabulary, as the converter writes them (`--no-vocab`) plus the
/// vocabulary's size (the embedding's height), from which llama.cpp makes its placeholder tokens.
pub fn none(arch: &str, vocab_size: Option<u64>) -> Result<Metadata> {
    let mut kv: Metadata = vec![("tokenizer.ggml.model".into(), MetaValue::Str("none".into()))];
    if let Some(n) = vocab_size {
        let n = u32::try_from(n).with_context(|| format!("a vocabulary of {n} tokens does not fit GGUF's u32"))?;
        kv.push((format!("{arch}.vocab_size"), MetaValue::U32(n)));
    }
    Ok(kv)
}

/// The tokenizer keys for `ck`, its ids padded to `vocab_size` (the embedding's height); what the
/// file leaves out is said in `warnings`.
pub fn metadata(ck: &Checkpoint, vocab_size: Option<u64>, warnings: &mut Vec<Warning>) -> Result<Metadata> {
    let tokenizer = json_file(ck, "tokenizer.json")?.with_context(|| {
        format!(
            "{}: no tokenizer.json, so no vocabulary for the GGUF file (--gguf-vocab none writes the tensors alone)",
            ck.root.display()
        )
    })?;
    let what = |detail: String| {
        format!("tokenizer.json: {detail}; llama.cpp would tokenize it wrongly if this tool guessed (--gguf-vocab none writes the tensors alone)")
    };
    let model = tokenizer.get("model").context("tokenizer.json has no model")?;
    if model.get("type").and_then(Value::as_str) != Some("BPE") {
        bail!(what(format!("a {} model, not byte-level BPE", model.get("type").unwrap_or(&Value::Null))));
    }
    let pre = pre_tokenizer(&tokenizer).map_err(|e| anyhow::anyhow!(what(e)))?;
    bpe_options(model, tokenizer.get("decoder")).map_err(|e| {
        anyhow::anyhow!(
            "tokenizer.json: {e}; llama.cpp's BPE tokenizer has no equivalent (--gguf-vocab none writes the tensors alone)"
        )
    })?;
    match tokenizer.get("normalizer") {
        None | Some(Value::Null) => {}
        Some(n) if n.get("type").and_then(Value::as_str) == Some("NFC") => {}
        Some(n) => bail!(what(format!("normalizer {n}"))),
    }
    match tokenizer.get("post_processor") {
        None | Some(Value::Null) => {}
        Some(p) if p.get("type").and_then(Value::as_str) == Some("ByteLevel") => {}
        Some(p) => bail!(what(format!("post-processor {}", p.get("type").unwrap_or(&Value::Null)))),
    }

    let vocab = model.get("vocab").and_then(Value::as_object).context("tokenizer.json: model.vocab is not a map")?;
    let added: Vec<&Value> =
        tokenizer.get("added_tokens").and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default();
    let mut by_id: HashMap<u64, (String, i32)> = HashMap::with_capacity(vocab.len() + added.len());
    for (token, id) in vocab {
        let id = id.as_u64().with_context(|| format!("tokenizer.json: token {token:?} has id {id}"))?;
        by_id.insert(id, (token.clone(), NORMAL));
    }
    for a in &added {
        let (Some(id), Some(content)) = (a.get("id").and_then(Value::as_u64), a.get("content").and_then(Value::as_str))
        else {
            bail!("tokenizer.json: an added token without id or content: {a}");
        };
        let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        let kind = if special || looks_special(content) { CONTROL } else { USER_DEFINED };
        let text = if kind == USER_DEFINED { content.replace('\u{2581}', " ") } else { content.to_string() };
        by_id.insert(id, (text, kind));
    }
    let largest = by_id.keys().max().copied().unwrap_or(0);
    let size = match vocab_size {
        Some(n) if n <= largest => {
            bail!("tokenizer.json has token id {largest}, but the vocabulary (config.json's vocab_size, the embedding's height) is {n}")
        }
        Some(n) if n - largest > MAX_PADDING => {
            bail!(
                "config.json: vocab_size {n} would pad tokenizer.json's {} ids with {} unused ones",
                largest + 1,
                n - largest - 1
            )
        }
        Some(n) => n,
        None => by_id.len() as u64,
    };
    let mut tokens = Vec::with_capacity(size as usize);
    let mut types = Vec::with_capacity(size as usize);
    for id in 0..size {
        let (text, kind) = by_id.remove(&id).unwrap_or_else(|| (format!("[PAD{id}]"), UNUSED));
        tokens.push(text);
        types.push(kind);
    }
    distinct_as_read(&tokens, &types)?;

    let mut kv: Metadata = vec![
        ("tokenizer.ggml.model".into(), MetaValue::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), MetaValue::Str(pre.into())),
        ("tokenizer.ggml.tokens".into(), MetaValue::Strings(tokens)),
        ("tokenizer.ggml.token_type".into(), MetaValue::I32s(types)),
    ];
    kv.push(("tokenizer.ggml.merges".into(), MetaValue::Strings(merges(model)?)));
    let config = json_file(ck, "tokenizer_config.json")?;
    let (ids, add) = specials(
        config.as_ref(),
        &added,
        ck.config.as_ref(),
        tokenizer.get("post_processor").is_some_and(|p| !p.is_null()),
        (size, warnings),
    );
    for (kind, id) in ids {
        let id = u32::try_from(id).with_context(|| format!("{kind} token id {id} does not fit GGUF's u32"))?;
        // llama.cpp's key names (its spelling).
        let key = match kind {
            "unk" => "unknown",
            "sep" => "seperator",
            "pad" => "padding",
            other => other,
        };
        kv.push((format!("tokenizer.ggml.{key}_token_id"), MetaValue::U32(id)));
    }
    for (kind, value) in add {
        kv.push((format!("tokenizer.ggml.add_{kind}_token"), MetaValue::Bool(value)));
    }
    if let Some(template) = chat_template(ck, config.as_ref())? {
        kv.push(("tokenizer.chat_template".into(), MetaValue::Str(template)));
    }
    Ok(kv)
}

/// llama.cpp's name for the tokenizer's pre-tokenizer: a split on a known pattern followed by
/// byte-level mapping without its own regex.
fn pre_tokenizer(tokenizer: &Value) -> Result<&'static str, String> {
    let pre = tokenizer.get("pre_tokenizer").ok_or("no pre-tokenizer")?;
    let steps: Vec<&Value> = match pre.get("type").and_then(Value::as_str) {
        Some("Sequence") => {
            pre.get("pretokenizers").and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default()
        }
        _ => vec![pre],
    };
    let kinds: Vec<&str> = steps.iter().map(|s| s.get("type").and_then(Value::as_str).unwrap_or("?")).collect();
    let [split, byte_level] = steps[..] else { return Err(format!("pre-tokenizer steps {kinds:?}")) };
    let pattern = split.get("pattern").and_then(|p| p.get("Regex")).and_then(Value::as_str);
    let isolated = split.get("behavior").and_then(Value::as_str) == Some("Isolated")
        && split.get("invert").and_then(Value::as_bool) == Some(false);
    let plain_bytes = byte_level.get("type").and_then(Value::as_str) == Some("ByteLevel")
        && byte_level.get("use_regex").and_then(Value::as_bool) == Some(false)
        && byte_level.get("add_prefix_space").and_then(Value::as_bool) != Some(true);
    let known = pattern.and_then(|p| PRE_TOKENIZERS.iter().find(|(known, _)| *known == p));
    match known {
        Some((_, name)) if isolated && plain_bytes => Ok(name),
        _ => Err(format!(
            "pre-tokenizer steps {kinds:?} with split pattern {}, not one whose llama.cpp pre-tokenizer is known",
            pattern.map_or_else(|| "(none)".to_string(), |p| format!("{p:?}"))
        )),
    }
}

/// The merges as llama.cpp reads them: `"a b"`, with a space inside a part written as U+0120.
/// None at all is refused: llama.cpp loads no BPE vocabulary without merges.
fn merges(model: &Value) -> Result<Vec<String>> {
    let list = match model.get("merges") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        found => bail!(
            "tokenizer.json: model.merges is {}; llama.cpp refuses a BPE vocabulary without merges (--gguf-vocab none writes the tensors alone)",
            match found {
                None => "missing".to_string(),
                Some(Value::Array(_)) => "empty".to_string(),
                Some(v) => format!("{v}, not a list"),
            }
        ),
    };
    list.iter()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(pair) if pair.len() == 2 => {
                let part = |v: &Value| -> Result<String> {
                    Ok(v.as_str().context("tokenizer.json: a merge part is not a string")?.replace(' ', "\u{0120}"))
                };
                Ok(format!("{} {}", part(&pair[0])?, part(&pair[1])?))
            }
            other => bail!("tokenizer.json: merge {other} is neither \"a b\" nor [a, b]"),
        })
        .collect()
}

/// Refuses the options of a BPE model, and a decoder, that the GGUF vocabulary cannot carry:
/// llama.cpp's BPE applies every merge (no `ignore_merges`, no dropout), has no subword prefix or
/// word suffix and no byte fallback, and decodes byte-level. Their defaults (false, null, "") pass.
fn bpe_options(model: &Value, decoder: Option<&Value>) -> Result<(), String> {
    let set = |key: &str| model.get(key).filter(|v| !v.is_null());
    for key in ["ignore_merges", "byte_fallback"] {
        if let Some(v) = set(key).filter(|v| **v != Value::Bool(false)) {
            return Err(format!("model.{key} is {v}"));
        }
    }
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if let Some(v) = set(key).filter(|v| v.as_str() != Some("")) {
            return Err(format!("model.{key} is {v}"));
        }
    }
    // A dropout of 0 drops no merge: the same tokens as none.
    if let Some(v) = set("dropout").filter(|v| v.as_f64() != Some(0.0)) {
        return Err(format!("model.dropout is {v}"));
    }
    match decoder {
        Some(d) if d.get("type").and_then(Value::as_str) == Some("ByteLevel") => Ok(()),
        None => Err("no decoder, not ByteLevel".into()),
        Some(d) => Err(format!("decoder is {}, not ByteLevel", d.get("type").unwrap_or(d))),
    }
}

/// Refuses token texts llama.cpp would read as one: it reads each up to its first NUL and aborts
/// on a text twice. A NUL is refused even where the cut text is unique: that token would read as
/// another text than the tokenizer's.
fn distinct_as_read(tokens: &[String], types: &[i32]) -> Result<()> {
    let way_out = "(--gguf-vocab none writes the tensors alone)";
    let name = |id: usize| {
        if types[id] == UNUSED {
            format!("{id} (padding for an id tokenizer.json does not use)")
        } else {
            id.to_string()
        }
    };
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (id, text) in tokens.iter().enumerate() {
        let read = text.split('\0').next().unwrap_or_default();
        if let Some(first) = seen.insert(read, id) {
            let cut: Vec<String> = [first, id]
                .iter()
                .filter(|&&i| tokens[i].contains('\0'))
                .map(|&i| format!("{:?}", tokens[i]))
                .collect();
            let how = if cut.is_empty() {
                String::new()
            } else {
                format!(" (as llama.cpp reads {}, up to the first NUL)", cut.join(" and "))
            };
            bail!(
                "tokenizer.json: tokens {} and {} both have the text {read:?}{how}; llama.cpp aborts on a vocabulary with a text twice {way_out}",
                name(first),
                name(id)
            );
        }
    }
    if let Some((id, text)) = tokens.iter().enumerate().find(|(_, t)| t.contains('\0')) {
        bail!(
            "tokenizer.json: token {id} {text:?} holds a NUL, and llama.cpp would read it as {:?} {way_out}",
            text.split('\0').next().unwrap_or_default()
        );
    }
    Ok(())
}

/// Whether an added token that is not marked special still reads as a control token.
fn looks_special(token: &str) -> bool {
    matches!(token, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || token.starts_with("<|") && token.ends_with("|>")
        || token.starts_with("<\u{ff5c}") && token.ends_with("\u{ff5c}>")
        || token.starts_with("<unused") && token.ends_with('>')
}

type Specials = (Vec<(&'static str, u64)>, Vec<(&'static str, bool)>);

/// Special token ids (`tokenizer_config`'s tokens found among the added tokens first, then
/// config.json's ids; the first found wins) and the `add_*` flags (a byte-level post-processor
/// adds neither bos nor eos; `tokenizer_config`'s flags fill in the rest). An id not below
/// `n_vocab` is skipped, with a warning, as the converter's `SpecialVocab` skips it: llama.cpp
/// would put another token in its place.
fn specials(
    config: Option<&Value>,
    added: &[&Value],
    model_config: Option<&Value>,
    byte_level: bool,
    (n_vocab, warnings): (u64, &mut Vec<Warning>),
) -> Specials {
    let mut ids: Vec<(&'static str, u64)> = Vec::new();
    let mut set = |ids: &mut Vec<(&'static str, u64)>, kind: &'static str, id: Option<u64>, from: &str| {
        let Some(id) = id else { return };
        if id >= n_vocab {
            warnings.push(Warning::new(WarningCode::SpecialTokenSkipped, format!(
                "{from}: {kind} token id {id} is beyond the vocabulary's {n_vocab} tokens; not written (llama.cpp would use another token)"
            )));
        } else if !ids.iter().any(|(k, _)| *k == kind) {
            ids.push((kind, id));
        }
    };
    let mut add: Vec<(&'static str, bool)> = Vec::new();
    if byte_level {
        add.push(("bos", false));
        add.push(("eos", false));
    }
    if let Some(config) = config {
        let token = |kind: &str| -> Option<String> {
            match config.get(format!("{kind}_token"))? {
                Value::String(s) if !s.is_empty() => Some(s.clone()),
                Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        for &kind in SPECIAL {
            if let Some(flag) = config.get(format!("add_{kind}_token")).and_then(Value::as_bool) {
                if !add.iter().any(|(k, _)| *k == kind) {
                    add.push((kind, flag));
                }
            }
            // A tokenizer without a bos (eos) token uses its cls (sep) token as one.
            let content = token(kind).or_else(|| match kind {
                "bos" => token("cls"),
                "eos" => token("sep"),
                _ => None,
            });
            let id = content.and_then(|c| {
                added.iter().find(|a| a.get("content").and_then(Value::as_str) == Some(c.as_str()))?.get("id")?.as_u64()
            });
            set(&mut ids, kind, id, "tokenizer_config.json");
        }
    }
    if let Some(model_config) = model_config {
        for &kind in SPECIAL {
            let key = format!("{kind}_token_id");
            let id =
                model_config.get(&key).or_else(|| model_config.get("text_config")?.get(&key)).and_then(Value::as_u64);
            set(&mut ids, kind, id, "config.json");
        }
    }
    (ids, add)
}

/// The chat template: `tokenizer_config`'s, else `chat_template.jinja`, else `chat_template.json`'s
/// (read only when there is a `tokenizer_config`, as the converter does).
fn chat_template(ck: &Checkpoint, config: Option<&Value>) -> Result<Option<String>> {
    let Some(config) = config else { return Ok(None) };
    match config.get("chat_template") {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(_)) => {
            bail!("tokenizer_config.json: a list of chat templates, which this tool does not write to GGUF")
        }
        _ => {}
    }
    if let Some(path) = file(ck, "chat_template.jinja") {
        return read_text(path).map(Some);
    }
    Ok(json_file(ck, "chat_template.json")?.and_then(|v| v.get("chat_template")?.as_str().map(str::to_string)))
}
