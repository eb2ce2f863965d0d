"""Rotary scaling as the model cards document it, loaded by the clients.

The Qwen3.6 card enables long context with YaRN under `text_config.rope_parameters` (`rope_type`
"yarn", `factor`, `original_max_position_embeddings`); Qwen3-Next's card does it with a top-level
`rope_scaling`. Each fixture is given that setting (scaled to its 4096 positions) and converted:

* bf16: transformers loads it and builds YaRN (its rotary embedding's `rope_type` is "yarn" and its
  attention scaling 0.1·ln(4) + 1), and the logits are finite and differ from the unscaled model's
  (the scaling is applied, not dropped);
* MLX: mlx-lm loads it and builds `YarnRoPE` for every full-attention layer, logits finite;
* GGUF (where llama.cpp is built): gguf-py reads `rope.scaling.type` / `.factor` /
  `.original_context_length`, and llama.cpp evaluates the file to finite logits.

Run: `python -m pytest tests/python/test_rope_scaling.py`.
"""

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from testenv import require, unavailable

torch = require("torch")
transformers = require("transformers")
mx = require("mlx.core")
mlx_lm_utils = require("mlx_lm.utils")

from test_mlx_output import qwen3_next_hf  # noqa: E402,F401 (a tiny Qwen3-Next, as a fixture)

REPO = Path(__file__).resolve().parents[2]
TOKENS = [1, 17, 42, 99, 3, 250, 128, 64, 7, 200, 33, 180, 5, 9, 77, 140]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
# Positions past the original context, where YaRN's interpolation shows in the logits.
FAR = list(range(8000, 8000 + len(TOKENS)))


def yarn_copy(name, dst):
    """fixtures/NAME with the Qwen3.6 card's YaRN setting in text_config.rope_parameters."""
    shutil.copytree(REPO / "fixtures" / name, dst)
    c = json.loads((dst / "config.json").read_text())
    c["text_config"]["rope_parameters"].update(YARN)
    c["text_config"]["max_position_embeddings"] = 16384
    (dst / "config.json").write_text(json.dumps(c, indent=2))
    return dst


def convert(binary, src, out, *args):
    r = subprocess.run([str(binary), str(src), str(out), "--quiet", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def hf_logits(d, positions=None):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    kw = {} if positions is None else {"position_ids": torch.tensor([positions])}
    with torch.no_grad():
        return model, model(torch.tensor([TOKENS]), **kw).logits[0].numpy()


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_transformers_runs_yarn_from_the_bf16_output(escha_convert, tmp_path, name):
    src = yarn_copy(name, tmp_path / "in")
    out = convert(escha_convert, src, tmp_path / "bf16")
    model, y = hf_logits(out, FAR)
    rotary = model.model.rotary_emb
    assert rotary.rope_type == "yarn"
    assert rotary.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1.0)
    assert np.isfinite(y).all()
    plain = convert(escha_convert, REPO / "fixtures" / name, tmp_path / "plain")
    _, y0 = hf_logits(plain, FAR)
    assert np.isfinite(y0).all()
    assert np.abs(y - y0).max() > 1e-3, "YaRN changes the logits past the original context"


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_mlx_lm_builds_yarn_from_the_mlx_output(escha_convert, tmp_path, name):
    from mlx_lm.models.rope_utils import YarnRoPE

    src = yarn_copy(name, tmp_path / "in")
    out = convert(escha_convert, src, tmp_path / "mlx", "--format", "mlx")
    model, _ = mlx_lm_utils.load_model(out, strict=True)
    ropes = [m.rope for _, m in model.named_modules() if hasattr(m, "rope")]
    assert ropes and all(isinstance(r, YarnRoPE) for r in ropes), [type(r).__name__ for r in ropes]
    assert np.isfinite(np.array(model(mx.array([TOKENS])).astype(mx.float32))).all()


def test_qwen3_next_rope_scaling_reaches_transformers_and_mlx_lm(escha_convert, qwen3_next_hf, tmp_path):
    """Qwen3-Next's card: a top-level rope_scaling, read by both clients from the bf16 and MLX outputs."""
    from mlx_lm.models.rope_utils import YarnRoPE

    src = tmp_path / "next"
    shutil.copytree(qwen3_next_hf, src)
    c = json.loads((src / "config.json").read_text())
    c["rope_scaling"] = dict(YARN)
    c["max_position_embeddings"] = 16384
    (src / "config.json").write_text(json.dumps(c))
    bf16 = convert(escha_convert, src, tmp_path / "bf16")
    model, y = hf_logits(bf16, FAR)
    assert model.model.rotary_emb.rope_type == "yarn"
    assert np.isfinite(y).all()
    mlx = convert(escha_convert, src, tmp_path / "mlx", "--format", "mlx")
    m, _ = mlx_lm_utils.load_model(mlx, strict=True)
    ropes = [x.rope for _, x in m.named_modules() if hasattr(x, "rope")]
    assert ropes and all(isinstance(r, YarnRoPE) for r in ropes), [type(r).__name__ for r in ropes]
    assert np.isfinite(np.array(m(mx.array([TOKENS])).astype(mx.float32))).all()


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_llama_cpp_reads_the_scaling_keys_and_runs_the_gguf(escha_convert, tmp_path, name):
    llama_bin = Path(os.environ.get("ESCHA_LLAMA_BIN", ""))
    if not (llama_bin / "llama_logits").is_file():
        unavailable("ESCHA_LLAMA_BIN has no llama_logits: run scripts/llama-cpp.sh")
    gguf = require("gguf")
    src = yarn_copy(name, tmp_path / "in")
    out = convert(escha_convert, src, tmp_path / "gguf", "--format", "gguf")
    r = gguf.GGUFReader(str(out / "model.gguf"))
    arch = "qwen35moe" if name == "moe" else "qwen35"

    def value(key):
        f = r.fields[f"{arch}.rope.scaling.{key}"]
        return f.contents()

    assert value("type") == "yarn"
    assert value("factor") == 4.0
    assert value("original_context_length") == 4096
    logits = tmp_path / "logits.f32"
    run = subprocess.run(
        [str(llama_bin / "llama_logits"), "-t", "2", "-o", str(logits), str(out / "model.gguf"), ",".join(map(str, TOKENS))],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    y = np.fromfile(logits, dtype="<f4")
    assert y.size and np.isfinite(y).all()
