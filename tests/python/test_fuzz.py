"""The fuzz harness itself (scripts/fuzz/): its cases are reproducible, every mutation kind applies
to both fixtures, each judge accepts the plain fixtures' outputs and refuses an output with a
mistake injected, and the driver holds a conversion's outcome to the promise (a panic or an exit 1
without a message is a failure, exit 1 with a message and nothing left behind is not).

Run: `python -m pytest tests/python/test_fuzz.py` with ESCHA_CONVERT pointing at the binary.
"""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testenv import require, unavailable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.fuzz.cases import FORMATS, plan_case  # noqa: E402
from scripts.fuzz.checkpoint import Ck, Shard  # noqa: E402
from scripts.fuzz.judges import exl3  # noqa: E402
from scripts.fuzz.mutations import KINDS, apply  # noqa: E402

FIXTURES = ["dense", "moe"]


def tree(d):
    """{relative path: bytes} of every file under d."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(Path(d).rglob("*")) if p.is_file()}


def convert(binary, src, out, *opts):
    subprocess.run([str(binary), str(src), str(out), "-q", *opts], check=True)
    return out


@pytest.mark.parametrize("fixture", FIXTURES)
def test_every_mutation_kind_applies(fixture, tmp_path):
    skipped = []
    for name in sorted(KINDS):
        d = tmp_path / name
        shutil.copytree(REPO / "fixtures" / fixture, d)
        desc = apply(Ck(d, fixture), random.Random(f"test:{name}"), name)
        if "not applied" in desc:
            skipped.append(desc)
        shutil.rmtree(d)
    assert not skipped, skipped


def test_a_case_is_a_function_of_seed_and_number(tmp_path):
    for i in (0, 1, 2, 300, 1234):
        a, b = plan_case(7, i, FORMATS), plan_case(7, i, FORMATS)
        assert a[1:] == b[1:]
        trees = []
        for run in ("a", "b"):
            rng, fixture, _, kinds, _ = plan_case(7, i, FORMATS)
            d = tmp_path / f"{i}-{run}"
            shutil.copytree(REPO / "fixtures" / fixture, d)
            for k in kinds:
                apply(Ck(d, fixture), rng, k)
            trees.append(tree(d))
        assert trees[0] == trees[1], f"case {i}: the same plan mutated the fixture differently"
    # The first cases walk every (kind, format) pair.
    n = len(KINDS) * len(FORMATS)
    walked = {(plan_case(7, i, FORMATS)[3][0], plan_case(7, i, FORMATS)[2]) for i in [0] + list(range(2, n + 1))}
    assert walked == {(k, f) for k in KINDS for f in FORMATS}


@pytest.fixture(scope="module")
def outputs(escha_convert, tmp_path_factory):
    """{(fixture, format): OUT} of the plain fixtures (exl3 and bf16 with --bias keep)."""
    root = tmp_path_factory.mktemp("fuzz-outputs")
    found = {}
    for name in FIXTURES:
        src = REPO / "fixtures" / name
        found[name, "bf16"] = convert(escha_convert, src, root / f"{name}-bf16", "--bias", "keep")
        found[name, "exl3"] = convert(escha_convert, src, root / f"{name}-exl3", "--format", "exl3", "--bias", "keep")
        found[name, "mlx"] = convert(escha_convert, src, root / f"{name}-mlx", "--format", "mlx")
    return found


def edit_tensor(out, name, fn):
    """Applies fn to the float16 values of tensor `name` in OUT's shards, in place."""
    for p in sorted(Path(out).glob("*.safetensors")):
        s = Shard(p)
        t = s.find(name)
        if t:
            a = np.frombuffer(t[3], "<f2").copy()
            t[3] = fn(a).astype("<f2").tobytes()
            s.write(p)
            return
    raise KeyError(name)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_exl3_decode_equals_the_bf16_conversion_and_catches_a_changed_scale(fixture, outputs, tmp_path):
    out, ref = outputs[fixture, "exl3"], outputs[fixture, "bf16"]
    assert exl3.compare(out, ref) == []
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    linear = "model.language_model.layers.0." + (
        "mlp.experts.2.up_proj" if fixture == "moe" else "linear_attn.in_proj_qkv"
    )

    def flip(a):
        a[5] = -a[5] * 1.01
        return a

    edit_tensor(bad, f"{linear}.svh", flip)
    problems = exl3.compare(bad, ref)
    assert len(problems) == 1 and problems[0].startswith(linear), problems


def test_exl3_judge_loads_with_exllamav3(outputs):
    require("torch")
    try:
        worker = exl3.Worker()  # puts the stand-in extension in place before importing exllamav3
    except ImportError as e:
        unavailable(f"cannot import exllamav3 ({e})")
    for name in FIXTURES:
        verdict = worker.judge({"out": str(outputs[name, "exl3"]), "ref": str(outputs[name, "bf16"])})
        assert verdict == {"warnings": []}, verdict


def drop_tensor(out, dst, suffix):
    """A copy of OUT without the first tensor whose name ends with `suffix` (index kept in step)."""
    shutil.copytree(out, dst)
    for p in sorted(dst.glob("*.safetensors")):
        s = Shard(p)
        hit = next((t for t in s.tensors if t[0].endswith(suffix)), None)
        if hit:
            s.tensors.remove(hit)
            s.write(p)
            index = dst / "model.safetensors.index.json"
            doc = json.loads(index.read_text())
            doc["weight_map"].pop(hit[0], None)
            index.write_text(json.dumps(doc))
            return hit[0]
    raise KeyError(suffix)


@pytest.mark.parametrize("client", ["bf16", "mlx"])
def test_python_judges_accept_the_fixtures_and_refuse_a_missing_tensor(client, outputs, tmp_path):
    require("torch" if client == "bf16" else "mlx_lm")
    from scripts.fuzz.judges import judge_module

    worker = judge_module(client).Worker()
    for name in FIXTURES:
        verdict = worker.judge({"out": str(outputs[name, client])})
        assert not verdict.get("problem") and not verdict.get("overflow"), verdict
    dropped = drop_tensor(outputs["dense", client], tmp_path / "bad", "post_attention_layernorm.weight")
    try:
        verdict = worker.judge({"out": str(tmp_path / "bad")})
    except Exception as e:  # mlx-lm's strict load raises; the worker loop turns that into a refusal
        verdict = {"problem": str(e)}
    assert verdict.get("problem"), f"{client} accepted an output without {dropped}"


STAND_INS = {
    # exit 1 with the message and nothing written: what the promise asks of a refusal
    "refuses": 'echo "escha-convert: error: $1: config.json: no" >&2; exit 1',
    "panics": "echo \"thread 'main' panicked at src/x.rs:1:2:\" >&2; echo 'boom' >&2; exit 101",
    "silent": "exit 1",
    "leaves_files": 'mkdir -p "$2.tmp"; echo "escha-convert: error: no" >&2; exit 1',
}


@pytest.mark.parametrize("behaviour", sorted(STAND_INS))
def test_the_driver_holds_every_outcome_to_the_promise(behaviour, tmp_path):
    require("torch")
    binary = tmp_path / "escha-convert"
    binary.write_text("#!/bin/sh\n" + STAND_INS[behaviour] + "\n")
    binary.chmod(0o755)
    r = subprocess.run(
        [sys.executable, "-m", "scripts.fuzz", "--cases", "3", "--formats", "bf16", "--jobs", "1", "--bin", str(binary)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = r.stdout.strip().splitlines()[-1]
    if behaviour == "refuses":
        assert r.returncode == 0 and last == "fuzz: cases 3, exit 0 0, exit 1 3, loaded 0, failures 0", r.stdout
    else:
        assert r.returncode == 1 and last.endswith("failures 3"), r.stdout
        assert "--only 0 --keep" in r.stdout, "each failing case says how to reproduce it"
        want = {"panics": "a panic", "silent": "without an 'escha-convert: error:' message", "leaves_files": "beside OUT"}
        assert want[behaviour] in r.stdout
