"""`--format mlx --bits auto`: each coded linear at the smallest width whose added error
‖deq(Q_b(W)) − W‖/‖W‖ (over live rows) is within R·2^-K. Checked with MLX itself: every quantized
tensor is what mx.quantize makes at its chosen width, the chosen width meets the budget and the next
smaller one does not, and mlx-lm loads the result strictly with no flags."""

import glob
import json

import numpy as np
import pytest

from testenv import require
from test_mlx_output import (FIXTURES, _cpu, binary, fixture_dir, load_dir, reference_weight, run,  # noqa: F401
                             same_bytes, spec_of)

mx = require("mlx.core")
mlx_lm_utils = require("mlx_lm.utils")

WIDTHS = [2, 3, 4, 5, 6, 8]
R = 0.5


def coded_modules(name):
    """{MLX module path: K} of the fixture's coded linears (fused experts split as mlx-lm does)."""
    from safetensors import safe_open
    out = {}
    for f in glob.glob(str(fixture_dir(name) / "*.safetensors")):
        with safe_open(f, "np") as s:
            for k in s.keys():
                if not k.endswith(".escha_code"):
                    continue
                K = s.get_slice(k).get_shape()[-1] // 16
                path = "language_model.model." + k[len("model.language_model."):-len(".escha_code")]
                if path.endswith(".experts.gate_up_proj"):
                    stem = path[: -len(".experts.gate_up_proj")] + ".switch_mlp."
                    out[stem + "gate_proj"] = out[stem + "up_proj"] = K
                elif path.endswith(".experts.down_proj"):
                    out[path[: -len(".experts.down_proj")] + ".switch_mlp.down_proj"] = K
                else:
                    out[path] = K
    return out


def added_error(w, bits, gs):
    """‖deq(Q_b(W)) − W‖ / ‖W‖ over the rows that are not all zero, by MLX itself."""
    q, s, b = mx.quantize(w, group_size=gs, bits=bits)
    back = np.array(mx.dequantize(q, s, b, group_size=gs, bits=bits).astype(mx.float32), dtype=np.float64)
    x = np.array(w.astype(mx.float32), dtype=np.float64).reshape(-1, w.shape[-1])
    back = back.reshape(x.shape)
    live = np.any(x != 0, axis=1)
    return float(np.linalg.norm((back - x)[live]) / np.linalg.norm(x[live]))


@pytest.mark.parametrize("name", FIXTURES)
def test_each_width_is_the_smallest_within_the_budget(run, name):
    out = run(name, "--format", "mlx", "--bits", "auto", "--measure-error")
    ours, hf = load_dir(out), load_dir(run(name))
    cfg = json.loads((out / "config.json").read_text())
    modules = coded_modules(name)
    assert modules
    for path, K in sorted(modules.items()):
        bits, gs = spec_of(cfg, path)
        w = reference_weight(hf, path)
        q, s, b = mx.quantize(w, group_size=gs, bits=bits)
        for leaf, r in (("weight", q), ("scales", s), ("biases", b)):
            assert same_bytes(ours[f"{path}.{leaf}"], r), f"{path}.{leaf} differs from mx.quantize at {bits} bits"
        budget = R * 2.0 ** -K
        assert added_error(w, bits, gs) <= budget, f"{path}: {bits} bits exceed the budget {budget}"
        smaller = [x for x in WIDTHS if x < bits]
        if smaller:
            assert added_error(w, smaller[-1], gs) > budget, f"{path}: {smaller[-1]} bits would do"
    # Wider where the trellis is finer: the fixtures' K=3 linears need more bits than their K=2 ones.
    widths = {K: {spec_of(cfg, p)[0] for p, k in modules.items() if k == K} for K in set(modules.values())}
    assert max(widths[2]) < min(widths[3]), widths


@pytest.mark.parametrize("name", FIXTURES)
def test_mlx_lm_loads_it_strictly_with_no_flags(run, name):
    out = run(name, "--format", "mlx", "--bits", "auto")
    model, _ = mlx_lm_utils.load_model(out, strict=True)
    logits = model(mx.array([[1, 2, 3, 4]]))
    assert np.isfinite(np.array(logits.astype(mx.float32))).all()
