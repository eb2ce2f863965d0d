"""A judge worker: `python -m scripts.fuzz.judges.serve CLIENT` imports the client of judge CLIENT
once (its module's `Worker`), says {"ready": true}, then answers each JSON request line on stdin
with one JSON verdict line on stdout. The libraries' own prints go to stderr, so stdout carries
only the protocol. An exception the client raises on an output is a verdict (the client refused
it), not the worker's end."""

import json
import os
import sys
import time
import traceback

from . import judge_module


def refusal(client, e):
    """The verdict for an exception the client raised: its type and first line, and where."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()] or [""]
    # A message that ends its first line with a colon says what on the next one.
    first = " ".join(lines[:2] if lines[0].endswith(":") else lines[:1])[:300]
    frames = traceback.extract_tb(e.__traceback__)
    where = next(
        (f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(frames) if "scripts/fuzz" not in f.filename),
        "",
    )
    return {
        "problem": f"{client} raised {type(e).__name__} at {where}: {first}",
        "signature": f"{client} raised {type(e).__name__} at {where}: {first[:160]}",
        "detail": "".join(traceback.format_exception(e))[-3000:],
    }


def main():
    client = sys.argv[1]
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    t0 = time.monotonic()
    try:
        worker = judge_module(client).Worker()
    except Exception as e:  # the client cannot be imported here: the run cannot judge this format
        protocol.write(json.dumps({"ready": False, "problem": f"{type(e).__name__}: {e}"}) + "\n")
        protocol.flush()
        return 1
    protocol.write(json.dumps({"ready": True, "seconds": time.monotonic() - t0}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        request = json.loads(line)
        t0, cpu0 = time.monotonic(), time.process_time()
        try:
            verdict = worker.judge(request)
        except Exception as e:
            verdict = refusal(client, e)
        verdict["seconds"] = time.monotonic() - t0
        verdict["cpu"] = time.process_time() - cpu0
        protocol.write(json.dumps(verdict) + "\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
