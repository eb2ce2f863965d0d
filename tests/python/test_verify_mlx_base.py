"""`verify` against an MLX-layout base: the bf16 base as mlx-lm itself lays it out after loading
(renamed keys, norms +1, conv1d transposed, experts split into switch_mlp), written by mlx."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from testenv import require

mx = require("mlx.core")
tree_flatten = require("mlx.utils").tree_flatten
load_model = require("mlx_lm.utils").load_model


def mlx_layout_copy(base: Path, out: Path) -> Path:
    model, _ = load_model(base)
    weights = dict(tree_flatten(model.parameters()))
    out.mkdir()
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    shutil.copy(base / "config.json", out / "config.json")
    return out


def verify(binary: Path, escha: Path, base: Path):
    p = subprocess.run([str(binary), "verify", str(escha), "--base", str(base), "--json"], capture_output=True, text=True)
    return p.returncode, json.loads(p.stdout) if p.stdout else p.stderr


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_fixture_passes_against_its_mlx_layout_base(escha_convert, repo_root, tmp_path, model):
    base = mlx_layout_copy(repo_root / "fixtures" / f"{model}-base", tmp_path / "mlx-base")
    code, report = verify(escha_convert, repo_root / "fixtures" / model, base)
    assert code == 0, report
    assert report["base_layout"] == "mlx"
    assert not report["missing_in_base"]
    for row in report["coded"]:
        assert 1.0 <= row["ratio"] <= 1.3, row
    kinds = {(n["kind"], n["verdict"]) for n in report["norms"]}
    # Offset norms match with +1 folded in; the gated linear_attn.norm matches as stored.
    assert kinds == {("zero-centred", "+1"), ("plain", "as stored")}


def test_an_hf_checkpoint_passed_where_mlx_norms_are_expected_fails(escha_convert, repo_root, tmp_path):
    """An MLX base whose norms lack the +1 (a converter that forgot it) is caught by the norm table."""
    base = mlx_layout_copy(repo_root / "fixtures" / "dense-base", tmp_path / "mlx-base")
    weights = mx.load(str(base / "model.safetensors"))
    for k in list(weights):
        if k.endswith("input_layernorm.weight"):
            weights[k] = weights[k] - 1.0
    mx.save_safetensors(str(base / "model.safetensors"), weights, metadata={"format": "mlx"})
    code, report = verify(escha_convert, repo_root / "fixtures" / "dense", base)
    assert code == 1
    failing = [n["tensor"] for n in report["norms"] if n["failures"]]
    assert failing and all(t.endswith("input_layernorm.weight") for t in failing)


def test_switch_mlp_pieces_that_disagree_are_an_error_naming_file_and_tensors(escha_convert, repo_root, tmp_path):
    """gate_proj and up_proj make one fused weight; a base where their widths differ is not read."""
    base = mlx_layout_copy(repo_root / "fixtures" / "moe-base", tmp_path / "mlx-base")
    weights = mx.load(str(base / "model.safetensors"))
    up = next(k for k in weights if k.endswith("switch_mlp.up_proj.weight"))
    weights[up] = weights[up][..., :-1]
    mx.save_safetensors(str(base / "model.safetensors"), weights, metadata={"format": "mlx"})
    p = subprocess.run([str(escha_convert), "verify", str(repo_root / "fixtures" / "moe"), "--base", str(base)], capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert "model.safetensors" in p.stderr and up in p.stderr and "disagree in shape" in p.stderr, p.stderr
    assert "panicked" not in p.stderr
