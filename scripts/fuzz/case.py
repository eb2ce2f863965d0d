"""One case: copy a fixture, mutate it, convert it, and either judge the exit-0 output with its
client or hold any other outcome to the promise (exit 1, an `escha-convert: error:` message,
nothing left beside OUT)."""

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import process
from .cases import plan_case
from .checkpoint import Ck
from .judges import Case, judge_module
from .mutations import apply

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    i: int
    fixture: str = ""
    format: str = ""
    kinds: list = field(default_factory=list)
    status: object = None  # exit code, negative for a signal, or "timeout"
    loaded: bool = False  # the client accepted the output
    # Why non-finite logits are the mutated model's values, not the file (empty: they are not).
    overflow: str = ""
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    # What the client accepted but reported (keys it ignores): not failures.
    warnings: list = field(default_factory=list)
    mutations: list = field(default_factory=list)
    cmd: list = field(default_factory=list)
    stderr: str = ""
    client_cmd: list = field(default_factory=list)
    client_stderr: str = ""
    signature: str = ""
    seconds: float = 0.0  # the conversion
    client_seconds: float = 0.0  # the judge, as the client measured it
    client_cpu: float = 0.0  # the CPU time the client's worker spent on it
    judge_seconds: float = 0.0  # the judge, wall clock in the driver (reference conversions included)


def run_case(ctx, seed, i, formats, keep):
    rng, fixture, fmt, kinds, opts = plan_case(seed, i, formats)
    res = Result(i, fixture=fixture, format=fmt, kinds=kinds)
    case_dir = ctx.work / f"case-{i:04d}"
    src = case_dir / "in"
    shutil.copytree(REPO / "fixtures" / fixture, src)
    ck = Ck(src, fixture)
    res.mutations = [apply(ck, rng, k) for k in kinds]
    parent = case_dir / "outp"
    parent.mkdir()
    out = parent / "out"
    t0 = time.monotonic()
    res.cmd, rc, err = process.convert(ctx.binary, src, out, opts, ctx.timeout)
    res.seconds = time.monotonic() - t0
    res.status, res.stderr = rc, err
    if rc == "timeout":
        res.problems.append(f"escha-convert did not finish within {ctx.timeout:g} s")
        res.signature = "conversion timed out"
    elif rc < 0:
        res.problems.append(f"escha-convert died by {process.signame(rc)}")
        if "memory allocation" in err:
            res.notes.append(
                f"the run's address space is limited to {process.MEMORY_LIMIT >> 30} GiB (the fixtures need about 100 MiB)"
            )
        res.signature = f"conversion killed by {process.signame(rc)}: {process.first_error_line(err)}"
    elif rc == 1:
        if "escha-convert: error:" not in err:
            res.problems.append("exit 1 without an 'escha-convert: error:' message")
            res.signature = f"exit 1 without a message: {process.first_error_line(err)}"
        left = sorted(x.name for x in parent.iterdir())
        if left:
            res.problems.append(f"exit 1 left {left} beside OUT")
            res.signature = res.signature or "exit 1 left output behind"
    elif rc != 0:
        res.problems.append(f"escha-convert exited {rc}" + (" (a panic)" if rc == 101 else ""))
        sig = process.panic_message(err) or process.first_error_line(err, r"panicked|error")
        res.signature = f"conversion exit {rc}: {sig}"
    else:
        t0 = time.monotonic()
        judge_module(fmt).check(ctx, Case(i, src, opts, case_dir), res, out)
        res.judge_seconds = time.monotonic() - t0
    if not keep:
        shutil.rmtree(case_dir, ignore_errors=True)
    return res
