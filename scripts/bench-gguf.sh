#!/usr/bin/env bash
# --format gguf against the bf16 conversion on a synthetic checkpoint (examples/make_synthetic.rs
# --whole: 27B-width full-attention layers, a 4096-token int8 embedding and head), one thread, RUNS runs alternated: bf16 safetensors, and GGUF as bf16,
# q8_0, q4_k_m and auto (--max-added-error 0.5, the default). Then the two-step path it replaces,
# also RUNS times (TWO_STEP_RUNS to change that): the bf16 conversion, llama.cpp's
# convert_hf_to_gguf.py --outtype bf16 on it, and llama-quantize of that to Q4_K_M (one thread).
# Prints the median wall time, CPU time (user + sys), CPU ns per weight and peak RSS of each step,
# the ratios, and checks that the converter's tensors are ours (bf16: the same bytes; Q4_K_M: the
# same types and sizes; the bytes differ, ours being rounded once from f32).
#
#     bash scripts/bench-gguf.sh [GB_OF_CODES] [RUNS]
#
# Defaults: 0.45 GB of codes (4 whole layers), 3 runs. Needs about 18 GB free under
# BENCH_DIR (default /tmp/escha-bench); removes its outputs at the end, keeps the synthetic
# checkpoint and the timings ($DIR/times.txt). The release binary is copied to $DIR before the
# runs, so a rebuild elsewhere during the runs does not change what is timed.
#
# The converter comes from the llama.cpp that scripts/llama-cpp.sh caches; it runs under the
# repository's .venv (torch, numpy). The synthetic checkpoint has no tokenizer and no MTP head: ours
# runs with --gguf-vocab none; the converter runs with --no-mtp and gets the dense fixture's
# tokenizer files copied beside the bf16 output (a 256-token vocabulary, padded by the converter to
# the config's 248,320 entries: 5.6 MB more in its file, negligible next to the weights). That
# stand-in tokenizer's pre-tokenizer hash is not in the converter's table, so, as
# tests/python/test_gguf.py does, a wrapper patches get_vocab_base_pre in-process to answer
# "qwen35" (what it answers for the real Qwen3.5 tokenizers) for qwen35; nothing else changes.
set -euo pipefail
cd "$(dirname "$0")/.."
GB=${1:-0.45}
RUNS=${2:-3}
TWO_STEP_RUNS=${TWO_STEP_RUNS:-$RUNS}
DIR=${BENCH_DIR:-/tmp/escha-bench}/gguf-whole-$GB
cargo build --release --quiet --example make_synthetic
cargo build --release --quiet
bash scripts/llama-cpp.sh
# shellcheck disable=SC1090
. "$(bash scripts/llama-cpp.sh --print-env)"
mkdir -p "$DIR"
BIN=$DIR/escha-convert
cp target/release/escha-convert "$BIN"
echo "escha-convert $(git describe --always --dirty 2>/dev/null || echo '?'), $($BIN -V)"
# --whole: attention blocks, embeddings and head, which llama.cpp's load rules require.
[ -d "$DIR/synth" ] || target/release/examples/make_synthetic "$DIR/synth" "$GB" --whole
WEIGHTS=$($BIN "$DIR/synth" "$DIR/out" --dry-run --json --force |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["weights"])')
TIMES="$DIR/times.txt"
: >"$TIMES"

run() { # label, command...: appends "label wall user sys rss_kb" to $TIMES; output to $DIR/label.log
    local label=$1
    shift
    if ! /usr/bin/time -f "$label %e %U %S %M" -a -o "$TIMES" "$@" >"$DIR/$label.log" 2>&1; then
        echo "$label failed: $*" >&2
        tail -20 "$DIR/$label.log" >&2
        exit 1
    fi
}

GGUF=(--format gguf --gguf-vocab none)
for i in $(seq "$RUNS"); do
    run bf16 $BIN "$DIR/synth" "$DIR/out-bf16" -j 1 --quiet --force
    run gguf-bf16 $BIN "$DIR/synth" "$DIR/out-gguf-bf16" -j 1 --quiet --force "${GGUF[@]}"
    run gguf-q8_0 $BIN "$DIR/synth" "$DIR/out-gguf-q8_0" -j 1 --quiet --force "${GGUF[@]}" --gguf-type q8_0
    run gguf-q4_k_m $BIN "$DIR/synth" "$DIR/out-gguf-q4_k_m" -j 1 --quiet --force "${GGUF[@]}" --gguf-type q4_k_m
    run gguf-auto $BIN "$DIR/synth" "$DIR/out-gguf-auto" -j 1 --quiet --force "${GGUF[@]}" --gguf-type auto
    [ "$i" -le "$TWO_STEP_RUNS" ] || continue
    # The two-step path: bf16 safetensors, llama.cpp's converter, then llama-quantize on one thread.
    rm -rf "$DIR/hf" "$DIR/ref-bf16.gguf" "$DIR/ref-q4_k_m.gguf"
    run two-step-1-bf16 $BIN "$DIR/synth" "$DIR/hf" -j 1 --quiet
    cp fixtures/dense/tokenizer.json fixtures/dense/tokenizer_config.json "$DIR/hf/"
    run two-step-2-converter .venv/bin/python scripts/convert_hf_to_gguf_standin.py "$ESCHA_LLAMA_CPP/convert_hf_to_gguf.py" \
        "$DIR/hf" --outtype bf16 --no-mtp --outfile "$DIR/ref-bf16.gguf"
    run two-step-3-llama-quantize "$ESCHA_LLAMA_BIN/llama-quantize" "$DIR/ref-bf16.gguf" "$DIR/ref-q4_k_m.gguf" Q4_K_M 1
done

if [ "$TWO_STEP_RUNS" -gt 0 ]; then
echo "== the converter's tensors against ours (last run's files)"
.venv/bin/python - "$ESCHA_LLAMA_CPP/gguf-py" "$DIR" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import gguf, numpy as np
d = sys.argv[2]
def tensors(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors}
for ours_path, theirs_path, what in (
    (f"{d}/out-gguf-bf16/model.gguf", f"{d}/ref-bf16.gguf", "bytes"),
    (f"{d}/out-gguf-q4_k_m/model.gguf", f"{d}/ref-q4_k_m.gguf", "types"),
):
    ours, theirs = tensors(ours_path), tensors(theirs_path)
    problems = []
    if set(ours) != set(theirs):
        problems.append(f"names differ: ours only {sorted(set(ours) - set(theirs))}, theirs only {sorted(set(theirs) - set(ours))}")
    same_layout = same_bytes = 0
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        if a.tensor_type != b.tensor_type or list(a.shape) != list(b.shape) or a.n_bytes != b.n_bytes:
            problems.append(f"{name}: ours {a.tensor_type.name} {list(a.shape)} {a.n_bytes} B, "
                            f"theirs {b.tensor_type.name} {list(b.shape)} {b.n_bytes} B")
            continue
        same_layout += 1
        x, y = a.data.reshape(-1).view(np.uint8), b.data.reshape(-1).view(np.uint8)
        equal = all(np.array_equal(x[i:i + (1 << 26)], y[i:i + (1 << 26)]) for i in range(0, x.size, 1 << 26))
        same_bytes += equal
        if what == "bytes" and not equal:
            problems.append(f"{name}: bytes differ")
    print(f"{theirs_path.rsplit('/', 1)[1]}: {len(theirs)} tensors (ours {len(ours)}), {same_layout} with our type, "
          f"shape and size, {same_bytes} byte-identical to ours: "
          + ("OK" if not problems else "PROBLEMS:\n  " + "\n  ".join(problems)))
PY
fi
echo "file sizes (bytes): $(for f in out-bf16/model-*.safetensors out-gguf-bf16/model.gguf ref-bf16.gguf \
    out-gguf-q8_0/model.gguf out-gguf-q4_k_m/model.gguf ref-q4_k_m.gguf out-gguf-auto/model.gguf; do
    ! compgen -G "$DIR/$f" >/dev/null || printf '%s %s; ' "$f" "$(du -cb "$DIR"/$f | tail -1 | cut -f1)"; done)"
rm -rf "$DIR"/out-* "$DIR/hf" "$DIR/ref-bf16.gguf" "$DIR/ref-q4_k_m.gguf" "$DIR/out"

python3 - "$TIMES" "$WEIGHTS" <<'PY'
import statistics, sys
times, weights = sys.argv[1], int(sys.argv[2])
rows = {}
for line in open(times):
    if line.startswith("Command"):  # /usr/bin/time's note of a failed command
        continue
    label, wall, user, sys_, rss = line.split()
    rows.setdefault(label, []).append((float(wall), float(user), float(sys_), int(rss)))
print(f"{weights / 1e9:.3f} G weights; escha-convert and llama-quantize on one thread; median of "
      f"{len(rows['bf16'])} alternated runs ({len(rows.get('two-step-1-bf16', []))} of the two-step path)")
print("| run | CPU (user + sys) | wall | CPU ns/weight | peak RSS | runs (CPU) |")
print("|---|---|---|---|---|---|")
cpu, wall, rss, user = {}, {}, {}, {}
for label, r in rows.items():
    med = lambda f: statistics.median(f(x) for x in r)
    cpu[label], wall[label], rss[label] = med(lambda x: x[1] + x[2]), med(lambda x: x[0]), med(lambda x: x[3])
    user[label] = med(lambda x: x[1])
    print(f"| {label} | {cpu[label]:.2f} s ({med(lambda x: x[1]):.2f} + {med(lambda x: x[2]):.2f}) "
          f"| {wall[label]:.2f} s | {cpu[label] / weights * 1e9:.2f} | {rss[label] / 1024:.0f} MiB | "
          + ", ".join(f"{x[1] + x[2]:.2f}" for x in r) + " |")
print()
for label in ("gguf-bf16", "gguf-q8_0", "gguf-q4_k_m", "gguf-auto"):
    print(f"{label} / bf16: CPU {cpu[label] / cpu['bf16']:.2f}x, user {user[label] / user['bf16']:.2f}x, "
          f"wall {wall[label] / wall['bf16']:.2f}x; "
          f"peak RSS {max(x[3] for x in rows[label]) / 1024:.0f} MiB at most")
if "two-step-2-converter" in cpu:
    two = cpu["two-step-1-bf16"] + cpu["two-step-2-converter"]
    two_wall = wall["two-step-1-bf16"] + wall["two-step-2-converter"]
    print(f"two-step to bf16 GGUF: CPU {two:.2f} s = {two / cpu['gguf-bf16']:.2f}x gguf-bf16's, "
          f"wall {two_wall:.2f} s = {two_wall / wall['gguf-bf16']:.2f}x")
    three = two + cpu["two-step-3-llama-quantize"]
    three_wall = two_wall + wall["two-step-3-llama-quantize"]
    print(f"two-step to Q4_K_M (+ llama-quantize): CPU {three:.2f} s = {three / cpu['gguf-q4_k_m']:.2f}x "
          f"gguf-q4_k_m's, wall {three_wall:.2f} s = {three_wall / wall['gguf-q4_k_m']:.2f}x; "
          f"llama-quantize alone {cpu['two-step-3-llama-quantize'] / cpu['gguf-q4_k_m']:.2f}x gguf-q4_k_m's CPU")
PY
