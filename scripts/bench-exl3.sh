#!/usr/bin/env bash
# --format exl3 against the bf16 conversion and against copying the same bytes, on a synthetic
# checkpoint of 27B-width MLP layers (examples/make_synthetic.rs; 0.3 GB of codes is 4 layers):
# CPU time (user + sys) and wall time of each, peak RSS, one thread of work (-j 1) so the CPU
# figures compare work, not scheduling. The copy is `cp` of the exl3 output's shard files
# followed by `sync`, the I/O floor of writing those bytes.
#
#     bash scripts/bench-exl3.sh [GB_OF_CODES] [RUNS]      (defaults 0.3 and 3; medians printed)
#
# BENCH_DIR (default /tmp/escha-bench-exl3) holds the synthetic checkpoint (kept) and the outputs
# (removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
GB=${1:-0.3}
RUNS=${2:-3}
DIR=${BENCH_DIR:-/tmp/escha-bench-exl3}
BIN=target/release/escha-convert
cargo build --release --quiet --example make_synthetic
cargo build --release --quiet
mkdir -p "$DIR"
[ -d "$DIR/synth" ] || target/release/examples/make_synthetic "$DIR/synth" "$GB"
echo "synthetic: $(du -sb "$DIR/synth" | cut -f1) bytes; machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"

# One run: label, command…; appends "wall cpu rss_kib" to $DIR/<label>.txt.
run() {
    local label=$1
    shift
    /usr/bin/time -f "%e %U %S %M" -o "$DIR/time.txt" "$@" >/dev/null
    read -r wall user sys rss <"$DIR/time.txt"
    echo "$wall $(echo "$user + $sys" | bc) $rss" >>"$DIR/$label.txt"
}
rm -f "$DIR"/*.txt
for _ in $(seq "$RUNS"); do
    # Each run writes a new OUT, as the copy writes a new directory: removing an earlier output
    # (--force) is not the conversion's cost.
    rm -rf "$DIR/out-bf16" "$DIR/out-exl3" "$DIR/copy" && mkdir "$DIR/copy"
    sync
    run bf16 $BIN "$DIR/synth" "$DIR/out-bf16" -j 1 --quiet
    run exl3 $BIN "$DIR/synth" "$DIR/out-exl3" --format exl3 -j 1 --quiet
    run copy sh -c "cp '$DIR'/out-exl3/*.safetensors '$DIR/copy/' && sync"
done
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
col() { cut -d' ' -f"$2" "$DIR/$1.txt" | median; }
printf "%-6s %10s %10s %12s\n" run "wall s" "cpu s" "peak MiB"
for label in bf16 exl3 copy; do
    printf "%-6s %10s %10s %12.1f\n" "$label" "$(col $label 1)" "$(col $label 2)" "$(echo "$(col $label 3) / 1024" | bc -l)"
done
echo "exl3 CPU / bf16 CPU: $(echo "$(col exl3 2) / $(col bf16 2)" | bc -l | cut -c1-5)"
echo "exl3 wall / copy wall: $(echo "$(col exl3 1) / $(col copy 1)" | bc -l | cut -c1-5)"
echo "exl3 bytes: $(du -sb "$DIR/out-exl3" | cut -f1)"
rm -rf "$DIR/out-bf16" "$DIR/out-exl3" "$DIR/copy"
