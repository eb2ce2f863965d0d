#!/usr/bin/env bash
# verify against conversion on a synthetic checkpoint (examples/make_synthetic.rs): the bf16
# conversion, --format mlx and `verify` on whole tensors, all on one thread, run RUNS times
# alternating; prints the median wall time, CPU time (user + sys), CPU ns per weight and peak RSS
# of each, then verify's peak RSS on one layer against all of them.
#
#     bash scripts/bench-verify.sh [GB_OF_CODES] [RUNS] [BINARY...]
#
# Defaults: 0.45 GB of codes (6 layers, 1.6 G weights; ~15x that of disk), 3 runs, this tree's
# release build. Several binaries (say an older commit's build and this one) are timed in turn
# within each run, on the same files. BASE is the bf16 decode of the checkpoint itself, so verify
# reports ratios below 1 ("compared with itself") and exits 1; the work is that of a real base.
set -euo pipefail
cd "$(dirname "$0")/.."
GB=${1:-0.45}
RUNS=${2:-3}
BINS=("${@:3}")
[ ${#BINS[@]} -gt 0 ] || BINS=(target/release/escha-convert)
DIR=${BENCH_DIR:-/tmp/escha-bench}/verify-$GB
cargo build --release --quiet --example make_synthetic
cargo build --release --quiet
mkdir -p "$DIR"
[ -d "$DIR/synth" ] || target/release/examples/make_synthetic "$DIR/synth" "$GB"
[ -d "$DIR/base" ] || target/release/escha-convert "$DIR/synth" "$DIR/base" -j 1 --quiet
WEIGHTS=$(target/release/escha-convert "$DIR/synth" "$DIR/out" --dry-run --json --force |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["weights"])')
TIMES="$DIR/times.txt"
: > "$TIMES"

run() { # binary index, label, command...: appends "index label wall user sys rss_kb" to $TIMES
    local at="$1 $2"; shift 2
    /usr/bin/time -f "$at %e %U %S %M" -a -o "$TIMES" "$@" > /dev/null || [ $? -eq 1 ] # verify: 1 here
}

for _ in $(seq "$RUNS"); do
    for b in "${!BINS[@]}"; do
        bin=${BINS[$b]}
        run "$b" bf16 "$bin" "$DIR/synth" "$DIR/out" -j 1 --quiet --force
        run "$b" mlx "$bin" "$DIR/synth" "$DIR/out" -j 1 --quiet --force --format mlx
        run "$b" verify "$bin" verify "$DIR/synth" --base "$DIR/base" -j 1 --json
    done
done
for b in "${!BINS[@]}"; do
    run "$b" verify-one-layer "${BINS[$b]}" verify "$DIR/synth" --base "$DIR/base" -j 1 --json --only '*layers.0.*'
done
rm -rf "$DIR/out"

python3 - "$TIMES" "$WEIGHTS" "${BINS[@]}" <<'PY'
import statistics, sys
times, weights, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for line in open(times):
    if line.startswith("Command"):  # /usr/bin/time's note of verify's exit status
        continue
    b, label, wall, user, sys_, rss = line.split()
    rows.setdefault((int(b), label), []).append((float(wall), float(user), float(sys_), int(rss)))
runs = len(rows[(0, "bf16")])
print(f"{weights / 1e9:.3f} G weights, one thread, median of {runs} alternated runs")
print("| binary | run | CPU (user + sys) | wall | CPU ns/weight | peak RSS |")
print("|---|---|---|---|---|---|")
for b, name in enumerate(bins):
    cpu = {}
    for label in ("bf16", "mlx", "verify"):
        r = rows[(b, label)]
        med = lambda f: statistics.median(f(x) for x in r)
        cpu[label] = med(lambda x: x[1] + x[2])
        print(f"| {name} | {label} | {cpu[label]:.2f} s ({med(lambda x: x[1]):.2f} + {med(lambda x: x[2]):.2f}) "
              f"| {med(lambda x: x[0]):.2f} s | {cpu[label] / weights * 1e9:.2f} | {med(lambda x: x[3]) / 1024:.0f} MiB |")
    one = rows[(b, "verify-one-layer")][0][3] / 1024
    print(f"|  | verify / bf16 CPU {cpu['verify'] / cpu['bf16']:.2f}x; verify peak RSS {one:.0f} MiB on "
          f"layer 0 only, {max(x[3] for x in rows[(b, 'verify')]) / 1024:.0f} MiB on all | | | | |")
PY
