#!/usr/bin/env bash
# --format gguf against the bf16 conversion on a synthetic checkpoint (examples/make_synthetic.rs:
# 27B-width MLP layers), one thread, RUNS runs alternated; then the two-step path it replaces, the
# bf16 conversion followed by llama.cpp's convert_hf_to_gguf.py, timed once. Prints the median wall
# time, CPU time (user + sys), CPU ns per weight and peak RSS of each.
#
#     bash scripts/bench-gguf.sh [GB_OF_CODES] [RUNS]
#
# Defaults: 0.45 GB of codes (6 layers, 1.6 G weights), 3 runs. The converter comes from the
# llama.cpp that scripts/llama-cpp.sh caches; it runs under the repository's .venv (torch, numpy).
# The synthetic checkpoint has no tokenizer: ours runs with --gguf-vocab none, and the converter
# gets the dense fixture's tokenizer files copied beside the bf16 output (a 256-token vocabulary,
# negligible next to the weights).
set -euo pipefail
cd "$(dirname "$0")/.."
GB=${1:-0.45}
RUNS=${2:-3}
BIN=target/release/escha-convert
DIR=${BENCH_DIR:-/tmp/escha-bench}/gguf-$GB
cargo build --release --quiet --example make_synthetic
cargo build --release --quiet
bash scripts/llama-cpp.sh
# shellcheck disable=SC1090
. "$(bash scripts/llama-cpp.sh --print-env)"
mkdir -p "$DIR"
[ -d "$DIR/synth" ] || target/release/examples/make_synthetic "$DIR/synth" "$GB"
WEIGHTS=$($BIN "$DIR/synth" "$DIR/out" --dry-run --json --force |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["weights"])')
TIMES="$DIR/times.txt"
: >"$TIMES"

run() { # label, command...: appends "label wall user sys rss_kb" to $TIMES
    local label=$1
    shift
    /usr/bin/time -f "$label %e %U %S %M" -a -o "$TIMES" "$@" >/dev/null
}

for _ in $(seq "$RUNS"); do
    run bf16 $BIN "$DIR/synth" "$DIR/out" -j 1 --quiet --force
    run gguf-bf16 $BIN "$DIR/synth" "$DIR/out" -j 1 --quiet --force --format gguf --gguf-vocab none
    run gguf-q8_0 $BIN "$DIR/synth" "$DIR/out" -j 1 --quiet --force --format gguf --gguf-vocab none --gguf-type q8_0
done
# The two-step path, once: bf16 safetensors, then llama.cpp's converter (all its threads).
rm -rf "$DIR/out" "$DIR/hf" "$DIR/ref.gguf"
run two-step-1-bf16 $BIN "$DIR/synth" "$DIR/hf" -j 1 --quiet
cp fixtures/dense/tokenizer.json fixtures/dense/tokenizer_config.json "$DIR/hf/"
run two-step-2-converter .venv/bin/python "$ESCHA_LLAMA_CPP/convert_hf_to_gguf.py" "$DIR/hf" --outtype bf16 \
    --outfile "$DIR/ref.gguf"
rm -rf "$DIR/hf" "$DIR/ref.gguf"

python3 - "$TIMES" "$WEIGHTS" <<'PY'
import statistics, sys
times, weights = sys.argv[1], int(sys.argv[2])
rows = {}
for line in open(times):
    label, wall, user, sys_, rss = line.split()
    rows.setdefault(label, []).append((float(wall), float(user), float(sys_), int(rss)))
print(f"{weights / 1e9:.3f} G weights; escha-convert on one thread, median of {len(rows['bf16'])} alternated runs")
print("| run | CPU (user + sys) | wall | CPU ns/weight | peak RSS |")
print("|---|---|---|---|---|")
cpu = {}
for label, r in rows.items():
    med = lambda f: statistics.median(f(x) for x in r)
    cpu[label] = med(lambda x: x[1] + x[2])
    print(f"| {label} | {cpu[label]:.2f} s ({med(lambda x: x[1]):.2f} + {med(lambda x: x[2]):.2f}) "
          f"| {med(lambda x: x[0]):.2f} s | {cpu[label] / weights * 1e9:.2f} | {med(lambda x: x[3]) / 1024:.0f} MiB |")
for label in ("gguf-bf16", "gguf-q8_0"):
    print(f"{label} / bf16 CPU: {cpu[label] / cpu['bf16']:.2f}x")
two = cpu["two-step-1-bf16"] + cpu["two-step-2-converter"]
print(f"two-step CPU {two:.2f} s = {two / cpu['gguf-bf16']:.2f}x gguf-bf16's")
PY
