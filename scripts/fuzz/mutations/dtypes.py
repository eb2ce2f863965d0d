"""Mutations of tensor dtypes: the same bytes under another dtype of the same width, or the values
converted to another dtype (F64 and the integer widths included)."""

import numpy as np

from ..checkpoint import NP
from . import kind

SAME_WIDTH = {
    "F16": ["BF16", "I16", "U16"],
    "BF16": ["F16"],
    "F32": ["I32", "U32"],
    "I32": ["F32", "U32"],
    "I16": ["F16", "U16", "BF16"],
    "I8": ["U8", "F8_E4M3", "BOOL"],
    "U8": ["I8"],
}


@kind(2)
def st_dtype_reinterpret(ck, rng):
    t = ck.pick_tensor(rng, ".", dtypes=set(SAME_WIDTH))
    new = rng.choice(SAME_WIDTH[t[2]])

    def edit(s):
        s.find(t[1])[1] = new

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} dtype {t[2]} -> {new} (bytes reinterpreted)"


@kind(2)
def st_dtype_convert(ck, rng):
    t = ck.pick_tensor(rng, ".", dtypes={"F16", "F32", "I8", "I16"})
    src = t[2]
    targets = {
        "F16": ["F32", "F64", "BF16"],
        "F32": ["F16", "F64", "BF16"],
        "I8": ["I16", "I32", "F16"],
        "I16": ["I32", "I8"],
    }[src]
    new = rng.choice(targets)

    def edit(s):
        x = s.find(t[1])
        a = np.frombuffer(x[3], dtype=NP[src])
        with np.errstate(all="ignore"):
            if new == "BF16":
                f = a.astype("<f4")
                b = ((f.view("<u4") + 0x8000) >> 16).astype("<u2").tobytes()
            else:
                b = a.astype(NP[new]).tobytes()
        x[1], x[3] = new, b

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} converted {src} -> {new}"


# dtype name -> bytes per element, for the tags the safetensors format knows but the fixtures lack
EXOTIC = {"F64": 8, "I64": 8, "U64": 8, "U32": 4, "U16": 2, "BOOL": 1, "F8_E5M2": 1, "F8_E4M3": 1, "C64": 8}


@kind(2)
def st_dtype_exotic(ck, rng):
    """A tensor re-tagged with a dtype the fixtures do not use (or an unknown one), its data cut or
    zero-extended to the bytes the new dtype needs, so the header stays consistent."""
    t = ck.pick_tensor(rng)
    new = rng.choice(sorted(EXOTIC) + ["F4", "X"])
    n = 1
    for d in t[3]:
        n *= d

    def edit(s):
        x = s.find(t[1])
        size = n * EXOTIC.get(new, 1)
        x[1] = new
        x[3] = (x[3] + bytes(max(0, size - len(x[3]))))[:size]

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} dtype {t[2]} -> {new} (bytes fitted)"
