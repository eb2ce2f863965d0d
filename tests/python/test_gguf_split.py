"""`--format gguf` with `--max-shard-size` small enough for at least 3 files: the files are
`model-0000i-of-0000N.gguf` carrying `split.no`, `split.count` and `split.tensors.count` as gguf-py
writes them, their tensors are the single file's in order and bytes, the first file holds the single
file's metadata; compared with llama.cpp's converter's `--split-max-size` at the same size (file
count, tensors per file, keys per file). llama.cpp loading the set from its first file is
test_gguf.py's `test_logits_split_from_first_file`; the workspace and the comparisons are
test_gguf.py's too.
"""

import numpy as np
import pytest

from test_gguf import (  # noqa: F401 (ws is a fixture)
    FIXTURES, describe_diff, fields, provenance, raw, reader, report, shape, short, split_size, ws,
)


def split_keys(r):
    return {k: ([t.name for t in f.types], f.contents()) for k, f in r.fields.items() if k.startswith("split.")}


@pytest.mark.parametrize("fixture", FIXTURES)
def test_split_files(ws, fixture):
    """The split set: names, split.* keys, the single file's tensors (in order, byte for byte) and its
    metadata in the first file."""
    size = split_size(ws, fixture)
    files = ws.ours(fixture, "bf16", max_shard=size)
    single = reader(ws.ours(fixture, "bf16")[0])
    n = len(files)
    problems = []
    if n < 3:
        problems.append(f"--max-shard-size {size} gave {n} files, want at least 3: {[f.name for f in files]}")
    want_names = [f"model-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    if [f.name for f in files] != want_names:
        problems.append(f"file names {[f.name for f in files]}, want {want_names}")
    readers = [reader(f) for f in files]
    total = len(single.tensors)
    for i, r in enumerate(readers):
        want = {
            "split.no": (["UINT16"], i),
            "split.count": (["UINT16"], n),
            "split.tensors.count": (["INT32"], total),
        }
        if split_keys(r) != want:
            problems.append(f"{files[i].name}: split keys {split_keys(r)}, want {want} (as gguf-py writes them)")
        if sum(int(t.n_bytes) for t in r.tensors) > size and len(r.tensors) > 1:
            problems.append(f"{files[i].name}: {sum(int(t.n_bytes) for t in r.tensors)} tensor bytes > {size}")
    # The tensors, in order, are the single file's.
    merged = [(t, r) for r in readers for t in r.tensors]
    if [t.name for t, _ in merged] != [t.name for t in single.tensors]:
        problems.append(
            f"the splits' tensors in order are not the single file's: {[t.name for t, _ in merged][:8]}... "
            f"vs {[t.name for t in single.tensors][:8]}..."
        )
    by_name = {t.name: t for t in single.tensors}
    for t, _ in merged:
        s = by_name.get(t.name)
        if s is None:
            continue
        if (t.tensor_type, shape(t)) != (s.tensor_type, shape(s)):
            problems.append(f"{t.name}: split {t.tensor_type.name} {shape(t)} vs single {s.tensor_type.name} {shape(s)}")
        elif not np.array_equal(raw(t), raw(s)):
            problems.append(describe_diff(t.name, s.tensor_type, raw(t), raw(s), shape(s)[0], "split vs single"))
    # Metadata: the first file holds the single file's (split.* apart).
    fo, fs = fields(readers[0]), fields(single)
    for k in sorted(set(fo) | set(fs)):
        if fo.get(k) != fs.get(k):
            problems.append(f"first split's metadata {k}: {short(fo.get(k))} vs single file's {short(fs.get(k))}")
    report(problems, f"{fixture} split into {n} files at {size} bytes")


@pytest.mark.parametrize("fixture", FIXTURES)
def test_split_matches_converter(ws, fixture):
    """Against the converter's `--split-max-size` at the same size (both fill files in tensor order
    until the next tensor would pass the size): the same file count, the same tensors in each file,
    and the same keys in each file (gguf-py puts the metadata in the first file only)."""
    size = split_size(ws, fixture)
    ours = [reader(f) for f in ws.ours(fixture, "bf16", int8="requant", max_shard=size)]
    theirs = [reader(f) for f in ws.theirs(fixture, "bf16", split=size)]
    problems = []
    if len(ours) != len(theirs):
        problems.append(f"{len(ours)} files ours, {len(theirs)} theirs")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        na, nb = [t.name for t in a.tensors], [t.name for t in b.tensors]
        if na != nb:
            problems.append(f"file {i + 1}: tensors ours {na} theirs {nb}")
        ka = sorted(k for k in fields(a, skip_split=False) if not provenance(k))
        kb = sorted(k for k in fields(b, skip_split=False) if not provenance(k))
        if ka != kb:
            problems.append(
                f"file {i + 1}: keys only in ours {sorted(set(ka) - set(kb))}, only in theirs {sorted(set(kb) - set(ka))}"
            )
        elif split_keys(a) != split_keys(b):
            problems.append(f"file {i + 1}: split keys ours {split_keys(a)} theirs {split_keys(b)}")
    report(problems, f"{fixture} split at {size} bytes vs convert_hf_to_gguf.py --split-max-size")
