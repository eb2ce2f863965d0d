"""The EXL3 output (`--format exl3`) under exllamav3 itself, on the CPU.

For each fixture (`fixtures/dense`, `fixtures/moe`), `escha-convert IN OUT --format exl3 --bias keep`
writes OUT, and exllamav3 (the pinned PyPI release) treats it as a model it quantized itself:

* `Config.from_directory(OUT)` picks the text-only class (`Qwen3_5Config` / `Qwen3_5MoeConfig`,
  from `architectures`) and reads the source's text settings (widths, heads, layer types, partial
  rotary factor, experts) from the flattened config; `Model.from_config` builds the model from it;
* every module's own `load()` runs on the CPU and finds its tensors in OUT: each coded linear loads
  through `Linear.load_exl3` as an EXL3 linear (trellis `[in/16, out/16, 16K]`, suh `[in]`, svh
  `[out]` in float16, the MCG marker, whose stored multiplier exllamav3 checks against its own
  constant from the file), the per-expert MoE linears included; embeddings, norms, the linear
  attention's own tensors, routers and the int8-derived linears load as float weights;
* every tensor of OUT but the MTP head (which the text-only model does not build) is read by some
  module: nothing is written that exllamav3 would not use;
* `quantization_config.json` is what exllamav3's own `create_quantization_config_json` makes of OUT
  (its `tensor_storage` map, which PonyExl3 requires), and config.json's `quantization_config` is
  the same dict without `tensor_storage`;
* OUT converted back to bf16 loads in transformers (its per-expert linears stacked into the fused
  expert tensors) with the direct bf16 conversion's logits.

exllamav3 needs its CUDA extension (`exllamav3_ext`), built from source on install. A stand-in
module put in `sys.modules` as `exllamav3.ext` only satisfies the import: every attribute is an
inert callable, so no kernel runs and no tensor data is read through it (exllamav3 reads tensor
data through the extension; shapes and dtypes come from the safetensors headers, which exllamav3
parses in Python, and so do the codebook-marker checks). The values themselves are checked by the
Rust tests (`tests/it/exl3.rs`: every trellis word, the folded scales, and the way back to bf16).

Run: `python -m pytest tests/python/test_exl3.py` with ESCHA_CONVERT pointing at the binary.
"""

import json
import shutil
import subprocess
import sys
import types

import pytest

from testenv import require

torch = require("torch")


class _Inert:
    """Whatever the stand-in extension is asked for: callable, with any attribute, doing nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Inert()

    def __getattr__(self, name):
        return _Inert()


def _stand_in_extension():
    ext = types.ModuleType("exllamav3_ext")
    ext.__getattr__ = lambda name: _Inert()
    wrapper = types.ModuleType("exllamav3.ext")
    wrapper.exllamav3_ext = ext
    return wrapper


# Before the package is imported: `exllamav3.ext` would otherwise compile the extension.
sys.modules.setdefault("exllamav3.ext", _stand_in_extension())
exllamav3 = require("exllamav3")
from exllamav3 import Config, Model  # noqa: E402
from exllamav3.conversion.quant_config import create_quantization_config_json  # noqa: E402
from exllamav3.modules import Linear  # noqa: E402
from exllamav3.modules.quant.exl3_lib.quantize import codebook_mcg_mult  # noqa: E402
from exllamav3.version import __version__ as EXLLAMAV3_VERSION  # noqa: E402

safetensors = require("safetensors")

CPU = torch.device("cpu")
CLASSES = {"dense": ("Qwen3_5Config", "Qwen3_5Model"), "moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeModel")}


@pytest.fixture(scope="module", params=["dense", "moe"])
def exl3_out(request, escha_convert, repo_root, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(f"exl3-{name}") / "out"
    subprocess.run(
        [str(escha_convert), str(repo_root / "fixtures" / name), str(out), "--format", "exl3", "--bias", "keep", "--quiet"],
        check=True,
    )
    return name, out


def stored_tensors(out):
    """Every tensor of OUT: name → (dtype, shape)."""
    names = {}
    for f in sorted(out.glob("*.safetensors")):
        with safetensors.safe_open(str(f), "pt") as st:
            for k in st.keys():
                s = st.get_slice(k)
                names[k] = (s.get_dtype(), tuple(s.get_shape()))
    return names


def test_exllamav3_builds_the_model_and_every_module_loads_its_tensors(exl3_out, repo_root):
    name, out = exl3_out
    config = Config.from_directory(str(out))
    model = Model.from_config(config)
    assert (type(config).__name__, type(model).__name__) == CLASSES[name]
    # exllamav3 reads the text model's settings from the flattened config as from the source's
    # text_config.
    text = json.loads((repo_root / "fixtures" / name / "config.json").read_text())["text_config"]
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (
        text["hidden_size"],
        text["num_hidden_layers"],
        text["vocab_size"],
    )
    assert (config.head_dim, config.num_q_heads, config.num_kv_heads) == (
        text["head_dim"],
        text["num_attention_heads"],
        text["num_key_value_heads"],
    )
    assert config.layer_types == text["layer_types"]
    assert config.rope_settings.partial_rotary_factor == text["rope_parameters"]["partial_rotary_factor"]
    assert config.rope_settings.rope_theta == text["rope_parameters"]["rope_theta"]
    assert config.rms_norm_eps == text["rms_norm_eps"]
    assert config.linear_num_value_heads == text["linear_num_value_heads"]
    if name == "moe":
        assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (
            text["num_experts"],
            text["num_experts_per_tok"],
            text["moe_intermediate_size"],
        )
        assert config.shared_expert_intermediate_size == text["shared_expert_intermediate_size"]
    else:
        assert config.intermediate_size == text["intermediate_size"]

    read = set()
    stc = config.stc
    for method in ("get_tensor", "get_codebook_marker"):
        original = getattr(stc, method)

        def recording(key, *args, _original=original, **kwargs):
            result = _original(key, *args, **kwargs)
            if result is not None:
                read.add(key)
            return result

        setattr(stc, method, recording)

    for module in model.modules:
        module.load(CPU)

    stored = stored_tensors(out)
    linears = [m for m in model if isinstance(m, Linear)]
    exl3 = [m for m in linears if m.quant_type == "exl3"]
    coded = {k[: -len(".trellis")] for k in stored if k.endswith(".trellis")}
    assert {m.key for m in exl3} == coded, "every coded linear, and only those, loads as EXL3"
    if name == "moe":
        assert any(".mlp.experts.3.up_proj" in m.key for m in exl3), "per-expert linears"
    for m in exl3:
        inner = m.inner
        k = stored[f"{m.key}.trellis"][1][2] // 16
        assert tuple(inner.trellis.shape) == (m.in_features // 16, m.out_features // 16, 16 * k), m.key
        assert inner.trellis.dtype == torch.int16
        assert (tuple(inner.suh.shape), tuple(inner.svh.shape)) == ((m.in_features,), (m.out_features,)), m.key
        assert inner.suh.dtype == inner.svh.dtype == torch.half
        assert inner.mcg and not inner.mul1, f"{m.key}: the MCG codebook"
        if name == "dense":
            assert inner.bias is not None and tuple(inner.bias.shape) == (m.out_features,), f"{m.key}: bias kept"
    for m in linears:
        if m.quant_type != "exl3":
            assert m.quant_type == "fp16" and m.inner is not None, m.key

    unread = {k for k in stored if k not in read and not k.startswith("mtp.")}
    assert not unread, f"tensors no module reads: {sorted(unread)[:5]}"


def test_an_exl3_input_keeps_the_biases_exllamav3_applies(exl3_out, escha_convert, tmp_path):
    """OUT is itself an EXL3 checkpoint whose biases exllamav3 adds: converted to EXL3 again with
    no flag, every coded linear's bias is still where exllamav3's `Linear.load_exl3` reads it (its
    values, which exllamav3 reads through the extension, are compared by tests/it/biases.rs). The
    dense fixture carries biases; the MoE fixture none, and none appear."""
    name, out = exl3_out
    biases = {k for k in stored_tensors(out) if k.endswith(".bias")}
    assert bool(biases) == (name == "dense"), f"{name}: the fixture's biases"
    again = tmp_path / "again"
    subprocess.run([str(escha_convert), str(out), str(again), "--format", "exl3", "--quiet"], check=True)
    assert {k for k in stored_tensors(again) if k.endswith(".bias")} == biases
    model = Model.from_config(Config.from_directory(str(again)))
    for module in model.modules:
        module.load(CPU)
    exl3 = [m for m in model if isinstance(m, Linear) and m.quant_type == "exl3"]
    assert {f"{m.key}.bias" for m in exl3 if m.inner.bias is not None} == biases
    for m in exl3:
        bias = m.inner.bias
        if bias is not None:
            assert tuple(bias.shape) == (m.out_features,) and bias.dtype == torch.half, f"{m.key}: bias loaded"


def test_quantization_config_json_is_what_exllamav3_makes_of_the_checkpoint(exl3_out, tmp_path):
    name, out = exl3_out
    ours = json.loads((out / "quantization_config.json").read_text())
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "quantization_config.json").unlink()
    create_quantization_config_json(str(copy))
    theirs = json.loads((copy / "quantization_config.json").read_text())

    # exllamav3 reads the marker's value through its extension, which the stand-in does not run (it
    # reads nothing, and a multiplier it reads as 0 is left out): the multipliers are compared
    # against exllamav3's constant below instead.
    def masked(q):
        q = json.loads(json.dumps(q))
        for info in q["tensor_storage"].values():
            info.pop("mcg_multiplier", None)
            info.pop("mul1_multiplier", None)
        return q

    assert masked(ours) == masked(theirs)
    exl3 = [info for info in ours["tensor_storage"].values() if info.get("quant_format") == "exl3"]
    assert exl3 and all(info["mcg_multiplier"] == codebook_mcg_mult for info in exl3)
    assert all(info["bits_per_weight"] in (2, 3) for info in exl3)

    config = json.loads((out / "config.json").read_text())
    q = config["quantization_config"]
    assert {k: v for k, v in ours.items() if k != "tensor_storage"} == q
    assert (q["quant_method"], q["version"], q["head_bits"], q["codebook"]) == (
        "exl3",
        EXLLAMAV3_VERSION,
        16,
        "mcg",
    )
    assert q["original_quantization_config"]["quant_method"] in ("escha", "eschamoe")
    assert "text_config" not in config and "vision_config" not in config


def test_the_way_back_to_bf16_loads_in_transformers_as_the_direct_conversion(exl3_out, escha_convert, repo_root, tmp_path):
    """OUT converted back to bf16 with `--bias drop` (the per-expert linears stacked into the fused
    expert tensors) loads in transformers with no missing or unexpected key, and gives the direct bf16
    conversion's logits: exactly on the MoE fixture (s_in = s_out = 1, so no weight changes), and
    within the effect of a bf16 rounding on the dense one (its s fold moves some bf16 values by one
    step; test_transformers.py sizes that effect at up to 0.053 on this fixture)."""
    transformers = require("transformers")
    name, out = exl3_out
    back, direct = tmp_path / "back", tmp_path / "direct"
    # OUT keeps the biases (`--bias keep`), and exllamav3 applies an EXL3 linear's, so the way back
    # keeps them by default; the direct conversion drops them (the reference runtime never applies
    # them), and so does this way back when asked.
    subprocess.run([str(escha_convert), str(out), str(back), "--bias", "drop", "--quiet"], check=True)
    subprocess.run([str(escha_convert), str(repo_root / "fixtures" / name), str(direct), "--quiet"], check=True)
    ids = torch.tensor([[1, 5, 9, 33, 70, 2, 100, 7, 12, 200, 3, 64]])
    logits = []
    for d in (back, direct):
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(d), output_loading_info=True, dtype=torch.float32
        )
        assert not any(info.values()), f"{d.name}: {info}"
        with torch.no_grad():
            logits.append(model(ids).logits)
    diff = (logits[0] - logits[1]).abs().max().item()
    if name == "moe":
        assert diff == 0.0
    else:
        assert diff < 0.08, diff
