#!/usr/bin/env bash
# README's "Make it fit": the 27B-shaped synthetic at 8, 9.5, 10 and 11 GB of model files (the
# floor where a size is below it) and at `--fit-memory 16GB`, in GGUF and MLX, each with and
# without an importance matrix (a heavy-tailed one, scripts/synthetic_imatrix.py: no text has run
# through a synthetic); wall, CPU and the ratios each run reports (importance-weighted with the
# matrix, plain without). With CLIENTS=1 llama.cpp evaluates the 9.5 GB GGUF made with the matrix.
#
#     bash scripts/bench-fit-16gb.sh [LAYERS] [VOCAB] [FORMATS] [SIZES]
#         (defaults 64, 248320, "gguf mlx", "8GB 9.5GB 10GB 11GB 16GB-memory")
#
# Input under BENCH_DIR (default /tmp/escha-fit): 10.3 GB, and up to 11 GB of output at a time.
# `bash scripts/bench-fit-16gb.sh 4 4096 "gguf mlx" "300MB 16GB-memory"` is a sanity run in minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS=${1:-64}
VOCAB=${2:-248320}
FORMATS=${3:-gguf mlx}
SIZES=${4:-8GB 9.5GB 10GB 11GB 16GB-memory}
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
: > "$DIR/choosing.tsv"

for format in $FORMATS; do
    flags=(--format "$format")
    [ "$format" = gguf ] && flags+=(--gguf-vocab none)
    for matrix in imatrix plain; do
        extra=()
        [ "$matrix" = imatrix ] && extra=(--imatrix "$MATRIX")
        # The floor: the refusal of a size nothing fits names it, after the whole choosing pass
        # (its CPU is the choosing's, for the table's note).
        floor=$(/usr/bin/time -f "%e %U %S %M" -o "$DIR/time.txt" \
            "$BIN" "$SYN" "$OUT" "${flags[@]}" "${extra[@]}" --max-size 1 --quiet 2>&1 | sed -n 's/.*can make is \([0-9]*\) bytes.*/\1/p')
        printf "%s\t%s\n" "$format-$matrix" "$(tail -1 "$DIR/time.txt" | tr ' ' '\t')" >> "$DIR/choosing.tsv"
        for size in $SIZES; do
            case $size in
                *-memory) ask=(--fit-memory "${size%-memory}") ;;
                *) ask=(--max-size "$size") ;;
            esac
            name=$format-$matrix-$size
            if ! /usr/bin/time -f "%e %U %S %M" -o "$DIR/time.txt" \
                "$BIN" "$SYN" "$OUT" "${flags[@]}" "${extra[@]}" "${ask[@]}" --force --quiet --json > "$DIR/$name.json"; then
                # Below the floor: the floor instead.
                name=$format-$matrix-floor
                /usr/bin/time -f "%e %U %S %M" -o "$DIR/time.txt" \
                    "$BIN" "$SYN" "$OUT" "${flags[@]}" "${extra[@]}" --max-size "$floor" --force --quiet --json > "$DIR/$name.json"
                ask=(--max-size "$floor")
            fi
            printf "%s\t%s\t%s\t%s\t%s\t%s\n" "$name" "$format" "$matrix" "${ask[*]}" "$floor" "$(tr ' ' '\t' < "$DIR/time.txt")" >> "$ROWS"
            if [ "${CLIENTS:-0}" = 1 ] && [ "$name" = gguf-imatrix-9.5GB ]; then
                # shellcheck disable=SC1090
                . "$(bash scripts/llama-cpp.sh --print-env)"
                /usr/bin/time -f "llama.cpp: %e s wall" "$ESCHA_LLAMA_BIN/llama_logits" -t 2 -o "$DIR/logits.f32" "$OUT/model.gguf" 1,2,3,4 2>&1 >/dev/null | tail -1
                .venv/bin/python -c "import numpy as np, sys; y = np.fromfile(sys.argv[1], '<f4'); assert y.size and np.isfinite(y).all(); print(f'llama.cpp: {y.size} logits, finite, largest {abs(y).max():.0f}')" "$DIR/logits.f32"
            fi
            rm -rf "$OUT"
        done
    done
done

python3 - "$DIR" "$ROWS" <<'PY'
import json, sys
d, rows = sys.argv[1], sys.argv[2]
print("| format | asked | matrix | model files | wall (CPU) | largest / mean ratio |")
print("|---|---|---|---|---|---|")
for line in open(rows):
    name, fmt, matrix, ask, floor, wall, user, sys_, _rss = line.rstrip("\n").split("\t")
    r = json.load(open(f"{d}/{name}.json"))
    b = r["budget"]
    if "floor" in name:
        ask = f"the floor, {int(floor):,} B"
    elif b.get("memory"):
        ask += f" (K/V {b['kv_cache_bytes'] / 1e9:.2f} GB, reserve {b['reserve_bytes'] / 1e9:.2f} GB)"
    cpu = float(user) + float(sys_)
    weighted = "importance-weighted" if b.get("weighted_by_imatrix") else "plain"
    print(f"| {fmt} | `{ask}` | {matrix} | {b['bytes'] / 1e9:.2f} GB | {float(wall):.0f} s ({cpu:.0f} s) | "
          f"{b['max_added_error_ratio']:.2f} / {b['mean_added_error_ratio']:.2f} ({weighted}) |")
print()
for line in open(f"{d}/choosing.tsv"):
    name, wall, user, sys_, rss = line.rstrip("\n").split("\t")
    print(f"choosing alone ({name}, the floor's refusal): {float(wall):.0f} s wall, "
          f"{float(user) + float(sys_):.0f} s CPU, peak RSS {int(rss) / 1024:.0f} MiB")
PY
