"""`escha-convert --format mlx` on the tiny Escha fixtures, checked against MLX and mlx-lm.

* every quantized tensor is byte-identical to `mx.quantize` (CPU) applied to the bf16 weight of
  our own bf16 Hugging Face export (MoE `switch_mlp.down_proj` with its dead channels zeroed
  first, as the converter does); with `--int8 requant`, the whole output equals what
  `mlx_lm.convert -q` makes of the bf16 export, tensor for tensor;
* exact int8 repacks dequantize (MLX) to exactly f32(w8)·f32(scale);
* the layout: no `mtp.*` key, conv1d `[C, K, 1]`, norms shifted once, metadata, index, config;
* mlx-lm loads the output strictly and its logits agree with mlx-lm running the bf16 export;
* a double-shifted norm or a stray `mtp.` key injected into a copy is caught.

The default run covers a few (bits, group size) pairs; ESCHA_MLX_SLOW=1 runs all 18. The binary
is $ESCHA_BIN or $ESCHA_CONVERT when set, otherwise built with `cargo build --release` (honouring
CARGO_TARGET_DIR). Run: `python -m pytest -s tests/python/test_mlx_output.py`.
"""

import glob
import itertools
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from testenv import require, unavailable

mx = require("mlx.core")
mlx_lm_utils = require("mlx_lm.utils")
from mlx.utils import tree_map  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = ["dense", "moe"]
ALL_COMBOS = list(itertools.product([2, 3, 4, 5, 6, 8], [32, 64, 128]))
SLOW = os.environ.get("ESCHA_MLX_SLOW") == "1"
COMBOS = ALL_COMBOS if SLOW else [(4, 64), (8, 64), (3, 32), (6, 128)]
# (bits, group size, --int8): `exact` at every combination, `requant` at the first one (all when SLOW).
QUANTIZE_CASES = [(b, g, "exact") for b, g in COMBOS] + [(b, g, "requant") for b, g in (COMBOS if SLOW else COMBOS[:1])]
CONVERT_COMBOS = ALL_COMBOS if SLOW else [(4, 64), (5, 128)]
OFFSET_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                ".q_norm.weight", ".k_norm.weight")
TOKENS = np.random.default_rng(1234).integers(0, 256, (1, 128))


@pytest.fixture(scope="session", autouse=True)
def _cpu():
    mx.set_default_device(mx.cpu)


def fixture_dir(name):
    d = REPO / "fixtures" / name
    if not (d / "config.json").is_file():
        unavailable(f"fixture {d} not present")
    return d


@pytest.fixture(scope="session")
def binary(request):
    if os.environ.get("ESCHA_BIN"):
        return Path(os.environ["ESCHA_BIN"])
    if os.environ.get("ESCHA_CONVERT"):
        return request.getfixturevalue("escha_convert")
    out = subprocess.run(["cargo", "build", "--release", "--bin", "escha-convert", "--message-format=json"],
                         cwd=REPO, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == "escha-convert":
            return Path(msg["executable"])
    raise RuntimeError("cargo did not report the escha-convert executable")


@pytest.fixture(scope="session")
def run(binary, tmp_path_factory):
    """run(fixture, *args) -> output dir; each distinct conversion runs once per session."""
    cache = {}
    root = tmp_path_factory.mktemp("conv")

    def go(name, *args):
        key = (name,) + args
        if key not in cache:
            out = root / ("_".join(key).replace("-", "") or "x")
            subprocess.run([str(binary), str(fixture_dir(name)), str(out), "-q", *args], check=True)
            cache[key] = out
        return cache[key]

    return go


def mlx_out(run, name, bits, gs, int8="exact"):
    return run(name, "--format", "mlx", "--bits", str(bits), "--group-size", str(gs), "--int8", int8)


def load_dir(d):
    w = {}
    for f in sorted(glob.glob(str(Path(d) / "model*.safetensors"))):
        w.update(mx.load(f))
    return w


def as_bits(a):
    view = {mx.float32: mx.uint32, mx.float16: mx.uint16, mx.bfloat16: mx.uint16, mx.uint32: mx.uint32}[a.dtype]
    return np.array(a.view(view))


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(as_bits(a), as_bits(b))


def hf_name(mlx_path):
    if mlx_path.startswith("language_model.model."):
        return "model.language_model." + mlx_path[len("language_model.model."):]
    return mlx_path[len("language_model."):]


def input_tensors(name):
    from safetensors import safe_open
    out = {}
    for f in glob.glob(str(fixture_dir(name) / "*.safetensors")):
        with safe_open(f, "np") as s:
            for k in s.keys():
                out[k] = f
    return out


def int8_paths(name):
    """MLX module paths of the Escha int8 pairs."""
    keys = input_tensors(name)
    paths = [k[: -len(".weight_int8")] for k in keys if k.endswith(".weight_int8")]
    return {("language_model.model." + p[len("model.language_model."):]) if p.startswith("model.language_model.")
            else "language_model." + p for p in paths}


def dead_channels(hf, prefix):
    """[E, I] mask of channels whose gate and up rows are all exactly zero."""
    gu = np.array(hf[prefix + ".experts.gate_up_proj"].astype(mx.float32))
    half = gu.shape[1] // 2
    zero = np.all(gu == 0, axis=2)
    return zero[:, :half] & zero[:, half:]


def reference_weight(hf, path):
    """The bf16 weight of MLX module `path` in the HF export, as the converter quantizes it."""
    if ".switch_mlp." in path:
        prefix, leaf = path.split(".switch_mlp.")
        hp = hf_name(prefix)
        if leaf.startswith("down_proj"):
            down_bits = as_bits(hf[hp + ".experts.down_proj"]).copy()  # numpy has no bf16
            dead = dead_channels(hf, hp)
            for e in range(dead.shape[0]):
                down_bits[e][:, dead[e]] = 0
            return mx.array(down_bits).view(mx.bfloat16)
        gu = hf[hp + ".experts.gate_up_proj"]
        half = gu.shape[1] // 2
        return gu[:, :half, :] if leaf.startswith("gate_proj") else gu[:, half:, :]
    return hf[hf_name(path) + ".weight"]


def spec_of(cfg, path):
    q = cfg["quantization"]
    e = q.get(path, {})
    return e.get("bits", q["bits"]), e.get("group_size", q["group_size"])


def mlx_dequantized(ours, cfg, path):
    """Module `path`'s weight of an MLX output (its tensors `ours`, its config `cfg`), as f32 numpy:
    `mx.dequantize` at the width and group size config.json gives it."""
    bits, gs = spec_of(cfg, path)
    back = mx.dequantize(ours[f"{path}.weight"], ours[f"{path}.scales"], ours[f"{path}.biases"],
                         group_size=gs, bits=bits)
    return np.array(back.astype(mx.float32))


# ---------------------------------------------------------------------------------------------
# Bytes


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("bits,gs,int8", QUANTIZE_CASES)
def test_quantized_tensors_match_mx_quantize(run, name, bits, gs, int8):
    out = mlx_out(run, name, bits, gs, int8)
    ours = load_dir(out)
    hf = load_dir(run(name))
    cfg = json.loads((out / "config.json").read_text())
    from_int8 = int8_paths(name)
    compared = 0
    for key in sorted(ours):
        if not key.endswith(".scales"):
            continue
        path = key[: -len(".scales")]
        qb, qg = spec_of(cfg, path)
        w, s = ours[path + ".weight"], ours[path + ".scales"]
        # What the shapes say matches what the config says (older loaders trust the config).
        ref = reference_weight(hf, path)
        assert ref.shape[-1] // s.shape[-1] == qg and w.shape[-1] * 32 // ref.shape[-1] == qb, path
        if int8 == "exact" and path in from_int8:
            assert (qb, s.dtype) == (8, mx.float32), path
            continue
        wq, sq, bq = mx.quantize(ref, group_size=qg, bits=qb)
        for leaf, r in (("weight", wq), ("scales", sq), ("biases", bq)):
            assert same_bytes(ours[f"{path}.{leaf}"], r), f"{path}.{leaf} differs from mx.quantize"
        compared += 1
    assert compared > 0
    # Everything mlx-lm would quantize is quantized: each 2-D linear/embedding weight, each expert
    # stack, whose input width the run's group size divides.
    for key, v in hf.items():
        if key.startswith("mtp."):
            continue  # the MLX layout carries no MTP head
        mlx_path = ("language_model.model." + key[len("model.language_model."):]) if key.startswith("model.language_model.") else "language_model." + key
        if key.endswith(".weight") and v.ndim == 2:
            p = mlx_path[: -len(".weight")]
            assert (p + ".scales" in ours) == (v.shape[-1] % gs == 0), p
        elif key.endswith(".experts.gate_up_proj"):
            p = mlx_path[: -len(".experts.gate_up_proj")] + ".switch_mlp.gate_proj"
            assert (p + ".scales" in ours) == (v.shape[-1] % gs == 0), p


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("bits,gs", CONVERT_COMBOS)
def test_requant_output_equals_mlx_lm_convert(run, tmp_path, name, bits, gs):
    """`--int8 requant` = `mlx_lm.convert -q` on the bf16 export: same names, dtypes, shapes,
    bytes, quantization config and index metadata (down_proj differs only by dead channels)."""
    import contextlib
    import io

    from mlx_lm import convert

    ours_dir = mlx_out(run, name, bits, gs, "requant")
    ref_dir = tmp_path / "mlx_lm"
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(run(name)), str(ref_dir), quantize=True, q_bits=bits, q_group_size=gs)
    ours, ref = load_dir(ours_dir), load_dir(ref_dir)
    assert set(ours) == set(ref)
    differing = sorted(k for k in ours if not same_bytes(ours[k], ref[k]))
    assert all(".switch_mlp.down_proj." in k for k in differing), differing
    if name == "moe":
        # The fixture has dead channels, so zeroing them does change down_proj.
        assert differing
    c_ours = json.loads((ours_dir / "config.json").read_text())
    c_ref = json.loads((ref_dir / "config.json").read_text())
    assert c_ours["quantization"] == c_ref["quantization"] == c_ours["quantization_config"]
    meta = lambda d: json.loads((d / "model.safetensors.index.json").read_text())["metadata"]  # noqa: E731
    assert meta(ours_dir) == meta(ref_dir)


@pytest.mark.parametrize("name", FIXTURES)
def test_int8_exact_repack(run, name):
    from safetensors import safe_open

    out = mlx_out(run, name, 4, 64)
    ours = load_dir(out)
    cfg = json.loads((out / "config.json").read_text())
    files = input_tensors(name)
    n = 0
    for key, f in files.items():
        if not key.endswith(".weight_int8"):
            continue
        p = key[: -len(".weight_int8")]
        with safe_open(f, "np") as s:
            w8 = s.get_tensor(key)
        with safe_open(files[p + ".weight_scale"], "np") as s:
            sc = s.get_tensor(p + ".weight_scale").astype(np.float32)
        path = ("language_model.model." + p[len("model.language_model."):]) if p.startswith("model.language_model.") else "language_model." + p
        w, scales, biases = ours[path + ".weight"], ours[path + ".scales"], ours[path + ".biases"]
        gs = w8.shape[1] // scales.shape[1]
        assert cfg["quantization"][path] == {"group_size": gs, "bits": 8}
        assert np.array_equal(np.array(w).view(np.uint8).reshape(w8.shape), w8.view(np.uint8) ^ 0x80)
        deq = np.array(mx.dequantize(w, scales, biases, group_size=gs, bits=8))
        want = w8.astype(np.float32) * sc[:, None] + np.float32(0)  # −0 → +0, as MLX gives
        assert deq.dtype == np.float32 and np.array_equal(deq.view(np.uint32), want.view(np.uint32)), path
        n += 1
    assert n > 0


# ---------------------------------------------------------------------------------------------
# Layout


def layout_problems(d, name):
    """What would make a loader misread the MLX directory `d` (empty when all is well)."""
    from safetensors import safe_open

    problems = []
    w = load_dir(d)
    problems += [f"stray key {k}" for k in w if "mtp." in k or k.startswith(("vision_tower", "model.visual"))]
    problems += [f"{k} not [C, K, 1]" for k in w if k.endswith("conv1d.weight") and w[k].shape[-1] != 1]
    # Norms carry +1 exactly once; the gated linear-attention norm carries none.
    for key, f in input_tensors(name).items():
        if "mtp." in key or not key.endswith("norm.weight"):
            continue
        mk = "language_model.model." + key[len("model.language_model."):]
        with safe_open(f, "np") as s:
            src = s.get_tensor(key).astype(np.float32)
        shift = 1.0 if mk.endswith(OFFSET_NORMS) else 0.0
        want = as_bits(mx.array(src + np.float32(shift)).astype(mx.bfloat16))
        if mk not in w or not np.array_equal(as_bits(w[mk]), want):
            problems.append(f"{mk} is not the stored norm + {shift:g}")
    return problems


@pytest.mark.parametrize("name", FIXTURES)
def test_layout(run, name):
    out = mlx_out(run, name, 4, 64)
    assert layout_problems(out, name) == []
    w = load_dir(out)
    files = sorted(Path(out).glob("model*.safetensors"))
    for f in files:
        raw = f.read_bytes()
        header = json.loads(raw[8: 8 + struct.unpack("<Q", raw[:8])[0]])
        assert header["__metadata__"] == {"format": "mlx"}
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(w)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in w.values())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"] == cfg["quantization_config"]
    assert cfg["quantization"]["mode"] == "affine"
    assert "vision_config" not in cfg and list(cfg) == sorted(cfg)
    assert cfg["text_config"]["rope_parameters"] == json.loads((fixture_dir(name) / "config.json").read_text())["text_config"]["rope_parameters"]
    assert not (out / "quantize_config.json").exists() and not (out / "mtp").exists()
    # Every module whose (bits, group size) differs from the top level is listed, correctly.
    q = cfg["quantization"]
    hf = load_dir(run(name))
    for k in w:
        if k.endswith(".scales"):
            p = k[: -len(".scales")]
            cols = reference_weight(hf, p).shape[-1]
            inferred = {"group_size": cols // w[k].shape[-1], "bits": w[p + ".weight"].shape[-1] * 32 // cols}
            if (inferred["bits"], inferred["group_size"]) != (q["bits"], q["group_size"]):
                assert q.get(p) == inferred, p
    # A_log keeps its source dtype (F32 in the fixtures).
    assert all(w[k].dtype == mx.float32 for k in w if k.endswith("A_log"))


def test_dead_channels_are_zeroed(run):
    out = mlx_out(run, "moe", 4, 64)
    ours = load_dir(out)
    hf = load_dir(run("moe"))
    total = 0
    for key in ours:
        if not key.endswith("switch_mlp.down_proj.weight"):
            continue
        p = key[: -len(".weight")]
        dead = dead_channels(hf, hf_name(p.split(".switch_mlp.")[0]))
        deq = np.array(mx.dequantize(ours[key], ours[p + ".scales"], ours[p + ".biases"], group_size=64, bits=4).astype(mx.float32))
        bias = np.repeat(np.abs(np.array(ours[p + ".biases"].astype(mx.float32))), 64, axis=-1)
        for e in range(dead.shape[0]):
            # A zeroed column sits exactly on the group's code −q0; only the bf16 rounding of the
            # stored scale and bias (each ≤ 2^−9 relative) keeps it from dequantizing to 0.
            assert np.all(np.abs(deq[e][:, dead[e]]) <= bias[e][:, dead[e]] / 128), (key, e)
        total += dead.sum()
        # The dead gate and up rows themselves are all-zero groups: codes 0, bias 0, exact zeros.
        for leaf in ("gate_proj", "up_proj"):
            g = p.replace("down_proj", leaf)
            dg = np.array(mx.dequantize(ours[g + ".weight"], ours[g + ".scales"], ours[g + ".biases"], group_size=64, bits=4).astype(mx.float32))
            assert all(np.all(dg[e][dead[e]] == 0) for e in range(dead.shape[0])), g
    assert total > 0, "the MoE fixture should have dead channels"


# ---------------------------------------------------------------------------------------------
# Loading and logits


def logits_of(d, f32=False):
    model, _ = mlx_lm_utils.load_model(Path(d), strict=True)
    if f32:
        model.update(tree_map(lambda x: x.astype(mx.float32) if mx.issubdtype(x.dtype, mx.floating) else x, model.parameters()))
    return np.array(model(mx.array(TOKENS)).astype(mx.float32))[0]


@pytest.fixture(scope="session")
def reference_logits(run):
    """mlx-lm running our bf16 HF export (widened to f32: the CPU gather_mm wants f32)."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = logits_of(run(name), f32=True)
        return cache[name]

    return get


def stats(x, ref):
    d = np.abs(x - ref)
    return {"max": float(d.max()), "mean": float(d.mean()), "top1": float((x.argmax(-1) == ref.argmax(-1)).mean())}


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("bits", [4, 8])
def test_strict_load_and_logits(run, reference_logits, tmp_path, name, bits):
    import contextlib
    import io

    from mlx_lm import convert

    ref = reference_logits(name)
    ours = stats(logits_of(mlx_out(run, name, bits, 64)), ref)
    # mlx-lm's own conversion of the same bf16 export, for scale.
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(run(name)), str(tmp_path / "m"), quantize=True, q_bits=bits, q_group_size=64)
    theirs = stats(logits_of(tmp_path / "m"), ref)
    print(f"\n[{name} {bits}-bit g64] ours vs bf16: max {ours['max']:.4f} mean {ours['mean']:.5f} top-1 {ours['top1']:.3f}"
          f" | mlx_lm.convert -q vs bf16: max {theirs['max']:.4f} mean {theirs['mean']:.5f} top-1 {theirs['top1']:.3f}")
    # Exact int8 repacks and zeroed dead channels make ours at least as close as mlx-lm's own.
    assert ours["mean"] <= theirs["mean"] * 1.05 + 1e-6
    if bits == 8:
        # Near-ties in the fixtures' flat logits flip a few argmaxes even at 8 bits (8 of 128 on the
        # dense fixture, 13 for mlx-lm's own conversion): at least 90%, and no fewer than mlx-lm's.
        assert ours["top1"] >= max(0.9, theirs["top1"]) and ours["mean"] < 0.02, (ours, theirs)
    else:
        # The fixtures' logits are nearly flat (median top-1 margin ≈ 0.13), so 4-bit rounding
        # flips many argmaxes for any converter; require no worse than mlx-lm's own.
        assert ours["top1"] >= theirs["top1"] - 0.03, (ours, theirs)


def shift_old_loader(src, dst):
    """Rewrites `src` into `dst` the way mlx-lm ≤ 0.31.3 loads it: any `mtp.` key (or an HF
    conv1d) makes it take the weights for HF layout and add 1 to the offset norms."""
    shutil.copytree(src, dst)
    for f in Path(dst).glob("model*.safetensors"):
        w = mx.load(str(f))
        if any("mtp." in k for k in load_dir(src)):
            w = {k: (v + 1.0 if k.endswith(OFFSET_NORMS) and v.ndim == 1 else v) for k, v in w.items() if "mtp." not in k}
        mx.save_safetensors(str(f), w, metadata={"format": "mlx"})


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("mistake", ["double_shifted_norm", "stray_mtp_key"])
def test_injected_mistakes_are_caught(run, reference_logits, tmp_path, name, mistake):
    good = mlx_out(run, name, 8, 64)
    ref = reference_logits(name)
    assert layout_problems(good, name) == []
    # Near-ties in the fixtures' flat logits flip a few argmaxes at 8 bits (see test_strict_load_and_logits).
    assert stats(logits_of(good), ref)["top1"] >= 0.9
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    shard = sorted(bad.glob("model*.safetensors"))[0]
    w = mx.load(str(shard))
    if mistake == "double_shifted_norm":
        w = {k: (v + 1.0 if k.endswith(OFFSET_NORMS) else v) for k, v in w.items()}
    else:
        w["mtp.fc.weight"] = mx.zeros((4, 4), dtype=mx.bfloat16)
    mx.save_safetensors(str(shard), w, metadata={"format": "mlx"})
    problems = layout_problems(bad, name)
    assert problems, "the layout check missed the mistake"
    # And the model that a loader would build from it is visibly wrong.
    loaded = tmp_path / "as_loaded"
    shift_old_loader(bad, loaded)
    s = stats(logits_of(loaded), ref)
    assert s["top1"] < 0.8 or s["mean"] > 0.1, s


# ---------------------------------------------------------------------------------------------
# Qwen3-Next (Hugging Face layout: per-expert weights), from a bf16 checkpoint whose shared-expert
# gate of layer 0 is trellis-coded (the tool converts Escha checkpoints only)


QWEN3_NEXT = {
    "model_type": "qwen3_next", "hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 256,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "linear_num_value_heads": 2,
    "linear_num_key_heads": 1, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
    "shared_expert_intermediate_size": 128, "mlp_only_layers": [], "moe_intermediate_size": 64,
    "rms_norm_eps": 1e-6, "vocab_size": 256, "rope_theta": 1000000.0, "partial_rotary_factor": 0.25,
    "max_position_embeddings": 4096, "full_attention_interval": 4, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="session")
def qwen3_next_hf(tmp_path_factory):
    """A random tiny Qwen3-Next in Hugging Face layout (per-expert experts, conv1d [C, 1, K],
    zero-centred norms), bf16, built from mlx-lm's own model definition."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_next

    mx.random.seed(5)
    model = qwen3_next.Model(qwen3_next.ModelArgs.from_dict(QWEN3_NEXT))
    rng = np.random.default_rng(5)
    hf = {}
    for k, v in tree_flatten(model.parameters()):
        v = v.astype(mx.bfloat16)
        if k.endswith(OFFSET_NORMS):
            v = mx.array(rng.normal(0, 0.1, v.shape).astype(np.float32)).astype(mx.bfloat16)  # HF: w − 1
        if "conv1d.weight" in k:
            v = v.swapaxes(1, 2)
        if ".switch_mlp." in k:
            prefix, leaf = k.split(".switch_mlp.")
            for e in range(v.shape[0]):
                hf[f"{prefix}.experts.{e}.{leaf}"] = v[e]
            continue
        hf[k] = v
    # One coded linear, K=2, random codes and small channel scales.
    coded = "model.layers.0.mlp.shared_expert.gate_proj"
    out_features, in_features = hf.pop(f"{coded}.weight").shape
    hf[f"{coded}.escha_code"] = mx.array(rng.integers(-32768, 32768, (in_features // 16, out_features // 16, 32)).astype(np.int16))
    hf[f"{coded}.escha_rin"] = mx.array(rng.uniform(0.1, 0.2, in_features).astype(np.float16))
    hf[f"{coded}.escha_rout"] = mx.array(rng.uniform(0.1, 0.2, out_features).astype(np.float16))
    hf[f"{coded}.escha_config"] = mx.array(np.array([16, 2, 2, 1, in_features, out_features], np.int32))
    d = tmp_path_factory.mktemp("qwen3_next_hf")
    mx.save_safetensors(str(d / "model.safetensors"), hf, metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(QWEN3_NEXT))
    shutil.copy(REPO / "fixtures" / "moe" / "tokenizer_config.json", d)
    return d


@pytest.mark.parametrize("bits,gs", [(4, 64), (3, 128)] + ([(b, g) for b, g in ALL_COMBOS if (b, g) not in ((4, 64), (3, 128))] if SLOW else []))
def test_qwen3_next_equals_mlx_lm_convert(binary, qwen3_next_hf, tmp_path, bits, gs):
    """Per-expert weights are stacked into switch_mlp, nothing is renamed, routers go to 8 bits,
    and a down_proj whose width (64) the group size 128 does not divide stays bf16: byte for
    byte what `mlx_lm.convert -q` writes, and it loads strictly to the same logits."""
    import contextlib
    import io

    from mlx_lm import convert

    ours_dir, bf16_dir = tmp_path / "ours", tmp_path / "bf16"
    subprocess.run([str(binary), str(qwen3_next_hf), str(ours_dir), "-q", "--format", "mlx",
                    "--bits", str(bits), "--group-size", str(gs)], check=True)
    # mlx-lm quantizes our bf16 export (the coded linear decoded); everything else is as built.
    subprocess.run([str(binary), str(qwen3_next_hf), str(bf16_dir), "-q"], check=True)
    ref_dir = tmp_path / "ref"
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(bf16_dir), str(ref_dir), quantize=True, q_bits=bits, q_group_size=gs)
    ours, ref = load_dir(ours_dir), load_dir(ref_dir)
    assert set(ours) == set(ref)
    assert [k for k in ours if not same_bytes(ours[k], ref[k])] == []
    if gs == 128:
        assert "model.layers.0.mlp.switch_mlp.down_proj.scales" not in ours
    c_ours = json.loads((ours_dir / "config.json").read_text())
    c_ref = json.loads((ref_dir / "config.json").read_text())
    assert c_ours["quantization"] == c_ref["quantization"]
    # f32: a bf16 (unquantized) SwitchLinear has no CPU gather_mm in bf16.
    assert np.array_equal(logits_of(ours_dir, f32=True), logits_of(ref_dir, f32=True))
