#!/usr/bin/env python3
"""NumPy reference of the Escha-W2 / EXL3 tile decode, for comparison with the Rust decoders.

states (16-bit windows of the circular MSB-first stream) -> codebook -> fp16 rounding -> tile
permutation, vectorised over tiles. It first checks itself against every golden tile in
fixtures/golden/ (the vectors the Rust decoders are tested on), then times the MCG decode on random
codes of a slice of the 5120x17408 K=3 linear used by `cargo bench --bench codec`.

    python3 scripts/numpy_decode.py [--rows 320] [--reps 5]

--rows is the number of 16-row tile rows to time (320 = the whole 5120x17408 tensor; the default
20 is a 1/16 slice, 5.6 M weights, to keep memory small). Prints ns per weight (median).
"""

import argparse
import json
import pathlib
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
IC, OC, K = 5120, 17408, 3


def perm():
    """Trellis position s -> tile element 16*row + col (format document, section 5)."""
    s = np.arange(256)
    row = 2 * ((s >> 3) & 3) + (s & 1) + 8 * ((s >> 1) & 1)
    col = (s >> 5) + 8 * ((s >> 2) & 1)
    return 16 * row + col


PERM = perm()


def states(code, k):
    """code: uint8 array of whole tiles -> uint32 [tiles, 256] states."""
    u = code.view("<u4").reshape(-1, 8 * k).astype(np.uint64)
    start = ((np.arange(256) + 1) * k - 16) % (256 * k)
    a, off = start >> 5, start & 31
    x = (u[:, a] << np.uint64(32)) | u[:, (a + 1) % (8 * k)]
    return ((x >> (48 - off).astype(np.uint64)) & np.uint64(0xFFFF)).astype(np.uint32)


def codebook(x, cb):
    """uint32 states -> float32 values (exact fp16), codebook id 0 (3INST), 1 (MCG) or 2 (MUL1)."""
    if cb == 2:
        y = x * np.uint32(0x83DCD12D)
        b = (y & 0xFF) + ((y >> 8) & 0xFF) + ((y >> 16) & 0xFF) + (y >> 24)
        v = (1024 + b).astype(np.float32) * np.float32(0.00676727294921875) + np.float32(-10.3828125)
    else:
        y = x * np.uint32(0xCBAC1FED) if cb == 1 else x * np.uint32(89226354) + np.uint32(64248484)
        y = (y & np.uint32(0x8FFF8FFF)) ^ np.uint32(0x3B603B60)
        lo = (y & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
        hi = (y >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
        v = lo + hi  # exact in f32
    return v.astype(np.float16).astype(np.float32)  # one round-to-nearest-even to fp16


def decode(code, k, cb):
    """Whole tiles -> float32 [tiles, 256] in row-major tile order (row = input feature)."""
    v = codebook(states(code, k), cb)
    tiles = np.empty_like(v)
    tiles[:, PERM] = v  # scatter: tile.flat[PERM[t]] = value[t]
    return tiles


def check_golden():
    n = 0
    for path in sorted((ROOT / "fixtures" / "golden").glob("*.json")):
        doc = json.loads(path.read_text())
        assert list(doc["tensor_core_perm"]) == PERM.tolist(), path
        k, cb = doc["K"], doc["cb"]
        for t in doc["tiles"]:
            code = np.array(t["words_i16"], dtype=np.int64).astype("<u2").view(np.uint8)
            st = states(code, k)[0]
            assert st.tolist() == [s & 0xFFFF for s in t["states_u16_trellis_order"]], (path, "states")
            bits = decode(code, k, cb)[0].astype(np.float16).view(np.uint16)
            assert bits.tolist() == [b & 0xFFFF for b in t["values_f16_bits_rowmajor"]], (path, "values")
            n += 1
    print(f"golden: {n} tiles agree bit for bit (states and fp16 values)")


def bench(rows, reps):
    tiles = rows * (OC // 16)
    rng = np.random.default_rng(1)
    code = rng.integers(0, 256, size=tiles * 32 * K, dtype=np.uint8)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        decode(code, K, 1)
        times.append(time.perf_counter() - t0)
    weights = tiles * 256
    print(f"numpy MCG decode, K={K}, {rows * 16} of {IC} input rows x {OC} ({weights / 1e6:.1f} M weights): "
          f"{np.median(times) * 1e9 / weights:.2f} ns/weight (median of {reps}, min {min(times) * 1e9 / weights:.2f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20, help="tile rows of the 5120x17408 K=3 linear to time")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    check_golden()
    bench(args.rows, args.reps)


if __name__ == "__main__":
    main()
