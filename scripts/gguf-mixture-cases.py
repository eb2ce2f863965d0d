#!/usr/bin/env python3
"""The per-tensor types `llama-quantize` picks for its mixtures (file types) on qwen35 / qwen35moe GGUFs.

Writes fixtures/gguf-mixtures.json, the cases the Rust unit tests of src/layout/gguf/mixture/ check
their rule against (`cargo test --lib mixture`), and which tests/python/test_gguf_mixture.py
recomputes with the real llama-quantize to notice a llama.cpp that decides differently.

llama.cpp is the one in the PyPI source distribution of llama-cpp-python 0.3.36 that
scripts/llama-cpp.sh builds: ESCHA_LLAMA_CPP (its vendor/llama.cpp, for gguf-py) and ESCHA_LLAMA_BIN
(llama-quantize). Run:

    bash scripts/llama-cpp.sh && . "$(bash scripts/llama-cpp.sh --print-env)"
    .venv/bin/python scripts/gguf-mixture-cases.py --escha-convert target/debug/escha-convert

Every model is one entry of the JSON: its architecture, its header (the `kv` list, every key with its
GGUF value type) and its tensors (name, shape in torch order, outermost first, and ggml type), from
which `write_gguf` writes a GGUF with zero data; each mixture of MIXTURES is run through
`llama-quantize --allow-requantize IN OUT MIXTURE` and the type of every tensor of OUT is recorded, in
the order of `tensors`, as one space-separated string per mixture (`types`). llama-quantize's choice
depends on the header's block_count, expert_count and head counts (the grouped-query ratio), a tensor's name, its number of dimensions and
its row length (the innermost dimension), and on which other tensors the file holds; not on the
tensor data, so zeros do. The low-bit mixtures (LOW_BIT) are run with `--imatrix`, a flat matrix
with an entry for every weight matrix (most are refused without one, and a matrix changes IQ3_XXS's
rules); the others without one.

The models:

* fixture-dense, fixture-moe: the header and tensors `escha-convert fixtures/{dense,moe} OUT --format
  gguf` writes (hidden size 128: rows of 128 values are not a multiple of the k-quants' 256, so most
  tensors take llama-quantize's fallback). With --escha-convert the files are converted afresh and
  llama-quantize is also run on the converted files themselves, whose types must be those of the
  zero-data copies (else this script fails).
* qwen35-64: a qwen35 header of 64 transformer blocks (every 4th full attention) plus one MTP block,
  hidden 256, every row a multiple of 256, output untied, 4 query heads per key/value head (Q2_K's
  and IQ4_XS's attn_v rule): the layer-position rules (use_more_bits, the
  first eighth) over 65 blocks.
* qwen35moe-40: qwen35moe, 40 blocks plus one MTP block, 16 experts, rows multiples of 256.
* qwen35moe-8x-tied: qwen35moe, 24 blocks, 8 experts (llama.cpp has rules for exactly 8), no MTP, no
  output.weight (tied embeddings: token_embd takes the output's rule).
* qwen35-odd-tied: qwen35, 8 blocks plus MTP, hidden 80 (not a multiple of 32: the fallback ends in
  F16), feed-forward 160, tied.

The synthetic models keep the outer dimensions small (the rule never looks at them); the inner ones
follow each tensor's role (attn_output reads n_head·head_dim values, ffn_down the feed-forward
length, ssm_out the linear attention's value dim, nextn.eh_proj twice the hidden size).

Options: --out PATH (default fixtures/gguf-mixtures.json); --check PATH recomputes the types of the
models in PATH and exits 1 listing every difference instead of writing (what the Python test does);
--escha-convert BIN (re)derives the two fixture models with that binary (without it they are taken
from --out's existing file); --keep DIR keeps the GGUF files there.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MIXTURES = ["Q4_K_M", "Q5_K_M", "Q4_K_S", "Q5_K_S", "Q6_K", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_XS"]
# The low-bit mixtures, recorded with an importance matrix (most are refused without one, and the
# matrix changes IQ3_XXS's rules): a flat one (every value 1) with an entry for every weight matrix.
LOW_BIT = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "Q2_K_S"]
MIXTURES += LOW_BIT
LLAMA_CPP_VERSION = "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp"


def import_gguf():
    src = os.environ.get("ESCHA_LLAMA_CPP", "")
    if not src or not (Path(src) / "gguf-py").is_dir():
        sys.exit('ESCHA_LLAMA_CPP is unset or has no gguf-py: . "$(bash scripts/llama-cpp.sh --print-env)"')
    if str(Path(src) / "gguf-py") not in sys.path:
        sys.path.insert(0, str(Path(src) / "gguf-py"))
    import gguf

    return gguf


def llama_quantize():
    exe = Path(os.environ.get("ESCHA_LLAMA_BIN", "")) / "llama-quantize"
    if not os.environ.get("ESCHA_LLAMA_BIN") or not exe.is_file():
        sys.exit('ESCHA_LLAMA_BIN is unset or has no llama-quantize: . "$(bash scripts/llama-cpp.sh --print-env)"')
    return exe


# --- models -----------------------------------------------------------------------------------


def kv_entry(gguf, key, value):
    """A header entry [key, value type, value] (arrays: [key, "ARRAY", values, element type])."""
    t = gguf.GGUFValueType
    if isinstance(value, bool):
        return [key, t.BOOL.name, value]
    if isinstance(value, int):
        return [key, t.UINT32.name, value]
    if isinstance(value, float):
        return [key, t.FLOAT32.name, value]
    if isinstance(value, str):
        return [key, t.STRING.name, value]
    assert isinstance(value, list) and value
    sub = t.BOOL if isinstance(value[0], bool) else t.INT32 if isinstance(value[0], int) else t.FLOAT32
    return [key, t.ARRAY.name, value, sub.name]


def synthetic(gguf, name, arch, *, trunk, mtp, hidden, ff, n_head, head_dim, lin_k_heads, lin_v_heads,
              lin_head_dim, experts=0, exp_ff=0, shexp_ff=0, tied=False, vocab=64, rows=32):
    """A qwen35 / qwen35moe model: header and tensors as llama.cpp's converter names and lays them out."""
    blocks = trunk + mtp
    kv = {
        "general.architecture": arch,
        f"{arch}.block_count": blocks,
        f"{arch}.context_length": 4096,
        f"{arch}.embedding_length": hidden,
        f"{arch}.feed_forward_length": ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": 1,
        f"{arch}.rope.dimension_sections": [11, 11, 10, 0],
        f"{arch}.rope.freq_base": 10000000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.ssm.conv_kernel": 4,
        f"{arch}.ssm.state_size": lin_head_dim,
        f"{arch}.ssm.group_count": lin_k_heads,
        f"{arch}.ssm.time_step_rank": lin_v_heads,
        f"{arch}.ssm.inner_size": lin_v_heads * lin_head_dim,
        f"{arch}.attention.recurrent_layers": [i < trunk and (i + 1) % 4 != 0 for i in range(blocks)],
        f"{arch}.full_attention_interval": 4,
        f"{arch}.rope.dimension_count": 32,
    }
    if experts:
        kv[f"{arch}.expert_count"] = experts
        kv[f"{arch}.expert_used_count"] = 2
        kv[f"{arch}.expert_feed_forward_length"] = exp_ff
        kv[f"{arch}.expert_shared_feed_forward_length"] = shexp_ff
    if mtp:
        kv[f"{arch}.nextn_predict_layers"] = mtp
    value_dim = lin_v_heads * lin_head_dim
    conv_dim = 2 * lin_k_heads * lin_head_dim + value_dim
    t = []

    def add(n, shape, ty="BF16"):
        t.append([n, list(shape), ty])

    add("token_embd.weight", [vocab, hidden])
    if not tied:
        add("output.weight", [vocab, hidden])
    add("output_norm.weight", [hidden], "F32")
    for b in range(blocks):
        p = f"blk.{b}."
        add(p + "attn_norm.weight", [hidden], "F32")
        add(p + "post_attention_norm.weight", [hidden], "F32")
        if b < trunk and (b + 1) % 4 != 0:
            add(p + "ssm_a", [lin_v_heads], "F32")
            add(p + "ssm_conv1d.weight", [conv_dim, 4], "F32")
            add(p + "ssm_dt.bias", [lin_v_heads], "F32")
            add(p + "ssm_alpha.weight", [lin_v_heads, hidden])
            add(p + "ssm_beta.weight", [lin_v_heads, hidden])
            add(p + "attn_qkv.weight", [rows, hidden])
            add(p + "attn_gate.weight", [rows, hidden])
            add(p + "ssm_norm.weight", [lin_head_dim], "F32")
            add(p + "ssm_out.weight", [rows, value_dim])
        else:
            add(p + "attn_q.weight", [rows, hidden])
            add(p + "attn_k.weight", [rows, hidden])
            add(p + "attn_v.weight", [rows, hidden])
            add(p + "attn_output.weight", [rows, n_head * head_dim])
            add(p + "attn_q_norm.weight", [head_dim], "F32")
            add(p + "attn_k_norm.weight", [head_dim], "F32")
        if experts:
            add(p + "ffn_gate_inp.weight", [experts, hidden], "F32")
            add(p + "ffn_gate_exps.weight", [experts, rows, hidden])
            add(p + "ffn_up_exps.weight", [experts, rows, hidden])
            add(p + "ffn_down_exps.weight", [experts, rows, exp_ff])
            add(p + "ffn_gate_inp_shexp.weight", [1, hidden], "F32")
            add(p + "ffn_gate_shexp.weight", [rows, hidden])
            add(p + "ffn_up_shexp.weight", [rows, hidden])
            add(p + "ffn_down_shexp.weight", [rows, shexp_ff])
        else:
            add(p + "ffn_gate.weight", [rows, hidden])
            add(p + "ffn_up.weight", [rows, hidden])
            add(p + "ffn_down.weight", [rows, ff])
        if b >= trunk:
            add(p + "nextn.eh_proj.weight", [rows, 2 * hidden])
            add(p + "nextn.enorm.weight", [hidden], "F32")
            add(p + "nextn.hnorm.weight", [hidden], "F32")
            add(p + "nextn.shared_head_norm.weight", [hidden], "F32")
    return {
        "name": name,
        "source": "synthetic (scripts/gguf-mixture-cases.py)",
        "arch": arch,
        "kv": [kv_entry(gguf, k, v) for k, v in kv.items()],
        "tensors": t,
    }


def synthetic_models(gguf):
    return [
        synthetic(gguf, "qwen35-64", "qwen35", trunk=64, mtp=1, hidden=256, ff=512, n_head=4, head_dim=128,
                  lin_k_heads=2, lin_v_heads=4, lin_head_dim=128),
        synthetic(gguf, "qwen35moe-40", "qwen35moe", trunk=40, mtp=1, hidden=256, ff=512, n_head=2,
                  head_dim=256, lin_k_heads=1, lin_v_heads=2, lin_head_dim=128, experts=16, exp_ff=256,
                  shexp_ff=512),
        synthetic(gguf, "qwen35moe-8x-tied", "qwen35moe", trunk=24, mtp=0, hidden=256, ff=512, n_head=2,
                  head_dim=128, lin_k_heads=1, lin_v_heads=2, lin_head_dim=128, experts=8, exp_ff=256,
                  shexp_ff=256, tied=True),
        synthetic(gguf, "qwen35-odd-tied", "qwen35", trunk=8, mtp=1, hidden=80, ff=160, n_head=2, head_dim=48,
                  lin_k_heads=1, lin_v_heads=2, lin_head_dim=48, tied=True),
    ]


def read_model(gguf, path, name, source):
    """The header (but the tokenizer and provenance keys, which llama-quantize only copies) and the
    tensors of the GGUF at `path`."""
    r = gguf.GGUFReader(path)
    kv = []
    for key, f in r.fields.items():
        if key.startswith(("GGUF.", "tokenizer.")) or (key.startswith("general.") and key != "general.architecture"):
            continue
        vt = gguf.GGUFValueType(f.types[0])
        if vt == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType(f.types[-1])
            kv.append([key, vt.name, [v.item() if hasattr(v, "item") else v for v in f.contents()], sub.name])
        else:
            v = f.contents()
            kv.append([key, vt.name, v.item() if hasattr(v, "item") else v])
    tensors = [[t.name, [int(d) for d in reversed(t.shape)], t.tensor_type.name] for t in r.tensors]
    arch = next(e[2] for e in kv if e[0] == "general.architecture")
    return {"name": name, "source": source, "arch": arch, "kv": kv, "tensors": tensors}


def fixture_models(gguf, escha_convert, tmp):
    """The fixture models as escha-convert converts them, and the converted files."""
    out = []
    for fixture in ("dense", "moe"):
        dst = Path(tmp) / f"convert-{fixture}"
        cmd = [str(escha_convert), str(REPO / "fixtures" / fixture), str(dst), "--format", "gguf", "--force"]
        subprocess.run(cmd, check=True, capture_output=True)
        path = dst / "model.gguf"
        model = read_model(gguf, path, f"fixture-{fixture}", f"escha-convert fixtures/{fixture} OUT --format gguf")
        out.append((model, path))
    return out


# --- files ------------------------------------------------------------------------------------


def write_gguf(gguf, model, path):
    """`model` as a GGUF at `path`, every tensor zeros in its type."""
    w = gguf.GGUFWriter(path, model["arch"])
    for entry in model["kv"]:
        key, vt = entry[0], gguf.GGUFValueType[entry[1]]
        if key == "general.architecture":
            continue  # GGUFWriter writes it from `arch`
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, entry[2], vt, sub_type=gguf.GGUFValueType[entry[3]])
        else:
            w.add_key_value(key, entry[2], vt)
    q = gguf.GGMLQuantizationType
    for name, shape, ty in model["tensors"]:
        qt = q[ty]
        if qt == q.F32:
            w.add_tensor(name, np.zeros(shape, np.float32))
        elif qt == q.F16:
            w.add_tensor(name, np.zeros(shape, np.float16))
        elif qt == q.BF16:
            w.add_tensor(name, np.zeros(shape, np.uint16), raw_dtype=q.BF16)
        else:
            w.add_tensor(name, gguf.quants.quantize(np.zeros(shape, np.float32), qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def flat_imatrix(gguf, src, path):
    """A llama-imatrix GGUF with every mean square 1 for each weight matrix (2 or 3 dimensions) of `src`."""
    w = gguf.GGUFWriter(str(path), arch="imatrix")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["flat"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 1)
    for t in gguf.GGUFReader(src).tensors:
        ne = [int(x) for x in t.shape]
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
        if len(ne) < 2 or not t.name.endswith(".weight"):
            continue
        n_mat = ne[2] if len(ne) == 3 else 1
        w.add_tensor(f"{t.name}.in_sum2", np.ones((n_mat, ne[0]), dtype=np.float32))
        w.add_tensor(f"{t.name}.counts", np.ones((n_mat, 1), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantized_types(gguf, src, dst, mixture):
    """{tensor name: ggml type name} of `llama-quantize --allow-requantize src dst mixture` (with
    `--imatrix`, a flat matrix, for the LOW_BIT mixtures)."""
    cmd = [str(llama_quantize()), "--allow-requantize"]
    if mixture in LOW_BIT:
        matrix = Path(dst).with_suffix(".imatrix.gguf")
        flat_imatrix(gguf, src, matrix)
        cmd += ["--imatrix", str(matrix)]
    cmd += [str(src), str(dst), mixture, "4"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    r = gguf.GGUFReader(dst)
    ft = r.fields["general.file_type"].contents()
    return {t.name: t.tensor_type.name for t in r.tensors}, int(ft)


def compute_types(gguf, model, tmp, real_file=None):
    """`types` (mixture → space-separated types in the order of model["tensors"]) and file types, from
    the zero-data copy of `model`; with `real_file`, that file must give the same types."""
    src = Path(tmp) / f"{model['name']}.gguf"
    write_gguf(gguf, model, src)
    names = [t[0] for t in model["tensors"]]
    types, file_types = {}, {}
    for mixture in MIXTURES:
        got, ft = quantized_types(gguf, src, Path(tmp) / f"{model['name']}-{mixture}.gguf", mixture)
        if sorted(got) != sorted(names):
            raise RuntimeError(f"{model['name']} {mixture}: llama-quantize wrote other tensors than it read")
        if real_file is not None:
            real, _ = quantized_types(gguf, real_file, Path(tmp) / f"{model['name']}-{mixture}-real.gguf", mixture)
            if real != got:
                diff = [n for n in names if real.get(n) != got.get(n)]
                raise RuntimeError(f"{model['name']} {mixture}: the zero-data copy quantizes differently: {diff}")
        types[mixture] = " ".join(got[n] for n in names)
        file_types[mixture] = ft
    return types, file_types


def dump(doc):
    """JSON with one line per tensor, kv entry and mixture: small, and diffs read well."""
    lines = ["{"]
    lines.append(f'"about": {json.dumps(doc["about"])},')
    lines.append(f'"llama_cpp": {json.dumps(doc["llama_cpp"])},')
    lines.append(f'"file_types": {json.dumps(doc["file_types"])},')
    lines.append('"models": [')
    for i, m in enumerate(doc["models"]):
        lines.append("{")
        for k in ("name", "source", "arch"):
            lines.append(f'"{k}": {json.dumps(m[k])},')
        lines.append('"kv": [')
        lines.append(",\n".join(json.dumps(e, separators=(",", ":")) for e in m["kv"]))
        lines.append("],")
        lines.append('"tensors": [')
        lines.append(",\n".join(json.dumps(e, separators=(",", ":")) for e in m["tensors"]))
        lines.append("],")
        lines.append('"types": {')
        lines.append(",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in m["types"].items()))
        lines.append("}")
        lines.append("}" + ("," if i + 1 < len(doc["models"]) else ""))
    lines.append("]")
    lines.append("}")
    return "\n".join(lines) + "\n"


ABOUT = (
    "Per-tensor ggml types that llama-quantize picks for its mixtures on qwen35/qwen35moe GGUFs; "
    "written by scripts/gguf-mixture-cases.py, checked by src/layout/gguf/mixture/tests.rs and "
    "tests/python/test_gguf_mixture.py. types[mixture] lists the type of each tensor, in the order of "
    "tensors (shapes in torch order, outermost first)."
)


def check(gguf, path, tmp):
    """The differences between the types in `path` and llama-quantize's, as lines."""
    doc = json.loads(Path(path).read_text())
    problems = []
    if doc.get("llama_cpp") != LLAMA_CPP_VERSION:
        problems.append(f"llama_cpp is {doc.get('llama_cpp')!r}, this script's is {LLAMA_CPP_VERSION!r}")
    for model in doc["models"]:
        types, file_types = compute_types(gguf, model, tmp)
        if sorted(model["types"]) != sorted(types):
            problems.append(f"{model['name']}: mixtures {sorted(model['types'])} != {sorted(types)}")
        for mixture, got in types.items():
            want = model["types"].get(mixture, "").split()
            for (name, _, _), w, g in zip(model["tensors"], want, got.split()):
                if w != g:
                    problems.append(f"{model['name']} {mixture} {name}: committed {w}, llama-quantize {g}")
            if doc["file_types"].get(mixture) != file_types[mixture]:
                problems.append(f"{mixture}: general.file_type {file_types[mixture]}, committed {doc['file_types'].get(mixture)}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "fixtures" / "gguf-mixtures.json"))
    ap.add_argument("--check", metavar="PATH")
    ap.add_argument("--escha-convert", metavar="BIN")
    ap.add_argument("--keep", metavar="DIR")
    args = ap.parse_args()
    gguf = import_gguf()
    with tempfile.TemporaryDirectory() as t:
        tmp = args.keep or t
        Path(tmp).mkdir(parents=True, exist_ok=True)
        if args.check:
            problems = check(gguf, args.check, tmp)
            for p in problems:
                print(p)
            sys.exit(1 if problems else 0)
        if args.escha_convert:
            fixtures = fixture_models(gguf, args.escha_convert, tmp)
        else:
            old = json.loads(Path(args.out).read_text())
            fixtures = [(m, None) for m in old["models"] if m["name"].startswith("fixture-")]
            for m, _ in fixtures:
                m.pop("types", None)
        models = []
        file_types = None
        for model, real in fixtures + [(m, None) for m in synthetic_models(gguf)]:
            model["types"], ft = compute_types(gguf, model, tmp, real)
            assert file_types in (None, ft)
            file_types = ft
            models.append(model)
            print(f"{model['name']}: {len(model['tensors'])} tensors", file=sys.stderr)
        doc = {"about": ABOUT, "llama_cpp": LLAMA_CPP_VERSION, "file_types": file_types, "models": models}
        Path(args.out).write_text(dump(doc))
        print(f"wrote {args.out} ({Path(args.out).stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
