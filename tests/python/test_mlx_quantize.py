"""Our MLX affine quantizer against real MLX (`mx.quantize` on the CPU), bit for bit.

Inputs are generated with numpy, saved with `mx.save_safetensors` (so bf16 works), quantized by
the `mlx_quantize_file` example of this crate, and compared with `mx.quantize` of the same arrays:
packed U32 words, scales and biases must be identical bytes.

The example binary is taken from $ESCHA_EXAMPLES_DIR when set, otherwise built with
`cargo build --release --example mlx_quantize_file` (honouring CARGO_TARGET_DIR).

Run: `python -m pytest tests/python/test_mlx_quantize.py`
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from testenv import require

mx = require("mlx.core")

REPO = Path(__file__).resolve().parents[2]
BITS = [2, 3, 4, 5, 6, 8]
GROUP_SIZES = [32, 64, 128]
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
ROWS, COLS = 24, 256


@pytest.fixture(scope="session", autouse=True)
def _cpu():
    mx.set_default_device(mx.cpu)


@pytest.fixture(scope="session")
def example_bin():
    d = os.environ.get("ESCHA_EXAMPLES_DIR")
    if d:
        p = Path(d) / "mlx_quantize_file"
        assert p.is_file(), f"{p} does not exist"
        return p
    out = subprocess.run(
        ["cargo", "build", "--release", "--example", "mlx_quantize_file", "--message-format=json"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "mlx_quantize_file" and msg.get("executable"):
            return Path(msg["executable"])
    raise RuntimeError("cargo did not report the mlx_quantize_file executable")


def group_kinds(rng):
    """Named [ROWS, COLS] f64 matrices that exercise every branch of the per-group algorithm."""
    g = {}
    g["gaussian"] = rng.standard_normal((ROWS, COLS)) * 0.02
    # Small integers times a power of two: exact in every dtype, many exact ties k + 1/2.
    g["ties"] = rng.integers(-8, 9, (ROWS, COLS)) * 0.25
    g["ties_wide"] = rng.integers(-40, 41, (ROWS, COLS)) * 0.125
    c = np.repeat(rng.standard_normal((ROWS, COLS // 32)), 32, axis=1)
    c[::3] = 0.0
    g["constant_and_zero_groups"] = c
    g["all_zero"] = np.zeros((ROWS, COLS))
    g["all_positive"] = rng.uniform(0.1, 0.9, (ROWS, COLS))
    g["all_negative"] = -rng.uniform(0.1, 0.9, (ROWS, COLS))
    g["heavy_tailed"] = rng.standard_t(1.5, (ROWS, COLS)) * 0.01
    s = rng.standard_normal((ROWS, COLS)) * 0.05
    s[rng.uniform(size=(ROWS, COLS)) < 0.9] = 0.0
    g["sparse"] = s
    # Per-row magnitudes spanning many binades (tiny scales, f16 subnormal scales).
    g["scaled_rows"] = rng.standard_normal((ROWS, COLS)) * np.logspace(-9, 2, ROWS)[:, None]
    ev = np.tile(np.linspace(0.1, 0.9, 32), (ROWS, COLS // 32))
    ev[1::2] *= -1
    g["evenly_spaced"] = ev
    return g


def as_bits(a):
    """The raw bits of an mx array as a numpy array of unsigned ints."""
    view = {mx.float32: mx.uint32, mx.float16: mx.uint16, mx.bfloat16: mx.uint16, mx.uint32: mx.uint32}[a.dtype]
    return np.array(a.view(view))


@pytest.fixture(scope="session")
def inputs(tmp_path_factory):
    rng = np.random.default_rng(20260822)
    kinds = group_kinds(rng)
    d = tmp_path_factory.mktemp("mlxq")
    files = {}
    for dname, dt in DTYPES.items():
        arrays = {k: mx.array(v.astype(np.float32)).astype(dt) for k, v in kinds.items()}
        path = d / f"in_{dname}.safetensors"
        mx.save_safetensors(str(path), arrays)
        files[dname] = (path, arrays)
    return d, files


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_bit_exact_against_mx_quantize(example_bin, inputs, dname, bits, group_size):
    d, files = inputs
    path, arrays = files[dname]
    out = d / f"out_{dname}_{bits}_{group_size}.safetensors"
    subprocess.run(
        [str(example_bin), str(path), str(out), "--bits", str(bits), "--group-size", str(group_size)],
        check=True,
    )
    ours = mx.load(str(out))
    for name, a in arrays.items():
        wq, scales, biases = mx.quantize(a, group_size=group_size, bits=bits)
        assert ours[f"{name}.weight"].dtype == mx.uint32
        assert ours[f"{name}.scales"].dtype == a.dtype, name
        for leaf, ref in (("weight", wq), ("scales", scales), ("biases", biases)):
            got = ours[f"{name}.{leaf}"]
            assert got.shape == ref.shape, (name, leaf)
            g, r = as_bits(got), as_bits(ref)
            if not np.array_equal(g, r):
                bad = np.argwhere(g != r)
                pytest.fail(f"{dname} bits={bits} gs={group_size} {name}.{leaf}: {len(bad)} differ, first at {bad[0].tolist()}: ours {g[tuple(bad[0])]:#x} mlx {r[tuple(bad[0])]:#x}")


def test_negative_scales_occur(example_bin, inputs):
    """About half the scales of a Gaussian group set are negative (code 0 at the group maximum)."""
    d, files = inputs
    path, _ = files["bfloat16"]
    out = d / "neg.safetensors"
    subprocess.run([str(example_bin), str(path), str(out), "--bits", "4", "--group-size", "32"], check=True)
    s = np.array(mx.load(str(out))["gaussian.scales"].astype(mx.float32))
    frac = (s < 0).mean()
    assert 0.3 < frac < 0.7, frac


@pytest.mark.parametrize("scale_dtype", ["f32", "f16", "bf16"])
def test_int8_exact_repack(example_bin, tmp_path, scale_dtype):
    """int8 rows with an F16 row scale repack into 8-bit affine; with F32 scales MLX dequantizes
    them to exactly f32(w8)·f32(scale)."""
    rng = np.random.default_rng(7)
    shapes = {"a": (48, 128), "b": (16, 512), "c": (8, 96)}
    arrays = {}
    for name, (r, c) in shapes.items():
        w8 = rng.integers(-128, 128, (r, c), dtype=np.int8)
        w8[0, :4] = [-128, 127, 0, -1]
        sc = (rng.uniform(1e-4, 5e-2, r) * rng.choice([-1, 1], r)).astype(np.float16)
        arrays[f"{name}.weight_int8"] = mx.array(w8)
        arrays[f"{name}.weight_scale"] = mx.array(sc)
    inp = tmp_path / "int8.safetensors"
    mx.save_safetensors(str(inp), arrays)
    out = tmp_path / "int8_out.safetensors"
    subprocess.run([str(example_bin), str(inp), str(out), "--int8", "--scale-dtype", scale_dtype], check=True)
    ours = mx.load(str(out))
    for name, (r, c) in shapes.items():
        w8 = np.array(arrays[f"{name}.weight_int8"])
        sc = np.array(arrays[f"{name}.weight_scale"]).astype(np.float32)
        w, s, b = ours[f"{name}.weight"], ours[f"{name}.scales"], ours[f"{name}.biases"]
        gs = c // s.shape[-1]
        assert gs == max(g for g in (32, 64, 128) if c % g == 0)
        assert np.array_equal(np.array(w).view(np.uint8).reshape(r, c), (w8.view(np.uint8) ^ 0x80))
        want = w8.astype(np.float32) * sc[:, None]
        if scale_dtype == "f32":
            deq = np.array(mx.dequantize(w, s, b, group_size=gs, bits=8))
            assert deq.dtype == np.float32
            # Bit for bit, except that w8 = 0 with a negative scale gives +0 here and −0 there.
            assert np.array_equal(deq.view(np.uint32), (want + 0.0).view(np.uint32)), name
        else:
            # Stored scales/biases satisfy scale·q + bias = w8·scale_stored exactly in f32.
            s32 = np.array(s.astype(mx.float32))
            b32 = np.array(b.astype(mx.float32))
            q = (w8.astype(np.int32) + 128).astype(np.float32)
            exact = q * np.repeat(s32, gs, axis=1) + np.repeat(b32, gs, axis=1)
            assert np.array_equal(exact, w8.astype(np.float32) * np.repeat(s32, gs, axis=1))
            if scale_dtype == "f16":
                assert np.array_equal(s32[:, 0], sc), "F16 row scales are stored exactly in F16"
