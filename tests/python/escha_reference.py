"""Independent NumPy reference decoder for Escha-W2 checkpoints (float64 throughout).

Written from the format document (`escha-w2-format.md`, sections 1-8), not from the crate's Rust code,
so that a test can hold the two against each other. It favours the literal definitions of the document
over fast forms:

* safetensors files are parsed by hand (header length, JSON header, raw little-endian data);
* the trellis stream is expanded into individual bits (u32 words MSB-first, §4.1-4.2) and each state is
  the 16-bit window that ends at stream bit (t+1)K, read circularly;
* codebook values are computed from the recipe (§3) with one round-to-nearest-even to fp16 of the exact
  sum (or fused multiply-add), done on the bits by `round_to_format`;
* the tensor-core permutation comes from the forward formula of §5 and is applied as a scatter;
* `W_hf[OC, IC] = diag(rout*s_out) . Hn . Wb^T . Hn . diag(rin*s_in)` with the Sylvester Hadamard built
  by doubling (§7); `H . Wb^T . H` is exact in float64 here (codebook values are multiples of 2^-13 below
  4, so every partial sum stays below 2^53 units), the scale vectors are exact products, and only the
  two final scalings round (float64, relative error ~1e-16);
* one rounding from float64 to the output dtype (bf16 round-to-nearest-even, on the bits, never through
  float32).

`convert(src, dst)` writes a Hugging Face layout checkpoint with the converter's naming and returns the
unrounded values, so a test can tell genuine differences from rounding ties.
"""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
import struct
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------------------------------
# safetensors, by hand

_ST_DTYPES = {
    "BOOL": np.dtype("?"),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # kept as raw bits
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
}


def read_safetensors(path):
    """{name: (dtype string, numpy array)}; BF16 comes back as its uint16 bit patterns."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = memoryview(raw)[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _ST_DTYPES[info["dtype"]]
        a, b = info["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=dt).reshape(info["shape"]).copy()
        out[name] = (info["dtype"], arr)
    return out


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype string, array)}; BF16 arrays are uint16 bit patterns."""
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        buf = np.ascontiguousarray(arr, dtype=_ST_DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(buf)]}
        blobs.append(buf)
        off += len(buf)
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_checkpoint_dir(d):
    """Every tensor of every *.safetensors file directly in `d` (all shards), cross-checked against the
    index when there is one."""
    d = Path(d)
    tensors, where = {}, {}
    for f in sorted(d.glob("*.safetensors")):
        for name, t in read_safetensors(f).items():
            if name in tensors:
                raise ValueError(f"{name} is in both {where[name]} and {f.name}")
            tensors[name] = t
            where[name] = f.name
    idx = d / "model.safetensors.index.json"
    if idx.exists():
        wm = json.loads(idx.read_text())["weight_map"]
        if wm != where:
            raise ValueError(f"{idx}: weight_map disagrees with the shards")
    return tensors


# --------------------------------------------------------------------------------------------------
# Rounding float64 to a narrower IEEE binary format, on the bits


def round_to_format(x, exp_bits, man_bits):
    """Round float64 `x` to the binary format with `exp_bits` exponent and `man_bits` fraction bits,
    round-to-nearest-even, subnormals and overflow to infinity included. Returns the bit patterns
    (uint16 for the 16-bit formats)."""
    x = np.asarray(x, dtype=np.float64)
    b = x.view(np.uint64)
    sign = (b >> np.uint64(63)).astype(np.uint64)
    e = ((b >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    m = b & np.uint64((1 << 52) - 1)
    bias = (1 << (exp_bits - 1)) - 1
    emin = 1 - bias
    # Significand as an integer, and the unbiased exponent of its leading bit position 52.
    full = np.where(e == 0, m, m | np.uint64(1 << 52))
    E = np.where(e == 0, -1022, e - 1023)
    # Bits to drop: 52 - man_bits for normal results, more below the target's normal range.
    shift = (52 - man_bits) + np.maximum(0, emin - E)
    shift = np.minimum(shift, 60).astype(np.uint64)
    q = full >> shift
    rem = full & ((np.uint64(1) << shift) - np.uint64(1))
    half = np.uint64(1) << (shift - np.uint64(1))
    up = (rem > half) | ((rem == half) & ((q & np.uint64(1)) == np.uint64(1)))
    q = q + up.astype(np.uint64)
    # q carries the implicit bit at position man_bits for normal results; adding it to the exponent
    # field minus one gives the right pattern, carries into the exponent (and up to infinity) included.
    mag = (np.maximum(E + bias - 1, 0).astype(np.uint64) << np.uint64(man_bits)) + q
    inf = np.uint64(((1 << exp_bits) - 1) << man_bits)
    mag = np.where(E > bias, inf, mag)  # beyond the largest binade: infinity
    special = e == 0x7FF
    nan = inf | np.uint64(1 << (man_bits - 1))
    mag = np.where(special, np.where(m == 0, inf, nan), mag)
    width = 1 + exp_bits + man_bits
    out = (sign << np.uint64(width - 1)) | mag
    return out.astype(np.uint16 if width == 16 else np.uint32)


def f64_to_bf16_bits(x):
    return round_to_format(x, 8, 7)


def f64_to_f16_bits(x):
    return round_to_format(x, 5, 10)


def bf16_bits_to_f64(bits):
    return (np.asarray(bits, dtype=np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def f16_bits_to_f64(bits):
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float64)


def bf16_bracket(x):
    """Bit patterns (lo, hi) of the two bf16 values next to float64 `x` on either side (lo == hi when x
    is exactly representable), signed like x."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    r = f64_to_bf16_bits(a)
    rv = bf16_bits_to_f64(r)
    lo = np.where(rv > a, r - np.uint16(1), r).astype(np.uint16)
    hi = np.where(rv < a, r + np.uint16(1), r).astype(np.uint16)
    sign = np.where(np.signbit(x), np.uint16(0x8000), np.uint16(0)).astype(np.uint16)
    return lo | sign, hi | sign


def bf16_tie_distance(x):
    """|x - m| for the bf16 rounding midpoint m between the two bf16 values around float64 `x`
    (infinite when x is exactly representable: there is nothing to tie). Small values mean that a
    float32 pipeline may legitimately round the other way."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    lo, hi = bf16_bracket(x)
    lv, hv = bf16_bits_to_f64(lo), bf16_bits_to_f64(hi)
    return np.where(lo == hi, np.inf, np.abs(x - (lv + (hv - lv) / 2)))


# --------------------------------------------------------------------------------------------------
# The trellis codec (§3-§6)

MCG, INST3, MUL1 = 1, 0, 2
_M32 = np.uint64(0xFFFFFFFF)


def codebook(states, cb):
    """Exact fp16 value (as float64) of every 16-bit state, codebook id `cb` (0 3INST, 1 MCG, 2 MUL1)."""
    x = np.asarray(states, dtype=np.uint64)
    if cb in (INST3, MCG):
        if cb == INST3:
            y = (x * np.uint64(89226354) + np.uint64(64248484)) & _M32
        else:
            y = (x * np.uint64(0xCBAC1FED)) & _M32
        y = (y & np.uint64(0x8FFF8FFF)) ^ np.uint64(0x3B603B60)
        lo = f16_bits_to_f64((y & np.uint64(0xFFFF)).astype(np.uint16))
        hi = f16_bits_to_f64((y >> np.uint64(16)).astype(np.uint16))
        return f16_bits_to_f64(f64_to_f16_bits(lo + hi))  # exact sum, one rounding
    if cb == MUL1:
        y = (x * np.uint64(0x83DCD12D)) & _M32
        b = sum((y >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)).astype(np.float64)
        h = 1024.0 + b  # the fp16 with bits 0x6400 + b
        s = f16_bits_to_f64(np.uint16(0x1EEE))
        c = f16_bits_to_f64(np.uint16(0xC931))
        return f16_bits_to_f64(f64_to_f16_bits(h * s + c))  # exact in float64, one rounding
    raise ValueError(f"unknown codebook id {cb}")


def stream_bits(words):
    """words: [..., 16K] int16/uint16 tile words -> [..., 256K] stream bits (uint8). Words pair into
    little-endian u32 (W[2m] | W[2m+1] << 16), read MSB first."""
    w = np.asarray(words).view(np.uint16).astype(np.uint32)
    u = w[..., 0::2] | (w[..., 1::2] << np.uint32(16))
    be = u.astype(">u4").view(np.uint8).reshape(u.shape[:-1] + (u.shape[-1] * 4,))
    return np.unpackbits(be, axis=-1)


def tile_states(words, K):
    """[..., 16K] tile words -> [..., 256] states; state t = the 16 bits ending at stream bit (t+1)K."""
    words = np.asarray(words)
    if words.shape[-1] != 16 * K:
        raise ValueError(f"a K={K} tile has {16 * K} words, got {words.shape[-1]}")
    bits = stream_bits(words)
    n = 256 * K
    t = np.arange(256)[:, None]
    i = np.arange(16)[None, :]
    idx = ((t + 1) * K - 16 + i) % n  # [256, 16]
    window = bits[..., idx].astype(np.uint32)  # [..., 256, 16]
    return (window << (15 - np.arange(16, dtype=np.uint32))).sum(axis=-1).astype(np.uint16)


def tensor_core_perm():
    """PERM[s] = 16*row + col of trellis position s (§5, forward form)."""
    s = np.arange(256)
    L, j = s >> 3, s & 7
    row = 2 * (L % 4) + (j & 1) + 8 * ((j >> 1) & 1)
    col = (L >> 2) + 8 * (j >> 2)
    return 16 * row + col


PERM = tensor_core_perm()


def tile_values(words, K, cb=MCG):
    """[..., 16K] tile words -> [..., 16, 16] tiles (rows = input, cols = output), float64."""
    v = codebook(tile_states(words, K), cb)
    tile = np.empty_like(v)
    tile[..., PERM] = v  # scatter: tile.flat[PERM[t]] = value[t]
    return tile.reshape(v.shape[:-1] + (16, 16))


def hadamard(n=128):
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


H128 = hadamard(128)


def _check_config(cfg, K, shape, stacked):
    cfg = [int(v) for v in np.asarray(cfg).ravel()]
    if stacked:
        E, it, ot = shape[:3]
        want = [16, K, 2, None, E, 16 * it, 16 * ot, 16 * it, 16 * ot]
    else:
        it, ot = shape[:2]
        want = [16, K, 2, None, 16 * it, 16 * ot]
    if len(cfg) != len(want) or any(w is not None and c != w for c, w in zip(cfg, want)):
        raise ValueError(f"escha_config {cfg} disagrees with code shape {list(shape)} (K={K})")
    return cfg[3]


def decode_linear(code, rin, rout, s_in=None, s_out=None, config=None):
    """One coded linear -> W_hf as float64, [OC, IC] (dense) or [E, OC, IC] (stacked experts)."""
    code = np.asarray(code)
    stacked = code.ndim == 4
    if code.ndim not in (3, 4) or code.shape[-1] % 16:
        raise ValueError(f"bad escha_code shape {code.shape}")
    K = code.shape[-1] // 16
    cb = MCG if config is None else _check_config(config, K, code.shape, stacked)
    if not stacked:
        code = code[None]
        rin, rout = rin[None], rout[None]
        s_in = None if s_in is None else s_in[None]
        s_out = None if s_out is None else s_out[None]
    E, IT, OT, _ = code.shape
    IC, OC = 16 * IT, 16 * OT
    if IC % 128 or OC % 128:
        raise ValueError(f"dimensions {IC}x{OC} are not multiples of 128")
    if rin.shape != (E, IC) or rout.shape != (E, OC):
        raise ValueError(f"rin {rin.shape} / rout {rout.shape} do not fit code {code.shape}")
    su = rin.astype(np.float64) * (1.0 if s_in is None else s_in.astype(np.float64))
    sv = rout.astype(np.float64) * (1.0 if s_out is None else s_out.astype(np.float64))
    tiles = tile_values(code, K, cb)  # [E, IT, OT, 16, 16]
    wb = tiles.transpose(0, 1, 3, 2, 4).reshape(E, IC, OC)  # Wb[e, 16i + r, 16j + c]
    # Wb^T as 128x128 blocks [E, OC/128, IC/128, 128, 128]; Hn . Wb^T . Hn = (H . block . H) / 128 per block.
    blocks = wb.transpose(0, 2, 1).reshape(E, OC // 128, 128, IC // 128, 128).transpose(0, 1, 3, 2, 4)
    x = (H128 @ blocks @ H128).transpose(0, 1, 3, 2, 4).reshape(E, OC, IC) / 128.0
    w = sv[:, :, None] * x * su[:, None, :]
    return w if stacked else w[0]


# --------------------------------------------------------------------------------------------------
# Whole checkpoints

ESCHA_LEAVES = ("code", "rin", "rout", "s_in", "s_out", "config")
Out = namedtuple("Out", "dtype value kind")


def decode_tensors(tensors):
    """Escha tensors {name: (dtype, array)} -> output {name: Out(dtype, value, kind)}.

    `dtype` is "BF16" for everything decoded or cast (value given in float64, not yet rounded), or the
    input dtype for tensors passed through unchanged (F32 and non-float tensors). `kind` is "coded",
    "int8" or "plain"."""
    coded = {}
    for name in tensors:
        if ".escha_" in name:
            mod, leaf = name.rsplit(".escha_", 1)
            if leaf not in ESCHA_LEAVES:
                raise ValueError(f"unknown Escha leaf {name}")
            coded.setdefault(mod, {})[leaf] = tensors[name][1]
    out = {}
    used = set()
    for mod, leaves in coded.items():
        missing = {"code", "rin", "rout"} - set(leaves)
        if missing:
            raise ValueError(f"{mod}: missing {sorted(missing)}")
        w = decode_linear(
            leaves["code"], leaves["rin"], leaves["rout"], leaves.get("s_in"), leaves.get("s_out"), leaves.get("config")
        )
        out[mod if w.ndim == 3 else mod + ".weight"] = Out("BF16", w, "coded")
        used.update(f"{mod}.escha_{leaf}" for leaf in leaves)
        if mod + ".bias" in tensors:
            used.add(mod + ".bias")  # dropped, as the reference runtime never applies it
    for name in tensors:
        if name.endswith(".weight_int8"):
            mod = name[: -len(".weight_int8")]
            w8 = tensors[name][1].astype(np.float64)
            scale = tensors[mod + ".weight_scale"][1].astype(np.float64)
            out[mod + ".weight"] = Out("BF16", w8 * scale[:, None], "int8")
            used.update((name, mod + ".weight_scale"))
    for name, (dtype, arr) in tensors.items():
        if name in used:
            continue
        if name.endswith(".weight_scale"):
            raise ValueError(f"{name} has no int8 partner")
        if dtype == "F16":
            out[name] = Out("BF16", arr.astype(np.float64), "plain")
        elif dtype == "BF16":
            out[name] = Out("BF16", bf16_bits_to_f64(arr), "plain")
        else:
            out[name] = Out(dtype, arr, "plain")
    return out


def encode_output(decoded):
    """Round the float64 values once: {name: (dtype, array ready for write_safetensors)}."""
    return {n: (o.dtype, f64_to_bf16_bits(o.value) if o.dtype == "BF16" else o.value) for n, o in decoded.items()}


SKIPPED_SIDE_FILES = {"config.json", "quantize_config.json", "model.safetensors.index.json"}


def convert(src, dst):
    """Write the reference conversion of checkpoint directory `src` into `dst` (HF layout, bf16).

    Returns {"": {name: Out(dtype, unrounded value, kind)}}. A separate `mtp/` head (the dense
    model's) joins the main tensors under its `mtp.*` names. An MoE head without routed experts
    cannot be used and is left out, with the config's MTP layer count set to 0."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    tensors = read_checkpoint_dir(src)
    if (src / "mtp").is_dir():
        tensors.update(read_checkpoint_dir(src / "mtp"))
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)
    text = cfg.get("text_config", cfg)
    if text.get("num_experts", 0) > 0 and not any(".mlp.experts." in n for n in tensors if n.startswith("mtp.")):
        tensors = {n: t for n, t in tensors.items() if not n.startswith("mtp.")}
        text["mtp_num_hidden_layers"] = 0
    decoded = decode_tensors(tensors)
    write_safetensors(dst / "model.safetensors", encode_output(decoded), {"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in src.glob("*.json"):
        if f.name not in SKIPPED_SIDE_FILES:
            shutil.copyfile(f, dst / f.name)
    return {"": decoded}


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: escha_reference.py IN_DIR OUT_DIR")
    res = convert(sys.argv[1], sys.argv[2])
    print({k: len(v) for k, v in res.items()})
