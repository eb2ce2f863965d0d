#!/usr/bin/env bash
# `--max-size` against the fixed recipes of the same size: CPU and wall of each, and what the
# budget bought (the largest and mean added-error ratio of the coded linears, as reported). Pairs:
# MLX `--bits 3`, GGUF `--gguf-type q4_k` and `q3_k_m`, each followed by `--max-size` set to that
# output's size; then `--max-size SIZE` in both formats, and the README's other rows (`--format
# exl3`, MLX 4-bit and `--bits auto`, `--gguf-type q4_k_m`). With CLIENTS=1 the SIZE outputs are
# also read back: mlx-lm loads the MLX one strictly and runs 4 tokens (minutes on a CPU), llama.cpp
# (scripts/llama-cpp.sh's) evaluates the GGUF one; both must give finite logits.
#
#     bash scripts/bench-fit.sh [LAYERS] [VOCAB] [RUNS] [SIZE]    (defaults 64, 248320, 1, 11GB)
#
# The defaults are the dense 27B's shape (scripts/make-synthetic-27b.sh: 10.3 GB of input under
# BENCH_DIR, default /tmp/escha-fit, and up to 18 GB of output at a time); `bash
# scripts/bench-fit.sh 4 4096 1 600MB` is a sanity run of the same steps in a few minutes (four
# layers: llama.cpp needs both kinds of attention layer). Keeps the checkpoint and the JSON reports.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS=${1:-64}
VOCAB=${2:-248320}
RUNS=${3:-1}
SIZE=${4:-11GB}
DIR=${BENCH_DIR:-/tmp/escha-fit}
BIN=target/release/escha-convert
cargo build --release --quiet
mkdir -p "$DIR"
SYN=$DIR/synth-$LAYERS-$VOCAB
[ -d "$SYN" ] || bash scripts/make-synthetic-27b.sh "$SYN" "$LAYERS" "$VOCAB"
OUT=$DIR/out
TIMES=$DIR/times.tsv
: > "$TIMES"

measure() { # name, command...: the JSON report to $DIR/NAME.json; appends name, wall, user, sys, RSS KiB
    local name=$1; shift
    /usr/bin/time -f "%e %U %S %M" -o "$DIR/time.txt" "$@" > "$DIR/$name.json"
    printf "%s\t%s\n" "$name" "$(tr ' ' '\t' < "$DIR/time.txt")" >> "$TIMES"
}

convert() { # name, flags...
    local name=$1; shift
    measure "$name" $BIN "$SYN" "$OUT" --force --quiet --json "$@"
}

size_of() { # bytes of the model files in OUT
    find "$OUT" -maxdepth 1 \( -name '*.safetensors' -o -name '*.gguf' \) -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}'
}

GGUF=(--format gguf --gguf-vocab none)
for i in $(seq "$RUNS"); do
    for fixed in "mlx:--format mlx --bits 3" "gguf-q4_k:${GGUF[*]} --gguf-type q4_k" "gguf-q3_k_m:${GGUF[*]} --gguf-type q3_k_m"; do
        name=${fixed%%:*}
        read -ra flags <<< "${fixed#*:}"
        convert "$name" "${flags[@]}"
        size=$(size_of)
        rm -rf "$OUT"
        # The same format flags, the fixed choice replaced by the budget.
        convert "$name-fit" "${flags[@]:0:${#flags[@]}-2}" --max-size "$size"
        rm -rf "$OUT"
    done
    convert "mlx-$SIZE" --format mlx --max-size "$SIZE"
    [ "${CLIENTS:-0}" = 1 ] && .venv/bin/python - "$OUT" <<'PY'
import pathlib, sys
import mlx.core as mx, mlx_lm.utils, numpy as np
model, _ = mlx_lm.utils.load_model(pathlib.Path(sys.argv[1]), strict=True)
y = np.array(model(mx.array([[1, 2, 3, 4]])).astype(mx.float32))
assert np.isfinite(y).all(), "mlx-lm: logits not finite"
print(f"mlx-lm: loaded strictly, logits {y.shape} finite")
PY
    rm -rf "$OUT"
    convert "gguf-$SIZE" "${GGUF[@]}" --max-size "$SIZE"
    if [ "${CLIENTS:-0}" = 1 ]; then
        # shellcheck disable=SC1090
        . "$(bash scripts/llama-cpp.sh --print-env)"
        "$ESCHA_LLAMA_BIN/llama_logits" -t 2 -o "$DIR/logits.f32" "$OUT/model.gguf" 1,2,3,4 2>/dev/null
        .venv/bin/python -c "import numpy as np, sys; y = np.fromfile(sys.argv[1], '<f4'); assert y.size and np.isfinite(y).all(); print('llama.cpp: logits finite')" "$DIR/logits.f32"
    fi
    rm -rf "$OUT"
    for other in "exl3:--format exl3" "mlx4:--format mlx" "mlx-auto:--format mlx --bits auto" "gguf-q4_k_m:${GGUF[*]} --gguf-type q4_k_m"; do
        read -ra flags <<< "${other#*:}"
        convert "${other%%:*}" "${flags[@]}"
        rm -rf "$OUT"
    done
done

python3 - "$DIR" <<'PY'
import json, statistics, sys
d = sys.argv[1]
times = {}
for line in open(f"{d}/times.tsv"):
    name, wall, user, sys_, rss = line.rstrip("\n").split("\t")
    times.setdefault(name, []).append((float(wall), float(user) + float(sys_), int(rss)))
print("| run | wall, median | CPU (user + sys), median | peak RSS | model files | largest ratio | mean ratio |")
print("|---|---|---|---|---|---|---|")
med = {}
for name, runs in times.items():
    m = [statistics.median(x[i] for x in runs) for i in range(3)]
    med[name] = m
    report = json.load(open(f"{d}/{name}.json"))
    b = report.get("budget") or {}
    ratios = f"{b['max_added_error_ratio']:.3f} | {b['mean_added_error_ratio']:.3f}" if b else " | "
    print(f"| `{name}` | {m[0]:.1f} s | {m[1]:.1f} s | {m[2] / 1024:.0f} MiB | {report['bytes_written']:,} B | {ratios} |")
for name in ("mlx", "gguf-q4_k", "gguf-q3_k_m"):
    fixed, fit = med[name], med[f"{name}-fit"]
    print(f"{name}: --max-size at its size costs {fit[1] / fixed[1]:.2f}x the CPU and {fit[0] / fixed[0]:.2f}x the wall")
PY
