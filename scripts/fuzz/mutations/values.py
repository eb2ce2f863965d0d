"""Mutations of the stored values: scales taken huge, tiny or non-finite, extreme norms, linear
attention parameters, int8 pairs and plain weights, huge finite values in any plain tensor, random
trellis words."""

import random

import numpy as np

from ..checkpoint import NP
from . import kind

# numeric edits of the weights


def scale_values(ck, t, fn, rows=None):
    """Applies fn to the float values of tensor t (F16/F32/BF16 as stored), optionally only some rows."""

    def edit(s):
        x = s.find(t[1])
        if x[1] == "BF16":
            a = (np.frombuffer(x[3], "<u2").astype("<u4") << 16).view("<f4").copy()
        else:
            a = np.frombuffer(x[3], NP[x[1]]).astype(np.float64)
        with np.errstate(all="ignore"):
            if rows is not None and x[2]:
                a = a.reshape(x[2][0], -1)
                a[rows] = fn(a[rows])
                a = a.reshape(-1)
            else:
                a = fn(a)
            if x[1] == "BF16":
                f = a.astype("<f4")
                x[3] = ((f.view("<u4") + 0x8000) >> 16).astype("<u2").tobytes()
            else:
                x[3] = a.astype(NP[x[1]]).tobytes()

    ck.edit_shard(t[0], edit)


@kind(3)
def w_scale_huge(ck, rng):
    t = ck.pick_tensor(rng, r"escha_s_(in|out)$")
    # The fixtures' weights are below about 0.2: these take them to about 1e3 .. 4e7.
    f = rng.choice([1e4, 1e6, 5e7, 2e8])
    one = rng.random() < 0.3
    rows = [0] if one and len(t[3]) > 1 else None
    scale_values(ck, t, lambda a: a * f, rows)
    return f"{ck.rel(t[0])}: {t[1]} x {f:g}{' (first expert/row only)' if rows else ''} (weights up to ~{0.2 * f:.0e})"


@kind(2)
def w_scale_tiny(ck, rng):
    t = ck.pick_tensor(rng, r"escha_s_(in|out)$")
    f = rng.choice([1e-6, 1e-10, 1e-30, 1e-45, 0.0, -1.0])
    scale_values(ck, t, lambda a: a * f)
    return f"{ck.rel(t[0])}: {t[1]} x {f:g}"


@kind(2)
def w_int8_scale(ck, rng):
    t = ck.pick_tensor(rng, r"weight_scale$")
    v = rng.choice([65504.0, 30000.0, 1000.0, 6e-8, 0.0, -1.0, -65504.0])
    rows = rng.choice([None, [0], list(range(1, 9))])
    scale_values(ck, t, lambda a: np.full_like(a, v), rows)
    return f"{ck.rel(t[0])}: {t[1]} = {v:g}{'' if rows is None else f' in rows {rows[0]}..{rows[-1]}'}"


@kind(2)
def w_norm(ck, rng):
    t = ck.pick_tensor(rng, r"norm\.weight$|norm_embedding|norm_hidden")
    v = rng.choice([65504.0, 1000.0, -1.0, -65504.0, 0.0, 6e-8])
    scale_values(ck, t, lambda a: np.full_like(a, v))
    return f"{ck.rel(t[0])}: {t[1]} = {v:g}"


@kind(2)
def w_gdn_params(ck, rng):
    t = ck.pick_tensor(rng, r"A_log|dt_bias|conv1d|in_proj_[ab]")
    v = rng.choice([88.8, 1e30, -1e30, 100.0, 65504.0, -65504.0, 0.0])
    scale_values(ck, t, lambda a: np.full_like(a, v))
    return f"{ck.rel(t[0])}: {t[1]} = {v:g}"


@kind(1)
def w_rin_rout(ck, rng):
    t = ck.pick_tensor(rng, r"escha_r(in|out)$")
    f = rng.choice([65504.0, 1000.0, 1e-7, 0.0])
    scale_values(ck, t, lambda a: a * f)
    return f"{ck.rel(t[0])}: {t[1]} x {f:g}"


@kind(1)
def w_code_bytes(ck, rng):
    t = ck.pick_tensor(rng, r"escha_code$")
    op = rng.choice(["random", "zero", "ones"])

    def edit(s):
        x = s.find(t[1])
        n = len(x[3])
        if op == "random":
            x[3] = random.Random(rng.random()).randbytes(n)
        elif op == "zero":
            x[3] = bytes(n)
        else:
            x[3] = b"\xff" * n

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} codes {op}"


@kind(1)
def w_int8_extreme(ck, rng):
    t = ck.pick_tensor(rng, r"weight_int8$")
    v = rng.choice([127, -128])

    def edit(s):
        x = s.find(t[1])
        x[3] = np.full(len(x[3]), v, dtype="i1").tobytes()

    ck.edit_shard(t[0], edit)
    s = t[1].replace("weight_int8", "weight_scale")
    st = next((x for x in ck.all_tensors() if x[1] == s), None)
    if st and rng.random() < 0.5:
        scale_values(ck, st, lambda a: np.full_like(a, 65504.0))
        return f"{t[1]} all {v}, {s} = 65504"
    return f"{t[1]} all {v}"


@kind(2)
def w_plain_extreme(ck, rng):
    t = ck.pick_tensor(rng, r"\.weight$", dtypes={"F16", "F32"})
    v = rng.choice([65504.0, -65504.0, 1e4, float("inf"), float("nan"), 0.0])
    one = rng.random() < 0.5

    def fn(a):
        if one:
            a = a.copy()
            a[0] = v
            return a
        return np.full_like(a, v)

    scale_values(ck, t, fn)
    return f"{ck.rel(t[0])}: {t[1]} {'element 0' if one else 'all'} = {v:g}"


# Finite values near the top of each float type's range (F64: past f32's).
HUGE = {
    "F16": [65504.0, -65504.0, 60000.0],
    "BF16": [3.38e38, -3.38e38, 1e30, -1e30],
    "F32": [3.4e38, -3.4e38, 1e30, 88.8],
    "F64": [1e300, -1e300, 3.5e38],
}


@kind(2)
def w_plain_huge(ck, rng):
    """A huge but finite value in any plain float tensor: norms, A_log, dt_bias, conv1d, biases,
    embeddings, the MTP head's."""
    t = ck.pick_tensor(rng, r"^(?!.*escha_)(?!.*weight_(int8|scale)$)", dtypes=set(HUGE))
    if t is None:
        return "no plain float tensor"
    v = rng.choice(HUGE[t[2]])
    one = rng.random() < 0.5

    def fn(a):
        if one:
            a = a.copy()
            a[rng.randrange(len(a))] = v
            return a
        return np.full_like(a, v)

    scale_values(ck, t, fn)
    return f"{ck.rel(t[0])}: {t[1]} {'one element' if one else 'all'} = {v:g}"


@kind(1)
def w_scale_nonfinite(ck, rng):
    t = ck.pick_tensor(rng, r"escha_s_(in|out)$|weight_scale$|escha_r(in|out)$")
    v = rng.choice([float("nan"), float("inf"), float("-inf")])

    def fn(a):
        a = a.copy()
        a[-1] = v
        return a

    scale_values(ck, t, fn)
    return f"{ck.rel(t[0])}: {t[1]} last element = {v}"
