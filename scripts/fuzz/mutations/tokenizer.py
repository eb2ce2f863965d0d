"""Mutations of the tokenizer and the side files: tokenizer.json (added tokens, model options,
decoder, model type, merges, vocabulary, pre-tokenizer, post-processor), tokenizer_config.json
(chat templates, special tokens), the other side files and generation_config.json."""

from ..checkpoint import MIB, Raw, dumps, short
from . import kind
from .config import break_file, replace_node

# tokenizer.json


def tok(ck):
    return ck.load("tokenizer.json")


def added(content, id_, special=True):
    return {
        "id": id_,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


@kind(3)
def tok_added_dup_vocab(ck, rng):
    t = tok(ck)
    vocab = t["model"]["vocab"]
    text = rng.choice(list(vocab))
    id_ = rng.choice([253, 254, 255, vocab[text], rng.randrange(248), 250])
    special = rng.choice([True, False])
    t["added_tokens"].append(added(text, id_, special))
    ck.save("tokenizer.json", t)
    return f"tokenizer.json: added token {text!r} (a vocab text, id {vocab[text]}) with id {id_}, special {special}"


@kind(2)
def tok_added_nul(ck, rng):
    t = tok(ck)
    text = rng.choice(["\u0000", "<|a\u0000b|>", "x\u0000", "\u0000<|im_end|>"])
    id_ = rng.choice([253, 254, 251])
    t["added_tokens"].append(added(text, id_, rng.choice([True, False])))
    ck.save("tokenizer.json", t)
    return f"tokenizer.json: added token {text!r} (NUL) with id {id_}"


@kind(3)
def tok_added_weird(ck, rng):
    t = tok(ck)
    at = t["added_tokens"]
    op = rng.choice(
        ["id_range", "dup_id", "empty", "dup_content", "huge", "no_content", "no_id", "not_object", "not_list", "ctrl"]
    )
    if op == "id_range":
        v = rng.choice([256, 300, 1000, -1, 2**31, 2**40])
        at.append(added("<|new|>", v))
        desc = f"added token id {v}"
    elif op == "dup_id":
        at.append(added("<|other|>", at[0]["id"]))
        desc = f"second added token with id {at[0]['id']}"
    elif op == "empty":
        at.append(added("", 253))
        desc = "added token with empty content, id 253"
    elif op == "dup_content":
        at.append(added(at[2]["content"], 253))
        desc = f"added token {at[2]['content']!r} again with id 253"
    elif op == "huge":
        n = rng.choice([10_000, 300_000])
        at.append(added("x" * n, 253))
        desc = f"added token of {n} chars, id 253"
    elif op == "no_content":
        e = added("", 253)
        del e["content"]
        at.append(e)
        desc = "added token without content"
    elif op == "no_id":
        e = added("<|noid|>", 0)
        del e["id"]
        at.append(e)
        desc = "added token without id"
    elif op == "not_object":
        at.append(rng.choice(["<|x|>", 5, None]))
        desc = f"added_tokens entry {short(at[-1])}"
    elif op == "ctrl":
        text = rng.choice(["\n", "\t<|x|>", "\u2028", "\ufeff", "\U0010ffff", " "])
        at.append(added(text, 253))
        desc = f"added token {text!r}, id 253"
    else:
        t["added_tokens"] = rng.choice([{}, None, "x"])
        desc = f"added_tokens = {short(t['added_tokens'])}"
    ck.save("tokenizer.json", t)
    return f"tokenizer.json: {desc}"


@kind(3)
def tok_model_option(ck, rng):
    t = tok(ck)
    key, values = rng.choice(
        [
            ("ignore_merges", [True, "yes", None]),
            ("byte_fallback", [True, 1]),
            ("continuing_subword_prefix", ["##", "", None, "Ġ"]),
            ("end_of_word_suffix", ["</w>", None, "Ġ"]),
            ("dropout", [0.0, 0.1, 1.0, -1, 2, "x"]),
            ("unk_token", ["<unk>", "!", "", None, "<|im_end|>"]),
            ("fuse_unk", [True]),
        ]
    )
    v = rng.choice(values)
    t["model"][key] = v
    ck.save("tokenizer.json", t)
    return f"tokenizer.json model.{key} = {short(v)}"


@kind(2)
def tok_decoder(ck, rng):
    t = tok(ck)
    v = rng.choice(
        [
            None,
            {"type": "WordPiece", "prefix": "##", "cleanup": True},
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
            {"type": "BPEDecoder", "suffix": "</w>"},
            {"type": "ByteFallback"},
            {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
            {
                "type": "Sequence",
                "decoders": [{"type": "ByteLevel"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}],
            },
            {"type": "Bogus"},
            "ByteLevel",
        ]
    )
    t["decoder"] = v
    ck.save("tokenizer.json", t)
    return f"tokenizer.json decoder = {short(v)}"


@kind(2)
def tok_model_type(ck, rng):
    t = tok(ck)
    v = rng.choice(["WordPiece", "Unigram", "WordLevel", "", None, "delete", "bpe"])
    if v == "delete":
        del t["model"]["type"]
    else:
        t["model"]["type"] = v
    ck.save("tokenizer.json", t)
    return f"tokenizer.json model.type: {short(v)}"


@kind(2)
def tok_merges(ck, rng):
    t = tok(ck)
    m = t["model"]["merges"]
    op = rng.choice(["empty", "strings", "unknown", "dup", "three", "not_list", "space_token", "many"])
    if op == "empty":
        m = []
    elif op == "strings":
        m = [" ".join(x) for x in m]
    elif op == "unknown":
        m = m + [["zz", "qq"]]
    elif op == "dup":
        m = m + m[:3]
    elif op == "three":
        m = m + ["a b c"]
    elif op == "not_list":
        m = rng.choice([{}, None, "Ġ t"])
    elif op == "space_token":
        m = m + [["Ġ ", "t"]]
    else:
        m = m + [[a, b] for a in "abcdefgh" for b in "abcdefgh"]
    t["model"]["merges"] = m
    ck.save("tokenizer.json", t)
    return f"tokenizer.json model.merges: {op}"


@kind(3)
def tok_vocab(ck, rng):
    t = tok(ck)
    v = t["model"]["vocab"]
    op = rng.choice(
        ["hole", "dup_id", "beyond", "negative", "empty_text", "nul", "huge", "empty", "list", "float_id", "shift"]
    )
    if op == "hole":
        k = rng.choice(list(v))
        del v[k]
        desc = f"vocab entry {k!r} deleted"
    elif op == "dup_id":
        ks = list(v)
        a, b = rng.sample(ks, 2)
        v[b] = v[a]
        desc = f"vocab {b!r} given {a!r}'s id {v[a]}"
    elif op == "beyond":
        id_ = rng.choice([256, 257, 300, 1000, 2**31, 2**40])
        v["<beyond>"] = id_
        desc = f"vocab entry with id {id_}"
    elif op == "negative":
        v["<neg>"] = -1
        desc = "vocab entry with id -1"
    elif op == "empty_text":
        v[""] = 253
        desc = 'vocab entry "" with id 253'
    elif op == "nul":
        id_ = rng.choice([253, 5])
        v["a\u0000"] = id_
        desc = f"vocab entry 'a\\x00' with id {id_}"
    elif op == "huge":
        v["y" * 100_000] = 253
        desc = "vocab entry of 100000 chars, id 253"
    elif op == "empty":
        t["model"]["vocab"] = {}
        desc = "vocab = {}"
    elif op == "list":
        t["model"]["vocab"] = [[k, i] for k, i in v.items()]
        desc = "vocab as a list of pairs"
    elif op == "float_id":
        k = rng.choice(list(v))
        v[k] = v[k] + 0.5
        desc = f"vocab {k!r} id {v[k]}"
    else:
        for k in v:
            v[k] += 8
        desc = "every vocab id + 8 (over the added tokens)"
    ck.save("tokenizer.json", t)
    return f"tokenizer.json model.{desc}"


@kind(2)
def tok_pretokenizer(ck, rng):
    t = tok(ck)
    if rng.random() < 0.5:
        v = rng.choice(
            [
                None,
                {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
                {
                    "type": "Sequence",
                    "pretokenizers": [
                        {"type": "Split", "pattern": {"Regex": "\\s+|[a-z]+"}, "behavior": "Isolated", "invert": False},
                        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
                    ],
                },
                {
                    "type": "Sequence",
                    "pretokenizers": [
                        {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": False}
                    ],
                },
                {"type": "Whitespace"},
                {"type": "Digits", "individual_digits": True},
                {"type": "Bogus"},
            ]
        )
        t["pre_tokenizer"] = v
        field = "pre_tokenizer"
    else:
        v = rng.choice(
            [
                None,
                {"type": "NFKC"},
                {"type": "Lowercase"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
                {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}]},
                {"type": "Prepend", "prepend": "▁"},
            ]
        )
        t["normalizer"] = v
        field = "normalizer"
    ck.save("tokenizer.json", t)
    return f"tokenizer.json {field} = {short(v)}"


@kind(1)
def tok_post_processor(ck, rng):
    t = tok(ck)
    v = rng.choice(
        [
            None,
            {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [249], "tokens": ["<|im_start|>"]}},
            },
            {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [9999], "tokens": ["<s>"]}},
            },
            {
                "type": "RobertaProcessing",
                "sep": ["</s>", 2],
                "cls": ["<s>", 0],
                "trim_offsets": True,
                "add_prefix_space": False,
            },
        ]
    )
    t["post_processor"] = v
    ck.save("tokenizer.json", t)
    return f"tokenizer.json post_processor = {short(v)}"


@kind(1)
def tok_broken(ck, rng):
    return break_file(ck, rng, "tokenizer.json")


@kind(1)
def tok_hostile_node(ck, rng):
    return replace_node(ck, rng, "tokenizer.json")


@kind(1)
def tok_many_added(ck, rng):
    t = tok(ck)
    n = rng.choice([3, 40, 300])
    start = 253
    for i in range(n):
        t["added_tokens"].append(added(f"<|extra_{i}|>", start + i, special=rng.random() < 0.5))
    ck.save("tokenizer.json", t)
    return f"tokenizer.json: {n} added tokens from id {start}"


# tokenizer_config.json, side files


def tok_config(ck):
    c = ck.load("tokenizer_config.json")
    return c if isinstance(c, dict) else {}


@kind(2)
def tc_big_chat_template(ck, rng):
    size = rng.choice([64 << 10, 512 << 10, 1 << 20, 3 << 20])
    c = tok_config(ck)
    base = c.get("chat_template") or "{{ x }}"
    c["chat_template"] = (base + "{# padding #}" * (size // 13 + 1))[:size]
    ck.save("tokenizer_config.json", c)
    return f"tokenizer_config.json chat_template of {size} bytes"


def chat_template_over_16mib(ck, rng):
    """Pinned to case 1 (not drawn): a chat template just over 16 MiB."""
    size = 16 * MIB + rng.choice([1, 7, 4096])
    c = tok_config(ck)
    base = c.get("chat_template") or "{{ x }}"
    c["chat_template"] = (base + "{# padding #}" * (size // 13 + 1))[:size]
    ck.save("tokenizer_config.json", c)
    return f"tokenizer_config.json chat_template of {size} bytes (16 MiB + {size - 16 * MIB})"


@kind(2)
def tc_odd_chat_template(ck, rng):
    c = tok_config(ck)
    v = rng.choice(
        [
            None,
            42,
            [],
            [{"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": "{{ tools }}"}],
            [{"name": "rag"}],
            "",
            "{{ 'a\u0000b' }}",
            "{% for %}",
            "{{ '日本語' }}🙂",
            Raw('"\\ud800 lone surrogate"'),
            {"template": "x"},
        ]
    )
    c["chat_template"] = v
    ck.save("tokenizer_config.json", c)
    return f"tokenizer_config.json chat_template = {short(v)}"


@kind(3)
def tc_special_tokens(ck, rng):
    c = tok_config(ck)
    key = rng.choice(["bos_token", "eos_token", "pad_token", "unk_token", "add_bos_token", "add_eos_token"])
    if key.startswith("add_"):
        v = rng.choice([True, "yes", 1, None])
    else:
        v = rng.choice(
            [
                "<nope>",
                "",
                "the",
                "!",
                {"content": "<|im_end|>", "__type": "AddedToken"},
                {"content": "<zz>"},
                {"content": 5},
                None,
                5,
                "<|im_end|>",
                "<think>",
                "a\u0000",
            ]
        )
    c[key] = v
    ck.save("tokenizer_config.json", c)
    return f"tokenizer_config.json {key} = {short(v)}"


@kind(1)
def tc_added_tokens_decoder(ck, rng):
    c = tok_config(ck)
    v = rng.choice(
        [
            {"250": {"content": "<x>", "special": True}},
            {"999": {"content": "<|im_end|>", "special": True}},
            {"-1": {"content": "<y>"}},
            {"abc": {"content": "<z>"}},
            {
                "253": {
                    "content": "<|im_end|>",
                    "special": True,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "single_word": False,
                }
            },
        ]
    )
    c["added_tokens_decoder"] = v
    ck.save("tokenizer_config.json", c)
    return f"tokenizer_config.json added_tokens_decoder = {short(v)}"


@kind(1)
def tc_misc(ck, rng):
    c = tok_config(ck)
    key, values = rng.choice(
        [
            ("model_max_length", [0, -1, 1e30, 2**64, Raw("1e400")]),
            ("tokenizer_class", ["LlamaTokenizer", "", None, "GPT2TokenizerFast"]),
        ]
    )
    v = rng.choice(values)
    c[key] = v
    ck.save("tokenizer_config.json", c)
    return f"tokenizer_config.json {key} = {short(v)}"


@kind(1)
def tc_broken(ck, rng):
    return break_file(ck, rng, "tokenizer_config.json")


@kind(2)
def side_files(ck, rng):
    op = rng.choice(["jinja", "jinja_big", "jinja_nul", "special_map", "added_json", "vocab_merges"])
    if op == "jinja":
        (ck.root / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    elif op == "jinja_big":
        (ck.root / "chat_template.jinja").write_text("{# pad #}" * (rng.choice([1, 2]) * MIB // 9))
    elif op == "jinja_nul":
        (ck.root / "chat_template.jinja").write_bytes(b"{{ a }}\x00\xff\xfe")
    elif op == "special_map":
        (ck.root / "special_tokens_map.json").write_text(
            dumps(
                rng.choice(
                    [
                        {"bos_token": "<nope>", "eos_token": {"content": "<|im_end|>"}},
                        {"eos_token": 5},
                        {"additional_special_tokens": ["<a>", "\u0000"]},
                    ]
                )
            )
        )
    elif op == "added_json":
        (ck.root / "added_tokens.json").write_text(
            dumps(rng.choice([{"<new>": 253}, {"<big>": 100000}, {"the": 3}, {"<neg>": -1}]))
        )
    else:
        (ck.root / "vocab.json").write_text(dumps({"a": 0, "b": 1}))
        (ck.root / "merges.txt").write_text("#version: 0.2\na b\n")
    return f"side file: {op}"


# generation_config.json


@kind(2)
def gen_ids(ck, rng):
    g = ck.load("generation_config.json") or {}
    key = rng.choice(["bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"])
    v = rng.choice([256, -1, 2**40, "2", [2, 300], [], None, 1.5, [2, 2, 2], 250, [250, 248], {"a": 1}])
    g[key] = v
    ck.save("generation_config.json", g)
    return f"generation_config.json {key} = {short(v)}"


@kind(1)
def gen_sampling(ck, rng):
    g = ck.load("generation_config.json") or {}
    key, values = rng.choice(
        [
            ("temperature", [-1, 0, 1e308, "hot", None, Raw("1e400")]),
            ("top_k", [-1, 0, 2**40, 1.5]),
            ("top_p", [2.0, -0.5, 0, "x"]),
            ("do_sample", ["yes", None]),
            ("repetition_penalty", [0, -1]),
            ("max_new_tokens", [0, -1]),
            ("min_p", [-1, 5]),
        ]
    )
    v = rng.choice(values)
    g[key] = v
    ck.save("generation_config.json", g)
    return f"generation_config.json {key} = {short(v)}"


@kind(1)
def gen_broken(ck, rng):
    return break_file(ck, rng, "generation_config.json")
