"""`--imatrix`: the types and bytes of `llama-quantize --imatrix`, tensor for tensor.

llama.cpp is scripts/llama-cpp.sh's (ESCHA_LLAMA_CPP, ESCHA_LLAMA_BIN with llama-quantize and
llama-imatrix); without it every test is skipped (a failure under CI=true), as in test_gguf.py.

1. `test_matches_llama_quantize_with_a_synthetic_matrix` (dense, moe and the 256-wide synthetic `wide`,
   whose every linear takes the 256-value types, x every --gguf-type llama-quantize makes, the low-bit
   ones included): a heavy-tailed importance matrix written here in llama-imatrix's GGUF format (one entry per
   weight matrix of our file, named as llama.cpp names it, per expert for the MoE's stacked experts;
   sums log-normal over many decades, counts random, an expert never routed to (count 0, which
   llama-quantize reads as importance 1)). Our `--gguf-type T --int8 requant --imatrix M` file must hold
   the same tensors, of the same ggml types, with the same bytes as `llama-quantize --imatrix M` makes
   from our `--gguf-type f32 --int8 requant` file (the same f32 values); and its bytes must differ from
   our file without the matrix (the matrix is used: the test can fail).
2. `test_matches_llama_quantize_with_a_dat_matrix` (dense, moe x q4_k_m, q3_k_m): the same with the
   synthetic sums in llama-imatrix's legacy .dat file (sums over a call count);
   `test_matches_llama_quantize_with_llama_imatrix` (dense, moe x q4_k_m, q2_k, iq4_xs): with a
   matrix made by llama.cpp's own llama-imatrix from our f32 file and a short text; the low-bit
   file types too (`LOW_BIT`), and where llama-quantize aborts for want of an MTP tensor's entry
   (llama-imatrix records none) we must refuse too, naming a tensor the matrix lacks. Where we refuse
   a low-bit type without a matrix (as llama-quantize does) the refusal must name --imatrix and
   llama-imatrix, and llama-quantize must refuse it too (and write it where we write it).
3. `test_llama_cpp_evaluates_an_iq2_file` (dense, moe): llama_logits runs our `iq2_xxs --imatrix` file
   to finite logits that follow those of our f32 file.
4. `test_card_and_json_record_the_matrix`: `--json` and the model card name the file, its sha256,
   datasets and chunk count.

Run: `. "$(bash scripts/llama-cpp.sh --print-env)"`, then
`ESCHA_CONVERT=target/debug/escha-convert .venv/bin/python -m pytest tests/python/test_gguf_imatrix.py -q`.
"""

import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from testenv import unavailable
from test_gguf import GT, LLAMA_BIN, gguf, llama_bin, logits, raw, reader, report, run, shape  # noqa: F401 (fixture)
from test_gguf_kquants import LLAMA_QUANTIZE, Workspace, squeeze

FIXTURES = ["dense", "moe"]
# fixtures/wide: every linear's rows 256 or 512 wide, where the fixtures' are mostly 128 (ggml's
# 256-value types then fall back to others).
WIDE = "wide"
# llama-quantize's low-bit file types: most need the matrix (llama-quantize refuses without one).
LOW_BIT = {
    t: (t.upper(), False)
    for t in ["iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq3_xxs", "iq3_xs", "iq3_s", "iq3_m", "q2_k_s"]
}
TYPES = {**LLAMA_QUANTIZE, **LOW_BIT}
TEXT = (
    "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. "
    "All that glitters is not gold, and every cloud has a silver lining. "
) * 40

if not LLAMA_BIN or not (Path(LLAMA_BIN) / "llama-quantize").is_file():
    unavailable(f"ESCHA_LLAMA_BIN ({LLAMA_BIN or 'unset'}) has no llama-quantize: run scripts/llama-cpp.sh")


@pytest.fixture(scope="session")
def im(repo_root, escha_convert, tmp_path_factory):
    return Workspace(repo_root, escha_convert, tmp_path_factory.mktemp("gguf-imatrix"))


def write_imatrix(path, entries, datasets=("synthetic heavy-tailed",), chunk_count=7, chunk_size=512):
    """A GGUF importance matrix as llama-imatrix writes it: entries {name: (sums [n_mat, ne0], counts
    [n_mat])}, `<name>.in_sum2` F32 ne [ne0, n_mat] and `<name>.counts` F32 ne [1, n_mat]."""
    w = gguf.GGUFWriter(str(path), arch="imatrix")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", list(datasets))
    w.add_uint32("imatrix.chunk_count", chunk_count)
    w.add_uint32("imatrix.chunk_size", chunk_size)
    for name, (sums, counts) in entries.items():
        w.add_tensor(f"{name}.in_sum2", np.ascontiguousarray(sums, dtype=np.float32))
        w.add_tensor(f"{name}.counts", np.ascontiguousarray(np.asarray(counts, dtype=np.float32).reshape(-1, 1)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def synthetic_matrix(im, fixture):
    """A heavy-tailed matrix for every weight matrix (2 or 3 dimensions) of our f32 file."""
    key = ("synthetic", fixture)
    if key not in im.cache:
        rng = np.random.default_rng(0x1A7 + len(fixture))
        entries = {}
        for t in reader(im.path(fixture, "f32", "requant")).tensors:
            ne = squeeze(shape(t))
            if len(ne) < 2 or not t.name.endswith(".weight") or t.name == "token_embd.weight":
                continue
            ne0, n_mat = ne[0], (ne[2] if len(ne) == 3 else 1)
            counts = rng.integers(1, 5000, size=n_mat).astype(np.float64)
            if n_mat > 1:
                counts[rng.integers(n_mat)] = 0
            mean_square = np.exp(rng.normal(0.0, 2.5, size=(n_mat, ne0))) * 1e-2
            entries[t.name] = (mean_square * counts[:, None], counts)
        path = im.tmp / f"synthetic-{fixture}.imatrix.gguf"
        write_imatrix(path, entries)
        im.cache[key] = path
    return im.cache[key]


def dat_matrix(im, fixture):
    """The synthetic matrix's sums in llama-imatrix's legacy .dat file: one call count per entry
    (3), and the trailer (chunk count, dataset name)."""
    key = ("dat", fixture)
    if key not in im.cache:
        rng = np.random.default_rng(0xDA7 + len(fixture))
        out = bytearray()
        names = [t.name for t in reader(synthetic_matrix(im, fixture)).tensors if t.name.endswith(".in_sum2")]
        out += len(names).to_bytes(4, "little")
        for t in reader(synthetic_matrix(im, fixture)).tensors:
            if not t.name.endswith(".in_sum2"):
                continue
            name = t.name.removesuffix(".in_sum2").encode()
            sums = np.asarray(t.data, dtype=np.float32).reshape(-1) * np.float32(rng.uniform(0.5, 2.0))
            out += len(name).to_bytes(4, "little") + name + (3).to_bytes(4, "little") + sums.size.to_bytes(4, "little")
            out += sums.astype("<f4").tobytes()
        out += (9).to_bytes(4, "little") + (8).to_bytes(4, "little") + b"wiki.dat"
        path = im.tmp / f"legacy-{fixture}.dat"
        path.write_bytes(bytes(out))
        im.cache[key] = path
    return im.cache[key]


def llama_imatrix(im, fixture):
    """llama-imatrix's own matrix of our f32 file over TEXT."""
    key = ("llama-imatrix", fixture)
    if key not in im.cache:
        exe = Path(LLAMA_BIN) / "llama-imatrix"
        if not exe.is_file():
            pytest.fail(f"{exe} missing: scripts/llama-cpp.sh builds it")
        text = im.tmp / "imatrix.txt"
        text.write_text(TEXT)
        out = im.tmp / f"llama-imatrix-{fixture}.gguf"
        model = im.path(fixture, "f32", "requant")
        run([exe, "-m", model, "-f", text, "-o", out, "-c", "64", "-b", "64", "--chunks", "4", "-t", "1", "--no-ppl"],
            f"llama-imatrix on {fixture}")
        im.cache[key] = out
    return im.cache[key]


def llama_quantize(im, src, qtype, pure, matrix):
    key = ("lq-imatrix", str(src), qtype, pure, str(matrix))
    if key not in im.cache:
        out = im.tmp / f"lq-{src.parent.name}-{qtype}-{Path(matrix).stem}.gguf"
        cmd = [Path(LLAMA_BIN) / "llama-quantize", "--imatrix", matrix, *(["--pure"] if pure else []), src, out, qtype, "2"]
        run(cmd, f"llama-quantize --imatrix {Path(matrix).name} {qtype}")
        im.cache[key] = out
    return im.cache[key]


def convert(im, fixture, ty, matrix, json_doc=False):
    """Our `--gguf-type ty --int8 requant --imatrix matrix` file (and the --json document)."""
    key = ("ours-imatrix", fixture, ty, str(matrix), json_doc)
    if key not in im.cache:
        out = im.tmp / f"ours-{fixture}-{ty}-{Path(matrix).stem}{'-json' if json_doc else ''}"
        cmd = [im.bin, im.repo_root / "fixtures" / fixture, out, "--quiet", "--format", "gguf", "--gguf-type", ty]
        cmd += ["--int8", "requant", "--imatrix", matrix, *(["--json"] if json_doc else [])]
        r = run(cmd, f"escha-convert {fixture} {ty} --imatrix {Path(matrix).name}")
        files = sorted(out.glob("*.gguf"))
        assert len(files) == 1, f"want one .gguf file, got {[f.name for f in files]}"
        im.cache[key] = (files[0], json.loads(r.stdout) if json_doc else None)
    return im.cache[key]


def without_matrix(im, fixture, ty):
    """Our file without --imatrix, or None where we refuse it (as llama-quantize does)."""
    key = ("ours-plain", fixture, ty)
    if key not in im.cache:
        out = im.tmp / f"ours-{fixture}-{ty}-plain"
        cmd = [im.bin, im.repo_root / "fixtures" / fixture, out, "--quiet", "--format", "gguf", "--gguf-type", ty]
        r = subprocess.run([str(c) for c in cmd + ["--int8", "requant"]], capture_output=True, text=True, timeout=600)
        lq = [Path(LLAMA_BIN) / "llama-quantize", im.path(fixture, "f32", "requant"), im.tmp / f"lq-plain-{fixture}-{ty}.gguf",
              TYPES[ty][0], "2"]
        lq = subprocess.run([str(c) for c in lq], capture_output=True, text=True, timeout=600)
        # We refuse without a matrix exactly where llama-quantize does.
        assert (r.returncode == 0) == (lq.returncode == 0), f"ours: {r.stderr[-1000:]}\nllama-quantize: {lq.stderr[-1000:]}"
        if r.returncode == 0:
            im.cache[key] = sorted(out.glob("*.gguf"))[0]
        else:
            assert "--imatrix" in r.stderr and "llama-imatrix" in r.stderr, r.stderr[-2000:]
            im.cache[key] = None
    return im.cache[key]


def compare(im, fixture, ty, matrix):
    m, pure = TYPES[ty]
    ours_path, _ = convert(im, fixture, ty, matrix)
    theirs_path = llama_quantize(im, im.path(fixture, "f32", "requant"), m, pure, matrix)
    ours = {t.name: t for t in reader(ours_path).tensors}
    theirs = {t.name: t for t in reader(theirs_path).tensors}
    plain_path = without_matrix(im, fixture, ty)
    plain = {t.name: t for t in reader(plain_path).tensors} if plain_path else {}
    problems = []
    if set(ours) != set(theirs):
        problems.append(f"tensor names: only ours {sorted(set(ours) - set(theirs))}, only theirs {sorted(set(theirs) - set(ours))}")
    weighted_differs, counts = 0, {}
    for n, t in ours.items():
        b = theirs.get(n)
        if b is None:
            continue
        if t.tensor_type != b.tensor_type:
            problems.append(f"{n}: type ours {t.tensor_type.name}, llama-quantize --imatrix {b.tensor_type.name}")
            continue
        if not np.array_equal(raw(t), raw(b)):
            problems.append(
                f"{n} ({t.tensor_type.name}, ne {shape(t)}): {int(np.count_nonzero(raw(t) != raw(b)))} of {raw(t).size} "
                "bytes differ from llama-quantize --imatrix's"
            )
        if n in plain and plain[n].tensor_type == t.tensor_type and not np.array_equal(raw(plain[n]), raw(t)):
            weighted_differs += 1
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    # Where we refuse the type without a matrix there is nothing to tell apart: byte equality with
    # llama-quantize's weighted file is the check that the matrix is used.
    if weighted_differs == 0 and plain_path:
        problems.append("no tensor differs from the file without --imatrix: the matrix was not used")
    print(f"\n{fixture} {ty} {Path(matrix).name}: types {dict(sorted(counts.items()))}, {weighted_differs} tensors weighted")
    report(problems, f"{fixture} {ty} vs llama-quantize --imatrix")


@pytest.mark.parametrize("ty", list(TYPES))
@pytest.mark.parametrize("fixture", [*FIXTURES, WIDE])
def test_matches_llama_quantize_with_a_synthetic_matrix(im, fixture, ty):
    compare(im, fixture, ty, synthetic_matrix(im, fixture))


@pytest.mark.parametrize("ty", ["q4_k_m", "q3_k_m"])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_matches_llama_quantize_with_a_dat_matrix(im, fixture, ty):
    compare(im, fixture, ty, dat_matrix(im, fixture))


@pytest.mark.parametrize("ty", ["q4_k_m", "q2_k", "iq4_xs", *LOW_BIT])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_matches_llama_quantize_with_llama_imatrix(im, fixture, ty):
    matrix = llama_imatrix(im, fixture)
    # llama-imatrix records no MTP tensor (inference never runs them): a type that needs a matrix
    # for them is refused by llama-quantize, and must be by us, naming a tensor the matrix lacks.
    m, _ = TYPES[ty]
    src = im.path(fixture, "f32", "requant")
    cmd = [Path(LLAMA_BIN) / "llama-quantize", "--imatrix", matrix, src, im.tmp / f"lq-try-{fixture}-{ty}.gguf", m, "2"]
    lq = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)
    if lq.returncode == 0 or "Missing importance matrix for tensor" not in lq.stdout + lq.stderr:
        assert lq.returncode == 0, (lq.stdout + lq.stderr)[-3000:]
        compare(im, fixture, ty, matrix)
        return
    out = im.tmp / f"ours-{fixture}-{ty}-refused"
    ours = [im.bin, im.repo_root / "fixtures" / fixture, out, "--quiet", "--format", "gguf", "--gguf-type", ty]
    r = subprocess.run([str(c) for c in ours + ["--int8", "requant", "--imatrix", matrix]], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode != 0, f"llama-quantize refuses {ty} with this matrix, we wrote a file"
    entries = {t.name.removesuffix(".in_sum2") for t in reader(matrix).tensors}
    named = r.stderr.split("no entry for tensor ", 1)[-1].split(",", 1)[0]
    assert "no entry for tensor" in r.stderr and named not in entries and named in {t.name for t in reader(src).tensors}, r.stderr
    assert not list(out.glob("*.gguf")), "a refused conversion left a .gguf"


def test_card_and_json_record_the_matrix(im):
    matrix = synthetic_matrix(im, "dense")
    path, doc = convert(im, "dense", "q4_k_m", matrix, json_doc=True)
    got = doc["imatrix"]
    sha = hashlib.sha256(matrix.read_bytes()).hexdigest()
    assert got["file"] == matrix.name and got["sha256"] == sha and got["format"] == "gguf"
    assert got["datasets"] == ["synthetic heavy-tailed"] and got["chunk_count"] == 7 and got["chunk_size"] == 512
    assert got["weighted_tensors"] > 0
    card = (path.parent / "README.md").read_text()
    assert sha in card and matrix.name in card and "synthetic heavy-tailed" in card


@pytest.mark.parametrize("fixture", FIXTURES)
def test_llama_cpp_evaluates_an_iq2_file(im, llama_bin, fixture, tmp_path):
    """llama.cpp runs our `iq2_xxs --imatrix` file to finite logits, near its logits of our f32 file."""
    path, _ = convert(im, fixture, "iq2_xxs", synthetic_matrix(im, fixture))
    assert any(t.tensor_type == GT.IQ2_XXS for t in reader(path).tensors), "no IQ2_XXS tensor"
    y = logits(llama_bin, path, tmp_path)
    assert not isinstance(y, str), y
    assert np.isfinite(y).all(), f"{int(np.count_nonzero(~np.isfinite(y)))} logits not finite"
    ref = logits(llama_bin, im.path(fixture, "f32", "requant"), tmp_path)
    assert not isinstance(ref, str), ref
    corr = float(np.corrcoef(y.reshape(-1), ref.reshape(-1))[0, 1])
    print(f"\n{fixture} iq2_xxs: logits' correlation with the f32 file's {corr:.3f}")
    assert corr > 0.3, f"iq2_xxs logits barely follow the f32 file's (correlation {corr:.3f})"
