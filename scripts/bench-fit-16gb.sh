#!/usr/bin/env bash
# README's "Make it fit": the 27B-shaped synthetic at 8, 9.5, 10 and 11 GB of model files (the
# floor where a size is below it) and at `--fit-memory 16GB`, in GGUF and MLX, each with and
# without an importance matrix (a heavy-tailed one, scripts/synthetic_imatrix.py: no text has run
# through a synthetic); wall, CPU and the ratios each run reports (importance-weighted with the
# matrix, plain without). A run marked `:dry` is `--dry-run` (the choosing alone: its CPU against
# the same run's is what choosing costs). With CLIENTS=1 llama.cpp evaluates each GGUF written.
#
#     bash scripts/bench-fit-16gb.sh [LAYERS] [VOCAB] [RUNS]
#
# RUNS is a list of FORMAT:MATRIX:SIZE[:dry] (MATRIX imatrix or plain, SIZE a --max-size or
# NGB-memory for --fit-memory NGB); the default is every format, matrix and size above, written.
# Input under BENCH_DIR (default /tmp/escha-fit): 10.3 GB, and up to 11 GB of output at a time.
# `bash scripts/bench-fit-16gb.sh 4 4096 "gguf:imatrix:300MB mlx:plain:16GB-memory"` is a sanity
# run in minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS=${1:-64}
VOCAB=${2:-248320}
ALL=""
for format in gguf mlx; do
    for matrix in imatrix plain; do
        for size in 8GB 9.5GB 10GB 11GB 16GB-memory; do ALL+=" $format:$matrix:$size"; done
    done
done
RUNS=${3:-$ALL}
DIR=${BENCH_DIR:-/tmp/escha-fit}
BIN=$PWD/target/release/escha-convert
cargo build --release --quiet
mkdir -p "$DIR"
SYN=$DIR/synth-$LAYERS-$VOCAB
[ -d "$SYN" ] || bash scripts/make-synthetic-27b.sh "$SYN" "$LAYERS" "$VOCAB"
MATRIX=$SYN.imatrix.gguf
[ -f "$MATRIX" ] || .venv/bin/python scripts/synthetic_imatrix.py "$SYN" "$MATRIX" "$BIN"
OUT=$DIR/out
ROWS=$DIR/rows.tsv
: > "$ROWS"

convert() { # name, flags...: the JSON report to $DIR/NAME.json, the time to $DIR/time.txt
    local name=$1; shift
    /usr/bin/time -f "%e %U %S %M" -o "$DIR/time.txt" "$BIN" "$SYN" "$OUT" "$@" --force --quiet --json > "$DIR/$name.json"
}

for run in $RUNS; do
    IFS=: read -r format matrix size dry <<< "$run"
    flags=(--format "$format")
    [ "$format" = gguf ] && flags+=(--gguf-vocab none)
    [ "$matrix" = imatrix ] && flags+=(--imatrix "$MATRIX")
    [ "$dry" = dry ] && flags+=(--dry-run)
    case $size in
        *-memory) ask=(--fit-memory "${size%-memory}") ;;
        *) ask=(--max-size "$size") ;;
    esac
    name=$format-$matrix-$size${dry:+-dry}
    if ! convert "$name" "${flags[@]}" "${ask[@]}" 2> "$DIR/stderr.txt"; then
        # Below the floor: the refusal names it; the floor instead.
        floor=$(sed -n 's/.*can make is \([0-9]*\) bytes.*/\1/p' "$DIR/stderr.txt")
        [ -n "$floor" ] || { cat "$DIR/stderr.txt" >&2; exit 1; }
        name=$format-$matrix-floor${dry:+-dry}
        ask=(--max-size "$floor")
        convert "$name" "${flags[@]}" "${ask[@]}"
    fi
    printf "%s\t%s\t%s\t%s\t%s\t%s\n" "$name" "$format" "$matrix" "${ask[*]}${dry:+ --dry-run}" "$(tr ' ' '\t' < "$DIR/time.txt")" >> "$ROWS"
    if [ "${CLIENTS:-0}" = 1 ] && [ "$format" = gguf ] && [ "$dry" != dry ]; then
        # shellcheck disable=SC1090
        . "$(bash scripts/llama-cpp.sh --print-env)"
        "$ESCHA_LLAMA_BIN/llama_logits" -t 2 -o "$DIR/logits.f32" "$OUT/model.gguf" 1,2,3,4 2>/dev/null
        .venv/bin/python -c "import numpy as np, sys; y = np.fromfile(sys.argv[1], '<f4'); assert y.size and np.isfinite(y).all(); print(f'llama.cpp: {y.size} logits of {sys.argv[2]}, finite, largest {abs(y).max():.0f}')" "$DIR/logits.f32" "$name"
    fi
    rm -rf "$OUT"
done

python3 - "$DIR" "$ROWS" <<'PY'
import json, sys
d, rows = sys.argv[1], sys.argv[2]
print("| format | asked | matrix | model files | wall (CPU) | peak RSS | largest / mean ratio | largest table ratio |")
print("|---|---|---|---|---|---|---|---|")
for line in open(rows):
    name, fmt, matrix, ask, wall, user, sys_, rss = line.rstrip("\n").split("\t")[:8]
    b = json.load(open(f"{d}/{name}.json"))["budget"]
    if "floor" in name:
        ask = f"{ask} (the floor)"
    if b.get("memory"):
        ask += f" (K/V {b['kv_cache_bytes'] / 1e9:.2f} GB, reserve {b['reserve_bytes'] / 1e9:.2f} GB)"
    cpu = float(user) + float(sys_)
    kind = "weighted" if b.get("weighted_by_imatrix") else "plain"
    print(f"| {fmt} | `{ask}` | {matrix} | {b['bytes']:,} B | {float(wall):.0f} s ({cpu:.0f} s) | "
          f"{int(rss) / 1024:.0f} MiB | {b['max_added_error_ratio']:.2f} / {b['mean_added_error_ratio']:.2f} ({kind}) | "
          f"{b['max_table_ratio']:.1f} |")
PY
