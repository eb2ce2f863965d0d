"""GGUF files read back by hand: the header (keys, tensor infos), the vocabulary size llama.cpp
will see, and the stored values that are not finite (weights, or the f16 scales of blocks)."""

import re
import struct

import numpy as np

GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GGUF_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type: (elements per block, bytes per block, byte offsets of its fp16 scales)
GGML_BLOCKS = {
    2: (32, 18, [0]),  # Q4_0
    3: (32, 20, [0, 2]),  # Q4_1
    6: (32, 22, [0]),  # Q5_0
    7: (32, 24, [0, 2]),  # Q5_1
    8: (32, 34, [0]),  # Q8_0
    10: (256, 84, [80, 82]),  # Q2_K
    11: (256, 110, [108]),  # Q3_K
    12: (256, 144, [0, 2]),  # Q4_K
    13: (256, 176, [0, 2]),  # Q5_K
    14: (256, 210, [208]),  # Q6_K
}
GGML_NAMES = {
    0: "F32",
    1: "F16",
    30: "BF16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
}


def gguf_read(path):
    """(metadata, [(name, dims, type, offset)], data start) of a GGUF file; arrays are ("array", n)."""
    with open(path, "rb") as f:

        def rd(fmt):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def rstr():
            return f.read(rd("<Q")).decode("utf-8", "replace")

        def skip(ty):
            if ty == 8:
                f.seek(rd("<Q"), 1)
            elif ty == 9:
                sub, n = rd("<I"), rd("<Q")
                if sub in GGUF_SIZES:
                    f.seek(GGUF_SIZES[sub] * n, 1)
                else:
                    for _ in range(n):
                        skip(sub)
            else:
                f.seek(GGUF_SIZES[ty], 1)

        if f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        rd("<I")
        n_tensors, n_kv = rd("<Q"), rd("<Q")
        kv = {}
        for _ in range(n_kv):
            key = rstr()
            ty = rd("<I")
            if ty == 9:
                at = f.tell()
                rd("<I")
                kv[key] = ("array", rd("<Q"))
                f.seek(at)
                skip(9)
            elif ty == 8:
                kv[key] = rstr()
            else:
                kv[key] = rd(GGUF_FMT[ty])
        tensors = []
        for _ in range(n_tensors):
            name = rstr()
            dims = [rd("<Q") for _ in range(rd("<I"))]
            tensors.append((name, dims, rd("<I"), rd("<Q")))
        align = kv.get("general.alignment", 32)
        start = -(-f.tell() // align) * align
    return kv, tensors, start


def gguf_vocab(path):
    """The vocabulary size llama.cpp will see in GGUF `path` (its tokens, else the vocab_size key,
    else the embedding's rows), or None when the header cannot be read."""
    try:
        kv, tensors, _ = gguf_read(path)
    except (OSError, ValueError, KeyError, struct.error):
        return None
    toks = kv.get("tokenizer.ggml.tokens")
    if isinstance(toks, tuple):
        return toks[1]
    size = kv.get(f"{kv.get('general.architecture')}.vocab_size")
    if isinstance(size, int):
        return size
    return next((d[1] for n, d, _, _ in tensors if n == "token_embd.weight" and len(d) >= 2), None)


def gguf_nonfinite(files):
    """The tensors of a GGUF set that store a non-finite value (a weight, or a block's fp16 scale)."""
    found = []
    for path in files:
        try:
            _, tensors, start = gguf_read(path)
            data = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError, KeyError, struct.error) as e:
            found.append(f"{path.name}: unreadable ({e})")
            continue
        for name, dims, ty, off in tensors:
            n = int(np.prod(dims)) if dims else 1
            a = start + off
            if ty in (0, 1, 30):
                width = 4 if ty == 0 else 2
                raw = np.asarray(data[a : a + n * width])
                v = (
                    raw.view("<f4")
                    if ty == 0
                    else raw.view("<f2") if ty == 1 else (raw.view("<u2").astype("<u4") << 16).view("<f4")
                )
            elif ty in GGML_BLOCKS:
                per, size, at = GGML_BLOCKS[ty]
                blocks = np.asarray(data[a : a + n // per * size]).reshape(-1, size)
                v = np.concatenate([blocks[:, k : k + 2].copy().view("<f2").reshape(-1) for k in at])
            else:
                continue
            bad = int(np.count_nonzero(~np.isfinite(v)))
            if bad:
                what = "weights" if ty in (0, 1, 30) else "block scales"
                found.append(f"{name} ({GGML_NAMES.get(ty, ty)}): {bad} non-finite {what}")
    return found


def model_file(out):
    """The file llama.cpp is given (model.gguf, or the first of a split set) and every GGUF in OUT."""
    files = sorted(out.glob("*.gguf"))
    if (out / "model.gguf").is_file():
        return out / "model.gguf", files
    firsts = [f for f in files if re.search(r"-00001-of-\d{5}\.gguf$", f.name)]
    return (firsts[0] if firsts else None), files
