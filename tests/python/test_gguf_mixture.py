"""fixtures/gguf-mixtures.json against the real llama-quantize.

src/layout/gguf/mixture/'s Rust rule for llama-quantize's mixtures (Q4_K_M, Q5_K_M, Q4_K_S, Q5_K_S,
Q6_K, Q8_0, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, IQ4_XS) is unit-tested against the committed fixtures/gguf-mixtures.json: llama-quantize's type for every
tensor of six qwen35 / qwen35moe models, written by scripts/gguf-mixture-cases.py. These tests check
that file is still what llama-quantize does, so that a llama.cpp deciding differently, or a converter
writing other tensors, is noticed:

* `test_cases_match_llama_quantize`: every model of the file is written as a zero-data GGUF and run
  through `llama-quantize --allow-requantize IN OUT MIXTURE` for each mixture; every tensor's type and
  `general.file_type` must be the committed ones.
* `test_fixture_models_are_current`: `escha-convert fixtures/{dense,moe} OUT --format gguf` must write
  the header and tensors the file records for fixture-dense / fixture-moe, and llama-quantize must give
  the converted files themselves the committed types.

llama.cpp is the llama-cpp-python 0.3.36 sdist's, from scripts/llama-cpp.sh: ESCHA_LLAMA_CPP (its gguf-py)
and ESCHA_LLAMA_BIN (llama-quantize). Without them the tests are skipped (a failure under CI=true).
When llama.cpp changes on purpose, regenerate the file (see the script) and re-run `cargo test --lib
mixture`.

Run: `. "$(bash scripts/llama-cpp.sh --print-env)"`, then
`ESCHA_CONVERT=target/debug/escha-convert .venv/bin/python -m pytest tests/python/test_gguf_mixture.py -q`.
"""

import importlib.util
import json
import os
from pathlib import Path

from testenv import unavailable

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "fixtures" / "gguf-mixtures.json"

LLAMA_CPP = os.environ.get("ESCHA_LLAMA_CPP", "")
LLAMA_BIN = os.environ.get("ESCHA_LLAMA_BIN", "")
if not LLAMA_CPP or not (Path(LLAMA_CPP) / "gguf-py").is_dir():
    unavailable(
        f"ESCHA_LLAMA_CPP ({LLAMA_CPP or 'unset'}) is not a llama.cpp source tree with gguf-py: "
        'run `bash scripts/llama-cpp.sh && . "$(bash scripts/llama-cpp.sh --print-env)"` (scripts/test.sh does)'
    )
if not LLAMA_BIN or not (Path(LLAMA_BIN) / "llama-quantize").is_file():
    unavailable(f"ESCHA_LLAMA_BIN ({LLAMA_BIN or 'unset'}) has no llama-quantize: run scripts/llama-cpp.sh")

_spec = importlib.util.spec_from_file_location("gguf_mixture_cases", REPO / "scripts" / "gguf-mixture-cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)
gguf = cases.import_gguf()


def test_cases_match_llama_quantize(tmp_path):
    problems = cases.check(gguf, CASES, tmp_path)
    assert not problems, f"{len(problems)} differences from llama-quantize:\n" + "\n".join(problems)


def test_fixture_models_are_current(tmp_path, escha_convert):
    committed = {m["name"]: m for m in json.loads(CASES.read_text())["models"]}
    problems = []
    for model, real_file in cases.fixture_models(gguf, escha_convert, tmp_path):
        want = committed[model["name"]]
        for key in ("arch", "kv", "tensors"):
            if model[key] != want[key]:
                problems.append(f"{model['name']}: escha-convert's {key} differ from the committed ones")
        names = [t[0] for t in want["tensors"]]
        for mixture in cases.MIXTURES:
            got, _ = cases.quantized_types(gguf, real_file, tmp_path / f"{model['name']}-{mixture}.gguf", mixture)
            for name, w in zip(names, want["types"][mixture].split()):
                if got.get(name) != w:
                    problems.append(f"{model['name']} {mixture} {name}: committed {w}, llama-quantize {got.get(name)}")
    assert not problems, (
        "\n".join(problems) + "\nregenerate: .venv/bin/python scripts/gguf-mixture-cases.py --escha-convert BIN"
    )
