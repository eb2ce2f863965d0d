"""The bf16 conversion against an independent NumPy reference, and both under mlx-lm.

For each fixture (`fixtures/dense`, `fixtures/moe`):

* `escha-convert IN OUT` (default bf16 HF layout) and `escha_reference.convert` (float64 decode written
  from the format document, one bf16 round-to-nearest-even) write two checkpoints;
* every output tensor, read back with the `safetensors` package (numpy + ml_dtypes), must have the
  reference's name, shape and dtype, and the same bits. The only exception allowed is a coded-linear
  element whose float64 value lies within 1e-6 * max|W| of a bf16 rounding midpoint (the converter works
  in float32 there) and whose converter value is the other neighbour of that midpoint. int8 and plain
  tensors, and exact zeros (dead MoE channels), must match exactly;
* both directories load with `mlx_lm.utils.load_model` (strict), are cast to float32 the same way (MLX's
  CPU gather_mm has no bf16 kernel), and give the same logits on a fixed token sequence.

The reference itself is checked against the golden tiles (`fixtures/golden`), its bf16 rounding against
brute force, and its decode against the bf16 base model (the error figures of fixtures/README.md).

Run: `python -m pytest tests/python/test_bf16_interop.py -q` (add `-s` to see the figures).
"""

import glob
import json
import subprocess
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, needed by safe_open(framework="numpy"))
import numpy as np
import pytest
from safetensors import safe_open

import escha_reference as R
from testenv import require

FIXTURES = ["dense", "moe"]
TOKENS = [1, 17, 42, 99, 3, 250, 128, 64, 7, 200, 33, 180]
TIE_BAND = 1e-6  # times max|W| of the tensor
MAX_TIE_FRACTION = 1e-4  # of all coded elements
LOGIT_ATOL = 1e-4


def load_dir(d):
    """{name: numpy array} of every *.safetensors directly in d, via the safetensors package."""
    out = {}
    for f in sorted(glob.glob(str(Path(d) / "*.safetensors"))):
        with safe_open(f, framework="numpy") as h:
            for k in h.keys():
                assert k not in out, f"{k} written twice"
                out[k] = h.get_tensor(k)
    return out


@pytest.fixture(scope="module", params=FIXTURES)
def pair(request, repo_root, escha_convert, tmp_path_factory):
    """(fixture name, converter output dir, reference output dir, reference values)."""
    name = request.param
    src = repo_root / "fixtures" / name
    tmp = tmp_path_factory.mktemp(name)
    out = tmp / "convert"
    r = subprocess.run([str(escha_convert), str(src), str(out), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, f"escha-convert failed ({r.returncode}):\n{r.stderr}"
    ref = tmp / "reference"
    values = R.convert(src, ref)
    return name, out, ref, values


# --------------------------------------------------------------------------------------------------
# The reference on its own


@pytest.mark.parametrize("path", sorted(glob.glob(str(Path(__file__).resolve().parents[2] / "fixtures/golden/*.json"))))
def test_reference_matches_golden_tiles(path):
    g = json.loads(Path(path).read_text())
    assert R.PERM.tolist() == g["tensor_core_perm"]
    for tile in g["tiles"]:
        words = np.array(tile["words_i16"], dtype=np.int64).astype(np.uint16)
        states = R.tile_states(words, g["K"])
        assert states.tolist() == tile["states_u16_trellis_order"]
        values = R.tile_values(words, g["K"], g["cb"]).ravel()
        assert R.f64_to_f16_bits(values).tolist() == tile["values_f16_bits_rowmajor"]
        assert values.tolist() == tile["values_rowmajor"]


def test_reference_codebook_table_statistics():
    """The whole MCG table after the fp16 rounding (format document §3)."""
    v = R.codebook(np.arange(65536), R.MCG)
    assert len(np.unique(v)) == 10746
    assert v.min() == -3.94921875 and v.max() == 3.94921875
    assert abs(np.sqrt(np.mean(v**2)) - 1.244112) < 5e-7


def test_reference_worked_example_states():
    """Format document §4.5: the synthetic stream 0x1234."""
    w = np.zeros(32, np.uint16)
    w[1] = 0x1234
    assert R.tile_states(w, 2)[:10].tolist() == [0, 1, 4, 0x12, 0x48, 0x123, 0x48D, 0x1234, 0x48D0, 0x2340]
    w = np.zeros(48, np.uint16)
    w[1] = 0x1234
    assert R.tile_states(w, 3)[:8].tolist() == [0, 4, 0x24, 0x123, 0x91A, 0x48D0, 0x4680, 0x3400]


def test_reference_rounding_is_correct():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(100_000) * 10.0 ** rng.integers(-45, 39, 100_000)
    specials = [0.0, -0.0, np.inf, -np.inf, 3.4e38, 3.39e38, -3.4e38, 1e-40, -1e-40, 9.2e-41, 1e-45, 5e-324]
    # float64 values one hair off a bf16 midpoint: float32 would round onto the midpoint first.
    hairs = [1 + 2**-8 + 2**-30, 1 + 2**-8 - 2**-30, 1 + 3 * 2**-8 - 2**-30, -(1 + 2**-8 + 2**-30)]
    x = np.concatenate([x, specials, hairs])
    bits = R.f64_to_bf16_bits(x)
    # Brute force: the result and its two neighbours, compared exactly in float64.
    with np.errstate(invalid="ignore", over="ignore"):
        v = R.bf16_bits_to_f64(bits)
        finite = np.isfinite(x) & np.isfinite(v)
        down = R.bf16_bits_to_f64(np.where(np.abs(v) > 0, bits - 1, bits ^ 0x8001).astype(np.uint16))
        up = R.bf16_bits_to_f64(bits + 1)
        d = np.abs(x - v)
        for nb in (down, up):
            ok = np.isfinite(nb) & finite
            assert (d[ok] <= np.abs(x - nb)[ok]).all()
            tie = ok & (d == np.abs(x - nb))
            assert ((bits[tie] & 1) == 0).all()
    assert [int(b) for b in R.f64_to_bf16_bits(np.array(hairs))] == [0x3F81, 0x3F80, 0x3F81, 0xBF81]
    assert (np.signbit(v) == np.signbit(x))[x != 0].all()
    assert (R.f64_to_bf16_bits(np.array([np.inf, -np.inf, 3.4e38, np.nan])) & 0x7FFF).tolist()[:3] == [0x7F80] * 3
    # fp16 (used for the codebook) against numpy's own float64 -> float16 conversion.
    y = rng.standard_normal(100_000) * 10.0 ** rng.integers(-9, 6, 100_000)
    with np.errstate(over="ignore"):
        assert (R.f64_to_f16_bits(y) == y.astype(np.float16).view(np.uint16)).all()


@pytest.mark.parametrize("name", FIXTURES)
def test_reference_against_base(repo_root, name, tmp_path):
    """The reference decode is close to the bf16 weights the fixture was encoded from."""
    values = R.convert(repo_root / "fixtures" / name, tmp_path)[""]
    base = R.read_checkpoint_dir(repo_root / "fixtures" / f"{name}-base")
    # The MoE fixture's MTP head has no routed experts: it is not converted (the base keeps it).
    expected = {n for n in base if not (name == "moe" and n.startswith("mtp."))}
    assert set(values) == expected
    for k, o in values.items():
        dt, b = base[k]
        if dt == "BF16":
            b = R.bf16_bits_to_f64(b)
        assert o.value.shape == b.shape, k
        if o.kind == "plain":
            assert o.dtype == dt, k
            assert (R.f64_to_bf16_bits(o.value) == base[k][1]).all() if dt == "BF16" else (o.value == b).all(), k
            continue
        w, b = (o.value, b) if o.value.ndim == 3 else (o.value[None], b[None])
        for e in range(w.shape[0]):
            err = np.linalg.norm(w[e] - b[e]) / np.linalg.norm(b[e])
            limit = 0.3 if o.kind == "coded" else 0.02
            assert err < limit, f"{k}[{e}]: relative error {err:.3f} against the base"
        dead = (b == 0).all(axis=-1)  # pruned MoE channels: whole rows of zeros in the base
        assert (w[dead] == 0).all(), f"{k}: dead rows do not decode to zero"


# --------------------------------------------------------------------------------------------------
# The converter against the reference


def test_checkpoint_matches_reference(pair):
    name, out, ref, values = pair
    subdirs = sorted(str(p.relative_to(out).parent) for p in out.rglob("*.safetensors"))
    assert sorted({"" if s == "." else s for s in subdirs}) == sorted(values), "output directories differ"

    coded = mismatched = near = 0
    worst = 0.0
    for sub, decoded in values.items():
        got, want = load_dir(out / sub), load_dir(ref / sub)
        assert sorted(got) == sorted(want), f"{name}/{sub}: tensor names differ"
        assert sorted(want) == sorted(decoded)
        for k in sorted(want):
            g, w, o = got[k], want[k], decoded[k]
            assert g.shape == w.shape, f"{k}: shape {g.shape} != {w.shape}"
            assert g.dtype == w.dtype, f"{k}: dtype {g.dtype} != {w.dtype}"
            gb, wb = g.view(np.uint16 if g.itemsize == 2 else np.uint8), w.view(np.uint16 if w.itemsize == 2 else np.uint8)
            diff = gb != wb
            if o.kind != "coded":
                assert not diff.any(), f"{k} ({o.kind}): {int(diff.sum())} elements differ from the reference"
                continue
            assert o.dtype == "BF16"
            x = o.value
            band = R.bf16_tie_distance(x) <= TIE_BAND * np.abs(x).max()
            lo, hi = R.bf16_bracket(x)
            excused = band & (x != 0) & ((gb == lo) | (gb == hi))
            bad = diff & ~excused
            assert not bad.any(), (
                f"{k}: {int(bad.sum())} elements differ from the reference away from a rounding tie, "
                f"e.g. index {np.argwhere(bad)[0].tolist()}"
            )
            coded += x.size
            near += int(band.sum())
            mismatched += int(diff.sum())
            if diff.any():
                worst = max(worst, float((R.bf16_tie_distance(x[diff]) / np.abs(x).max()).max()))
    assert mismatched <= MAX_TIE_FRACTION * coded, f"{mismatched} tie mismatches in {coded} coded elements"
    print(
        f"\n{name}: {coded} coded elements, {mismatched} differ from the reference (all near-ties, worst "
        f"{worst:.2e}·max|W| from the midpoint); {near} lie within {TIE_BAND:g}·max|W| of a tie"
    )

    cfg_out = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg_out
    assert cfg_out == json.loads((ref / "config.json").read_text())
    for sub in values:
        if sub:
            assert json.loads((out / sub / "config.json").read_text()) == json.loads((ref / sub / "config.json").read_text())
    side = {p.name for p in ref.glob("*.json")} - {"config.json"}
    for f in side:
        assert (out / f).read_bytes() == (ref / f).read_bytes(), f"side file {f} not copied as is"
    assert not (out / "quantize_config.json").exists()


def test_mlx_logits_match_reference(pair):
    mx = require("mlx.core")
    load_model = require("mlx_lm.utils").load_model

    mx.set_default_device(mx.cpu)
    name, out, ref, _ = pair
    logits = []
    for d in (out, ref):
        model, _ = load_model(Path(d))  # strict: names and shapes must fit the model exactly
        model.set_dtype(mx.float32)
        y = model(mx.array([TOKENS]))
        mx.eval(y)
        logits.append(np.array(y.astype(mx.float32))[0])
    a, b = logits
    assert a.shape == (len(TOKENS), 256)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    diff = float(np.abs(a - b).max())
    print(f"\n{name}: max |logit diff| {diff:.3e} (max |logit| {np.abs(b).max():.3f}); top-1 {a.argmax(-1).tolist()}")
    assert diff <= LOGIT_ATOL, f"{name}: logits differ by {diff}"
    assert (a.argmax(-1) == b.argmax(-1)).all(), f"{name}: top-1 tokens differ"
