#!/usr/bin/env python3
"""A bounded fuzz run of `escha-convert IN OUT --format gguf` against llama.cpp.

The promise under test: exit 0 means OUT holds a GGUF that llama.cpp loads and runs (finite logits);
any other outcome is exit 1 with an `escha-convert: error:` message and nothing left behind. Never a
signal, never exit 101 (a panic), never a hang.

Each case copies fixtures/dense or fixtures/moe into a temporary directory, applies one to three
structured mutations (JSON-aware edits of config.json, tokenizer.json, tokenizer_config.json,
generation_config.json, the index and the side files; semantic edits of shard headers that keep the
offsets consistent: renamed, dropped, added, reshaped or retyped tensors; numeric edits of weights
and scales that give extreme values; a few raw byte edits), converts it with GGUF options drawn at
random (--gguf-type q4_k_m | q8_0 | auto | bf16, --gguf-vocab none, a small --max-shard-size giving a
split set, --mtp drop | keep), and loads every exit-0 output with the suite's llama_logits (the
first file of a split set), requiring exit 0 and finite logits.

Non-finite logits are diagnosed: the file is scanned for non-finite stored values (weights, or the
fp16 scales of quantized blocks), and the same input is converted with --gguf-type f32 and run
again. When that f32 file gives non-finite logits too and neither file stores a non-finite value,
the mutated model itself overflows in llama.cpp's f32 arithmetic; when the f32 file is finite but a
quantized file is not, nothing stored is non-finite and the bf16 file of the same input is finite
too, the activations overflow llama.cpp's quantized matmuls (which round them to 8-bit blocks with
f16 scales: about 65504 x 127 at most). Such cases are listed, with the reason, not counted as
failures. Each conversion and llama_logits run has a timeout and a 2 GiB address-space
limit (an allocation of gigabytes for these fixtures is a failure, not the machine's memory); after
10 timeouts the run starts no more cases.

Everything is derived from --seed and the case number: `--seed S --only N` re-runs case N alone,
with the same mutations and options (add --keep to keep its directory). Case 1 always carries a
chat template just over 16 MiB; case 0 and the cases from 2 on start with each mutation kind in
turn (in a seeded order), so a run of more cases than kinds tries every kind at least once.

    .venv/bin/python scripts/gguf-fuzz.py [--cases N] [--seed S] [--only N[,M...]] [--jobs J]
                                          [--timeout SECONDS] [--bin PATH] [--llama-bin DIR] [--keep] [-v]

ESCHA_LLAMA_BIN (from `. "$(bash scripts/llama-cpp.sh --print-env)"`) names the directory holding
llama_logits; the binary defaults to ${CARGO_TARGET_DIR:-target}/debug/escha-convert, the one
`cargo test` builds. Exit status: 0 when no case failed, 1 listing every failing case, 2 on bad
arguments or a missing binary. The last line holds the counts:

    gguf-fuzz: cases 2000, exit 0 1300, exit 1 700, loaded 1300, failures 0
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FIXTURES = ("dense", "moe")
DEFAULT_SEED = 20240611
# A case takes about 0.05 s of CPU: the default run took 52-124 s on two cores shared with other
# jobs (load average 5-13), well inside the 6 minutes it may take in .ci/run.
DEFAULT_CASES = 2000
DEFAULT_TIMEOUT = 30
# The address space a conversion or llama_logits run may take: the fixtures need about 100 MiB,
# and a run that tries to allocate gigabytes for them fails here instead of taking the machine's memory.
MEMORY_LIMIT = 2 << 30
# A run stops starting cases after this many timeouts.
MAX_TIMEOUTS = 10
TOKENS = [1, 17, 42, 99, 3, 128, 64, 7]
PREFIX = "model.language_model."
MIB = 1 << 20


# ---- JSON helpers ------------------------------------------------------------------------------


class Raw:
    """A JSON value written as given (e.g. 1e400, NaN, a lone surrogate escape)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def dumps(value):
    """json.dumps, with Raw values spliced in as their text."""
    raws = []

    def default(o):
        if isinstance(o, Raw):
            raws.append(o.text)
            return f"\u0001RAW{len(raws) - 1}\u0001"
        raise TypeError(type(o))

    text = json.dumps(value, default=default, ensure_ascii=False)
    for i, r in enumerate(raws):
        text = text.replace(json.dumps(f"\u0001RAW{i}\u0001"), r)
    return text


def short(value, n=60):
    s = dumps(value) if not isinstance(value, Raw) else value.text
    return s if len(s) <= n else f"{s[:n]}… ({len(s)} chars)"


# ---- safetensors -------------------------------------------------------------------------------


class Shard:
    """A safetensors file as metadata plus a list of [name, dtype, shape, bytes], in data order."""

    def __init__(self, path):
        b = path.read_bytes()
        n = struct.unpack("<Q", b[:8])[0]
        header = json.loads(b[8 : 8 + n])
        data = b[8 + n :]
        self.meta = header.pop("__metadata__", None)
        self.tensors = []
        for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            a, z = t["data_offsets"]
            self.tensors.append([name, t["dtype"], list(t["shape"]), data[a:z]])

    def find(self, name):
        for t in self.tensors:
            if t[0] == name:
                return t
        return None

    def write(self, path):
        header = {}
        if self.meta is not None:
            header["__metadata__"] = self.meta
        off = 0
        for name, dtype, shape, data in self.tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
            off += len(data)
        text = dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in self.tensors))


NP = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "I8": "i1", "U8": "u1", "I16": "<i2", "I32": "<i4"}


# ---- the checkpoint of one case ----------------------------------------------------------------


class Ck:
    """The copied fixture a case mutates, with helpers that keep the index in step."""

    def __init__(self, root, fixture):
        self.root = root
        self.fixture = fixture

    # JSON side files
    def load(self, name):
        try:
            return json.loads((self.root / name).read_text())
        except (OSError, ValueError):
            return None

    def save(self, name, value):
        (self.root / name).write_text(dumps(value))

    def config(self):
        return self.load("config.json")

    @staticmethod
    def text(cfg):
        tc = cfg.get("text_config") if isinstance(cfg, dict) else None
        return tc if isinstance(tc, dict) else cfg

    # shards
    def shard_paths(self):
        paths = sorted(self.root.glob("*.safetensors"))
        if (self.root / "mtp" / "model.safetensors").is_file():
            paths.append(self.root / "mtp" / "model.safetensors")
        return paths

    def main_shards(self):
        return sorted(self.root.glob("*.safetensors"))

    def all_tensors(self, mtp=True):
        """(shard path, tensor name, dtype, shape) of every tensor whose shard still parses."""
        out = []
        for p in self.shard_paths() if mtp else self.main_shards():
            try:
                s = Shard(p)
            except (ValueError, KeyError, TypeError, struct.error):
                continue
            out += [(p, t[0], t[1], t[2]) for t in s.tensors]
        return out

    def edit_shard(self, path, fn):
        s = Shard(path)
        result = fn(s)
        s.write(path)
        return result

    def index_edit(self, fn):
        """Applies fn(weight_map) to the index, when the shard is listed in one."""
        idx = self.load("model.safetensors.index.json")
        if isinstance(idx, dict) and isinstance(idx.get("weight_map"), dict):
            fn(idx["weight_map"])
            self.save("model.safetensors.index.json", idx)

    def pick_tensor(self, rng, pattern=".", mtp=True, dtypes=None):
        cands = [t for t in self.all_tensors(mtp) if re.search(pattern, t[1]) and (dtypes is None or t[2] in dtypes)]
        return rng.choice(cands) if cands else None

    def rel(self, path):
        return str(path.relative_to(self.root))


def layer_of(name):
    m = re.search(r"\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


# ---- mutation kinds ----------------------------------------------------------------------------
# Each takes (ck, rng) and returns a description of what it did; registered with a weight.

KINDS = {}


def kind(weight=1.0):
    def reg(fn):
        KINDS[fn.__name__] = (fn, weight)
        return fn

    return reg


HOSTILE = [
    0,
    -1,
    1,
    2,
    3,
    7,
    129,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**63,
    2**64 + 1,
    1e30,
    1e308,
    Raw("1e400"),
    Raw("NaN"),
    0.5,
    1.5,
    -0.0,
    "4",
    "",
    None,
    True,
    [],
    {},
    [1, 2],
]


def set_config(ck, rng, key, values, top=0.15):
    """Sets key in text_config (or, with probability `top`, at the top level) to one of values."""
    cfg = ck.config()
    if cfg is None:
        return "config.json unreadable: nothing set"
    target = cfg if rng.random() < top else ck.text(cfg)
    where = "config.json" if target is cfg else "config.json text_config"
    v = rng.choice(values)
    old = target.get(key, "<absent>")
    target[key] = v
    ck.save("config.json", cfg)
    return f"{where}.{key}: {short(old, 30)} -> {short(v)}"


@kind(2)
def cfg_delete_key(ck, rng):
    cfg = ck.config()
    if rng.random() < 0.2:
        key = rng.choice(list(cfg))
        del cfg[key]
        ck.save("config.json", cfg)
        return f"config.json: delete {key}"
    tc = ck.text(cfg)
    key = rng.choice(list(tc))
    del tc[key]
    ck.save("config.json", cfg)
    return f"config.json: delete text_config.{key}"


@kind(2)
def cfg_number(ck, rng):
    cfg = ck.config()
    tc = ck.text(cfg)
    nums = [k for k, v in tc.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    key = rng.choice(nums)
    return set_config(ck, rng, key, HOSTILE, top=0.0)


@kind(2)
def cfg_layer_types(ck, rng):
    cfg = ck.config()
    tc = ck.text(cfg)
    lt = list(tc.get("layer_types", []))
    op = rng.choice(["set", "set", "drop", "append", "empty", "all_full", "all_linear", "reverse", "string", "long"])
    if op == "set" and lt:
        i = rng.randrange(len(lt))
        v = rng.choice(["full_attention", "linear_attention", "sliding_attention", "", "Full_Attention", None, 3])
        lt[i] = v
        desc = f"layer_types[{i}] = {short(v)}"
    elif op == "drop":
        lt = lt[:-1]
        desc = "layer_types: last entry dropped"
    elif op == "append":
        lt.append(rng.choice(["full_attention", "linear_attention"]))
        desc = f"layer_types: {lt[-1]} appended"
    elif op == "empty":
        lt = []
        desc = "layer_types = []"
    elif op == "all_full":
        lt = ["full_attention"] * len(lt)
        desc = "layer_types all full_attention"
    elif op == "all_linear":
        lt = ["linear_attention"] * len(lt)
        desc = "layer_types all linear_attention"
    elif op == "reverse":
        lt = lt[::-1]
        desc = "layer_types reversed"
    elif op == "string":
        lt = "linear_attention"
        desc = 'layer_types = "linear_attention"'
    else:
        lt = (lt * 3)[:8]
        desc = "layer_types: 8 entries"
    tc["layer_types"] = lt
    ck.save("config.json", cfg)
    return f"config.json text_config.{desc}"


@kind(1)
def cfg_attention_interval(ck, rng):
    return set_config(ck, rng, "full_attention_interval", [0, 1, 2, 3, 5, -4, 2**32, None, "4"], top=0.0)


@kind(3)
def cfg_heads(ck, rng):
    key = rng.choice(
        [
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        ]
    )
    return set_config(ck, rng, key, [0, 1, 2, 3, 4, 8, 32, 64, 256, -1, 2**31, 2**32 + 1], top=0.0)


@kind(2)
def cfg_hidden(ck, rng):
    key = rng.choice(
        ["hidden_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"]
    )
    return set_config(ck, rng, key, [0, 1, 64, 127, 129, 256, 512, 2**31, 2**40], top=0.1)


@kind(2)
def cfg_vocab(ck, rng):
    return set_config(
        ck,
        rng,
        "vocab_size",
        [0, 1, 2, 200, 247, 248, 252, 253, 255, 257, 300, 512, 65536, 2**31, 2**32 + 256, -256],
        top=0.2,
    )


@kind(2)
def cfg_layers(ck, rng):
    return set_config(ck, rng, "num_hidden_layers", [0, 1, 3, 5, 8, 2**31, 3999999999, -1], top=0.1)


@kind(3)
def cfg_experts(ck, rng):
    key, values = rng.choice(
        [
            ("num_experts", [0, 1, 2, 3, 8, 256, -1]),
            ("num_experts_per_tok", [0, -1, 1, 3, 4, 5, 64, 2**31, 2**32 + 2]),
            ("num_experts_per_tok", [0, 4, 5]),
            ("decoder_sparse_step", [0, 2, 3, -1]),
            ("mlp_only_layers", [[0], [3], [0, 1, 2, 3], [9], [-1], "0"]),
            ("norm_topk_prob", [False, "yes", None, 2]),
        ]
    )
    return set_config(ck, rng, key, values, top=0.0)


@kind(3)
def cfg_special_ids(ck, rng):
    key = rng.choice(["bos_token_id", "eos_token_id", "pad_token_id"])
    values = [256, 257, 1000, -1, -2, 2**31, 2**32, 2**64, None, "2", 1.5, [2, 256], [], [2, 2], [-1], [2, 250]]
    return set_config(ck, rng, key, values, top=0.4)


@kind(2)
def cfg_rope(ck, rng):
    cfg = ck.config()
    tc = ck.text(cfg)
    rp = tc.get("rope_parameters")
    rp = rp if isinstance(rp, dict) else {}
    op = rng.choice(["theta", "partial", "mrope", "type", "delete", "legacy", "maxpos", "scaling"])
    if op == "theta":
        v = rng.choice([0, -1, 1e-30, 1e308, "x", None, Raw("1e400")])
        rp["rope_theta"] = v
        desc = f"rope_parameters.rope_theta = {short(v)}"
    elif op == "partial":
        v = rng.choice([0, 0.0001, 1.0, 2.0, -0.25, 0.3])
        rp["partial_rotary_factor"] = v
        desc = f"rope_parameters.partial_rotary_factor = {v}"
    elif op == "mrope":
        v = rng.choice([[], [64, 64, 64], [0, 0, 0], [1], [-1, 11, 10], None])
        rp["mrope_section"] = v
        desc = f"rope_parameters.mrope_section = {short(v)}"
    elif op == "type":
        v = rng.choice(["yarn", "linear", "dynamic", "llama3", "mrope", "", None])
        rp["rope_type"] = v
        if rng.random() < 0.5:
            rp["factor"] = rng.choice([0, 4.0, -1, 1e30])
        desc = f"rope_parameters.rope_type = {short(v)}, factor {rp.get('factor', '<absent>')}"
    elif op == "delete":
        tc.pop("rope_parameters", None)
        ck.save("config.json", cfg)
        return "config.json: delete text_config.rope_parameters"
    elif op == "legacy":
        tc.pop("rope_parameters", None)
        tc["rope_theta"] = rng.choice([10000000, 0, -5])
        tc["partial_rotary_factor"] = 0.25
        ck.save("config.json", cfg)
        return f"config.json: rope_parameters replaced by rope_theta {tc['rope_theta']} at text_config level"
    elif op == "maxpos":
        v = rng.choice([0, 1, 2**40, -1])
        tc["max_position_embeddings"] = v
        ck.save("config.json", cfg)
        return f"config.json text_config.max_position_embeddings = {v}"
    else:
        tc["rope_scaling"] = rng.choice(
            [
                {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
                {"rope_type": "linear", "factor": 0},
                {"type": "yarn", "factor": -2.0},
                "yarn",
            ]
        )
        ck.save("config.json", cfg)
        return f"config.json text_config.rope_scaling = {short(tc['rope_scaling'])}"
    tc["rope_parameters"] = rp
    ck.save("config.json", cfg)
    return f"config.json text_config.{desc}"


@kind(1)
def cfg_eps(ck, rng):
    return set_config(ck, rng, "rms_norm_eps", [0, -1e-6, 1e30, 1, "1e-6", None, 1e-45], top=0.0)


@kind(1)
def cfg_tie(ck, rng):
    return set_config(ck, rng, "tie_word_embeddings", [True, "true", None, 1], top=0.5)


@kind(1)
def cfg_mtp(ck, rng):
    return set_config(ck, rng, "mtp_num_hidden_layers", [0, 2, 3, -1, 2**31, None, "1"], top=0.1)


@kind(2)
def cfg_arch(ck, rng):
    cfg = ck.config()
    op = rng.choice(["model_type", "architectures", "text_model_type"])
    if op == "model_type":
        v = rng.choice(["qwen3_5_moe", "qwen3_5", "qwen3_next", "qwen3", "llama", "", None])
        cfg["model_type"] = v
    elif op == "architectures":
        v = rng.choice(
            [
                [],
                ["Qwen3_5ForCausalLM"],
                ["Qwen3_5MoeForConditionalGeneration"],
                ["Qwen3_5ForConditionalGeneration"],
                ["X"],
                "Qwen3_5ForCausalLM",
                None,
            ]
        )
        cfg["architectures"] = v
    else:
        v = rng.choice(["qwen3_5_moe_text", "qwen3_5_text", "qwen3_next", "", None])
        ck.text(cfg)["model_type"] = v
    ck.save("config.json", cfg)
    return f"config.json {op} = {short(v)}"


@kind(1)
def cfg_flatten(ck, rng):
    cfg = ck.config()
    tc = cfg.pop("text_config", None)
    if isinstance(tc, dict):
        for k, v in tc.items():
            cfg.setdefault(k, v)
    ck.save("config.json", cfg)
    return "config.json: text_config's keys moved to the top level"


@kind(2)
def cfg_quant(ck, rng):
    cfg = ck.config()
    q = cfg.get("quantization_config")
    op = rng.choice(["method", "bits", "ignore", "layer_meta", "delete", "meta_k"])
    if op == "delete":
        cfg.pop("quantization_config", None)
        desc = "delete quantization_config"
    elif op == "method":
        v = rng.choice(["escha", "eschamoe", "exl3", "gptq", "", None])
        q["quant_method"] = v
        desc = f"quantization_config.quant_method = {short(v)}"
    elif op == "bits":
        v = rng.choice([4, 0, -2, 16, "2"])
        q["bits"] = v
        desc = f"quantization_config.bits = {short(v)}"
    elif op == "ignore":
        v = rng.choice([[], ["lm_head"], ["model.language_model"], None, "lm_head"])
        q["ignore"] = v
        desc = f"quantization_config.ignore = {short(v)}"
    elif op == "layer_meta":
        q.pop("layer_meta", None)
        desc = "delete quantization_config.layer_meta"
    else:
        lm = q.get("layer_meta") or {}
        if lm:
            name = rng.choice(list(lm))
            field = rng.choice(["K", "in_features", "out_features", "bits"])
            v = rng.choice([0, 1, 9, 3, 1024, -1])
            lm[name][field] = v
            desc = f"quantization_config.layer_meta[{name}].{field} = {v}"
        else:
            q["layer_meta"] = {f"{PREFIX}layers.0.mlp.experts.gate_up_proj": {"K": 9}}
            desc = "quantization_config.layer_meta with K 9"
    ck.save("config.json", cfg)
    return f"config.json {desc}"


def pointers(v, at=()):
    out = []
    if isinstance(v, dict):
        for k, c in v.items():
            out += pointers(c, at + (k,))
    elif isinstance(v, list):
        for i, c in enumerate(v):
            out += pointers(c, at + (i,))
    out.append(at)
    return out


def replace_node(ck, rng, name):
    doc = ck.load(name)
    if doc is None:
        return f"{name} unreadable: nothing replaced"
    ps = [p for p in pointers(doc) if p]
    p = rng.choice(ps)
    v = rng.choice(HOSTILE)
    node = doc
    for k in p[:-1]:
        node = node[k]
    node[p[-1]] = v
    ck.save(name, doc)
    return f"{name}: node /{'/'.join(map(str, p))} = {short(v)}"


@kind(2)
def cfg_hostile_node(ck, rng):
    return replace_node(ck, rng, "config.json")


def break_file(ck, rng, name):
    p = ck.root / name
    op = rng.choice(["delete", "truncate", "empty", "list", "number", "bad_utf8"])
    if op == "delete":
        p.unlink(missing_ok=True)
    elif op == "truncate":
        b = p.read_bytes()
        p.write_bytes(b[: len(b) // 2])
    elif op == "empty":
        p.write_bytes(b"")
    elif op == "list":
        p.write_text("[]")
    elif op == "number":
        p.write_text("5")
    else:
        p.write_bytes(p.read_bytes().replace(b"{", b"{\xff\xfe", 1))
    return f"{name}: {op}"


@kind(1)
def cfg_broken(ck, rng):
    return break_file(ck, rng, "config.json")


@kind(1)
def cfg_activation(ck, rng):
    key, values = rng.choice(
        [
            ("attn_output_gate", [False, None, "yes"]),
            ("hidden_act", ["gelu", "relu", "unknown", None]),
            ("attention_bias", [True, "x"]),
        ]
    )
    return set_config(ck, rng, key, values, top=0.0)


@kind(1)
def cfg_vision(ck, rng):
    cfg = ck.config()
    v = rng.choice(["delete", None, {}, {"depth": 0}])
    if v == "delete":
        cfg.pop("vision_config", None)
    else:
        cfg["vision_config"] = v
    ck.save("config.json", cfg)
    return f"config.json vision_config: {short(v)}"


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


# shard headers: semantic edits that keep the files well formed

HUGE_LAYERS = [
    4,
    5,
    31,
    255,
    3999999999,
    4294967295,
    4294967296,
    18446744073709551615,
    18446744073709551616,
    99999999999999999999,
]


def rename_tensors(ck, renames, update_index=True):
    """Renames tensors (old -> new) in whichever shard holds them, and in the index."""
    for p in ck.shard_paths():
        try:
            s = Shard(p)
        except (ValueError, KeyError, TypeError, struct.error):
            continue
        hit = False
        for t in s.tensors:
            if t[0] in renames:
                t[0] = renames[t[0]]
                hit = True
        if hit:
            s.write(p)
    if update_index:

        def fix(wm):
            for old, new in renames.items():
                if old in wm:
                    wm[new] = wm.pop(old)

        ck.index_edit(fix)


@kind(3)
def st_rename_tensor_layer(ck, rng):
    t = ck.pick_tensor(rng, r"\.layers\.\d+\.")
    layer = layer_of(t[1])
    new = rng.choice(HUGE_LAYERS + ["-1", "01", "x", str(3 - layer if layer is not None else 0)])
    name = re.sub(r"\.layers\.\d+\.", f".layers.{new}.", t[1], count=1)
    upd = rng.random() < 0.85
    rename_tensors(ck, {t[1]: name}, upd)
    return f"{ck.rel(t[0])}: rename {t[1]} -> {name}{'' if upd else ' (index not updated)'}"


@kind(3)
def st_rename_layer(ck, rng):
    tensors = ck.all_tensors()
    src = rng.choice([0, 1, 2, 3])
    op = rng.choice(["move", "move", "swap"])
    if op == "swap":
        dst = rng.choice([x for x in (0, 1, 2, 3) if x != src])
        renames = {}
        for _, n, _, _ in tensors:
            if n.startswith(PREFIX) and layer_of(n) in (src, dst):
                other = dst if layer_of(n) == src else src
                renames[n] = re.sub(r"\.layers\.\d+\.", f".layers.{other}.", n, count=1)
        rename_tensors(ck, renames)
        return f"shards: layers {src} and {dst} swapped ({len(renames)} tensors)"
    dst = rng.choice(HUGE_LAYERS)
    renames = {
        n: re.sub(r"\.layers\.\d+\.", f".layers.{dst}.", n, count=1)
        for _, n, _, _ in tensors
        if n.startswith(PREFIX) and layer_of(n) == src
    }
    rename_tensors(ck, renames)
    return f"shards: layer {src} renamed to layer {dst} ({len(renames)} tensors)"


@kind(1)
def st_rename_mtp_layer(ck, rng):
    tensors = [t for t in ck.all_tensors() if t[1].startswith("mtp.layers.")]
    if not tensors:
        return "no mtp tensors"
    dst = rng.choice([1, 2, 3999999999, 18446744073709551616])
    renames = {n: n.replace("mtp.layers.0.", f"mtp.layers.{dst}.", 1) for _, n, _, _ in tensors}
    rename_tensors(ck, renames)
    return f"shards: mtp.layers.0 renamed to mtp.layers.{dst}"


@kind(3)
def st_drop_tensor(ck, rng):
    pattern = rng.choice(
        [
            ".",
            ".",
            r"escha_(s_in|s_out|config)$",
            r"weight_scale$",
            r"norm\.weight$",
            r"^mtp\.",
            r"conv1d|A_log|dt_bias|in_proj_[ab]",
            r"mlp\.gate\.weight|shared_expert",
        ]
    )
    t = ck.pick_tensor(rng, pattern) or ck.pick_tensor(rng)
    ck.edit_shard(t[0], lambda s: s.tensors.remove(s.find(t[1])))
    upd = rng.random() < 0.85
    if upd:
        ck.index_edit(lambda wm: wm.pop(t[1], None))
    return f"{ck.rel(t[0])}: drop {t[1]}{'' if upd else ' (index not updated)'}"


@kind(3)
def st_reshape(ck, rng):
    """Shape changed, bytes kept (header only)."""
    t = ck.pick_tensor(rng)
    shape = list(t[3])
    n = int(np.prod(shape)) if shape else 1
    choices = []
    if len(shape) >= 2:
        choices.append(shape[::-1])
        choices.append([shape[0] * shape[1]] + shape[2:])
    if n % 2 == 0:
        choices.append([n // 2, 2])
        choices.append([2, n // 2])
    choices.append([1] + shape)
    choices.append(shape + [1])
    choices.append([n])
    if n == 1:
        choices.append([])
    new = rng.choice(choices)

    def edit(s):
        s.find(t[1])[2] = new

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} shape {shape} -> {new} (same bytes)"


@kind(3)
def st_resize(ck, rng):
    """The first dimension shrunk or grown, data cut or zero/copy-extended to match."""
    pattern = rng.choice(
        [
            ".",
            r"norm\.weight$",
            r"embed_tokens|lm_head",
            r"escha_code$",
            r"escha_(s_in|s_out|rin|rout)$",
            r"conv1d|in_proj_[ab]|mlp\.gate\.weight",
        ]
    )
    t = ck.pick_tensor(rng, pattern) or ck.pick_tensor(rng)
    shape = list(t[3])
    if not shape:
        shape = [1]
    d0 = shape[0]
    new0 = rng.choice([d0 // 2, d0 - 1, d0 + 1, d0 * 2, d0 + 44, 1])
    new0 = max(new0, 1)

    def edit(s):
        x = s.find(t[1])
        row = len(x[3]) // d0 if d0 else 0
        data = (
            x[3][: new0 * row]
            if new0 <= d0
            else x[3] + x[3][: (new0 - d0) * row] + bytes(max(0, (new0 - 2 * d0) * row))
        )
        x[2] = [new0] + shape[1:]
        x[3] = data

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} shape {t[3]} -> {[new0] + shape[1:]} (data resized)"


SAME_WIDTH = {
    "F16": ["BF16", "I16", "U16"],
    "BF16": ["F16"],
    "F32": ["I32", "U32"],
    "I32": ["F32", "U32"],
    "I16": ["F16", "U16", "BF16"],
    "I8": ["U8", "F8_E4M3", "BOOL"],
    "U8": ["I8"],
}


@kind(2)
def st_dtype_reinterpret(ck, rng):
    t = ck.pick_tensor(rng, ".", dtypes=set(SAME_WIDTH))
    new = rng.choice(SAME_WIDTH[t[2]])

    def edit(s):
        s.find(t[1])[1] = new

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} dtype {t[2]} -> {new} (bytes reinterpreted)"


@kind(2)
def st_dtype_convert(ck, rng):
    t = ck.pick_tensor(rng, ".", dtypes={"F16", "F32", "I8", "I16"})
    src = t[2]
    targets = {
        "F16": ["F32", "F64", "BF16"],
        "F32": ["F16", "F64", "BF16"],
        "I8": ["I16", "I32", "F16"],
        "I16": ["I32", "I8"],
    }[src]
    new = rng.choice(targets)

    def edit(s):
        x = s.find(t[1])
        a = np.frombuffer(x[3], dtype=NP[src])
        with np.errstate(all="ignore"):
            if new == "BF16":
                f = a.astype("<f4")
                b = ((f.view("<u4") + 0x8000) >> 16).astype("<u2").tobytes()
            else:
                b = a.astype(NP[new]).tobytes()
        x[1], x[3] = new, b

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} converted {src} -> {new}"


@kind(2)
def st_add_tensor(ck, rng):
    name, dtype, shape = rng.choice(
        [
            (f"{PREFIX}layers.0.mlp.extra.weight", "F16", [4]),
            ("model.visual.blocks.0.norm1.weight", "F16", [64]),
            ("mtp.layers.0.extra.weight", "F16", [128]),
            (f"{PREFIX}layers.3999999999.input_layernorm.weight", "F16", [128]),
            (f"{PREFIX}layers.4.input_layernorm.weight", "F16", [128]),
            ("lm_head.weight", "F16", [256, 128]),
            (f"{PREFIX}embed_tokens.weight", "F16", [256, 128]),
            (f"{PREFIX}layers.0.self_attn.q_proj.weight", "F16", [256, 128]),
            (f"{PREFIX}layers.0.mlp.up_proj.escha_x", "F32", [4]),
            ("mtp.layers.1.input_layernorm.weight", "F16", [128]),
            (f"{PREFIX}layers.0.linear_attn.norm.weight", "F16", [64]),
            ("", "F16", [1]),
            ("a\u0000b", "F16", [1]),
        ]
    )
    n = int(np.prod(shape))
    data = (np.full(n, 0.01, dtype="<f4").astype(NP[dtype])).tobytes()
    shards = ck.main_shards()
    p = rng.choice(shards)

    def edit(s):
        if s.find(name):
            s.find(name)[1:] = [dtype, shape, data]
        else:
            s.tensors.append([name, dtype, shape, data])

    ck.edit_shard(p, edit)
    ck.index_edit(lambda wm: wm.__setitem__(name, p.name))
    return f"{ck.rel(p)}: add {name!r} {dtype} {shape}"


@kind(1)
def st_metadata(ck, rng):
    p = rng.choice(ck.shard_paths())
    v = rng.choice([None, {"format": "tf"}, {"format": "pt", "x": "y" * 100_000}, {"format": 5}, {}, []])

    def edit(s):
        s.meta = v

    ck.edit_shard(p, edit)
    return f"{ck.rel(p)}: __metadata__ = {short(v)}"


@kind(1)
def st_move_tensor(ck, rng):
    shards = ck.main_shards()
    t = ck.pick_tensor(rng, ".", mtp=False)
    if len(shards) == 1:
        new = ck.root / "model-00002-of-00002.safetensors"
        s = Shard.__new__(Shard)
        s.meta, s.tensors = {"format": "pt"}, []
        s.write(new)
        shards.append(new)
    dst = rng.choice([p for p in shards if p != t[0]])
    holder = {}

    def take(s):
        x = s.find(t[1])
        s.tensors.remove(x)
        holder["x"] = x

    ck.edit_shard(t[0], take)
    ck.edit_shard(dst, lambda s: s.tensors.append(holder["x"]))
    ck.index_edit(lambda wm: wm.__setitem__(t[1], dst.name))
    return f"{t[1]} moved from {ck.rel(t[0])} to {ck.rel(dst)} (index updated)"


@kind(2)
def st_index(ck, rng):
    idx = ck.load("model.safetensors.index.json")
    wm = idx["weight_map"]
    op = rng.choice(["drop_entry", "wrong_shard", "phantom", "delete", "total_size", "empty_map"])
    if op == "delete":
        (ck.root / "model.safetensors.index.json").unlink()
        return "model.safetensors.index.json deleted"
    if op == "drop_entry":
        k = rng.choice(list(wm))
        del wm[k]
        desc = f"weight_map entry {k} dropped"
    elif op == "wrong_shard":
        k = rng.choice(list(wm))
        wm[k] = rng.choice(
            [s.name for s in ck.main_shards()] + ["mtp/model.safetensors", "model-00003-of-00003.safetensors"]
        )
        desc = f"weight_map {k} -> {wm[k]}"
    elif op == "phantom":
        wm[f"{PREFIX}layers.0.phantom.weight"] = ck.main_shards()[0].name
        desc = "phantom weight_map entry"
    elif op == "total_size":
        idx["metadata"] = {"total_size": rng.choice([0, -1, 2**64, "x"])}
        desc = f"metadata.total_size = {idx['metadata']['total_size']}"
    else:
        idx["weight_map"] = {}
        desc = "weight_map = {}"
    ck.save("model.safetensors.index.json", idx)
    return f"model.safetensors.index.json: {desc}"


@kind(1)
def st_raw_bytes(ck, rng):
    p = rng.choice(ck.shard_paths())
    b = bytearray(p.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    op = rng.choice(["header_byte", "truncate", "header_len", "data_tail"])
    if op == "header_byte":
        at = 8 + rng.randrange(n)
        b[at] = rng.randrange(256)
        desc = f"header byte {at} = {b[at]}"
    elif op == "truncate":
        keep = rng.randrange(len(b))
        b = b[:keep]
        desc = f"cut to {keep} bytes"
    elif op == "header_len":
        v = rng.choice([0, n - 8, n + 8, len(b), 2**63])
        b[:8] = struct.pack("<Q", v)
        desc = f"header length {n} -> {v}"
    else:
        b += bytes(rng.choice([1, 8, 4096]))
        desc = "bytes appended after the data"
    p.write_bytes(bytes(b))
    return f"{ck.rel(p)}: {desc}"


# numeric edits of the weights


def scale_values(ck, t, fn, rows=None):
    """Applies fn to the float values of tensor t (F16/F32/BF16 as stored), optionally only some rows."""

    def edit(s):
        x = s.find(t[1])
        if x[1] == "BF16":
            a = (np.frombuffer(x[3], "<u2").astype("<u4") << 16).view("<f4").copy()
        else:
            a = np.frombuffer(x[3], NP[x[1]]).astype(np.float64)
        with np.errstate(all="ignore"):
            if rows is not None and x[2]:
                a = a.reshape(x[2][0], -1)
                a[rows] = fn(a[rows])
                a = a.reshape(-1)
            else:
                a = fn(a)
            if x[1] == "BF16":
                f = a.astype("<f4")
                x[3] = ((f.view("<u4") + 0x8000) >> 16).astype("<u2").tobytes()
            else:
                x[3] = a.astype(NP[x[1]]).tobytes()

    ck.edit_shard(t[0], edit)


@kind(3)
def w_scale_huge(ck, rng):
    t = ck.pick_tensor(rng, r"escha_s_(in|out)$")
    # The fixtures' weights are below about 0.2: these take them to about 1e3 .. 4e7.
    f = rng.choice([1e4, 1e6, 5e7, 2e8])
    one = rng.random() < 0.3
    rows = [0] if one and len(t[3]) > 1 else None
    scale_values(ck, t, lambda a: a * f, rows)
    return f"{ck.rel(t[0])}: {t[1]} x {f:g}{' (first expert/row only)' if rows else ''} (weights up to ~{0.2 * f:.0e})"


@kind(2)
def w_scale_tiny(ck, rng):
    t = ck.pick_tensor(rng, r"escha_s_(in|out)$")
    f = rng.choice([1e-6, 1e-10, 1e-30, 1e-45, 0.0, -1.0])
    scale_values(ck, t, lambda a: a * f)
    return f"{ck.rel(t[0])}: {t[1]} x {f:g}"


@kind(2)
def w_int8_scale(ck, rng):
    t = ck.pick_tensor(rng, r"weight_scale$")
    v = rng.choice([65504.0, 30000.0, 1000.0, 6e-8, 0.0, -1.0, -65504.0])
    rows = rng.choice([None, [0], list(range(1, 9))])
    scale_values(ck, t, lambda a: np.full_like(a, v), rows)
    return f"{ck.rel(t[0])}: {t[1]} = {v:g}{'' if rows is None else f' in rows {rows[0]}..{rows[-1]}'}"


@kind(2)
def w_norm(ck, rng):
    t = ck.pick_tensor(rng, r"norm\.weight$|norm_embedding|norm_hidden")
    v = rng.choice([65504.0, 1000.0, -1.0, -65504.0, 0.0, 6e-8])
    scale_values(ck, t, lambda a: np.full_like(a, v))
    return f"{ck.rel(t[0])}: {t[1]} = {v:g}"


@kind(2)
def w_gdn_params(ck, rng):
    t = ck.pick_tensor(rng, r"A_log|dt_bias|conv1d|in_proj_[ab]")
    v = rng.choice([88.8, 1e30, -1e30, 100.0, 65504.0, -65504.0, 0.0])
    scale_values(ck, t, lambda a: np.full_like(a, v))
    return f"{ck.rel(t[0])}: {t[1]} = {v:g}"


@kind(1)
def w_rin_rout(ck, rng):
    t = ck.pick_tensor(rng, r"escha_r(in|out)$")
    f = rng.choice([65504.0, 1000.0, 1e-7, 0.0])
    scale_values(ck, t, lambda a: a * f)
    return f"{ck.rel(t[0])}: {t[1]} x {f:g}"


@kind(1)
def w_code_bytes(ck, rng):
    t = ck.pick_tensor(rng, r"escha_code$")
    op = rng.choice(["random", "zero", "ones"])

    def edit(s):
        x = s.find(t[1])
        n = len(x[3])
        if op == "random":
            x[3] = random.Random(rng.random()).randbytes(n)
        elif op == "zero":
            x[3] = bytes(n)
        else:
            x[3] = b"\xff" * n

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} codes {op}"


@kind(1)
def w_int8_extreme(ck, rng):
    t = ck.pick_tensor(rng, r"weight_int8$")
    v = rng.choice([127, -128])

    def edit(s):
        x = s.find(t[1])
        x[3] = np.full(len(x[3]), v, dtype="i1").tobytes()

    ck.edit_shard(t[0], edit)
    s = t[1].replace("weight_int8", "weight_scale")
    st = next((x for x in ck.all_tensors() if x[1] == s), None)
    if st and rng.random() < 0.5:
        scale_values(ck, st, lambda a: np.full_like(a, 65504.0))
        return f"{t[1]} all {v}, {s} = 65504"
    return f"{t[1]} all {v}"


@kind(2)
def w_plain_extreme(ck, rng):
    t = ck.pick_tensor(rng, r"\.weight$", dtypes={"F16", "F32"})
    v = rng.choice([65504.0, -65504.0, 1e4, float("inf"), float("nan"), 0.0])
    one = rng.random() < 0.5

    def fn(a):
        if one:
            a = a.copy()
            a[0] = v
            return a
        return np.full_like(a, v)

    scale_values(ck, t, fn)
    return f"{ck.rel(t[0])}: {t[1]} {'element 0' if one else 'all'} = {v:g}"


@kind(1)
def w_scale_nonfinite(ck, rng):
    t = ck.pick_tensor(rng, r"escha_s_(in|out)$|weight_scale$|escha_r(in|out)$")
    v = rng.choice([float("nan"), float("inf"), float("-inf")])

    def fn(a):
        a = a.copy()
        a[-1] = v
        return a

    scale_values(ck, t, fn)
    return f"{ck.rel(t[0])}: {t[1]} last element = {v}"


# ---- cases -------------------------------------------------------------------------------------


def kind_order(seed):
    names = sorted(KINDS)
    random.Random(f"{seed}:order").shuffle(names)
    return names


def weighted_kind(rng):
    names = sorted(KINDS)
    return rng.choices(names, weights=[KINDS[n][1] for n in names])[0]


def plan_case(seed, i, order):
    """The fixture, mutation kinds and options of case i (a pure function of seed and i)."""
    rng = random.Random(f"{seed}:{i}")
    fixture = rng.choice(FIXTURES)
    if i == 1:
        kinds = ["chat_template_over_16mib"]
    else:
        j = i - (i > 1)  # case 0 and cases 2.. walk the seeded order once
        kinds = [order[j] if j < len(order) else weighted_kind(rng)]
    while rng.random() < 0.3 and len(kinds) < 3:
        kinds.append(weighted_kind(rng))
    opts = ["--gguf-type", rng.choices(["q4_k_m", "q8_0", "auto", "bf16"], weights=[3, 2.5, 2.5, 2])[0]]
    if rng.random() < 0.25:
        opts += ["--gguf-vocab", "none"]
    if rng.random() < 0.25:
        opts += ["--max-shard-size", rng.choice(["200K", "200K", "100K", "300KB", "64KiB"])]
    r = rng.random()
    if r < 0.25:
        opts += ["--mtp", "drop"]
    elif r < 0.5:
        opts += ["--mtp", "keep"]
    return rng, fixture, kinds, opts


class Result:
    def __init__(self, i):
        self.i = i
        self.status = None  # exit code, negative for a signal, or "timeout"
        self.loaded = False  # loaded, ran, finite logits
        # Why non-finite logits are the mutated model's values, not the file (empty: they are not):
        # the f32 conversion of the same input overflows too, or llama.cpp's 8-bit activation
        # blocks overflow where the bf16 and f32 files run finite.
        self.overflow = ""
        self.problems = []
        self.notes = []
        self.mutations = []
        self.cmd = []
        self.stderr = ""
        self.llama_cmd = []
        self.llama_stderr = ""
        self.fixture = ""
        self.signature = ""
        self.seconds = 0.0


def useful_lines(text):
    """stderr without progress lines, llama.cpp's "unused tensor" warnings and gdb chatter."""
    skip = re.compile(r"% written|unused tensor|^\s*$")
    return [x for x in text.splitlines() if not skip.search(x)]


def tail(text, lines=8):
    ls = useful_lines(text)
    errs = [x for x in ls[:-lines] if re.search(r"error|warning|panick|assert", x, re.I)][:3]
    if panic_message(text) and not any("panicked" in x for x in ls[-lines:]):
        errs.append(panic_message(text))
    return [x[:400] for x in errs + ls[-lines:]]


def first_error_line(text, pattern=r"error|fail|panick|assert|abort|not below|exception|invalid|unable"):
    lines = useful_lines(text)
    for x in lines:
        if re.search(pattern, x, re.I):
            return x.strip()
    return lines[-1].strip() if lines else ""


def panic_message(text):
    """A Rust panic's "panicked at FILE:LINE:COL: MESSAGE", or ""."""
    m = re.search(r"panicked at (\S+):\n?(.*)", text)
    return f"panicked at {m.group(1)} {m.group(2).strip()}" if m else ""


def run_killable(cmd, timeout, env=None):
    """Runs cmd in its own process group, its address space limited to MEMORY_LIMIT (an allocation
    past it fails, and the program says so), and kills that group on timeout: (rc or "timeout", stderr)."""
    limited = ["/bin/sh", "-c", f'ulimit -v {MEMORY_LIMIT >> 10} && exec "$@"', "sh", *map(str, cmd)]
    p = subprocess.Popen(limited, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
    try:
        _, err = p.communicate(timeout=timeout)
        return p.returncode, err.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, err = p.communicate()
        return "timeout", err.decode("utf-8", "replace")


# A panic's stderr is its location and message, without a backtrace.
CONVERT_ENV = dict(os.environ, RUST_BACKTRACE="0")


def signame(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


# ---- GGUF --------------------------------------------------------------------------------------

GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GGUF_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type: (elements per block, bytes per block, byte offsets of its fp16 scales)
GGML_BLOCKS = {
    2: (32, 18, [0]),  # Q4_0
    3: (32, 20, [0, 2]),  # Q4_1
    6: (32, 22, [0]),  # Q5_0
    7: (32, 24, [0, 2]),  # Q5_1
    8: (32, 34, [0]),  # Q8_0
    10: (256, 84, [80, 82]),  # Q2_K
    11: (256, 110, [108]),  # Q3_K
    12: (256, 144, [0, 2]),  # Q4_K
    13: (256, 176, [0, 2]),  # Q5_K
    14: (256, 210, [208]),  # Q6_K
}
GGML_NAMES = {
    0: "F32",
    1: "F16",
    30: "BF16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
}


def gguf_read(path):
    """(metadata, [(name, dims, type, offset)], data start) of a GGUF file; arrays are ("array", n)."""
    with open(path, "rb") as f:

        def rd(fmt):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def rstr():
            return f.read(rd("<Q")).decode("utf-8", "replace")

        def skip(ty):
            if ty == 8:
                f.seek(rd("<Q"), 1)
            elif ty == 9:
                sub, n = rd("<I"), rd("<Q")
                if sub in GGUF_SIZES:
                    f.seek(GGUF_SIZES[sub] * n, 1)
                else:
                    for _ in range(n):
                        skip(sub)
            else:
                f.seek(GGUF_SIZES[ty], 1)

        if f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        rd("<I")
        n_tensors, n_kv = rd("<Q"), rd("<Q")
        kv = {}
        for _ in range(n_kv):
            key = rstr()
            ty = rd("<I")
            if ty == 9:
                at = f.tell()
                rd("<I")
                kv[key] = ("array", rd("<Q"))
                f.seek(at)
                skip(9)
            elif ty == 8:
                kv[key] = rstr()
            else:
                kv[key] = rd(GGUF_FMT[ty])
        tensors = []
        for _ in range(n_tensors):
            name = rstr()
            dims = [rd("<Q") for _ in range(rd("<I"))]
            tensors.append((name, dims, rd("<I"), rd("<Q")))
        align = kv.get("general.alignment", 32)
        start = -(-f.tell() // align) * align
    return kv, tensors, start


def gguf_vocab(path):
    """The vocabulary size llama.cpp will see in GGUF `path` (its tokens, else the vocab_size key,
    else the embedding's rows), or None when the header cannot be read."""
    try:
        kv, tensors, _ = gguf_read(path)
    except (OSError, ValueError, KeyError, struct.error):
        return None
    toks = kv.get("tokenizer.ggml.tokens")
    if isinstance(toks, tuple):
        return toks[1]
    size = kv.get(f"{kv.get('general.architecture')}.vocab_size")
    if isinstance(size, int):
        return size
    return next((d[1] for n, d, _, _ in tensors if n == "token_embd.weight" and len(d) >= 2), None)


def gguf_nonfinite(files):
    """The tensors of a GGUF set that store a non-finite value (a weight, or a block's fp16 scale)."""
    found = []
    for path in files:
        try:
            _, tensors, start = gguf_read(path)
            data = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError, KeyError, struct.error) as e:
            found.append(f"{path.name}: unreadable ({e})")
            continue
        for name, dims, ty, off in tensors:
            n = int(np.prod(dims)) if dims else 1
            a = start + off
            if ty in (0, 1, 30):
                width = 4 if ty == 0 else 2
                raw = np.asarray(data[a : a + n * width])
                v = (
                    raw.view("<f4")
                    if ty == 0
                    else raw.view("<f2") if ty == 1 else (raw.view("<u2").astype("<u4") << 16).view("<f4")
                )
            elif ty in GGML_BLOCKS:
                per, size, at = GGML_BLOCKS[ty]
                blocks = np.asarray(data[a : a + n // per * size]).reshape(-1, size)
                v = np.concatenate([blocks[:, k : k + 2].copy().view("<f2").reshape(-1) for k in at])
            else:
                continue
            bad = int(np.count_nonzero(~np.isfinite(v)))
            if bad:
                what = "weights" if ty in (0, 1, 30) else "block scales"
                found.append(f"{name} ({GGML_NAMES.get(ty, ty)}): {bad} non-finite {what}")
    return found


def model_file(out):
    files = sorted(out.glob("*.gguf"))
    if (out / "model.gguf").is_file():
        return out / "model.gguf", files
    firsts = [f for f in files if re.search(r"-00001-of-\d{5}\.gguf$", f.name)]
    return (firsts[0] if firsts else None), files


def llama(args, model, logits):
    """Runs llama_logits on `model`: (command, stderr, problem or None, logits or None)."""
    n_vocab = gguf_vocab(model)
    tokens = [t % n_vocab for t in TOKENS] if n_vocab else TOKENS
    cmd = [Path(args.llama_bin) / "llama_logits", "-t", "1", "-o", logits, model, ",".join(map(str, tokens))]
    env = dict(os.environ, GGML_NO_BACKTRACE="1")  # an assertion aborts at once instead of running gdb
    rc, err = run_killable(cmd, args.timeout, env)
    if rc == "timeout":
        return cmd, err, ("llama_logits timed out", f"llama_logits did not finish within {args.timeout:g} s"), None
    if rc != 0:
        what = signame(rc) if rc < 0 else f"exit {rc}"
        return (
            cmd,
            err,
            (f"llama.cpp {what}: {first_error_line(err)}", f"llama_logits {what} on the exit-0 output"),
            None,
        )
    try:
        n = int(err.strip().splitlines()[-1].rsplit("n_vocab=", 1)[1])
        y = np.fromfile(logits, dtype="<f4")
    except (IndexError, ValueError, OSError) as e:
        return cmd, err, ("llama_logits output unreadable", f"llama_logits' output unreadable: {e}"), None
    if y.size != len(tokens) * n:
        return (
            cmd,
            err,
            (
                "llama_logits wrote the wrong number of floats",
                f"llama_logits wrote {y.size} floats, want {len(tokens)} x {n}",
            ),
            None,
        )
    return cmd, err, None, y.reshape(len(tokens), n)


# ---- one case ----------------------------------------------------------------------------------


def run_case(args, seed, i, order, work):
    res = Result(i)
    rng, fixture, kinds, opts = plan_case(seed, i, order)
    res.fixture = fixture
    case = work / f"case-{i:04d}"
    ck_dir = case / "in"
    shutil.copytree(REPO / "fixtures" / fixture, ck_dir)
    ck = Ck(ck_dir, fixture)
    for k in kinds:
        fn = chat_template_over_16mib if k == "chat_template_over_16mib" else KINDS[k][0]
        try:
            res.mutations.append(f"{k}: {fn(ck, rng)}")
        except Exception as e:  # an earlier mutation can leave a file this one cannot edit
            res.mutations.append(f"{k}: not applied ({type(e).__name__}: {e})")
    parent = case / "outp"
    parent.mkdir()
    out = parent / "out"
    res.cmd = [args.bin, ck_dir, out, "--format", "gguf", *opts, "-j", "1"]
    t0 = time.monotonic()
    rc, err = run_killable(res.cmd, args.timeout, CONVERT_ENV)
    res.seconds = time.monotonic() - t0
    res.status, res.stderr = rc, err
    if rc == "timeout":
        res.problems.append(f"escha-convert did not finish within {args.timeout:g} s")
        res.signature = "conversion timed out"
    elif rc < 0:
        res.problems.append(f"escha-convert died by {signame(rc)}")
        if "memory allocation" in err:
            res.notes.append(
                f"the run's address space is limited to {MEMORY_LIMIT >> 30} GiB (the fixtures need about 100 MiB)"
            )
        res.signature = f"conversion killed by {signame(rc)}: {first_error_line(err)}"
    elif rc == 1:
        if "escha-convert: error:" not in err:
            res.problems.append("exit 1 without an 'escha-convert: error:' message")
            res.signature = f"exit 1 without a message: {first_error_line(err)}"
        left = sorted(x.name for x in parent.iterdir())
        if left:
            res.problems.append(f"exit 1 left {left} beside OUT")
            res.signature = res.signature or "exit 1 left output behind"
    elif rc != 0:
        res.problems.append(f"escha-convert exited {rc}" + (" (a panic)" if rc == 101 else ""))
        res.signature = f"conversion exit {rc}: {panic_message(err) or first_error_line(err, r'panicked|error')}"
    else:
        load(args, res, out, opts)
    if not args.keep:
        shutil.rmtree(case, ignore_errors=True)
    return res


def load(args, res, out, opts):
    model, files = model_file(out)
    if model is None:
        res.problems.append(f"exit 0 but no model.gguf or model-00001-of-N.gguf in OUT: {[f.name for f in files]}")
        res.signature = "exit 0 without a GGUF"
        return
    res.llama_cmd, res.llama_stderr, problem, y = llama(args, model, out.parent / "logits.f32")
    if problem:
        res.signature, p = problem
        res.problems.append(p)
        return
    bad = ~np.isfinite(y)
    if not bad.any():
        res.loaded = True
        return
    k = int(np.argmax(bad))
    n = y.shape[1]
    p = f"{int(bad.sum())} of {y.size} logits not finite (first at position {k // n}, token {k % n}: {y.flat[k]})"
    # Diagnosis: does the file store a non-finite value (a broken file), and does the f32 conversion
    # of the same input give finite logits (then the types chosen lose it) or not (then the mutated
    # model itself overflows in llama.cpp's f32 arithmetic, which is not held against the conversion
    # when neither file stores a non-finite value)?
    stored = gguf_nonfinite(files)
    ref = out.parent / "ref"
    ty = opts.index("--gguf-type") + 1
    ref_cmd = [*res.cmd[:2], ref, *res.cmd[3:]]
    ref_cmd[5 + ty] = "f32"
    rc, err = run_killable(ref_cmd, args.timeout, CONVERT_ENV)
    ref_model, ref_files = model_file(ref) if rc == 0 else (None, [])
    ref_y = llama(args, ref_model, out.parent / "ref.f32")[3] if ref_model else None
    if ref_y is None:
        res.notes.append(f"the f32 conversion of the same input did not load or run (escha-convert exit {rc})")
    elif np.isfinite(ref_y).all():
        res.notes.append(
            f"the f32 conversion of the same input gives finite logits (max |logit| {float(np.max(np.abs(ref_y))):.3g})"
        )
        # A quantized file whose every stored value is finite (and within what blocks hold: the tool
        # refuses the rest), whose bf16 conversion runs finite too: the NaN arises in llama.cpp's
        # quantized matmuls, which round the activations to 8-bit blocks with f16 scales, so an
        # activation beyond about 65504 x 127 overflows. That is the mutated model's values meeting
        # llama.cpp's kernels, not something the file can carry differently.
        if not stored and res.cmd[5 + ty] not in ("bf16", "f16", "f32"):
            bf16 = out.parent / "ref-bf16"
            bf16_cmd = [*ref_cmd[:2], bf16, *ref_cmd[3:]]
            bf16_cmd[5 + ty] = "bf16"
            rc, _ = run_killable(bf16_cmd, args.timeout, CONVERT_ENV)
            bf16_model = model_file(bf16)[0] if rc == 0 else None
            bf16_y = llama(args, bf16_model, out.parent / "bf16.f32")[3] if bf16_model else None
            if bf16_y is not None and np.isfinite(bf16_y).all():
                res.overflow = "activations overflow llama.cpp's 8-bit activation blocks (bf16 and f32 files finite)"
                res.notes.append(f"{p}; {res.overflow}")
                return
    elif not stored and not gguf_nonfinite(ref_files):
        res.overflow = "the model overflows in f32 too"
        res.notes.append(
            f"{p}; the f32 conversion gives non-finite logits too, every stored value finite: the mutated model overflows"
        )
        return
    else:
        res.notes.append("the f32 conversion of the same input gives non-finite logits too")
    if stored:
        res.notes.append(
            "non-finite values stored in the file: " + "; ".join(stored[:4]) + (" …" if len(stored) > 4 else "")
        )
        res.signature = "non-finite logits: the file stores non-finite values"
    else:
        res.signature = "non-finite logits: every stored value finite, f32 conversion " + (
            "finite" if ref_y is not None else "did not run"
        )
    res.problems.append(p)


# ---- the run -----------------------------------------------------------------------------------


def normalise(sig, work):
    sig = sig.replace(str(work), "")
    sig = re.sub(r"/case-\d+/(in|outp/out)", "<\\1>", sig)
    sig = re.sub(r"(?<![A-Za-z_\d])\d+", "N", sig)  # counts and block numbers, not f32 or conv1d
    sig = re.sub(r"\s+", " ", sig)
    return sig[:200]


def report(res, seed, script):
    lines = [f"case {res.i} ({res.fixture}; reproduce: {script} --seed {seed} --only {res.i} --keep)"]
    lines += [f"  mutation: {m}" for m in res.mutations]
    lines.append(f"  command: {' '.join(map(str, res.cmd))}")
    lines.append(f"  exit status: {res.status}")
    lines += [f"  problem: {p}" for p in res.problems]
    lines += [f"  note: {n}" for n in res.notes]
    err = tail(res.stderr)
    if err:
        lines.append("  escha-convert stderr:")
        lines += [f"    {x}" for x in err]
    if res.llama_cmd:
        lines.append(f"  llama_logits command: {' '.join(map(str, res.llama_cmd))}")
        lines.append("  llama_logits stderr:")
        lines += [f"    {x}" for x in tail(res.llama_stderr, 6)]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cases", type=int, default=DEFAULT_CASES, help=f"number of cases (default {DEFAULT_CASES})")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"run seed (default {DEFAULT_SEED})")
    ap.add_argument("--only", help="run only these case numbers (comma-separated)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="cases run at once (default: the cores, at most 4)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per conversion and per llama_logits run (default {DEFAULT_TIMEOUT})",
    )
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    ap.add_argument(
        "--bin",
        default=str(Path(target) / "debug" / "escha-convert"),
        help="the escha-convert binary (default: cargo test's)",
    )
    ap.add_argument(
        "--llama-bin",
        default=os.environ.get("ESCHA_LLAMA_BIN"),
        help="the directory holding llama_logits (default $ESCHA_LLAMA_BIN)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the case directories (their parent is printed)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    ap.add_argument("--list-kinds", action="store_true", help="print the mutation kinds in this seed's order and exit")
    args = ap.parse_args()

    order = kind_order(args.seed)
    if args.list_kinds:
        print("\n".join(f"{i}: {k}" for i, k in enumerate(order)))
        return 0
    if not Path(args.bin).is_file():
        print(
            f"gguf-fuzz: no escha-convert binary at {args.bin} (cargo test builds it; or pass --bin)", file=sys.stderr
        )
        return 2
    if not args.llama_bin or not (Path(args.llama_bin) / "llama_logits").is_file():
        print(
            f"gguf-fuzz: no llama_logits in ESCHA_LLAMA_BIN ({args.llama_bin or 'unset'}): run scripts/llama-cpp.sh and source its env file",
            file=sys.stderr,
        )
        return 2
    args.bin = str(Path(args.bin).resolve())
    try:
        cases = [int(x) for x in args.only.split(",")] if args.only else list(range(args.cases))
    except ValueError:
        print(f"gguf-fuzz: --only takes case numbers separated by commas, not {args.only!r}", file=sys.stderr)
        return 2
    script = "scripts/gguf-fuzz.py"
    work = Path(tempfile.mkdtemp(prefix="gguf-fuzz-"))
    if args.keep:
        print(f"gguf-fuzz: case directories kept in {work}", file=sys.stderr)
    print(
        f"gguf-fuzz: {len(cases)} cases, seed {args.seed}, {len(order)} mutation kinds, {args.jobs} at a time",
        file=sys.stderr,
    )
    t0 = time.monotonic()
    results = []
    lock = threading.Lock()

    timeouts = []

    def one(i):
        if len(timeouts) >= MAX_TIMEOUTS:
            return None  # something hangs everywhere: stop rather than wait out every case
        r = run_case(args, args.seed, i, order, work)
        with lock:
            results.append(r)
            if "timed out" in r.signature:
                timeouts.append(r.i)
            if r.problems:
                print(f"gguf-fuzz: case {r.i} FAILED: {r.signature}", file=sys.stderr)
            elif args.verbose:
                got = (
                    "loaded"
                    if r.loaded
                    else (
                        r.overflow if r.overflow else f"exit {r.status}: {first_error_line(r.stderr)[:160]}"
                    )
                )
                print(
                    f"gguf-fuzz: case {r.i} ({r.fixture}, {r.seconds:.1f} s): {' | '.join(r.mutations)[:240]} [{' '.join(map(str, r.cmd[4:-2]))}] -> {got}",
                    file=sys.stderr,
                )
            elif len(results) % 100 == 0:
                print(
                    f"gguf-fuzz: {len(results)} of {len(cases)} cases done ({time.monotonic() - t0:.0f} s)",
                    file=sys.stderr,
                )
        return r

    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            list(pool.map(one, cases))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    results.sort(key=lambda r: r.i)
    failed = [r for r in results if r.problems]
    if failed:
        print(f"\ngguf-fuzz: {len(failed)} failing cases\n")
        for r in failed:
            print(report(r, args.seed, script) + "\n")
        classes = {}
        for r in failed:
            classes.setdefault(normalise(r.signature, work), []).append(r.i)
        print(f"gguf-fuzz: {len(classes)} kinds of failure:")
        for sig, ids in sorted(classes.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(ids)} x {sig} (cases {', '.join(map(str, ids[:12]))}{' …' if len(ids) > 12 else ''})")
    for why in sorted({r.overflow for r in results if r.overflow}):
        ids = [r.i for r in results if r.overflow == why]
        print(
            f"gguf-fuzz: {len(ids)} exit-0 outputs gave non-finite logits from the mutated model's values, not the "
            f"file ({why}; not failures): cases {', '.join(map(str, ids))}"
        )
    if len(results) < len(cases):
        print(
            f"gguf-fuzz: stopped after {len(timeouts)} timeouts (cases {', '.join(map(str, timeouts))}): {len(cases) - len(results)} cases not run"
        )
    n0 = sum(r.status == 0 for r in results)
    n1 = sum(r.status == 1 for r in results)
    loaded = sum(r.loaded for r in results)
    print(f"gguf-fuzz: {time.monotonic() - t0:.0f} s")
    print(f"gguf-fuzz: cases {len(results)}, exit 0 {n0}, exit 1 {n1}, loaded {loaded}, failures {len(failed)}")
    return 1 if failed or len(results) < len(cases) else 0


if __name__ == "__main__":
    sys.exit(main())
