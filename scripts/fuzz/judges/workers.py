"""Long-lived judge workers, driver side: a pool per client of `python -m scripts.fuzz.judges.serve
CLIENT` processes, each importing its client once and then judging one output directory per
request (a JSON line in, a JSON line out).

A pool starts a worker when every started one is busy, up to the number of cases run at once. A
worker runs in its own process group under an address-space limit; one that does not answer in
time is killed with its group, and one that dies (a signal, an abort) is replaced: either is the
client failing on that output, reported as such.
"""

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .. import process

REPO = Path(__file__).resolve().parents[3]
# torch alone maps about 3 GiB of address space on import; a client that tries to allocate far more
# for these fixtures fails inside the worker (and says so) instead of taking the machine's memory.
WORKER_MEMORY_LIMIT = 10 << 30
# Importing torch, transformers or mlx on a busy machine.
STARTUP_TIMEOUT = 300


class WorkerGone(Exception):
    """The worker died or did not answer in time; its reason says which."""


class Worker:
    def __init__(self, client, log):
        self.client = client
        self.log = log
        self.buffer = b""

        cmd = [sys.executable, "-m", "scripts.fuzz.judges.serve", client]
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                ["/bin/sh", "-c", f'ulimit -v {WORKER_MEMORY_LIMIT >> 10} && exec "$@"', "sh", *cmd],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                env=dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false"),
            )
        t0 = time.monotonic()
        hello = self.read(STARTUP_TIMEOUT)
        self.startup = time.monotonic() - t0
        if not hello.get("ready"):
            self.kill()
            raise WorkerGone(f"the {client} worker did not start: {hello.get('problem', hello)}")

    def read(self, timeout):
        """The next JSON line from the worker, or WorkerGone."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                raise WorkerGone(f"the {self.client} worker did not answer within {timeout:g} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                rc = self.proc.wait()
                what = process.signame(rc) if rc < 0 else f"exit {rc}"
                raise WorkerGone(f"the {self.client} worker died ({what}): {self.log_tail()}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def ask(self, request, timeout):
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerGone(f"the {self.client} worker is gone ({e}): {self.log_tail()}") from None
        return self.read(timeout)

    def log_tail(self):
        try:
            lines = Path(self.log).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(x.strip() for x in lines[-3:])[:400]

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


class Pool:
    """Workers of one client, started on demand up to `size`."""

    def __init__(self, client, size, work):
        self.client = client
        self.size = max(1, size)
        self.work = work
        self.idle = []
        self.started = 0
        self.live = 0
        self.startup_seconds = []
        self.cond = threading.Condition()

    def acquire(self):
        with self.cond:
            while not self.idle and self.live >= self.size:
                self.cond.wait()
            if self.idle:
                return self.idle.pop()
            self.live += 1
            self.started += 1
            n = self.started
        try:
            w = Worker(self.client, self.work / f"worker-{self.client}-{n}.log")
        except BaseException:
            with self.cond:
                self.live -= 1
                self.cond.notify()
            raise
        self.startup_seconds.append(w.startup)
        return w

    def release(self, worker):
        with self.cond:
            if worker is None:
                self.live -= 1
            else:
                self.idle.append(worker)
            self.cond.notify()

    def request(self, request, timeout):
        """The worker's verdict on `request`; a worker that fails to start, dies or hangs gives a
        verdict saying so (a problem), and is replaced for the next request."""
        try:
            worker = self.acquire()
        except WorkerGone as e:
            return {"problem": str(e), "signature": f"{self.client} worker did not start", "startup": True}
        try:
            reply = worker.ask(request, timeout)
        except WorkerGone as e:
            worker.kill()
            self.release(None)
            msg = str(e)
            sig = f"{self.client} timed out" if "did not answer" in msg else f"{self.client} worker died"
            if "died (" in msg:
                sig += " " + msg.split("died (", 1)[1].split(")", 1)[0]
            return {"problem": msg, "signature": sig}
        self.release(worker)
        return reply

    def close(self):
        with self.cond:
            idle, self.idle = self.idle, []
        for w in idle:
            w.close()


def judge_in_worker(ctx, client, res, request):
    """Asks a worker of `client` for its verdict on `request` and records it on the case's result."""
    verdict = ctx.pools[client].request(request, ctx.timeout)
    res.client_seconds = verdict.get("seconds", 0.0)
    res.client_cpu = verdict.get("cpu", 0.0)
    res.notes += verdict.get("notes", [])
    res.warnings += verdict.get("warnings", [])
    if verdict.get("problem"):
        res.problems.append(verdict["problem"])
        res.signature = verdict["signature"]
        res.client_stderr = verdict.get("detail", "")
    elif verdict.get("overflow"):
        res.overflow = verdict["overflow"]
    else:
        res.loaded = True
