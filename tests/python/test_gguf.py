"""`--format gguf` against llama.cpp's own converter, and our files loaded by llama.cpp itself.

llama.cpp is the one in the PyPI source distribution of llama-cpp-python 0.3.36, which
`scripts/llama-cpp.sh` downloads, builds for the CPU and describes in `$CACHE/env.sh`:
ESCHA_LLAMA_CPP (its vendor/llama.cpp: convert_hf_to_gguf.py, conversion/, gguf-py/) and
ESCHA_LLAMA_BIN (llama-quantize and our tests/c/llama_logits). Without them every test here is skipped
(a failure under CI=true). The GGUF files are read with gguf-py, the `gguf` package on PyPI (`gguf.GGUFReader`,
`gguf.quants`), pinned to 0.19.0, the version of the gguf-py the converter writes with.

For each fixture (`fixtures/dense`: Qwen3.5 with a complete MTP head; `fixtures/moe`: Qwen3.5-MoE, whose
inline head has no routed experts and is dropped by `--mtp auto`) and each type T of bf16, f16, q8_0:

* THEIRS: `escha-convert IN HF` writes the bf16 Hugging Face layout, and
  `convert_hf_to_gguf.py HF --outtype T --outfile ref.gguf` (the venv's python; `--no-mtp` when HF holds
  no `mtp.*` tensor, as the README says) converts it. One thing is patched, in-process: the fixtures
  carry a tiny stand-in for the Qwen3.5 tokenizer, whose pre-tokenizer hash is not in the converter's
  table (`get_vocab_base_pre` raises NotImplementedError), so for the qwen35/qwen35moe architectures
  the patch returns "qwen35", what the converter returns for the real Qwen3.5 tokenizers. Nothing else
  of the converter changes.
* OURS: `escha-convert IN OUT --format gguf --gguf-type T`.

What must agree:

* tensors (`test_tensors_match_converter`): with `--int8 requant` our int8 embeddings and head go
  through the same bf16 rounding as the HF export, so every tensor must be the converter's: the same
  names (as a set, and in the same order: the converter's order is deterministic, the order of the HF
  shards with gate/up split in place), shapes, ggml types and bytes.
* int8 exact (`test_int8_exact_tensors`): by default (`--int8 exact`) the int8 pairs become Q8_0 holding
  exactly the stored w8·scale, where the converter only sees their bf16 rounding, so those bytes cannot
  be the converter's. The closest exact thing is asserted: decoding our Q8_0, rounding to bf16 (what
  the HF export holds) and encoding that as the converter does (gguf-py's quantize for T) gives the
  converter's bytes. Every other tensor must be byte-identical.
* metadata (`test_metadata_matches_converter`): the same keys, value types and values, but the
  provenance keys of PROVENANCE (general.name and the like: they describe where a file came from, not
  the model; see there why each differs by construction).
* MTP (`test_mtp_drop_matches_converter`, `test_mtp_default`): `--mtp drop` against the converter on a
  `--mtp drop` HF export (tensors, bytes and metadata), and the default keeping the dense head
  (`blk.4.nextn.*`, `nextn_predict_layers` 1) and dropping the MoE's incomplete one, as the converter does.
* splits: `test_gguf_split.py`.
* logits (`test_logits_*`): `llama_logits` (one batch of TOKENS, every position's logits) on our file and
  the converter's, `--int8 requant` and exact: bit-identical when every tensor's bytes are the same,
  else within LOGIT_ATOL (below). The dense files also load with their MTP layers. llama.cpp's qwen35
  loaders take the linear-attention V head size to be the K head size (`ssm.state_size`); a fixture
  where they differ loads in neither file, and the failure says so.

Every comparison collects all discrepancies (tensor name, ours vs theirs shape and type, the first
differing element with both values, metadata key with both values, llama.cpp's load errors) before it
fails, so one run lists everything.

Run: `bash scripts/llama-cpp.sh && . "$(bash scripts/llama-cpp.sh --print-env)"`, then
`ESCHA_CONVERT=target/debug/escha-convert .venv/bin/python -m pytest tests/python/test_gguf.py -q`
(`-s` prints the measured logit differences).
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testenv import unavailable

LLAMA_CPP = os.environ.get("ESCHA_LLAMA_CPP", "")
LLAMA_BIN = os.environ.get("ESCHA_LLAMA_BIN", "")
if not LLAMA_CPP or not (Path(LLAMA_CPP) / "convert_hf_to_gguf.py").is_file():
    unavailable(
        f"ESCHA_LLAMA_CPP ({LLAMA_CPP or 'unset'}) is not a llama.cpp source tree with convert_hf_to_gguf.py: "
        'run `bash scripts/llama-cpp.sh && . "$(bash scripts/llama-cpp.sh --print-env)"` (scripts/test.sh does)'
    )
# gguf-py as published on PyPI (tests/python/requirements.txt pins the version the sdist carries);
# the converter itself runs on its own copy.
import gguf  # noqa: E402

GT = gguf.GGMLQuantizationType
FIXTURES = ["dense", "moe"]
TYPES = {"bf16": GT.BF16, "f16": GT.F16, "q8_0": GT.Q8_0}
TOKENS = [1, 17, 42, 99, 3, 250, 128, 64, 7, 200, 33, 180, 5, 9, 77, 140]
CONVERTER_TIMEOUT = 900
TIMEOUT = 300

# general.* keys not compared, and why: they record where a file came from, not the model.
PROVENANCE = {
    # The converter names the model after the directory it is given (our temporary HF export, so
    # "Hf"), we after the Escha input ("dense", "moe").
    "general.name": "named after the directory converted",
    # Copied by the converter from the model card (README.md) of the HF export we wrote: its tags
    # describe that export (`bf16`), not the GGUF; we write no card tags into the GGUF.
    "general.tags": "copied from the HF export's model card",
    # The converter's human-readable parameter count label ("1.0M"), computed from the tensor list;
    # llama.cpp never reads it.
    "general.size_label": "a descriptive parameter-count label",
}
# Provenance keys a real model card can add (none of the fixtures has them).
PROVENANCE_PREFIXES = (
    "general.basename", "general.finetune", "general.version", "general.license", "general.base_model.",
    "general.dataset", "general.languages", "general.author", "general.organization", "general.url",
    "general.repo_url", "general.description", "general.quantized_by", "general.source.", "general.doi",
    "general.uuid",
)

# The converter with one patch (see the module docstring), shared with scripts/bench-gguf.sh.
CONVERTER_WRAPPER = Path(__file__).resolve().parents[2] / "scripts" / "convert_hf_to_gguf_standin.py"

# Bound on max |ours - theirs| over all logits (max |logit| about 2) when the tensor bytes differ:
# test_transformers.py's BF16_ATOL (1.5 times the largest logit change that random bf16-sized weight
# perturbations cause: 0.08 dense, 0.35 MoE, where near-tied router logits flip experts), doubled for
# dense Q8_0, whose step is relative to the block's largest value (and llama.cpp's CPU matmuls with
# Q8_0 weights quantize the activations to Q8_0 too). Measured on fixture variants llama.cpp loads
# (1 V head of 128 per K head; 2 K heads of 64 with 4 V heads of 64), dense / MoE: bf16 (only the
# int8 tensors differ) 0.020-0.036 / 0.051-0.129, f16 0.014-0.031 / 0.013-0.138, q8_0 0.061-0.132 /
# 0.059-0.158.
LOGIT_ATOL = {
    "dense": {"bf16": 0.08, "f16": 0.08, "q8_0": 0.16},
    "moe": {"bf16": 0.35, "f16": 0.35, "q8_0": 0.35},
}


def run(cmd, what, timeout=TIMEOUT, env=None):
    """Run cmd; fail naming `what` with the end of its stderr unless it exits 0."""
    try:
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: timed out after {timeout} s: {' '.join(map(str, cmd))}", pytrace=False)
    if r.returncode != 0:
        pytest.fail(
            f"{what} failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr[-6000:]}", pytrace=False
        )
    return r


class Workspace:
    """Every conversion the tests need, made once per session and cached by its arguments."""

    def __init__(self, repo_root, escha_convert, tmp):
        self.repo_root, self.bin, self.tmp = repo_root, escha_convert, tmp
        self.cache = {}

    def _dir(self, *key):
        return self.tmp / "-".join(str(k) for k in key if k)

    def hf(self, fixture, mtp="auto"):
        """Our bf16 Hugging Face export of the fixture."""
        key = ("hf", fixture, mtp)
        if key not in self.cache:
            out = self._dir(*key)
            run([self.bin, self.repo_root / "fixtures" / fixture, out, "--quiet", "--mtp", mtp], f"escha-convert {key}")
            self.cache[key] = out
        return self.cache[key]

    def ours(self, fixture, ty, mtp="auto", int8="exact", max_shard=None):
        """Our GGUF: the list of its files (one, or the splits in order)."""
        key = ("ours", fixture, ty, mtp, int8, max_shard)
        if key not in self.cache:
            out = self._dir(*key)
            cmd = [self.bin, self.repo_root / "fixtures" / fixture, out, "--quiet", "--format", "gguf"]
            cmd += ["--gguf-type", ty, "--mtp", mtp, "--int8", int8]
            if max_shard:
                cmd += ["--max-shard-size", str(max_shard)]
            run(cmd, f"escha-convert {key}")
            files = sorted(out.glob("*.gguf"))
            assert files, f"escha-convert {key} wrote no .gguf file: {sorted(p.name for p in out.iterdir())}"
            self.cache[key] = files
        return self.cache[key]

    def theirs(self, fixture, ty, mtp="auto", split=None):
        """llama.cpp's converter on our HF export: the list of its files."""
        key = ("theirs", fixture, ty, mtp, split)
        if key not in self.cache:
            hf = self.hf(fixture, mtp)
            out = self._dir(*key)
            out.mkdir()
            index = json.loads((hf / "model.safetensors.index.json").read_text())
            has_mtp = any(k.startswith("mtp.") for k in index["weight_map"])
            cmd = [sys.executable, CONVERTER_WRAPPER, Path(LLAMA_CPP) / "convert_hf_to_gguf.py", hf]
            cmd += ["--outtype", ty, "--outfile", out / "model.gguf"]
            if not has_mtp:
                cmd.append("--no-mtp")
            if split:
                cmd += ["--split-max-size", str(split)]
            run(cmd, f"convert_hf_to_gguf.py {key}", timeout=CONVERTER_TIMEOUT)
            self.cache[key] = sorted(out.glob("*.gguf"))
        return self.cache[key]


@pytest.fixture(scope="session")
def ws(repo_root, escha_convert, tmp_path_factory):
    return Workspace(repo_root, escha_convert, tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="session")
def llama_bin():
    """ESCHA_LLAMA_BIN, holding llama_logits; skips (fails under CI) when it does not."""
    if not LLAMA_BIN or not (Path(LLAMA_BIN) / "llama_logits").is_file():
        unavailable(f"ESCHA_LLAMA_BIN ({LLAMA_BIN or 'unset'}) has no llama_logits: run scripts/llama-cpp.sh")
    return Path(LLAMA_BIN)


# ---- reading and comparing -------------------------------------------------------------------------


def reader(path):
    return gguf.GGUFReader(str(path))


def raw(t):
    """The bytes of tensor t as a flat uint8 array."""
    return np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)


def decode(t):
    """Tensor t's values as float32, flat (ggml order: ne0 fastest)."""
    b = raw(t)
    row = int(t.shape[0]) if len(t.shape) else 1
    block, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
    rows = b.reshape(-1, row // block * size)
    if t.tensor_type == GT.F32:
        return rows.reshape(-1).view(np.float32).copy()
    return gguf.quants.dequantize(rows, t.tensor_type).astype(np.float32).reshape(-1)


def encode(values, ne0, qtype):
    """Flat float32 values (rows of ne0) encoded as the converter encodes them: bytes."""
    data = np.asarray(values, dtype=np.float32).reshape(-1, ne0)
    return np.ascontiguousarray(gguf.quants.quantize(data, qtype)).reshape(-1).view(np.uint8)


def shape(t):
    """GGUF (ggml ne) order."""
    return [int(d) for d in t.shape]


def describe_diff(name, qtype, ours_bytes, theirs_bytes, ne0, label="bytes"):
    """Where two encodings of one tensor first differ: element (or block) index, both values."""
    a, b = np.asarray(ours_bytes, np.uint8), np.asarray(theirs_bytes, np.uint8)
    if a.size != b.size:
        return f"{name}: {label}: {a.size} bytes ours vs {b.size} theirs"
    nbytes = int(np.count_nonzero(a != b))
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    first_byte = int(np.flatnonzero(a != b)[0])
    rows_a, rows_b = a.reshape(-1, ne0 // block * size), b.reshape(-1, ne0 // block * size)
    va = decode_bytes(rows_a, qtype)
    vb = decode_bytes(rows_b, qtype)
    diff = np.flatnonzero(~((va == vb) | (np.isnan(va) & np.isnan(vb))))
    msg = f"{name} ({qtype.name}): {label} differ: {nbytes} of {a.size} bytes, first at byte {first_byte}"
    if block > 1:
        msg += f" (block {first_byte // size}, byte {first_byte % size} of it)"
    if diff.size:
        i = int(diff[0])
        msg += (
            f"; {diff.size} of {va.size} decoded elements differ, first at element {i} "
            f"(row {i // ne0}, col {i % ne0}): ours {va[i]!r} theirs {vb[i]!r}, "
            f"max |diff| {float(np.max(np.abs(va[diff].astype(np.float64) - vb[diff]))):.6g}"
        )
    else:
        msg += "; the decoded values are equal (encoding differs, e.g. block scale or NaN payload)"
    return msg


def decode_bytes(rows, qtype):
    if qtype == GT.F32:
        return rows.reshape(-1).view(np.float32)
    return gguf.quants.dequantize(rows, qtype).astype(np.float32).reshape(-1)


def compare_tensor_lists(ours, theirs, int8_exact=frozenset()):
    """Every discrepancy between two GGUF readers' tensors (names, order, shapes, types, bytes).

    Tensors named in int8_exact (ours: Q8_0 of the exact int8 values) are compared by re-encoding: our
    decoded values rounded to bf16, encoded in their type, must be their bytes."""
    problems = []
    to, tt = {t.name: t for t in ours.tensors}, {t.name: t for t in theirs.tensors}
    if only := [n for n in to if n not in tt]:
        problems.append(f"tensors only in ours ({len(only)}): {only}")
    if only := [n for n in tt if n not in to]:
        problems.append(f"tensors only in theirs ({len(only)}): {only}")
    common_o = [n for n in to if n in tt]
    common_t = [n for n in tt if n in to]
    if common_o != common_t:
        first = next(i for i, (a, b) in enumerate(zip(common_o, common_t)) if a != b)
        problems.append(
            f"tensor order differs from position {first}: ours {common_o[first:first + 4]} "
            f"theirs {common_t[first:first + 4]}"
        )
    for n in common_t:
        a, b = to[n], tt[n]
        if shape(a) != shape(b):
            problems.append(f"{n}: shape ours {shape(a)} theirs {shape(b)} (ggml ne order)")
            continue
        ne0 = shape(b)[0]
        if n in int8_exact:
            if a.tensor_type != GT.Q8_0:
                problems.append(f"{n}: int8 exact should be Q8_0, ours {a.tensor_type.name}")
                continue
            bf16 = gguf.quants.dequantize(encode(decode(a), ne0, GT.BF16).reshape(-1, ne0 * 2), GT.BF16)
            expected = encode(bf16, ne0, b.tensor_type)
            if not np.array_equal(expected, raw(b)):
                problems.append(
                    describe_diff(n, b.tensor_type, expected, raw(b), ne0, "our Q8_0 rounded to bf16 and re-encoded")
                )
            continue
        if a.tensor_type != b.tensor_type:
            problems.append(f"{n}: type ours {a.tensor_type.name} theirs {b.tensor_type.name} (shape {shape(b)})")
            continue
        if not np.array_equal(raw(a), raw(b)):
            problems.append(describe_diff(n, b.tensor_type, raw(a), raw(b), ne0))
    return problems


def subject(problem):
    """The tensor a compare_tensor_lists message is about (its first word)."""
    return problem.split(" ", 1)[0].rstrip(":")


def fields(r, skip_split=True):
    """{key: (value types, value)} of a reader's key-value pairs (the GGUF.* header pseudo-fields out)."""
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or (skip_split and k.startswith("split.")):
            continue
        out[k] = ([t.name for t in f.types], f.contents())
    return out


def provenance(key):
    return key in PROVENANCE or key.startswith(PROVENANCE_PREFIXES)


def short(v):
    s = repr(v)
    return s if len(s) <= 300 else s[:300] + f"... ({len(s)} chars)"


def compare_metadata(ours, theirs):
    """Every key-value discrepancy, provenance keys out."""
    problems = []
    fo, ft = fields(ours), fields(theirs)
    for k in sorted(set(fo) | set(ft)):
        if provenance(k):
            continue
        if k not in fo:
            problems.append(f"metadata {k}: missing in ours; theirs {ft[k][0]} {short(ft[k][1])}")
        elif k not in ft:
            problems.append(f"metadata {k}: only in ours: {fo[k][0]} {short(fo[k][1])}")
        elif fo[k][0] != ft[k][0]:
            problems.append(f"metadata {k}: type ours {fo[k][0]} theirs {ft[k][0]}; values {short(fo[k][1])} / {short(ft[k][1])}")
        elif fo[k][1] != ft[k][1]:
            a, b = fo[k][1], ft[k][1]
            if isinstance(a, list) and isinstance(b, list):
                first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                at = f"; first difference at index {first}: ours {short(a[first:first + 3])} theirs {short(b[first:first + 3])}"
                problems.append(f"metadata {k}: {len(a)} items ours, {len(b)} theirs{at}")
            else:
                problems.append(f"metadata {k}: ours {short(a)} theirs {short(b)}")
    for k in ("GGUF.version",):
        a, b = ours.fields[k].contents(), theirs.fields[k].contents()
        if a != b:
            problems.append(f"header {k}: ours {a} theirs {b}")
    return problems


def int8_names(ws, fixture):
    """The tensors our default (`--int8 exact`) bf16 file writes as Q8_0: the int8 pairs."""
    r = reader(ws.ours(fixture, "bf16")[0])
    return frozenset(t.name for t in r.tensors if t.tensor_type == GT.Q8_0)


def report(problems, what):
    assert not problems, f"{what}: {len(problems)} discrepancies:\n  " + "\n  ".join(problems)


# ---- tensors and metadata against the converter ----------------------------------------------------


@pytest.mark.parametrize("ty", list(TYPES))
@pytest.mark.parametrize("fixture", FIXTURES)
def test_tensors_match_converter(ws, fixture, ty):
    """`--int8 requant`: the converter's tensors, names, shapes, types and order, and byte for byte
    every tensor where both start from the same values. That is every tensor for bf16 and f32. For
    f16 and q8_0 it leaves out the tensors whose exact values (our f32 file) are not bf16 values, the
    decoded linears: the converter reads them from the bf16 export and rounds a second time, this
    tool rounds the exact f32 reconstruction once, so those bytes differ by design;
    test_rounding_path proves both exactly."""
    ours = reader(ws.ours(fixture, ty, int8="requant")[0])
    theirs = reader(ws.theirs(fixture, ty)[0])
    problems = compare_tensor_lists(ours, theirs)
    if ty in ("f16", "q8_0"):
        exact = reader(ws.ours(fixture, "f32", int8="requant")[0])
        rounded_twice = set()
        for t in exact.tensors:
            values = decode(t)
            bf16 = gguf.quants.dequantize(encode(values, shape(t)[0], GT.BF16).reshape(-1, shape(t)[0] * 2), GT.BF16)
            if not np.array_equal(values.reshape(-1), bf16.reshape(-1)):
                rounded_twice.add(t.name)
        assert rounded_twice, f"{fixture}: no tensor's exact values differ from their bf16 rounding"
        problems = [p for p in problems if subject(p) not in rounded_twice]
    report(problems, f"{fixture} {ty} --int8 requant vs convert_hf_to_gguf.py")


@pytest.mark.parametrize("ty", ["f16", "q8_0"])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_rounding_path(ws, fixture, ty):
    """Where the tensors of test_tensors_match_converter differ, why: both files hold the same f32
    values (our `--gguf-type f32` file, the exact decode) rounded differently. Asserted exactly:

    * theirs: every non-F32 tensor is the gguf-py encoding (the converter's) of the bf16 rounding of
      our f32 values: the converter reads the bf16 HF export and rounds a second time;
    * ours: the gguf-py encoding of our f32 values rounded once.

    F32 tensors (norms with their +1, conv1d, ssm_a, routers) must be our f32 file's in both."""
    f32 = {t.name: t for t in reader(ws.ours(fixture, "f32", int8="requant")[0]).tensors}
    ours = reader(ws.ours(fixture, ty, int8="requant")[0])
    theirs = {t.name: t for t in reader(ws.theirs(fixture, ty)[0]).tensors}
    problems = []
    for a in ours.tensors:
        b, x = theirs.get(a.name), f32.get(a.name)
        if b is None or x is None or x.tensor_type != GT.F32:
            problems.append(f"{a.name}: not in theirs or not F32 in our f32 file")
            continue
        ne0, values = shape(x)[0], decode(x)
        if a.tensor_type == GT.F32:
            for who, t in (("ours", a), ("theirs", b)):
                if not np.array_equal(raw(t), raw(x)):
                    problems.append(describe_diff(a.name, GT.F32, raw(t), raw(x), ne0, f"{who} vs our f32 file"))
            continue
        once = encode(values, ne0, a.tensor_type)
        if not np.array_equal(raw(a), once):
            problems.append(describe_diff(a.name, a.tensor_type, raw(a), once, ne0, "ours vs our f32 encoded once"))
        bf16 = gguf.quants.dequantize(encode(values, ne0, GT.BF16).reshape(-1, ne0 * 2), GT.BF16)
        twice = encode(bf16, ne0, b.tensor_type)
        if not np.array_equal(raw(b), twice):
            problems.append(describe_diff(a.name, b.tensor_type, raw(b), twice, ne0, "theirs vs our f32 via bf16"))
    report(problems, f"{fixture} {ty}: rounding paths")


@pytest.mark.parametrize("ty", list(TYPES))
@pytest.mark.parametrize("fixture", FIXTURES)
def test_int8_exact_tensors(ws, fixture, ty):
    """Default `--int8 exact`: the int8 pairs are Q8_0 whose values, rounded to bf16 (the HF export's
    values) and encoded as the converter encodes, are the converter's bytes; every other tensor is
    the `--int8 requant` file's (so test_tensors_match_converter covers it, and a rounding difference
    there is reported once, not twice)."""
    names = int8_names(ws, fixture)
    assert names, f"{fixture}: the default bf16 GGUF has no Q8_0 tensor, but the fixture has int8 pairs"
    ours = reader(ws.ours(fixture, ty)[0])
    theirs = reader(ws.theirs(fixture, ty)[0])
    requant = reader(ws.ours(fixture, ty, int8="requant")[0])
    problems = compare_tensor_lists(ours, theirs, int8_exact=names)
    problems = [p for p in problems if subject(p) in names or p.startswith(("tensors only", "tensor order"))]
    problems += [f"vs our --int8 requant file: {p}" for p in compare_tensor_lists(ours, requant) if subject(p) not in names]
    report(problems, f"{fixture} {ty} --int8 exact vs convert_hf_to_gguf.py")


@pytest.mark.parametrize("ty", list(TYPES))
@pytest.mark.parametrize("fixture", FIXTURES)
def test_metadata_matches_converter(ws, fixture, ty):
    ours = reader(ws.ours(fixture, ty)[0])
    theirs = reader(ws.theirs(fixture, ty)[0])
    report(compare_metadata(ours, theirs), f"{fixture} {ty} metadata vs convert_hf_to_gguf.py")


@pytest.mark.parametrize("fixture", FIXTURES)
def test_mtp_drop_matches_converter(ws, fixture):
    """`--mtp drop` against the converter (`--no-mtp`) on a `--mtp drop` HF export."""
    ours = reader(ws.ours(fixture, "bf16", mtp="drop", int8="requant")[0])
    theirs = reader(ws.theirs(fixture, "bf16", mtp="drop")[0])
    problems = compare_tensor_lists(ours, theirs) + compare_metadata(ours, theirs)
    if nextn := [t.name for t in ours.tensors if ".nextn." in t.name]:
        problems.append(f"--mtp drop still writes nextn tensors: {nextn}")
    report(problems, f"{fixture} --mtp drop vs convert_hf_to_gguf.py")


@pytest.mark.parametrize("fixture", FIXTURES)
def test_mtp_default(ws, fixture):
    """The default keeps the dense fixture's complete head as llama.cpp's nextn layer and drops the
    MoE's (no routed experts), like the converter on the matching HF export."""
    ours = reader(ws.ours(fixture, "bf16")[0])
    theirs = reader(ws.theirs(fixture, "bf16")[0])
    layers = json.loads((ws.repo_root / "fixtures" / fixture / "config.json").read_text())["text_config"][
        "num_hidden_layers"
    ]
    problems = []

    def nextn(r):
        return [t.name for t in r.tensors if t.name.startswith(f"blk.{layers}.")]

    def count(r):
        f = r.fields.get(f"{r.fields['general.architecture'].contents()}.nextn_predict_layers")
        return None if f is None else f.contents()

    want = 1 if fixture == "dense" else None
    if count(ours) != want:
        problems.append(f"ours nextn_predict_layers {count(ours)}, want {want}")
    if count(theirs) != want:
        problems.append(f"theirs nextn_predict_layers {count(theirs)}, want {want}")
    if nextn(ours) != nextn(theirs):
        problems.append(f"MTP block blk.{layers}.*: ours {nextn(ours)} theirs {nextn(theirs)}")
    if fixture == "dense" and not nextn(ours):
        problems.append(f"the dense default has no blk.{layers}.* (MTP) tensor")
    if fixture == "moe" and nextn(ours):
        problems.append(f"the MoE default writes its incomplete MTP head: {nextn(ours)}")
    report(problems, f"{fixture} default MTP")


def split_size(ws, fixture):
    """A --max-shard-size (bytes) giving at least 3 files: a quarter of the tensor bytes, but no less
    than the largest tensor."""
    r = reader(ws.ours(fixture, "bf16")[0])
    sizes = [int(t.n_bytes) for t in r.tensors]
    return max(max(sizes), sum(sizes) // 4)


# ---- llama.cpp -------------------------------------------------------------------------------------


def llama_cpp_limits(model):
    """Why llama.cpp cannot load `model` whatever wrote it, when the model itself is the reason."""
    r = reader(model)
    arch = r.fields["general.architecture"].contents()

    def key(k):
        f = r.fields.get(f"{arch}.{k}")
        return None if f is None else f.contents()

    state, inner, rank = key("ssm.state_size"), key("ssm.inner_size"), key("ssm.time_step_rank")
    if state and inner and rank and inner // rank != state:
        return (
            f"\n[the model itself: llama.cpp's {arch} loader takes the linear-attention V head size to be "
            f"ssm.state_size ({state}, the K head size), but this model's is ssm.inner_size / "
            f"ssm.time_step_rank = {inner} / {rank} = {inner // rank}: no GGUF of it, ours or the "
            f"converter's, loads in this llama.cpp; the fixture needs linear_value_head_dim == "
            f"linear_key_head_dim]"
        )
    return ""


def logits(llama_bin, model, tmp_path, mtp=False, tokens=TOKENS):
    """llama.cpp's logits of every position of `tokens` from GGUF `model` (n_tokens x n_vocab), or the
    load/decode error as a string."""
    out = tmp_path / f"logits-{hashlib.sha1(str(model).encode()).hexdigest()[:10]}-{int(mtp)}.f32"
    cmd = [llama_bin / "llama_logits", "-t", "2", "-o", out]
    if mtp:
        cmd.append("--mtp")
    cmd += [model, ",".join(map(str, tokens))]
    try:
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"llama_logits timed out on {model}"
    if r.returncode != 0:
        errors = "\n".join(x for x in r.stderr.splitlines() if "unused tensor" not in x)
        return (
            f"llama.cpp could not run {Path(model).parent.name}/{Path(model).name} (exit {r.returncode}):\n"
            f"{errors[-4000:]}{llama_cpp_limits(model)}"
        )
    last = r.stderr.strip().splitlines()[-1]
    n_vocab = int(last.rsplit("n_vocab=", 1)[1])
    y = np.fromfile(out, dtype="<f4")
    assert y.size == len(tokens) * n_vocab, f"llama_logits wrote {y.size} floats, want {len(tokens)} x {n_vocab}"
    return y.reshape(len(tokens), n_vocab)


def first_diff(a, b):
    d = np.argwhere(a != b)
    if not d.size:
        return "equal"
    p, v = (int(x) for x in d[0])
    return (
        f"{len(d)} of {a.size} logits differ, first at position {p} token {v}: ours {a[p, v]!r} theirs {b[p, v]!r}; "
        f"max |diff| {float(np.max(np.abs(a.astype(np.float64) - b))):.6g}"
    )


@pytest.mark.parametrize("int8", ["requant", "exact"])
@pytest.mark.parametrize("ty", list(TYPES))
@pytest.mark.parametrize("fixture", FIXTURES)
def test_logits_match_converter(ws, llama_bin, tmp_path, fixture, ty, int8):
    """llama.cpp's logits of ours and of the converter's file: bit-identical when every tensor's bytes
    are the same (test_tensors_match_converter), else within LOGIT_ATOL. The distances of both to the
    exact model (our `--gguf-type f32 --int8 requant` file) are printed with -s."""
    ours_file, theirs_file = ws.ours(fixture, ty, int8=int8)[0], ws.theirs(fixture, ty)[0]
    same_bytes = not compare_tensor_lists(reader(ours_file), reader(theirs_file))
    a = logits(llama_bin, ours_file, tmp_path)
    b = logits(llama_bin, theirs_file, tmp_path)
    problems = [x for x in (a, b) if isinstance(x, str)]
    if not problems:
        assert np.all(np.isfinite(b)), "the converter's file gives non-finite logits"
        if a.shape != b.shape:
            problems.append(f"logits shape ours {a.shape} theirs {b.shape}")
        elif same_bytes:
            if not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
                problems.append(f"byte-identical tensors, yet {first_diff(a, b)}")
        else:
            err = float(np.max(np.abs(a.astype(np.float64) - b)))
            exact = logits(llama_bin, ws.ours(fixture, "f32", int8="requant")[0], tmp_path)
            if not isinstance(exact, str):
                print(
                    f"{fixture} {ty} --int8 {int8}: max |ours - theirs| {err:.3g}; to the f32 model: ours "
                    f"{float(np.max(np.abs(a.astype(np.float64) - exact))):.3g}, theirs "
                    f"{float(np.max(np.abs(b.astype(np.float64) - exact))):.3g} (max |logit| {float(np.max(np.abs(b))):.3g})"
                )
            bound = LOGIT_ATOL[fixture][ty]
            if not err <= bound:
                problems.append(f"tensors differ and max |ours - theirs| {err:.6g} > {bound}: {first_diff(a, b)}")
    report(problems, f"{fixture} {ty} --int8 {int8}: llama.cpp logits, ours vs convert_hf_to_gguf.py")


@pytest.mark.parametrize("fixture", FIXTURES)
def test_logits_split_from_first_file(ws, llama_bin, tmp_path, fixture):
    """llama.cpp loads our split set from its first file, with the single file's logits."""
    size = split_size(ws, fixture)
    files = ws.ours(fixture, "bf16", max_shard=size)
    a = logits(llama_bin, files[0], tmp_path)
    b = logits(llama_bin, ws.ours(fixture, "bf16")[0], tmp_path)
    problems = [x for x in (a, b) if isinstance(x, str)]
    if not problems and not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
        problems.append(first_diff(a, b))
    report(problems, f"{fixture} split ({len(files)} files) loaded from {files[0].name}")


def test_logits_with_mtp_layers(ws, llama_bin, tmp_path):
    """The dense file loads with its MTP (nextn) layers too (llama_model_params.load_mtp), ours and
    the converter's alike, and the main logits do not change."""
    problems = []
    for who, path in (("ours", ws.ours("dense", "bf16", int8="requant")[0]), ("theirs", ws.theirs("dense", "bf16")[0])):
        with_mtp = logits(llama_bin, path, tmp_path, mtp=True)
        without = logits(llama_bin, path, tmp_path)
        bad = [x for x in (with_mtp, without) if isinstance(x, str)]
        problems += [f"{who}: {x}" for x in bad]
        if not bad and not np.array_equal(with_mtp, without):
            problems.append(f"{who}: loading the MTP layers changes the logits: {first_diff(with_mtp, without)}")
    report(problems, "dense bf16 with MTP layers")


def test_drop_loads_in_llama_cpp(ws, llama_bin, tmp_path):
    """`--mtp drop` gives a file llama.cpp loads, with the logits of the default file (the head does
    not take part in the main forward pass)."""
    a = logits(llama_bin, ws.ours("dense", "bf16", mtp="drop")[0], tmp_path)
    b = logits(llama_bin, ws.ours("dense", "bf16")[0], tmp_path)
    problems = [x for x in (a, b) if isinstance(x, str)]
    if not problems and not np.array_equal(a, b):
        problems.append(first_diff(a, b))
    report(problems, "dense --mtp drop vs default, in llama.cpp")
