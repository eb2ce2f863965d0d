"""Child processes under limits, and what their stderr says: each runs in its own process group
with a limited address space, and is killed with its group on timeout."""

import os
import re
import signal
import subprocess

# The address space a conversion or llama_logits run may take: the fixtures need about 100 MiB,
# and a run that tries to allocate gigabytes for them fails here instead of taking the machine's memory.
MEMORY_LIMIT = 2 << 30
# A panic's stderr is its location and message, without a backtrace.
CONVERT_ENV = dict(os.environ, RUST_BACKTRACE="0")


def useful_lines(text):
    """stderr without progress lines, llama.cpp's "unused tensor" warnings and gdb chatter."""
    skip = re.compile(r"% written|unused tensor|^\s*$")
    return [x for x in text.splitlines() if not skip.search(x)]


def tail(text, lines=8):
    ls = useful_lines(text)
    errs = [x for x in ls[:-lines] if re.search(r"error|warning|panick|assert", x, re.I)][:3]
    if panic_message(text) and not any("panicked" in x for x in ls[-lines:]):
        errs.append(panic_message(text))
    return [x[:400] for x in errs + ls[-lines:]]


def first_error_line(text, pattern=r"error|fail|panick|assert|abort|not below|exception|invalid|unable"):
    lines = useful_lines(text)
    for x in lines:
        if re.search(pattern, x, re.I):
            return x.strip()
    return lines[-1].strip() if lines else ""


def panic_message(text):
    """A Rust panic's "panicked at FILE:LINE:COL: MESSAGE", or ""."""
    m = re.search(r"panicked at (\S+):\n?(.*)", text)
    return f"panicked at {m.group(1)} {m.group(2).strip()}" if m else ""


def run_killable(cmd, timeout, env=None):
    """Runs cmd in its own process group, its address space limited to MEMORY_LIMIT (an allocation
    past it fails, and the program says so), and kills that group on timeout: (rc or "timeout", stderr)."""
    limited = ["/bin/sh", "-c", f'ulimit -v {MEMORY_LIMIT >> 10} && exec "$@"', "sh", *map(str, cmd)]
    p = subprocess.Popen(limited, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
    try:
        _, err = p.communicate(timeout=timeout)
        return p.returncode, err.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, err = p.communicate()
        return "timeout", err.decode("utf-8", "replace")


def signame(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def convert(binary, src, out, opts, timeout):
    """escha-convert SRC OUT OPTS -j 1 under the limits: (command, rc or "timeout", stderr)."""
    cmd = [binary, src, out, *opts, "-j", "1"]
    rc, err = run_killable(cmd, timeout, CONVERT_ENV)
    return cmd, rc, err
