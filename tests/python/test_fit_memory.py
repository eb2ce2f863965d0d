"""`--fit-memory`: the K/V cache and the recurrent state the tool counts are what mlx-lm allocates
for the MLX output. mlx-lm computes in the dtype of the embedding's scales: an exact int8 repack
(F32 scales) caches K and V in f32, a requantized one in bf16, and the budget counts each."""

import json
import subprocess

import pytest

from testenv import require

mx = require("mlx.core")
mlx_lm = require("mlx_lm")

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
