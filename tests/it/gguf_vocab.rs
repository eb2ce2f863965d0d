//! The GGUF vocabulary as llama.cpp reads it: a file written (exit 0) is one llama.cpp loads and
//! tokenizes with as the tokenizer does; a tokenizer it cannot carry is refused before anything is
//! converted, naming what is wrong and `--gguf-vocab none` as the way on; a special token id past
//! the vocabulary is skipped with a warning; a long chat template is written and reads back; and a
//! file without a vocabulary says so and gives the vocabulary's size.

use crate::common::{escha_convert, fixture, stderr};
use crate::gguf::{convert, edited, fails, failure, run_bounded, text};
use crate::gguf_reader::{check_layout, Val};
use crate::gguf_refusals::all_refused;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const WAY_OUT: &str = "--gguf-vocab none";

/// The id of `token` in a fixture's tokenizer.json vocabulary.
fn vocab_id(model: &str, token: &str) -> u64 {
    let t: Value = serde_json::from_slice(&std::fs::read(fixture(model).join("tokenizer.json")).unwrap()).unwrap();
    t["model"]["vocab"][token].as_u64().unwrap_or_else(|| panic!("{model}: no token {token:?}"))
}

/// A copy of fixture `model` whose tokenizer.json model (`tokenizer["model"]`) `edit` changes.
fn bpe_edited(tmp: &Path, name: &str, model: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    edited(tmp, name, model, "tokenizer.json", |t| edit(&mut t["model"]))
}

fn add_token(t: &mut Value, id: u64, content: &str, special: bool) {
    t["added_tokens"].as_array_mut().unwrap().push(json!({
        "id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
        "normalized": false, "special": special
    }));
}

// ---------------------------------------------------------------------------------------------
// Token texts llama.cpp would read as one (it aborts: id_to_token.size() == token_to_id.size()).

#[test]
fn token_texts_llama_cpp_reads_as_one_are_refused_naming_both_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // The fixtures have ids 0..247 in the vocabulary, 248..252 added, padding 253..255.
    let a = vocab_id("dense", "a").to_string();
    let mut wrong = Vec::new();
    let mut check = |input: PathBuf, expect: &[&str]| wrong.extend(failure(&input, &[], expect).err());
    // An added token whose content is a vocabulary token at another id.
    check(
        edited(t, "added-is-vocab", "dense", "tokenizer.json", |tk| add_token(tk, 253, "a", false)),
        &["tokenizer.json", &a, "253", "\"a\"", WAY_OUT],
    );
    check(
        edited(t, "added-special-is-vocab", "moe", "tokenizer.json", |tk| add_token(tk, 254, "a", true)),
        &["tokenizer.json", &a, "254", "\"a\"", WAY_OUT],
    );
    // Two added tokens with one text.
    check(
        edited(t, "added-twice", "dense", "tokenizer.json", |tk| add_token(tk, 253, "<|im_end|>", true)),
        &["tokenizer.json", "250", "253", "<|im_end|>", WAY_OUT],
    );
    // A text with a NUL reads up to it: "a\0b" is "a" to llama.cpp.
    check(
        bpe_edited(t, "nul-is-vocab", "dense", |m| m["vocab"]["a\u{0}b"] = Value::from(253)),
        &["tokenizer.json", &a, "253", "\"a\"", "NUL", WAY_OUT],
    );
    // A vocabulary token named as the padding of an unused id is.
    check(
        bpe_edited(t, "named-as-padding", "dense", |m| m["vocab"]["[PAD255]"] = Value::from(253)),
        &["tokenizer.json", "253", "255", "[PAD255]", "padding", WAY_OUT],
    );
    // A NUL even where the text before it is no other token's: llama.cpp would read another text.
    check(
        bpe_edited(t, "nul-unique", "moe", |m| m["vocab"]["zq\u{0}x"] = Value::from(253)),
        &["tokenizer.json", "253", "NUL", "\"zq\"", WAY_OUT],
    );
    all_refused(&wrong);

    // An added token that is the vocabulary token at its own id is one token, as the converter
    // has it (the added token's type wins).
    let same = edited(t, "added-same-id", "dense", "tokenizer.json", |tk| {
        add_token(tk, vocab_id("dense", "a"), "a", false);
    });
    let out = t.join("same-out");
    convert(&same, &out, &[]);
    let f = check_layout(&out.join("model.gguf"));
    let Some(Val::Arr(8, tokens)) = f.get("tokenizer.ggml.tokens") else { panic!("no token list") };
    assert_eq!(tokens[vocab_id("dense", "a") as usize], Val::Str("a".into()));
    assert_eq!(tokens.iter().filter(|v| **v == Val::Str("a".into())).count(), 1);
}

// ---------------------------------------------------------------------------------------------
// Special token ids past the vocabulary.

#[test]
fn a_special_token_id_past_the_vocabulary_is_skipped_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let input = edited(tmp.path(), "bos-300", "dense", "config.json", |c| {
        text(c)["bos_token_id"] = Value::from(300);
    });
    // The warning on stderr, as the user sees it.
    let out = tmp.path().join("out");
    let o = escha_convert().arg(&input).arg(&out).args(["--format", "gguf"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let warning = stderr(&o).lines().find(|l| l.contains("warning") && l.contains("300")).map(str::to_string);
    let warning = warning.unwrap_or_else(|| panic!("no warning names id 300: {}", stderr(&o)));
    assert!(warning.starts_with("escha-convert: warning: config.json") && warning.contains("bos"), "{warning}");
    let f = check_layout(&out.join("model.gguf"));
    assert_eq!(f.get("tokenizer.ggml.bos_token_id"), None, "an id past the vocabulary is not written");
    assert_eq!(f.get("tokenizer.ggml.eos_token_id"), Some(&Val::Int(4, 250)), "the others are");

    // And in --json's warnings.
    let (o, _, _) = run_bounded(&input, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["warnings"].to_string().contains("bos token id 300"), "{}", report["warnings"]);
}

// ---------------------------------------------------------------------------------------------
// Strings llama.cpp reads (up to 1 GiB) are written and read back.

#[test]
fn a_chat_template_over_16_mib_is_written_and_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let template = format!("{{# {} #}}", "x".repeat(1 << 24));
    let input = edited(tmp.path(), "long-template", "dense", "tokenizer_config.json", |c| {
        c["chat_template"] = Value::from(template.clone());
    });
    let out = tmp.path().join("out");
    convert(&input, &out, &[]);
    let f = check_layout(&out.join("model.gguf"));
    assert_eq!(f.get("tokenizer.chat_template"), Some(&Val::Str(template)));
}

// ---------------------------------------------------------------------------------------------
// BPE options a GGUF vocabulary cannot carry.

#[test]
fn bpe_options_llama_cpp_cannot_follow_are_refused_naming_the_option() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let mut wrong = Vec::new();
    let mut check = |input: PathBuf, expect: &[&str]| wrong.extend(failure(&input, &[], expect).err());
    let options: [(&str, Value, &str); 5] = [
        ("ignore_merges", Value::Bool(true), "model.ignore_merges"),
        ("continuing_subword_prefix", Value::from("##"), "model.continuing_subword_prefix"),
        ("end_of_word_suffix", Value::from("</w>"), "model.end_of_word_suffix"),
        ("byte_fallback", Value::Bool(true), "model.byte_fallback"),
        ("dropout", Value::from(0.1), "model.dropout"),
    ];
    for (key, value, name) in options {
        check(bpe_edited(t, key, "dense", |m| m[key] = value), &["tokenizer.json", name, WAY_OUT]);
    }
    check(
        edited(t, "decoder-wordpiece", "moe", "tokenizer.json", |tk| {
            tk["decoder"] = json!({"type": "WordPiece", "prefix": "##", "cleanup": true});
        }),
        &["tokenizer.json", "decoder", "WordPiece", WAY_OUT],
    );
    check(
        edited(t, "decoder-none", "dense", "tokenizer.json", |tk| tk["decoder"] = Value::Null),
        &["tokenizer.json", "decoder", WAY_OUT],
    );
    check(bpe_edited(t, "merges-empty", "dense", |m| m["merges"] = json!([])), &["model.merges", "empty", WAY_OUT]);
    check(
        bpe_edited(t, "merges-missing", "moe", |m| {
            m.as_object_mut().unwrap().remove("merges");
        }),
        &["model.merges", "missing", WAY_OUT],
    );
    all_refused(&wrong);

    // Their defaults, as tokenizers writes them, pass.
    let defaults = bpe_edited(t, "defaults", "dense", |m| {
        m["continuing_subword_prefix"] = Value::Null;
        m["end_of_word_suffix"] = Value::Null;
        m["dropout"] = Value::from(0.0);
        m["ignore_merges"] = Value::Bool(false);
        m["byte_fallback"] = Value::Bool(false);
    });
    convert(&defaults, &t.join("defaults-out"), &[]);
}

// ---------------------------------------------------------------------------------------------
// --gguf-vocab none.

#[test]
fn a_file_without_vocabulary_says_so_and_gives_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    for (model, arch) in [("dense", "qwen35"), ("moe", "qwen35moe")] {
        let out = tmp.path().join(model);
        convert(&fixture(model), &out, &["--gguf-vocab", "none"]);
        let f = check_layout(&out.join("model.gguf"));
        assert_eq!(f.get("tokenizer.ggml.model"), Some(&Val::Str("none".into())), "{model}");
        let embd = f.tensors.iter().find(|t| t.name == "token_embd.weight").unwrap();
        assert_eq!(
            f.get(&format!("{arch}.vocab_size")),
            Some(&Val::Int(4, i128::from(embd.dims[1]))),
            "{model}: a u32, the embedding's height"
        );
        assert_eq!(embd.dims[1], 256);
        let tokenizer: Vec<&str> = f.keys().into_iter().filter(|k| k.starts_with("tokenizer.")).collect();
        assert_eq!(tokenizer, ["tokenizer.ggml.model"], "{model}");
    }
    // Without a tokenizer.json at all.
    let bare = tmp.path().join("bare");
    crate::common::copy_tree(&fixture("dense"), &bare);
    std::fs::remove_file(bare.join("tokenizer.json")).unwrap();
    fails(&bare, &[], &["tokenizer.json", WAY_OUT]);
    convert(&bare, &tmp.path().join("bare-out"), &["--gguf-vocab", "none"]);
    let f = check_layout(&tmp.path().join("bare-out/model.gguf"));
    assert_eq!(f.get("qwen35.vocab_size"), Some(&Val::Int(4, 256)));
}
