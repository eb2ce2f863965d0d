"""`--max-size --imatrix` (GGUF): at the size of each file llama-quantize `--imatrix` makes of the same
model, our file has a lower largest and no higher mean importance-weighted added error over the coded
linears, both files read back with gguf-py's dequantizer and weighed here by the matrix (each input
column's squared error times its importance), against the f32 GGUF of the same input; and the
report says its ratios are weighted and weighs every file type (llama-quantize's iq2_xxs size is no
smaller than the floor: the run there must succeed); llama.cpp runs each plan to finite logits, and
the file at our floor, IQ2_XXS where the rows allow. The matrix is read as llama-quantize reads it
(an expert that saw no token weighs every column 1). Needs llama-quantize (ESCHA_LLAMA_BIN), as
test_gguf_imatrix.py, whose heavy-tailed synthetic matrix it uses.

`ESCHA_CONVERT=target/debug/escha-convert .venv/bin/python -m pytest tests/python/test_fit_imatrix.py -q`.
"""

import json
import re
import subprocess

import numpy as np
import pytest

from test_gguf import llama_bin, logits, raw, reader, run  # noqa: F401 (fixture)
from test_gguf_imatrix import im, llama_quantize, synthetic_matrix  # noqa: F401

# fixtures/wide (256-wide rows throughout) besides the two 128-wide fixtures.
FIXTURES = ["dense", "moe", "wide"]
# llama-quantize's file types with a matrix, the name it takes: the sizes the budget must beat.
FILE_TYPES = ["IQ2_XXS", "IQ2_M", "Q2_K", "IQ3_XXS", "Q3_K_M", "Q4_K_M"]

def importance(matrix):
    """{tensor: mean squared activation [n_mat, ne0]} of a llama-imatrix GGUF file, as llama-quantize's
    load_imatrix reads it: an expert that saw no token (count 0) weighs every column 1."""
    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader(matrix).tensors}
    out = {}
    for name, sums in tensors.items():
        if name.endswith(".in_sum2"):
            base = name.removesuffix(".in_sum2")
            counts = np.round(tensors[base + ".counts"].reshape(-1))
            sums = sums.reshape(counts.size, -1)
            out[base] = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1.0)[:, None], 1.0)
    return out


def values(t):
    import gguf

    back = gguf.quants.dequantize(t.data, t.tensor_type)
    return np.asarray(back, dtype=np.float64).reshape(-1, int(t.shape[0]))


def weighted_ratios(path, reference, choices, weights):
    """{tensor: (importance-weighted added-error ratio, weights)} of the coded linears in `choices`:
    sqrt(Σ w_j (y − x)² / Σ w_j x²) over 2^-K, each row weighed by its expert's entry."""
    tensors = {t.name: t for t in reader(path).tensors}
    got = {}
    for name, c in choices.items():
        x = values(reference[name])
        y = values(tensors[name])
        w = weights.get(name)
        if w is None:
            w = np.ones((1, x.shape[1]))
        rows_per_mat = x.shape[0] // w.shape[0]
        w = np.repeat(w, rows_per_mat, axis=0)
        err = np.sqrt(np.sum(w * (y - x) ** 2) / np.sum(w * x * x))
        got[name] = (err / 2.0 ** -c["k"], x.size)
    return got


def summary(ratios):
    total = sum(n for _, n in ratios.values())
    return max(r for r, _ in ratios.values()), sum(r * n for r, n in ratios.values()) / total


@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize("qtype", FILE_TYPES)
def test_the_budget_beats_llama_quantize_imatrix_at_its_size(im, llama_bin, fixture, qtype, tmp_path):  # noqa: F811
    matrix = synthetic_matrix(im, fixture)
    f32 = im.path(fixture, "f32", "requant")
    theirs = llama_quantize(im, f32, qtype, False, matrix)
    size = theirs.stat().st_size
    out = im.tmp / f"fit-{fixture}-{qtype}"
    r = run([im.bin, im.repo_root / "fixtures" / fixture, out, "--quiet", "--json", "--format", "gguf",
             "--max-size", str(size), "--imatrix", matrix], f"escha-convert --max-size {size} --imatrix")
    report = json.loads(r.stdout)
    assert report["budget"]["weighted_by_imatrix"] is True
    assert report["imatrix"]["weighted_tensors"] > 0
    # Every llama-quantize file type is a yardstick: none gives a tensor a type off the menu.
    assert report["budget"]["fixed_recipes_off_menu"] == []
    files = sorted(out.glob("*.gguf"))
    assert sum(f.stat().st_size for f in files) <= size
    choices = {c["tensor"]: c for c in report["width_choices"] if c["k"] != 8}
    assert choices
    reference = {t.name: t for t in reader(f32).tensors}
    weights = importance(matrix)
    largest, mean = summary(weighted_ratios(files[0], reference, choices, weights))
    their_largest, their_mean = summary(weighted_ratios(theirs, reference, choices, weights))
    print(f"{fixture} {qtype} at {size} bytes: ours {largest:.5f} / {mean:.5f}, "
          f"llama-quantize --imatrix {their_largest:.5f} / {their_mean:.5f}")
    assert largest < their_largest, (largest, their_largest)
    assert mean <= their_mean * (1 + 1e-9), (mean, their_mean)
    # Where both chose the same type, the bytes are llama-quantize --imatrix's: the chosen types are
    # written with the weighted encoders.
    ours_t = {t.name: t for t in reader(files[0]).tensors}
    their_t = {t.name: t for t in reader(theirs).tensors}
    same = [n for n in choices if ours_t[n].tensor_type == their_t[n].tensor_type]
    for n in same:
        assert np.array_equal(raw(ours_t[n]), raw(their_t[n])), f"{n} {ours_t[n].tensor_type.name}"
    # And llama.cpp runs the plan.
    y = logits(llama_bin, files[0], tmp_path)
    assert not isinstance(y, str), y
    assert np.isfinite(y).all(), f"{int(np.count_nonzero(~np.isfinite(y)))} logits not finite"


@pytest.mark.parametrize("fixture", FIXTURES)
def test_llama_cpp_evaluates_the_floor_in_iq_types(im, llama_bin, fixture, tmp_path):  # noqa: F811
    """At the smallest size the budget reaches (named by its refusal of 1 byte), every tensor with
    an entry whose rows are whole 256-value blocks takes IQ2_XXS, and llama.cpp runs the file to
    finite logits."""
    matrix = synthetic_matrix(im, fixture)
    src = im.repo_root / "fixtures" / fixture
    refused = subprocess.run([im.bin, src, tmp_path / "none", "--format", "gguf", "--max-size", "1",
                              "--imatrix", matrix], capture_output=True, text=True)
    assert refused.returncode == 1, refused.stderr
    floor = int(re.search(r"can make is (\d+) bytes", refused.stderr).group(1))
    out = tmp_path / "out"
    r = run([im.bin, src, out, "--quiet", "--json", "--format", "gguf", "--max-size", str(floor),
             "--imatrix", matrix], f"escha-convert --max-size {floor} --imatrix")
    chosen = {c["gguf_type"] for c in json.loads(r.stdout)["width_choices"]}
    assert "IQ2_XXS" in chosen, chosen
    y = logits(llama_bin, out / "model.gguf", tmp_path)
    assert not isinstance(y, str), y
    assert np.isfinite(y).all(), f"{int(np.count_nonzero(~np.isfinite(y)))} logits not finite"
