#!/usr/bin/env bash
# Conversion benchmark on a synthetic checkpoint of random codes (dense-27B-shaped MLP layers):
# wall time, throughput and peak RSS of the bf16 conversion at -j1 and -j2, the disk floor (dd of
# the same number of bytes, fsync'd), resident memory against model size, and --format mlx against
# the bf16 conversion followed by MLX's own quantization step.
#
#     bash scripts/bench-convert.sh [GB_OF_CODES]      (default 2; needs ~10x that in free disk)
set -euo pipefail
cd "$(dirname "$0")/.."
GB=${1:-2}
DIR=${BENCH_DIR:-/tmp/escha-bench}
BIN=target/release/escha-convert
cargo build --release --quiet --example make_synthetic
cargo build --release --quiet
mkdir -p "$DIR"
[ -d "$DIR/synth" ] || target/release/examples/make_synthetic "$DIR/synth" "$GB"

measure() { # label, command...: prints wall seconds and peak RSS (MiB)
    local label=$1; shift
    /usr/bin/time -f "%e %M" -o "$DIR/time.txt" "$@" > "$DIR/last.json"
    read -r wall rss < "$DIR/time.txt"
    printf "%-44s %8.2f s  %8.1f MiB\n" "$label" "$wall" "$((rss))e-3"
}

echo "codes: $(du -sb "$DIR/synth" | cut -f1) bytes in $(ls "$DIR/synth" | wc -l) files"
measure "escha-convert bf16 -j1" $BIN "$DIR/synth" "$DIR/out" -j 1 --force --json
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"  {r['bytes_written']} bytes, {r['gb_per_s']:.3f} GB/s, {r['weights_per_s']:.3e} weights/s\")" "$DIR/last.json"
BYTES=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['bytes_written'])" "$DIR/last.json")
measure "dd of the same bytes (fsync), the I/O floor" dd if=/dev/zero of="$DIR/floor.bin" bs=16M count=$((BYTES / 16777216 + 1)) conv=fsync status=none
rm -f "$DIR/floor.bin"
measure "escha-convert bf16 -j2" $BIN "$DIR/synth" "$DIR/out" -j 2 --force --json
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"  {r['gb_per_s']:.3f} GB/s, {r['weights_per_s']:.3e} weights/s\")" "$DIR/last.json"
measure "dd of the same bytes again" dd if=/dev/zero of="$DIR/floor.bin" bs=16M count=$((BYTES / 16777216 + 1)) conv=fsync status=none
rm -f "$DIR/floor.bin"
measure "escha-convert bf16 -j2, one layer only" $BIN "$DIR/synth" "$DIR/out1" -j 2 --force --json --only '*layers.0.*'
rm -rf "$DIR/out1"

measure "escha-convert --format mlx (4 bit, g64) -j2" $BIN "$DIR/synth" "$DIR/out-mlx" --format mlx -j 2 --force --json
measure "MLX quantization of the bf16 output" python3 scripts/mlx_quantize_baseline.py "$DIR/out" "$DIR/out-mlx-baseline" 4 64
python3 - "$DIR/out-mlx" "$DIR/out-mlx-baseline" <<'PY'
import glob, sys
import mlx.core as mx
ours, base = ({}, {})
for d, w in ((sys.argv[1], ours), (sys.argv[2], base)):
    for f in glob.glob(d + "/model*.safetensors"):
        w.update(mx.load(f))
# mlx-lm renames model.language_model.* to language_model.model.* when it loads a Qwen3.5.
base = {k.replace("model.language_model.", "language_model.model.", 1): v for k, v in base.items()}
same = set(ours) == set(base) and all(mx.array_equal(ours[k], base[k]).item() for k in base)
print(f"  MLX outputs identical tensor for tensor: {same}")
PY
rm -rf "$DIR/out" "$DIR/out-mlx" "$DIR/out-mlx-baseline"
