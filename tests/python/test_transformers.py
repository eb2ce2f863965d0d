"""The bf16 conversion under transformers, against an independent float64 decode.

For each fixture (`fixtures/dense`: Qwen3.5 with an MTP head; `fixtures/moe`: Qwen3.5-MoE):

* `escha-convert IN OUT --quiet` writes the bf16 Hugging Face layout, and
  `AutoModelForCausalLM.from_pretrained(OUT, output_loading_info=True)` loads it with no missing,
  unexpected or mismatched keys and no error messages. transformers (5.2.0 is the first release with
  the `qwen3_5` and `qwen3_5_moe` model types) maps both configs to the text-only
  `Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM`, renames `model.language_model.*` to `model.*`, and
  drops every `mtp.*` key without reporting it: `_keys_to_ignore_on_load_unexpected = [r"^mtp.*"]`
  on `Qwen3_5PreTrainedModel` and `Qwen3_5MoePreTrainedModel` (plus `^model.visual.*` on the
  `*ForCausalLM` classes); transformers has no MTP module. The dense output is also loaded in the
  other layouts of its MTP head: inline as `mtp.*` tensors in the main shards, and dropped altogether
  (`mtp_num_hidden_layers` 0); whichever layout the converter writes, all three must load cleanly
  and give identical logits. A stray key that is not `mtp.*` must be reported, or the check would
  prove nothing.
* Logits on three token sequences (12 tokens; 100 tokens, past the 64-token chunk of the gated
  delta rule; 40 tokens of two repeated ids) are compared with the same architecture built from
  the config that `escha_reference` writes and holding the float64 values it decodes from the
  fixture (never rounded). Every model runs in float64 on the CPU (our bf16 weights widened
  exactly); transformers still computes the gated delta rule, its gated norm and the rotary
  frequencies in float32, which is the compute noise below.

Tolerances. Our weights are the exact decode rounded once to bf16, whose unit roundoff is
u = 2^-8: every weight is off by a relative error of at most 2^-8, and the logits move
accordingly. To size that, each coded and int8 tensor of the exact model was perturbed by
independent uniform relative errors in [-u, u] (5 seeds; max over positions and vocabulary, per
sequence): the logits moved by 0.011-0.053 (dense) and 0.014-0.24 (MoE: single tokens jump where
two of the 4 experts' router logits nearly tie and the top-2 choice flips), with max |logit| about
2. The real rounding moves them by at most 0.032 (dense) and 0.127 (MoE). Hence:

* BF16_ATOL, the ceiling on max |ours - exact|: 0.08 (dense) and 0.35 (MoE), 1.5 times the largest
  effect of a random bf16-sized perturbation;
* elementwise, |ours - exact| <= |rounded - exact| + SAME_WEIGHTS_ATOL, where `rounded` is the same
  architecture holding escha_reference's own bf16 rounding of the decode: ours must be as close to
  the exact model as a correct rounding is;
* max |ours - rounded| <= SAME_WEIGHTS_ATOL = 1e-3: the two hold the same bf16 numbers except the
  rare near-tie elements that test_bf16_interop.py allows (one bf16 step each), seen through the
  float32 compute noise; measured at most 1.7e-4 (MoE, 100 tokens).

Run: `python -m pytest -s tests/python/test_transformers.py` (-s prints the measured differences).
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import escha_reference as R
from testenv import require

torch = require("torch")
transformers = require("transformers")
safetensors_torch = require("safetensors.torch")

FIXTURES = ["dense", "moe"]
SEQUENCES = {
    "12": [1, 17, 42, 99, 3, 250, 128, 64, 7, 200, 33, 180],
    "100": np.random.default_rng(2024).integers(0, 256, 100).tolist(),
    "repeat40": [5] * 20 + [9] * 20,
}
BF16_ATOL = {"dense": 0.08, "moe": 0.35}
SAME_WEIGHTS_ATOL = 1e-3
DENSE_LAYOUTS = ["as_written", "mtp_inline", "mtp_dropped"]


def load(d):
    """from_pretrained as a user would call it; returns (model, loading info)."""
    return transformers.AutoModelForCausalLM.from_pretrained(str(d), output_loading_info=True)


def clean(info):
    return {k: sorted(v) for k, v in info.items() if v}


def shards(d):
    """{tensor name: shard file} of the main checkpoint in d, from its index."""
    return json.loads((Path(d) / "model.safetensors.index.json").read_text())["weight_map"]


def save_shard(path, tensors):
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})


def write_index(d, weight_map):
    p = Path(d) / "model.safetensors.index.json"
    index = json.loads(p.read_text())
    index["weight_map"] = dict(sorted(weight_map.items()))
    index["metadata"]["total_size"] = sum(
        t.numel() * t.element_size()
        for f in sorted(set(weight_map.values()))
        for t in safetensors_torch.load_file(str(Path(d) / f)).values()
    )
    p.write_text(json.dumps(index, indent=2))


def mtp_tensors(out):
    """The MTP head the converter wrote, wherever it put it: OUT/mtp/ or inline `mtp.*`."""
    found = {}
    for f in sorted((out / "mtp").glob("*.safetensors")):
        found.update(safetensors_torch.load_file(str(f)))
    for name, f in shards(out).items():
        if name.startswith("mtp."):
            found[name] = safetensors_torch.load_file(str(out / f))[name]
    return found


def make_layout(out, layout, dst):
    """A copy of the converter's dense output with its MTP head in `layout`."""
    if layout == "as_written":
        return out
    shutil.copytree(out, dst)
    mtp = mtp_tensors(out)
    assert mtp, "the dense fixture has an MTP head"
    shutil.rmtree(dst / "mtp", ignore_errors=True)
    weight_map = {k: f for k, f in shards(dst).items() if not k.startswith("mtp.")}
    for f in sorted(set(shards(dst).values())):
        tensors = {k: v for k, v in safetensors_torch.load_file(str(dst / f)).items() if not k.startswith("mtp.")}
        save_shard(dst / f, tensors)
    if layout == "mtp_inline":
        last = sorted(set(weight_map.values()))[-1]
        save_shard(dst / last, {**safetensors_torch.load_file(str(dst / last)), **mtp})
        weight_map.update({k: last for k in mtp})
    else:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["text_config"]["mtp_num_hidden_layers"] = 0
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    write_index(dst, weight_map)
    return dst


@pytest.fixture(scope="module", params=FIXTURES)
def case(request, repo_root, escha_convert, tmp_path_factory):
    """(fixture name, converter output dir, reference config dir, reference float64 values)."""
    name = request.param
    src = repo_root / "fixtures" / name
    tmp = tmp_path_factory.mktemp(f"tf_{name}")
    out = tmp / "convert"
    r = subprocess.run([str(escha_convert), str(src), str(out), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, f"escha-convert failed ({r.returncode}):\n{r.stderr}"
    values = R.convert(src, tmp / "reference")[""]
    return name, out, tmp / "reference", values


def param_name(key):
    """Checkpoint name -> parameter name of *ForCausalLM (transformers' `language_model` prefix change)."""
    prefix = "model.language_model."
    return "model." + key[len(prefix):] if key.startswith(prefix) else key


def reference_model(ref_dir, values, rounded):
    """The architecture from the reference's config.json, holding the reference decode in float64:
    exact, or rounded once to bf16 by escha_reference (`rounded`)."""
    config = transformers.AutoConfig.from_pretrained(str(ref_dir))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float64, experts_implementation="eager")
    state = {}
    for key, o in values.items():
        if key.startswith("mtp."):
            continue  # transformers has no MTP module
        v = o.value
        if rounded and o.dtype == "BF16":
            v = R.bf16_bits_to_f64(R.f64_to_bf16_bits(v))
        state[param_name(key)] = torch.from_numpy(np.asarray(v, dtype=np.float64))
    model.load_state_dict(state, strict=True)  # every parameter, nothing else
    return model.eval()


def as_float64(model):
    """Our loaded bf16 model widened exactly to float64 (the eager experts path runs in float64)."""
    if hasattr(model, "set_experts_implementation") and model.config.model_type.startswith("qwen3_5_moe"):
        model.set_experts_implementation("eager")
    return model.to(torch.float64).eval()


def logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy()


def test_loads_without_missing_unexpected_or_mismatched_keys(case, tmp_path):
    name, out, _, values = case
    layouts = DENSE_LAYOUTS if name == "dense" else ["as_written"]
    baseline = None
    for layout in layouts:
        d = make_layout(out, layout, tmp_path / layout)
        model, info = load(d)
        assert clean(info) == {}, f"{name} ({layout}): {clean(info)}"
        assert type(model).__name__ == {"dense": "Qwen3_5ForCausalLM", "moe": "Qwen3_5MoeForCausalLM"}[name]
        assert model.dtype == torch.bfloat16
        # Every parameter came from the checkpoint: the same names as the reference decode (but
        # the MTP head, which transformers has no module for).
        assert {n for n, _ in model.named_parameters()} == {param_name(k) for k in values if not k.startswith("mtp.")}
        y = logits(as_float64(model), SEQUENCES["12"])
        if baseline is None:
            baseline = y
        assert np.array_equal(y, baseline), f"{name}: layout {layout} changes the logits"
        if layout == "mtp_inline":
            assert any(k.startswith("mtp.") for k in shards(d))


def test_stray_keys_are_reported(case, tmp_path):
    """A key that is neither a parameter nor `mtp.*` shows up in unexpected_keys."""
    _, out, _, _ = case
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    weight_map = shards(bad)
    first = sorted(set(weight_map.values()))[0]
    tensors = safetensors_torch.load_file(str(bad / first))
    tensors["model.language_model.layers.0.mlp.stray.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    save_shard(bad / first, tensors)
    weight_map["model.language_model.layers.0.mlp.stray.weight"] = first
    write_index(bad, weight_map)
    _, info = load(bad)
    assert any("stray" in k for k in info["unexpected_keys"]), clean(info)


def test_logits_match_the_float64_reference(case):
    name, out, ref_dir, values = case
    model, info = load(out)
    assert clean(info) == {}
    ours = as_float64(model)
    exact = reference_model(ref_dir, values, rounded=False)
    rounded = reference_model(ref_dir, values, rounded=True)
    for label, tokens in SEQUENCES.items():
        a, e, r = logits(ours, tokens), logits(exact, tokens), logits(rounded, tokens)
        assert a.shape == (len(tokens), 256) and np.isfinite(a).all() and np.isfinite(e).all()
        d_exact, d_rounded, budget = np.abs(a - e), np.abs(a - r), np.abs(r - e)
        print(
            f"\n{name} [{label} tokens]: max |ours - exact| {d_exact.max():.3e} (bf16 rounding alone "
            f"{budget.max():.3e}, ceiling {BF16_ATOL[name]}); max |ours - rounded| {d_rounded.max():.3e}; "
            f"max |logit| {np.abs(e).max():.3f}; top-1 agreement {(a.argmax(-1) == e.argmax(-1)).mean():.3f}"
        )
        assert d_rounded.max() <= SAME_WEIGHTS_ATOL, f"{name} [{label}]: {d_rounded.max()} from the rounded reference"
        assert (d_exact <= budget + SAME_WEIGHTS_ATOL).all(), f"{name} [{label}]: further from exact than bf16 rounding"
        assert d_exact.max() <= BF16_ATOL[name], f"{name} [{label}]: {d_exact.max()} from the exact reference"
