"""`--fit-memory`: the K/V cache and the recurrent state the tool counts are what mlx-lm and llama.cpp
allocate for the output. mlx-lm computes in the dtype of the embedding's scales: an exact int8 repack
(F32 scales) caches K and V in f32, a requantized one in bf16, and the budget counts each."""

import json
import re
import subprocess

import pytest

from testenv import require

mx = require("mlx.core")
mlx_lm = require("mlx_lm")

from test_gguf import llama_bin  # noqa: E402,F401
from test_mlx_output import fixture_dir  # noqa: E402

CONTEXT = 1000


@pytest.mark.parametrize("int8", ["exact", "requant"])
def test_mlx_lm_allocates_the_cache_counted(escha_convert, tmp_path, int8):
    out = tmp_path / "out"
    args = ["--format", "mlx", "--int8", int8, "--fit-memory", "6MB", "--context", str(CONTEXT), "--reserve", "0"]
    p = subprocess.run([str(escha_convert), str(fixture_dir("dense")), str(out), "-q", "--json", *args],
                       check=True, capture_output=True, text=True)
    budget = json.loads(p.stdout)["budget"]
    model, _ = mlx_lm.load(str(out))
    cache = model.make_cache()
    # A prompt of CONTEXT tokens, as one prefill.
    mx.eval(model(mx.array([[i % 250 + 3 for i in range(CONTEXT)]]), cache=cache))
    kv = sum(c.keys.nbytes + c.values.nbytes for c in cache if hasattr(c, "keys"))
    state = sum(a.nbytes for c in cache if not hasattr(c, "keys") for a in c.cache)
    assert kv == budget["kv_cache_bytes"], (kv, budget)
    # The reserve is the state alone here (--reserve 0); mlx-lm's conv state is in the compute dtype.
    assert state <= budget["reserve_bytes"], (state, budget)
    if int8 == "exact":
        assert state == budget["reserve_bytes"], (state, budget)


def test_llama_cpp_allocates_the_cache_counted(escha_convert, llama_bin, tmp_path):
    """llama.cpp (its context sized to the prompt, as llama_logits makes it) pads the context to
    256 cells and keeps F16 K and V and an F32 recurrent state: its own log of the sizes."""
    tokens = 300
    out = tmp_path / "out"
    args = ["--format", "gguf", "--fit-memory", "6MB", "--context", str(tokens), "--reserve", "0"]
    p = subprocess.run([str(escha_convert), str(fixture_dir("dense")), str(out), "-q", "--json", *args],
                       check=True, capture_output=True, text=True)
    budget = json.loads(p.stdout)["budget"]
    ids = ",".join(str(i % 250 + 3) for i in range(tokens))
    r = subprocess.run([str(llama_bin / "llama_logits"), "-v", "-t", "2", "-o", str(tmp_path / "l.f32"),
                        str(out / "model.gguf"), ids], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    kv = re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells.*K \(f16\).*V \(f16\)", r.stderr)
    rs = re.search(r"llama_memory_recurrent: size = +([\d.]+) MiB .*R \(f32\).*S \(f32\)", r.stderr)
    assert kv and rs, r.stderr[-4000:]
    assert int(kv.group(2)) == 512, "300 tokens padded to 512 cells"
    # The log gives MiB to two decimals.
    mib = 1 << 20
    assert abs(float(kv.group(1)) * mib - budget["kv_cache_bytes"]) <= 0.005 * mib, (kv.group(0), budget)
    assert abs(float(rs.group(1)) * mib - budget["reserve_bytes"]) <= 0.005 * mib, (rs.group(0), budget)
