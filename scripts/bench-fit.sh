#!/usr/bin/env bash
# `--max-size` against the fixed-type conversion of the same size: CPU and wall of each, and what
# the budget bought (the largest and mean added-error ratio of the coded linears). MLX: against
# `--bits 3`, the budget set to that output's size; GGUF: against `--gguf-type q4_k`, likewise.
#
#     bash scripts/bench-fit.sh [LAYERS] [VOCAB] [RUNS]    (defaults 64, 248320 and 1)
#
# The defaults are the 27B's shape (scripts/make-synthetic-27b.sh, about 28 GB of input and as
# much again of output under BENCH_DIR, default /tmp/escha-fit); `bash scripts/bench-fit.sh 2 4096`
# is a sanity run of the same steps in a few minutes. Keeps the checkpoint and the JSON reports.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS=${1:-64}
VOCAB=${2:-248320}
RUNS=${3:-1}
DIR=${BENCH_DIR:-/tmp/escha-fit}
BIN=target/release/escha-convert
cargo build --release --quiet
mkdir -p "$DIR"
SYN=$DIR/synth-$LAYERS-$VOCAB
[ -d "$SYN" ] || bash scripts/make-synthetic-27b.sh "$SYN" "$LAYERS" "$VOCAB"
OUT=$DIR/out
TIMES=$DIR/times.tsv
: > "$TIMES"

measure() { # label, command...: stdout to $DIR/last.json; appends label, wall, user, sys, RSS KiB
    local label=$1; shift
    /usr/bin/time -f "%e %U %S %M" -o "$DIR/time.txt" "$@" > "$DIR/last.json"
    printf "%s\t%s\n" "$label" "$(tr ' ' '\t' < "$DIR/time.txt")" >> "$TIMES"
}

size_of() { # bytes of the model files in OUT
    find "$OUT" -maxdepth 1 \( -name '*.safetensors' -o -name '*.gguf' \) -printf '%s\n' | awk '{s += $1} END {print s}'
}

for i in $(seq "$RUNS"); do
    measure "mlx --bits 3" $BIN "$SYN" "$OUT" --format mlx --bits 3 --force --quiet --json
    cp "$DIR/last.json" "$DIR/mlx-fixed.json"
    MLX_SIZE=$(size_of); rm -rf "$OUT"
    measure "mlx --max-size $MLX_SIZE" $BIN "$SYN" "$OUT" --format mlx --max-size "$MLX_SIZE" --force --quiet --json
    cp "$DIR/last.json" "$DIR/mlx-fit.json"; rm -rf "$OUT"
    measure "gguf --gguf-type q4_k" $BIN "$SYN" "$OUT" --format gguf --gguf-vocab none --gguf-type q4_k --force --quiet --json
    cp "$DIR/last.json" "$DIR/gguf-fixed.json"
    GGUF_SIZE=$(size_of); rm -rf "$OUT"
    measure "gguf --max-size $GGUF_SIZE" $BIN "$SYN" "$OUT" --format gguf --gguf-vocab none --max-size "$GGUF_SIZE" --force --quiet --json
    cp "$DIR/last.json" "$DIR/gguf-fit.json"; rm -rf "$OUT"
done

python3 - "$DIR" <<'PY'
import json, statistics, sys
d = sys.argv[1]
times = {}
for line in open(f"{d}/times.tsv"):
    label, wall, user, sys_, rss = line.rstrip("\n").split("\t")
    times.setdefault(label, []).append((float(wall), float(user) + float(sys_), int(rss)))
print("| run | wall, median | CPU (user + sys), median | peak RSS | bytes written |")
print("|---|---|---|---|---|")
med = {}
for label, runs in times.items():
    m = [statistics.median(x[i] for x in runs) for i in range(3)]
    med[label] = m
    fmt, kind = label.split()[0], ("fit" if "--max-size" in label else "fixed")
    written = json.load(open(f"{d}/{fmt}-{kind}.json"))["bytes_written"]
    print(f"| `{label}` | {m[0]:.1f} s | {m[1]:.1f} s | {m[2] / 1024:.0f} MiB | {written:,} |")
for fmt in ("mlx", "gguf"):
    fixed = next(v for k, v in med.items() if k.startswith(fmt) and "--max-size" not in k)
    fit = next(v for k, v in med.items() if k.startswith(fmt) and "--max-size" in k)
    b = json.load(open(f"{d}/{fmt}-fit.json"))["budget"]
    print(f"{fmt}: --max-size costs {fit[1] / fixed[1]:.2f}x the CPU and {fit[0] / fixed[0]:.2f}x the wall of the "
          f"fixed type; largest ratio {b['max_added_error_ratio']:.3f}, mean {b['mean_added_error_ratio']:.3f}")
PY
