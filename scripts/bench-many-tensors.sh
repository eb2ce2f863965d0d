#!/usr/bin/env bash
# Tensor-count benchmark: a checkpoint of TENSORS tiny float16 tensors (and one coded linear, so
# that it is an Escha checkpoint) written by scripts/make_many_tensors.py, converted to bf16 and
# to --format mlx. The weights are negligible (0.2 GB), so the times are what planning, work
# units, writes and page releases cost per tensor. Prints wall, CPU (user + sys) and peak RSS of
# the median run of RUNS (by wall time), and of the plan alone (--dry-run).
#
#     bash scripts/bench-many-tensors.sh [TENSORS] [RUNS] [THREADS]    (default 400000 3 2)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-400000}
RUNS=${2:-3}
J=${3:-2}
DIR=${BENCH_DIR:-/tmp/escha-bench}
BIN=${ESCHA_CONVERT:-target/release/escha-convert}
[ -n "${ESCHA_CONVERT:-}" ] || cargo build --release --quiet
mkdir -p "$DIR"
[ -d "$DIR/many-$N" ] || python3 scripts/make_many_tensors.py "$DIR/many-$N" "$N"

median() { # label, command...: runs it RUNS times, prints the median by wall time
    local label=$1; shift
    for _ in $(seq "$RUNS"); do
        /usr/bin/time -f "%e %U %S %M" -o "$DIR/time.txt" "$@" > /dev/null
        cat "$DIR/time.txt"
    done | sort -n | awk -v label="$label" -v runs="$RUNS" 'NR == int((runs + 1) / 2) {
        printf "%-34s %7.2f s wall %7.2f s CPU (%.2f user + %.2f sys) %7.0f MiB\n", label, $1, $2 + $3, $2, $3, $4 / 1024 }'
}

echo "$(find "$DIR/many-$N" -name '*.safetensors' | wc -l) shards, $(du -sm "$DIR/many-$N" | cut -f1) MB, -j$J, median of $RUNS"
median "plan only (--dry-run --json)" $BIN "$DIR/many-$N" "$DIR/many-out" -j "$J" --force --dry-run --json
median "escha-convert bf16" $BIN "$DIR/many-$N" "$DIR/many-out" -j "$J" --force --quiet
median "escha-convert --format mlx" $BIN "$DIR/many-$N" "$DIR/many-out" -j "$J" --force --quiet --format mlx
rm -rf "$DIR/many-out"
