#!/usr/bin/env bash
# Every --gguf-type on a small synthetic checkpoint (examples/make_synthetic.rs --hybrid: by default
# two 27B-width layers, linear and full attention, as llama.cpp runs no model without both; gate
# K=2, the other linears K=3, the linear attention's K=2): file size, bits
# per weight over the coded linears and the added error ‖deq(W_q) − W_f32‖ / ‖W_f32‖ of each coded
# linear and of all of them (scripts/gguf_errors.py, with gguf-py's dequantize), against
# `--gguf-type f32`, the exact reconstruction. Types: bf16, q8_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m,
# q2_k, q3_k_s, q3_k_m, q3_k_l, iq4_xs, auto at R = 0.3, 0.5 and 0.8 (estimated, the default, and with --measure-error), and
# llama-quantize's Q4_K_M of our bf16 GGUF (the two-step path's K-quant). For the auto rows, the
# budget R·2^-K of each choice. Then llama-quantize (one thread) against our direct q4_k_m
# conversion, RUNS times alternated: medians of wall, CPU (user + sys) and peak RSS.
#
#     bash scripts/bench-gguf-types.sh [LAYERS] [RUNS]     (defaults 2 and 3)
#
# Every escha-convert run is -j 1 --gguf-vocab none (the checkpoint has no tokenizer), and is timed
# once (one run each) besides. Needs about 4 GB free under BENCH_DIR (default /tmp/escha-bench);
# removes the GGUF files at the end (KEEP=1 keeps them), keeps the synthetic checkpoint, the JSON
# reports and $DIR/errors.json. The llama.cpp is scripts/llama-cpp.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS=${1:-2}
RUNS=${2:-3}
DIR=${BENCH_DIR:-/tmp/escha-bench}/gguf-types-hybrid-$LAYERS
cargo build --release --quiet --example make_synthetic
cargo build --release --quiet
bash scripts/llama-cpp.sh
# shellcheck disable=SC1090
. "$(bash scripts/llama-cpp.sh --print-env)"
mkdir -p "$DIR"
BIN=$DIR/escha-convert
cp target/release/escha-convert "$BIN"
echo "escha-convert $(git describe --always --dirty 2>/dev/null || echo '?'), $($BIN -V)"
# Both kinds of attention block, embeddings and head, which llama.cpp's load rules require.
[ -d "$DIR/synth" ] || target/release/examples/make_synthetic "$DIR/synth" --hybrid --layers "$LAYERS"
TIMES=$DIR/times.txt
: >"$TIMES"

run() { # label, command...: appends "label wall user sys rss_kb" to $TIMES; stdout to $DIR/label.json
    local label=$1
    shift
    if ! /usr/bin/time -f "$label %e %U %S %M" -a -o "$TIMES" "$@" >"$DIR/$label.json" 2>"$DIR/$label.log"; then
        echo "$label failed: $*" >&2
        tail -20 "$DIR/$label.log" >&2
        exit 1
    fi
}
convert() { # label, escha-convert options...: writes $DIR/label.gguf and $DIR/label.json
    local label=$1
    shift
    run "$label" $BIN "$DIR/synth" "$DIR/out" -j 1 --force --json --format gguf --gguf-vocab none "$@"
    mv "$DIR/out/model.gguf" "$DIR/$label.gguf"
    rm -rf "$DIR/out"
}

echo "== conversions, one run each"
ROWS=()
for t in f32 bf16 q8_0 q4_k q5_k q6_k q4_k_m q5_k_m q2_k q3_k_s q3_k_m q3_k_l iq4_xs; do
    convert "$t" --gguf-type "$t"
    ROWS+=("$t=$DIR/$t.gguf")
done
for r in 0.3 0.5 0.8; do
    convert "auto-$r" --gguf-type auto --max-added-error "$r"
    convert "auto-$r-measured" --gguf-type auto --max-added-error "$r" --measure-error
    ROWS+=("auto R=$r=$DIR/auto-$r.gguf,$DIR/auto-$r.json")
    ROWS+=("auto R=$r --measure-error=$DIR/auto-$r-measured.gguf,$DIR/auto-$r-measured.json")
done
run llama-quantize-q4_k_m "$ESCHA_LLAMA_BIN/llama-quantize" "$DIR/bf16.gguf" "$DIR/llama-quantize-q4_k_m.gguf" Q4_K_M 1
ROWS+=("llama-quantize Q4_K_M of our bf16=$DIR/llama-quantize-q4_k_m.gguf")

echo "== llama-quantize Q4_K_M of our bf16 GGUF against our q4_k_m conversion, $RUNS runs alternated"
for _ in $(seq "$RUNS"); do
    run ours-q4_k_m-alternated $BIN "$DIR/synth" "$DIR/out" -j 1 --force --quiet --format gguf \
        --gguf-vocab none --gguf-type q4_k_m
    rm -rf "$DIR/out"
    run llama-quantize-Q4_K_M-alternated "$ESCHA_LLAMA_BIN/llama-quantize" "$DIR/bf16.gguf" \
        "$DIR/lq-timing.gguf" Q4_K_M 1
    rm -f "$DIR/lq-timing.gguf"
done

echo "== added errors against f32"
status=0
.venv/bin/python scripts/gguf_errors.py --gguf-py "$ESCHA_LLAMA_CPP/gguf-py" --reference "$DIR/f32.gguf" \
    --synth "$DIR/synth" --json "$DIR/errors.json" "${ROWS[@]}" || status=$?
[ "${KEEP:-0}" = 1 ] || rm -f "$DIR"/*.gguf

python3 - "$TIMES" "$DIR/f32.json" <<'PY'
import json, statistics, sys
weights = json.load(open(sys.argv[2]))["weights"]
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("Command"):
        continue
    label, wall, user, sys_, rss = line.split()
    rows.setdefault(label, []).append((float(wall), float(user), float(sys_), int(rss)))
print(f"\n{weights:,} weights, one thread; conversions one run each, the alternated pair median of its runs")
print("| run | CPU (user + sys) | wall | CPU ns/weight | peak RSS | runs (CPU) |")
print("|---|---|---|---|---|---|")
med = {}
for label, r in rows.items():
    m = lambda f: statistics.median(f(x) for x in r)
    med[label] = (m(lambda x: x[1] + x[2]), m(lambda x: x[0]), m(lambda x: x[3]))
    print(f"| {label} | {med[label][0]:.2f} s ({m(lambda x: x[1]):.2f} + {m(lambda x: x[2]):.2f}) | "
          f"{med[label][1]:.2f} s | {med[label][0] / weights * 1e9:.2f} | {med[label][2] / 1024:.0f} MiB | "
          + ", ".join(f"{x[1] + x[2]:.2f}" for x in r) + " |")
a, b = med["llama-quantize-Q4_K_M-alternated"], med["ours-q4_k_m-alternated"]
print(f"llama-quantize / ours (q4_k_m): CPU {a[0] / b[0]:.2f}x, wall {a[1] / b[1]:.2f}x, peak RSS {a[2] / b[2]:.2f}x; "
      f"with the bf16 GGUF it reads (our bf16 conversion, {med['bf16'][0]:.2f} s CPU): "
      f"{(a[0] + med['bf16'][0]) / b[0]:.2f}x")
PY
exit $status
