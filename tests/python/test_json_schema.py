"""The --json contract: every document escha-convert prints (convert, convert --dry-run, verify,
inspect, merge, and the failure document) validates against docs/escha-convert.schema.json, as a
whole and as the kind of document the run prints. The runs cover both fixtures and every option
combination the Rust suite (tests/it) uses with --json, so its documents are held to the schema too.
A failing run prints exactly one document: stdout parses as one JSON value and nothing else.
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testenv import require

jsonschema = require("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
SCHEMA = json.loads((ROOT / "docs" / "escha-convert.schema.json").read_text())
BASES = {"dense": ["dense-base", "dense-base-fp8"], "moe": ["moe-base", "moe-base-fp8"]}


def validate(doc, kind):
    """`doc` is a valid document, and one of `kind` (a key of the schema's $defs)."""
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    only = {k: v for k, v in SCHEMA.items() if k != "oneOf"}
    only["$ref"] = f"#/$defs/{kind}"
    jsonschema.Draft202012Validator(only).validate(doc)
    assert doc["schema_version"] == 1
    assert next(iter(doc)) == "schema_version", "schema_version comes first"


def run(binary, *args, env=None):
    """Runs escha-convert; returns the process and its one JSON document (json.loads refuses
    anything after the first value)."""
    p = subprocess.run(
        [str(binary), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env=None if env is None else {**os.environ, **env},
    )
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(f"stdout is not one JSON document ({e}): {p.stdout!r}\nstderr: {p.stderr}")
    return p, doc


def error_line(stderr):
    """The text of stderr's `escha-convert: error: …` line."""
    lines = [l for l in stderr.splitlines() if l.startswith("escha-convert: error: ")]
    assert len(lines) == 1, stderr
    return lines[0].removeprefix("escha-convert: error: ")


def failed(p, doc, code, status):
    """A failure document with `code` and `status`, the process's status and stderr's line."""
    validate(doc, "error")
    assert doc["error"]["code"] == code, doc
    assert doc["error"]["exit_status"] == status == p.returncode, (doc, p.returncode, p.stderr)
    return doc["error"]["message"]


def codes(doc):
    return {w["code"] for w in doc["warnings"]}


# Every option combination the Rust suite runs convert with under --json, on the fixtures here.
CONVERT_ARGS = [
    [],
    ["--dry-run"],
    ["--format", "f16"],
    ["--format", "mlx"],
    ["--format", "mlx", "--dry-run"],
    ["--format", "mlx", "--bits", "auto", "--measure-error", "--quiet"],
    ["--format", "gguf"],
    ["--format", "gguf", "--dry-run"],
    ["--format", "gguf", "--max-shard-size", "200KB"],
    ["--format", "gguf", "--gguf-type", "auto"],
    ["--format", "gguf", "--gguf-type", "auto", "--measure-error", "--dry-run"],
    ["--mtp", "keep"],
    ["--bias", "keep"],
    ["--quiet", "--checksums"],
    ["--max-shard-size", "100KB", "--checksums", "--part", "2/3"],
    ["--format", "mlx", "--max-shard-size", "100KB", "--checksums", "--part", "1/3"],
    ["--format", "gguf", "--quiet", "-j", "2", "--gguf-type", "auto", "--measure-error"],
    ["--format", "gguf", "--quiet", "-j", "2", "--mtp", "keep"],
    ["--format", "exl3"],
    ["--format", "mlx", "--max-size", "2MB"],
    ["--format", "gguf", "--max-size", "2MB", "--dry-run"],
    ["--format", "mlx", "--fit-memory", "6MB", "--context", "1000", "--reserve", "1MB"],
    ["--format", "gguf", "--fit-memory", "6MB", "--reserve", "0", "--dry-run"],
    ["--format", "exl3", "--dry-run", "--bias", "keep"],
]
# Combinations a fixture cannot take: their failure document is checked instead. llama.cpp's
# qwen35moe has no place for an MTP head without routed experts, which the moe fixture's is.
REFUSED = {("moe", "--format gguf --quiet -j 2 --mtp keep"): "input_refused"}


@pytest.mark.parametrize("model", ["dense", "moe"])
@pytest.mark.parametrize("args", CONVERT_ARGS, ids=lambda a: " ".join(a) or "default")
def test_convert_documents_validate(escha_convert, tmp_path, model, args):
    p, doc = run(escha_convert, FIXTURES / model, tmp_path / "out", "--json", *args)
    refused = REFUSED.get((model, " ".join(args)))
    if refused:
        failed(p, doc, refused, 1)
        return
    assert p.returncode == 0, p.stderr
    validate(doc, "convert")
    assert doc["dry_run"] == ("--dry-run" in args)
    assert (tmp_path / "out").exists() != doc["dry_run"]
    if "--dry-run" not in args and "--quiet" not in args:
        # The same warnings, in the same order, on stderr as ever.
        said = [l.removeprefix("escha-convert: warning: ") for l in p.stderr.splitlines() if "warning: " in l]
        assert said == [w["message"] for w in doc["warnings"]], p.stderr
    if "auto" in args:
        assert doc["width_choices"], "auto lists its choices"
    if "--fit-memory" in args:
        budget = doc["budget"]
        assert budget["max_size"] == budget["memory"] - budget["kv_cache_bytes"] - budget["reserve_bytes"], budget
    elif "budget" in doc:
        assert "memory" not in doc["budget"], doc["budget"]
    if "--checksums" in args:
        assert all("sha256" in f for f in doc["files"] if not f["file"].startswith("SHA256SUMS"))


def test_warning_codes_say_what_happened(escha_convert, tmp_path):
    _, doc = run(escha_convert, FIXTURES / "moe", tmp_path / "moe", "--json")
    assert "mtp_dropped" in codes(doc), doc["warnings"]
    _, doc = run(escha_convert, FIXTURES / "moe", tmp_path / "kept", "--json", "--mtp", "keep")
    assert "mtp_incomplete_kept" in codes(doc), doc["warnings"]
    _, doc = run(escha_convert, FIXTURES / "dense", tmp_path / "mlx", "--json", "--format", "mlx", "--dry-run")
    assert "mlx_mtp_dropped" in codes(doc), doc["warnings"]
    _, doc = run(escha_convert, FIXTURES / "dense", tmp_path / "j", "--json", "--dry-run", "-j", "100000")
    assert "threads_capped" in codes(doc), doc["warnings"]


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_convert_with_an_imatrix_validates(escha_convert, tmp_path, model):
    """--imatrix (a legacy .dat matrix with one entry, for a quantized tensor) adds its record."""
    args = ("--format", "gguf", "--gguf-type", "q4_k_m", "--int8", "requant")
    p, plan = run(escha_convert, FIXTURES / model, tmp_path / "plan", "--json", *args, "--dry-run")
    assert p.returncode == 0, p.stderr
    t = next(t for t in plan["tensors"] if t["dtype"] not in ("F32", "F16", "BF16", "Q8_0") and len(t["shape"]) >= 2)
    values = t["shape"][-1] * math.prod(t["shape"][:-2])
    name = t["name"].encode()
    dat = tmp_path / "m.dat"
    dat.write_bytes(
        (1).to_bytes(4, "little") + len(name).to_bytes(4, "little") + name + (2).to_bytes(4, "little")
        + values.to_bytes(4, "little") + b"".join(int(0x3F800000).to_bytes(4, "little") for _ in range(values))
    )
    p, doc = run(escha_convert, FIXTURES / model, tmp_path / "out", "--json", *args, "--imatrix", dat)
    assert p.returncode == 0, p.stderr
    validate(doc, "convert")
    m = doc["imatrix"]
    assert (m["file"], m["format"], m["chunk_size"], m["entries"], m["weighted_tensors"]) == ("m.dat", "dat", None, 1, 1)
    assert m["steered_tensors"] == 0
    # The same entry steers an MLX size budget (the MLX tensor found under llama.cpp's name); it
    # encodes nothing there.
    p, doc = run(escha_convert, FIXTURES / model, tmp_path / "mlx", "--json", "--format", "mlx", "--max-size", "900000",
                 "--imatrix", dat)
    assert p.returncode == 0, p.stderr
    validate(doc, "convert")
    m = doc["imatrix"]
    steered = (m["entries"], m["weighted_tensors"], m["steered_tensors"], doc["budget"]["weighted_by_imatrix"])
    assert steered == (1, 0, 1, True)


@pytest.mark.parametrize("model", ["dense", "moe"])
@pytest.mark.parametrize("base_index", [0, 1], ids=["base", "base-fp8"])
def test_convert_with_verify_base_validates(escha_convert, tmp_path, model, base_index):
    base = FIXTURES / BASES[model][base_index]
    p, doc = run(escha_convert, FIXTURES / model, tmp_path / "out", "--json", "--verify-base", base)
    assert p.returncode == 0, p.stderr
    validate(doc, "convert")
    assert doc["verify"]["passed"] is True


@pytest.mark.parametrize("model", ["dense", "moe"])
@pytest.mark.parametrize("base_index", [0, 1], ids=["base", "base-fp8"])
@pytest.mark.parametrize("extra", [[], ["--sample", "3"]], ids=["whole", "sample"])
def test_verify_documents_validate(escha_convert, tmp_path, model, base_index, extra):
    base = FIXTURES / BASES[model][base_index]
    p, doc = run(escha_convert, "verify", FIXTURES / model, "--base", base, "--json", *extra)
    assert p.returncode == 0, p.stderr
    validate(doc, "verify")
    assert doc["passed"] is True


def test_verify_with_html_prints_one_document(escha_convert, tmp_path):
    html = tmp_path / "report.html"
    p, doc = run(escha_convert, "verify", FIXTURES / "dense", "--base", FIXTURES / "dense-base", "--json", "--html", html)
    assert p.returncode == 0, p.stderr
    validate(doc, "verify")
    assert html.is_file()


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_inspect_documents_validate(escha_convert, model):
    p, doc = run(escha_convert, "inspect", FIXTURES / model, "--json")
    assert p.returncode == 0, p.stderr
    validate(doc, "inspect")


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_merge_documents_validate(escha_convert, tmp_path, model):
    merged = tmp_path / "merged"
    for i in (1, 2):
        part = tmp_path / f"part{i}"
        p, doc = run(escha_convert, FIXTURES / model, part, "--json", "--part", f"{i}/2", "--checksums")
        assert p.returncode == 0, p.stderr
        validate(doc, "convert")
        shutil.copytree(part, merged, dirs_exist_ok=True)
    p, doc = run(escha_convert, "merge", merged, "--json")
    assert p.returncode == 0, p.stderr
    validate(doc, "merge")
    assert doc["parts"] == 2


def test_a_verify_whose_checks_fail_prints_its_report(escha_convert):
    """Failing checks are verify's answer, not a failure of the run: the verify document, exit 1."""
    p, doc = run(escha_convert, "verify", FIXTURES / "dense", "--base", FIXTURES / "dense-base", "--json",
                 "--max-ratio", "1", "--min-corr", "1")
    assert p.returncode == 1, p.stderr
    validate(doc, "verify")
    assert doc["passed"] is False


# (arguments, code, exit status); `{tmp}` is the test's directory, `{fx}` the fixtures.
FAILURES = {
    "unknown flag": (["convert", "{fx}/dense", "{tmp}/out", "--json", "--frmat", "mlx"], "usage", 2),
    "bad value": (["{fx}/dense", "{tmp}/out", "--json", "--format", "png"], "usage", 2),
    "flags that do not go together": (["{fx}/dense", "{tmp}/out", "--json", "--bits", "4"], "usage", 2),
    "no command": (["--json"], "usage", 2),
    "a context the model cannot take": (
        ["{fx}/dense", "{tmp}/out", "--json", "--format", "gguf", "--fit-memory", "5MB", "--context", "5000"],
        "usage",
        2,
    ),
    "verify without --base": (["verify", "{fx}/dense", "--json"], "usage", 2),
    "missing input": (["{tmp}/nothing/here", "{tmp}/out", "--json"], "input_refused", 1),
    "not a checkpoint": (["{fx}/dense-base", "{tmp}/out", "--json"], "input_refused", 1),
    "dry run of a missing input": (["{tmp}/nothing/here", "{tmp}/out", "--json", "--dry-run"], "input_refused", 1),
    "output inside the input": (["{fx}/dense", "{fx}/dense/out", "--json"], "output_refused", 1),
    "output not empty": (["{fx}/dense", "{tmp}/full", "--json"], "output_refused", 1),
    "verify-base fails": (["{fx}/dense", "{tmp}/out", "--json", "--verify-base", "{fx}/moe-base"], "verify_failed", 1),
    "verify-base unreadable": (["{fx}/dense", "{tmp}/out", "--json", "--verify-base", "{tmp}/nobase"], "input_refused", 1),
    "inspect a missing input": (["inspect", "{tmp}/nothing", "--json"], "input_refused", 1),
    "verify a missing base": (["verify", "{fx}/dense", "--base", "{tmp}/nobase", "--json"], "input_refused", 2),
    "verify html inside the input": (
        ["verify", "{fx}/dense", "--base", "{fx}/dense-base", "--json", "--html", "{fx}/dense/r.html"],
        "output_refused",
        2,
    ),
    "merge of one part": (["merge", "{tmp}/onepart", "--json"], "input_refused", 1),
    "merge of nothing": (["merge", "{tmp}", "--json"], "input_refused", 1),
}
if sys.platform != "darwin":
    FAILURES["metal on linux"] = (["{fx}/dense", "{tmp}/out", "--json", "--metal"], "backend_unavailable", 1)
    FAILURES["verify on metal on linux"] = (
        ["verify", "{fx}/dense", "--base", "{fx}/dense-base", "--json", "--backend", "metal"],
        "backend_unavailable",
        2,
    )


@pytest.mark.parametrize("case", FAILURES)
def test_failure_documents_validate(escha_convert, tmp_path, case):
    args, code, status = FAILURES[case]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine\n")
    if "onepart" in " ".join(args):
        p, _ = run(escha_convert, FIXTURES / "dense", tmp_path / "onepart", "--json", "--part", "1/2", "--checksums")
        assert p.returncode == 0, p.stderr
    args = [a.format(tmp=tmp_path, fx=FIXTURES) for a in args]
    p, doc = run(escha_convert, *args)
    message = failed(p, doc, code, status)
    if code == "usage":
        # clap's message on stderr as ever; the document carries its error paragraph on one line.
        assert message and message in " ".join(p.stderr.split()), (message, p.stderr)
    else:
        assert message == error_line(p.stderr)
    assert not (FIXTURES / "dense" / "out").exists()


def negate_matrices(path):
    """Flips the sign of every 2-D bf16/f16 tensor of a safetensors file, in place."""
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    for name, t in header.items():
        if name != "__metadata__" and t["dtype"] in ("BF16", "F16") and len(t["shape"]) == 2:
            start, end = (8 + n + o for o in t["data_offsets"])
            for i in range(start + 1, end, 2):
                data[i] ^= 0x80
    path.write_bytes(bytes(data))


def test_a_proof_that_fails_is_verify_failed(escha_convert, tmp_path):
    """--verify-base against a base whose matrices are negated: the decode disagrees with it."""
    base = tmp_path / "base"
    shutil.copytree(FIXTURES / "dense-base", base)
    for f in base.glob("*.safetensors"):
        negate_matrices(f)
    p, doc = run(escha_convert, FIXTURES / "dense", tmp_path / "out", "--json", "--verify-base", base)
    failed(p, doc, "verify_failed", 1)
    assert doc["error"]["message"] == error_line(p.stderr)
    assert not (tmp_path / "out").exists()


def test_an_interrupted_run_prints_the_interrupted_document(escha_convert, tmp_path):
    """SIGINT while an earlier output is swapped out (the pause point of debug builds)."""
    out = tmp_path / "out"
    p, _ = run(escha_convert, FIXTURES / "dense", out, "--json", "--quiet")
    assert p.returncode == 0, p.stderr
    child = subprocess.Popen(
        [str(escha_convert), FIXTURES / "dense", out, "--json", "--force", "--format", "f16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ESCHA_CONVERT_PAUSE": "swap"},
    )
    deadline = time.monotonic() + 120
    while not any(e.name.startswith(".out.old-") for e in tmp_path.iterdir()):
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            child.communicate()
            pytest.skip("the binary does not pause at the swap (a release build): nothing to interrupt")
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)
    doc = json.loads(stdout)
    validate(doc, "error")
    assert doc["error"] == {"code": "interrupted", "message": "interrupted; partial output removed", "exit_status": 130}
    assert child.returncode == 130, stderr
    assert "escha-convert: interrupted; partial output removed" in stderr
