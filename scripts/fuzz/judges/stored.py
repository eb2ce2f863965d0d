"""The tensors of an output directory read by hand (safetensors headers and raw bytes), as float64
where they are floats: for the non-finite scans and the EXL3 comparison."""

import numpy as np

from ..checkpoint import Shard

FLOATS = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}
INTS = {"I8": "i1", "U8": "u1", "I16": "<i2", "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8", "U64": "<u8"}


def tensors(out):
    """{name: (dtype, shape, bytes)} of every *.safetensors in OUT and OUT/mtp."""
    found = {}
    for p in sorted(out.glob("*.safetensors")) + sorted(out.glob("mtp/*.safetensors")):
        for name, dtype, shape, data in Shard(p).tensors:
            found[name] = (dtype, shape, data)
    return found


def values(dtype, shape, data):
    """The tensor as a float64 array of its shape (BF16 widened exactly), or None for other dtypes."""
    if dtype == "BF16":
        a = (np.frombuffer(data, "<u2").astype("<u4") << 16).view("<f4")
    elif dtype in FLOATS:
        a = np.frombuffer(data, FLOATS[dtype])
    elif dtype in INTS:
        a = np.frombuffer(data, INTS[dtype])
    else:
        return None
    return a.astype(np.float64).reshape(shape)


def nonfinite(out):
    """'name (dtype): n non-finite values' for each stored float tensor of OUT that holds any."""
    found = []
    for name, (dtype, shape, data) in tensors(out).items():
        if dtype == "BF16" or dtype in FLOATS:
            bad = int(np.count_nonzero(~np.isfinite(values(dtype, shape, data))))
            if bad:
                found.append(f"{name} ({dtype}): {bad} non-finite values")
    return found
