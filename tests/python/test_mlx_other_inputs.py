"""MLX outputs of inputs other than an Escha checkpoint directory, loaded by mlx-lm as the tool says.

* A single `.safetensors` file as IN (the MoE fixture's one shard, alone in a directory) is the
  tensors-only case: no config.json is written, and the warning and the card give the step that
  makes OUT loadable. The test follows it literally: it copies the model's own config.json and
  tokenizer files into OUT and runs the card's shell line in OUT; mlx-lm then loads OUT with
  `strict=True` and its logits equal those of the same conversion from the fixture's directory,
  at a fixed `--bits`, under `--bits auto` and under `--max-size` (where every tensor has its own
  width and group size, which only the merged `quantization` map tells mlx-lm).
* The same file to bf16 (the default step: copy the model's own files): transformers loads OUT to
  the directory conversion's logits. GGUF and EXL3, written from config.json, refuse the file
  (`tests/it/convert_cli.rs`).
* The tool's own EXL3 output (config.json `model_type` `qwen3_5_text` / `qwen3_5_moe_text`,
  exllamav3's text-only classes) to MLX: config.json names mlx-lm's module, and mlx-lm loads it
  with `strict=True` to finite logits close to the direct conversion's (at 8 bits).

Run: `ESCHA_CONVERT=target/debug/escha-convert python -m pytest tests/python/test_mlx_other_inputs.py`.
"""

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from testenv import require

mx = require("mlx.core")
mlx_lm_utils = require("mlx_lm.utils")

REPO = Path(__file__).resolve().parents[2]
TOKENS = np.random.default_rng(1234).integers(0, 256, (1, 64))
SIDE_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]


@pytest.fixture(scope="session", autouse=True)
def _cpu():
    mx.set_default_device(mx.cpu)


def convert(binary, src, out, *args):
    subprocess.run([str(binary), str(src), str(out), "-q", *args], check=True)
    return out


def single_file(tmp_path):
    """The MoE fixture's one shard, alone: a single `.safetensors` file as IN."""
    d = tmp_path / "in"
    d.mkdir()
    shutil.copyfile(REPO / "fixtures/moe/model-00001-of-00001.safetensors", d / "model.safetensors")
    return d / "model.safetensors"


def follow_the_card(out):
    """Does what the card's "tensors only" line says: copy the model's own files, run its command."""
    line = next(l for l in (out / "README.md").read_text().splitlines() if l.startswith("| tensors only |"))
    assert "copy the model's own config.json and tokenizer files into OUT" in line, line
    for name in SIDE_FILES:
        shutil.copyfile(REPO / "fixtures/moe" / name, out / name)
    command = re.search(r"cd OUT && (.*) \|$", line)
    if command:
        subprocess.run(command.group(1), shell=True, cwd=out, check=True)


def mlx_logits(d):
    model, _ = mlx_lm_utils.load_model(Path(d), strict=True)
    return np.array(model(mx.array(TOKENS)).astype(mx.float32))[0]


@pytest.mark.parametrize("flags", [["--bits", "4"], ["--bits", "auto"], ["--max-size", "1.15MB"]],
                         ids=["bits4", "bits_auto", "max_size"])
def test_single_file_to_mlx_loads_after_the_documented_step(escha_convert, tmp_path, flags):
    out = convert(escha_convert, single_file(tmp_path), tmp_path / "out", "--format", "mlx", *flags)
    assert not (out / "config.json").exists()
    follow_the_card(out)
    ours = mlx_logits(out)
    assert np.isfinite(ours).all()
    direct = convert(escha_convert, REPO / "fixtures/moe", tmp_path / "direct", "--format", "mlx", *flags)
    np.testing.assert_array_equal(ours, mlx_logits(direct))


def test_single_file_to_bf16_loads_after_the_documented_step(escha_convert, tmp_path):
    torch = require("torch")
    transformers = require("transformers")

    def logits(d):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype="auto")
        with torch.no_grad():
            return model(torch.tensor(TOKENS)).logits.float().numpy()[0]

    out = convert(escha_convert, single_file(tmp_path), tmp_path / "out", "--format", "bf16")
    follow_the_card(out)
    ours = logits(out)
    assert np.isfinite(ours).all()
    direct = convert(escha_convert, REPO / "fixtures/moe", tmp_path / "direct", "--format", "bf16")
    np.testing.assert_array_equal(ours, logits(direct))


@pytest.mark.parametrize("name,model_type", [("dense", "qwen3_5"), ("moe", "qwen3_5_moe")])
def test_exl3_output_to_mlx_loads(escha_convert, tmp_path, name, model_type):
    import json

    exl3 = convert(escha_convert, REPO / "fixtures" / name, tmp_path / "exl3", "--format", "exl3")
    assert json.loads((exl3 / "config.json").read_text())["model_type"] == f"{model_type}_text"
    out = convert(escha_convert, exl3, tmp_path / "mlx", "--format", "mlx", "--bits", "8")
    assert json.loads((out / "config.json").read_text())["model_type"] == model_type
    ours = mlx_logits(out)
    assert np.isfinite(ours).all()
    # The EXL3 detour folds the channel scales into f16 and keeps int8 tables as bf16 weights:
    # close to the direct conversion (int8 requantized too), not equal; at 8 bits, as close as
    # `test_mlx_output.py` holds an 8-bit output to the bf16 model.
    direct = mlx_logits(convert(escha_convert, REPO / "fixtures" / name, tmp_path / "direct",
                                "--format", "mlx", "--bits", "8", "--int8", "requant"))
    assert np.abs(ours - direct).mean() < 0.02, np.abs(ours - direct).mean()
