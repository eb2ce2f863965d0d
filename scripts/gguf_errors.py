"""Size, bits per weight and added error of GGUF files against an f32 GGUF of the same model.

    python scripts/gguf_errors.py --gguf-py DIR --reference REF.gguf [--synth SYNTH] [--json OUT.json] \
        LABEL=FILE.gguf[,REPORT.json] ...      (LABEL may hold '=', FILE and REPORT not)

REF.gguf is `escha-convert IN OUT --format gguf --gguf-type f32`: every tensor's exact f32
reconstruction W. For every tensor of REF that is not F32 in FILE (the tensors `--gguf-type` decides;
on the synthetic checkpoint of examples/make_synthetic.rs, every coded linear), the added error
‖deq(W_q) − W‖ / ‖W‖ is computed with gguf-py's own `gguf.quants.dequantize` (DIR is llama.cpp's
gguf-py, as in tests/python/test_gguf.py), a block of rows at a time (bounded memory), in float64
sums; with it the tensor's bytes and bits per weight (bytes × 8 / weights). Per file: its size, the
bits per weight and the error over all those tensors (sqrt(Σ‖ΔW‖² / Σ‖W‖²)), the largest tensor error.

With --synth (the Escha input), each tensor's trellis K comes from its `escha_code` shape, and the
error is also given as a fraction of 2^-K (the R it reaches). REPORT.json, the conversion's `--json`
report, adds for `--gguf-type auto` the budget R·2^-K of each choice and its predicted (and, with
--measure-error, measured) error; a measured error above its budget, or one that differs from ours
by more than 1e-6 relative, is listed as a problem (exit status 1).

Prints Markdown tables; --json writes every figure.
"""

import argparse
import json
import math
import os
import re
import struct
import sys
from pathlib import Path

import numpy as np


def synth_ks(synth):
    """K of every coded linear of an Escha checkpoint, under its GGUF name."""
    ks = {}
    for f in sorted(Path(synth).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            m = re.fullmatch(r".*layers\.(\d+)\.mlp\.(gate|up|down)_proj\.escha_code", name)
            if m:
                ks[f"blk.{m[1]}.ffn_{m[2]}.weight"] = info["shape"][2] // 16
    return ks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py directory")
    ap.add_argument("--reference", required=True, help="the f32 GGUF (exact reconstruction)")
    ap.add_argument("--synth", help="the Escha checkpoint, for each coded linear's K")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("files", nargs="+", metavar="LABEL=FILE.gguf[,REPORT.json]")
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf
    from gguf import quants

    ks = synth_ks(args.synth) if args.synth else {}
    ref = {t.name: t for t in gguf.GGUFReader(args.reference).tensors}
    ref_sq = {}  # name -> Σ W² (float64), computed once

    def chunks(t):
        rows = t.data.shape[0]
        step = max(1, (1 << 22) // max(1, t.data[0].size))  # about 4 M elements per block
        for r in range(0, rows, step):
            yield r, min(rows, r + step)

    results, problems = [], []
    for spec in args.files:
        label, _, rest = spec.rpartition("=")
        path, _, report_path = rest.partition(",")
        choices = {}
        if report_path:
            report = json.load(open(report_path))
            choices = {c["tensor"]: c for c in report.get("width_choices") or []}
        reader = gguf.GGUFReader(path)
        row = {"label": label, "file": os.path.basename(path), "file_bytes": os.path.getsize(path), "tensors": []}
        for t in reader.tensors:
            if t.name not in ref:
                problems.append(f"{label}: {t.name} is not in the reference")
                continue
            w = ref[t.name]
            if t.tensor_type == gguf.GGMLQuantizationType.F32 and w.tensor_type == t.tensor_type and t.name not in ks:
                continue  # kept in F32 whatever the type (norms and the like): not what --gguf-type decides
            if t.data.shape[0] != w.data.shape[0] or t.n_elements != w.n_elements:
                problems.append(f"{label}: {t.name} shape {list(t.shape)}, reference {list(w.shape)}")
                continue
            d2 = 0.0
            need_ref = t.name not in ref_sq
            w2 = 0.0
            for r0, r1 in chunks(t):
                x = w.data[r0:r1].astype(np.float64)
                q = quants.dequantize(t.data[r0:r1], t.tensor_type).astype(np.float64)
                q -= x
                d2 += float(np.einsum("ij,ij->", q, q))
                if need_ref:
                    w2 += float(np.einsum("ij,ij->", x, x))
            if need_ref:
                ref_sq[t.name] = w2
            err = math.sqrt(d2 / ref_sq[t.name]) if ref_sq[t.name] > 0 else float("nan")
            k = ks.get(t.name)
            e = {
                "tensor": t.name, "type": t.tensor_type.name, "weights": int(t.n_elements), "bytes": int(t.n_bytes),
                "bits_per_weight": t.n_bytes * 8 / t.n_elements, "sq_error": d2, "sq_ref": ref_sq[t.name],
                "error": err, "k": k, "reach": err * 2**k if k is not None else None,
            }
            c = choices.get(t.name)
            if c:
                e.update(budget=c["budget"], predicted=c["predicted"], actual=c.get("actual"),
                         chosen=c["gguf_type"])
                if c["gguf_type"].upper() != t.tensor_type.name.upper():
                    problems.append(f"{label}: {t.name} is {t.tensor_type.name}, the report says {c['gguf_type']}")
                if err > c["budget"]:
                    problems.append(f"{label}: {t.name} ({t.tensor_type.name}) added error {err:.6f} "
                                    f"above its budget {c['budget']:.6f}")
                if c.get("actual") is not None and abs(c["actual"] / err - 1) > 1e-6:
                    problems.append(f"{label}: {t.name} measured {err:.8f} here, the report says {c['actual']:.8f}")
            row["tensors"].append(e)
        tt = row["tensors"]
        n = sum(e["weights"] for e in tt)
        row["weights"] = n
        row["bits_per_weight"] = sum(e["bytes"] for e in tt) * 8 / n if n else float("nan")
        sq = sum(e["sq_ref"] for e in tt)
        row["error"] = math.sqrt(sum(e["sq_error"] for e in tt) / sq) if sq else float("nan")
        row["max_error"] = max((e["error"] for e in tt), default=float("nan"))
        reach = [e["reach"] for e in tt if e["reach"] is not None]
        row["max_reach"] = max(reach) if reach else None
        results.append(row)
        print(f"{label}: {len(tt)} tensors measured", file=sys.stderr)

    def types(row):
        got = {}
        for e in row["tensors"]:
            got.setdefault(e["type"], []).append(e)
        return ", ".join(
            f"{ty}: {len(v)}" + (f" (K={'/'.join(str(k) for k in sorted({e['k'] for e in v}))})" if ks else "")
            for ty, v in sorted(got.items()))

    weights = results[0]["weights"] if results else 0
    print(f"\n{len(results[0]['tensors']) if results else 0} coded linears, {weights:,} weights; "
          "error = ‖deq(W_q) − W_f32‖ / ‖W_f32‖ (gguf-py dequantize, float64 sums)\n")
    print("| run | file bytes | bits/weight (coded linears) | added error, all | max (one tensor) | "
          "max error / 2^-K | types (tensors) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        reach = f"{r['max_reach']:.3f}" if r["max_reach"] is not None else ""
        print(f"| {r['label']} | {r['file_bytes']:,} | {r['bits_per_weight']:.4f} | {r['error']:.5f} | "
              f"{r['max_error']:.5f} | {reach} | {types(r)} |")

    print("\n| run | tensor | K | type | bits/weight | added error | error / 2^-K | budget R·2^-K | "
          "predicted | measured (--measure-error) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    f = lambda v, p=5: "" if v is None else f"{v:.{p}f}"
    for r in results:
        for e in r["tensors"]:
            if e["type"] == "F32" and r["label"].startswith("f32"):
                continue
            print(f"| {r['label']} | {e['tensor']} | {e['k'] or ''} | {e['type']} | {e['bits_per_weight']:.4f} | "
                  f"{e['error']:.5f} | {f(e['reach'], 3)} | {f(e.get('budget'))} | {f(e.get('predicted'))} | "
                  f"{f(e.get('actual'))} |")
    print("\nproblems: " + ("none" if not problems else "\n  " + "\n  ".join(problems)))
    if args.json:
        json.dump({"results": results, "problems": problems}, open(args.json, "w"), indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
