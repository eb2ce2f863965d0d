"""The driver: arguments, the judges' workers, the cases run a few at a time, the report."""

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import report
from .case import REPO, run_case
from .cases import FORMATS
from .judges import Context, judge_module
from .judges.workers import Pool, WorkerGone
from .mutations import kind_order

DEFAULT_SEED = 20240611
# A case takes about 0.22 s of CPU (conversions and llama_logits 0.17 s, the client workers 0.04 s,
# the driver 0.01 s; 400 cases took 86 CPU-seconds): 2000 cases are about 5 minutes on two cores.
DEFAULT_CASES = 2000
DEFAULT_TIMEOUT = 30
# A run stops starting cases after this many timeouts.
MAX_TIMEOUTS = 10
PYTHON_CLIENTS = ("bf16", "mlx", "exl3")


def parse(argv):
    from . import __doc__ as doc

    ap = argparse.ArgumentParser(
        prog="python -m scripts.fuzz",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--cases", type=int, default=DEFAULT_CASES, help=f"number of cases (default {DEFAULT_CASES})")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"run seed (default {DEFAULT_SEED})")
    ap.add_argument("--only", help="run only these case numbers (comma-separated)")
    ap.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help=f"the output formats the cases draw from, comma-separated (default {','.join(FORMATS)})",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="cases run at once (default: the cores, at most 4)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per conversion and per judge (default {DEFAULT_TIMEOUT})",
    )
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    ap.add_argument(
        "--bin",
        default=str(Path(target) / "debug" / "escha-convert"),
        help="the escha-convert binary (default: cargo test's)",
    )
    ap.add_argument(
        "--llama-bin",
        default=os.environ.get("ESCHA_LLAMA_BIN"),
        help="the directory holding llama_logits (default $ESCHA_LLAMA_BIN)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the case directories (their parent is printed)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    ap.add_argument("--list-kinds", action="store_true", help="print the mutation kinds in this seed's order and exit")
    return ap.parse_args(argv)


def say(msg):
    print(f"fuzz: {msg}", file=sys.stderr, flush=True)


def main(argv=None):
    args = parse(argv)
    if args.list_kinds:
        print("\n".join(f"{i}: {k}" for i, k in enumerate(kind_order(args.seed))))
        return 0
    formats = tuple(f for f in args.formats.split(",") if f)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        say(f"--formats takes some of {', '.join(FORMATS)}, not {args.formats!r}")
        return 2
    try:
        cases = [int(x) for x in args.only.split(",")] if args.only else list(range(args.cases))
    except ValueError:
        say(f"--only takes case numbers separated by commas, not {args.only!r}")
        return 2
    if not Path(args.bin).is_file():
        say(f"no escha-convert binary at {args.bin} (cargo test builds it; or pass --bin)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="escha-fuzz-"))
    ctx = Context(str(Path(args.bin).resolve()), args.timeout, args.llama_bin, work)
    for f in formats:
        why = judge_module(f).available(ctx)
        if why:
            say(f"cannot judge {f}: {why}")
            return 2
    try:
        return run(args, ctx, formats, cases)
    finally:
        for pool in ctx.pools.values():
            pool.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def start_workers(args, ctx, formats):
    """One worker per Python client, started before the cases: a client that cannot be imported
    stops the run here, and the startup cost is measured apart from the cases."""
    for f in formats:
        if f in PYTHON_CLIENTS:
            pool = ctx.pools[f] = Pool(f, args.jobs, ctx.work)
            pool.release(pool.acquire())
            say(f"{f} worker ready in {pool.startup_seconds[0]:.1f} s")


def cpu_since(start):
    """CPU seconds of the driver and of its reaped children (conversions, llama_logits), since
    `start` (another such dict) or in all."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    now = {"driver": own.ru_utime + own.ru_stime, "children": children.ru_utime + children.ru_stime}
    return {k: v - (start[k] if start else 0.0) for k, v in now.items()}


def run(args, ctx, formats, cases):
    if args.keep:
        say(f"case directories kept in {ctx.work}")
    say(
        f"{len(cases)} cases, seed {args.seed}, formats {','.join(formats)}, {len(kind_order(args.seed))} mutation kinds, {args.jobs} at a time"
    )
    t0 = time.monotonic()
    try:
        start_workers(args, ctx, formats)
    except WorkerGone as e:
        say(f"cannot judge: {e}")
        return 2
    say(f"workers started in {time.monotonic() - t0:.0f} s")
    t0, cpu0 = time.monotonic(), cpu_since(None)
    results, timeouts = [], []
    lock = threading.Lock()

    def one(i):
        if len(timeouts) >= MAX_TIMEOUTS:
            return None  # something hangs everywhere: stop rather than wait out every case
        r = run_case(ctx, args.seed, i, formats, args.keep)
        with lock:
            results.append(r)
            if "timed out" in r.signature:
                timeouts.append(r.i)
            if r.problems:
                say(f"case {r.i} ({r.format}) FAILED: {r.signature[:200]}")
            elif args.verbose:
                from .process import first_error_line

                got = "loaded" if r.loaded else r.overflow or f"exit {r.status}: {first_error_line(r.stderr)[:160]}"
                say(
                    f"case {r.i} ({r.fixture}, {r.format}, {r.seconds:.1f} + {r.judge_seconds:.1f} s): "
                    f"{' | '.join(r.mutations)[:240]} [{' '.join(map(str, r.cmd[3:-2]))}] -> {got}"
                )
            elif len(results) % 50 == 0:
                say(f"{len(results)} of {len(cases)} cases done ({time.monotonic() - t0:.0f} s)")
        return r

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, cases))
    results.sort(key=lambda r: r.i)
    failed = [r for r in results if r.problems]
    if failed:
        print(f"\nfuzz: {len(failed)} failing cases\n")
        for r in failed:
            print(report.case_report(r, report.reproduce(r, args.seed, formats, FORMATS)) + "\n")
    if len(results) < len(cases):
        print(
            f"fuzz: stopped after {len(timeouts)} timeouts (cases {report.ids(timeouts)}): {len(cases) - len(results)} cases not run"
        )
    for line in report.summary(results, ctx.work, formats, time.monotonic() - t0, cpu_since(cpu0)):
        print(line)
    return 1 if failed or len(results) < len(cases) else 0
