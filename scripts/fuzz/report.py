"""What a run prints: one block per failing case (with the command that reproduces it), failures
classed by signature, by format and by mutation kind, the cases listed apart (overflow, client
warnings), the cost of a case per format, and the closing counts."""

import re
from collections import Counter, defaultdict

from . import process


def normalise(sig, work):
    sig = sig.replace(str(work), "")
    sig = re.sub(r"/case-\d+/(in|outp/out)", "<\\1>", sig)
    sig = re.sub(r"(?<![A-Za-z_\d])\d+", "N", sig)  # counts and block numbers, not f32 or conv1d
    sig = re.sub(r"\s+", " ", sig)
    return sig[:200]


def reproduce(res, seed, formats, default_formats):
    fmts = "" if tuple(formats) == tuple(default_formats) else f" --formats {','.join(formats)}"
    return f"python -m scripts.fuzz --seed {seed}{fmts} --only {res.i} --keep"


def case_report(res, repro):
    lines = [f"case {res.i} ({res.fixture}, {res.format}; reproduce: {repro})"]
    lines += [f"  mutation: {m}" for m in res.mutations]
    lines.append(f"  command: {' '.join(map(str, res.cmd))}")
    lines.append(f"  exit status: {res.status}")
    lines += [f"  problem: {p}" for p in res.problems]
    lines += [f"  note: {n}" for n in res.notes]
    lines += [f"  warning: {w}" for w in res.warnings]
    err = process.tail(res.stderr)
    if err:
        lines.append("  escha-convert stderr:")
        lines += [f"    {x}" for x in err]
    if res.client_cmd:
        lines.append(f"  client command: {' '.join(map(str, res.client_cmd))}")
    if res.client_stderr:
        lines.append("  client output:")
        lines += [f"    {x}" for x in process.tail(res.client_stderr, 6)]
    return "\n".join(lines)


def ids(xs, n=12):
    return ", ".join(map(str, xs[:n])) + (" …" if len(xs) > n else "")


def summary(results, work, formats, elapsed, cpu):
    """The lines after the failing cases: classes, tables, listed-apart cases, costs."""
    lines = []
    failed = [r for r in results if r.problems]
    if failed:
        classes = defaultdict(list)
        for r in failed:
            classes[f"[{r.format}] {normalise(r.signature, work)}"].append(r.i)
        lines.append(f"fuzz: {len(classes)} kinds of failure:")
        for sig, xs in sorted(classes.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"  {len(xs)} x {sig} (cases {ids(xs)})")
        by_kind = defaultdict(Counter)
        for r in failed:
            for k in r.kinds:
                by_kind[k][r.format] += 1
        lines.append("fuzz: failing cases by mutation kind (a case with two kinds counts under both):")
        for k, c in sorted(by_kind.items(), key=lambda kv: -sum(kv[1].values())):
            lines.append(f"  {k}: " + ", ".join(f"{f} {c[f]}" for f in formats if c[f]))
    for why in sorted({r.overflow for r in results if r.overflow}):
        xs = [r.i for r in results if r.overflow == why]
        lines.append(
            f"fuzz: {len(xs)} exit-0 outputs gave non-finite logits from the mutated model's values, not the "
            f"file ({why}; not failures): cases {ids(xs, 40)}"
        )
    warned = [r for r in results if r.warnings and not r.problems]
    if warned:
        lines.append(
            f"fuzz: {len(warned)} accepted outputs hold tensors their client ignores (not failures): "
            f"cases {ids([r.i for r in warned], 40)}"
        )
    lines.append(
        "fuzz: per format: cases, exit 0, exit 1, loaded, overflow, failures; mean conversion and judge seconds"
    )
    for f in formats:
        rs = [r for r in results if r.format == f]
        if not rs:
            continue
        judged = [r for r in rs if r.status == 0]
        conv = sum(r.seconds for r in rs) / len(rs)
        judge = sum(r.judge_seconds for r in judged) / len(judged) if judged else 0.0
        client = sum(r.client_cpu for r in judged) / len(judged) if judged else 0.0
        lines.append(
            f"  {f}: {len(rs)}, {sum(r.status == 0 for r in rs)}, {sum(r.status == 1 for r in rs)}, "
            f"{sum(r.loaded for r in rs)}, {sum(bool(r.overflow) for r in rs)}, {sum(bool(r.problems) for r in rs)}; "
            f"{conv:.2f} s, {judge:.2f} s" + (f" (client CPU {client:.2f} s)" if client else "")
        )
    workers = sum(r.client_cpu for r in results)
    total = cpu["children"] + cpu["driver"] + workers
    lines.append(
        f"fuzz: {elapsed:.0f} s; CPU {total:.0f} s ({total / max(1, len(results)):.2f} s a case): conversions and "
        f"llama_logits {cpu['children']:.0f} s, client workers {workers:.0f} s, driver {cpu['driver']:.0f} s"
    )
    n0 = sum(r.status == 0 for r in results)
    n1 = sum(r.status == 1 for r in results)
    loaded = sum(r.loaded for r in results)
    lines.append(f"fuzz: cases {len(results)}, exit 0 {n0}, exit 1 {n1}, loaded {loaded}, failures {len(failed)}")
    return lines
