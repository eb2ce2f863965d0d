#!/usr/bin/env bash
# `--format mlx --bits auto` on a synthetic checkpoint of random codes (dense-27B-shaped MLP
# layers), against uniform widths: output size, bits per weight and the added error of every
# coded linear, measured exactly at every width (examples/affine_errors.rs); how often the
# range estimate picks the width the exact error picks; what the width-choosing pass costs
# (`--dry-run`); and what `--checksums` costs on the bf16 conversion, with the hash rate of the
# sha256 step alone (examples/sha256_rate.rs) and of coreutils' sha256sum.
#
#     bash scripts/bench-bits-auto.sh [GB_OF_CODES] [RUNS]    (defaults 0.3, 4 layers; and 3)
#
# Needs about 3 GB free under BENCH_DIR (default /tmp/escha-bits-auto); removes its outputs at
# the end, keeps the synthetic checkpoint and the JSON reports.
set -euo pipefail
cd "$(dirname "$0")/.."
GB=${1:-0.3}
RUNS=${2:-3}
DIR=${BENCH_DIR:-/tmp/escha-bits-auto}
BIN=target/release/escha-convert
EX=target/release/examples
ROOT=$PWD
cargo build --release --quiet
cargo build --release --quiet --example make_synthetic --example affine_errors --example sha256_rate
mkdir -p "$DIR"
[ -d "$DIR/synth" ] || $EX/make_synthetic "$DIR/synth" "$GB"
SYN=$DIR/synth
OUT=$DIR/out
TIMES=$DIR/times.tsv
: > "$TIMES"

measure() { # label, command...: stdout to $DIR/last.json; appends label, wall, user, sys, RSS KiB
    local label=$1; shift
    /usr/bin/time -f "%e %U %S %M" -o "$DIR/time.txt" "$@" > "$DIR/last.json"
    printf "%s\t%s\n" "$label" "$(tr ' ' '\t' < "$DIR/time.txt")" >> "$TIMES"
}

echo "== exact and estimated errors of every coded linear at every width"
$EX/affine_errors "$SYN" > "$DIR/errors.jsonl"

echo "== uniform widths, and --bits auto (estimate; the default) at each R"
for b in 3 4 5; do
    measure "convert --bits $b (one run)" $BIN "$SYN" "$OUT" --format mlx --bits "$b" -j 2 --force --quiet --json
    cp "$DIR/last.json" "$DIR/uniform-$b.json"
    rm -rf "$OUT"
done
for r in 0.3 0.5 0.8; do
    measure "convert --bits auto, R = $r (one run)" \
        $BIN "$SYN" "$OUT" --format mlx --bits auto --max-added-error "$r" -j 2 --force --quiet --json
    cp "$DIR/last.json" "$DIR/auto-$r.json"
    rm -rf "$OUT"
    $BIN "$SYN" "$OUT" --format mlx --bits auto --max-added-error "$r" --measure-error --dry-run -j 2 --json \
        > "$DIR/exact-$r.json"
done

echo "== the width-choosing pass: --dry-run, $RUNS alternating runs"
for i in $(seq "$RUNS"); do
    measure "dry-run --bits 4" $BIN "$SYN" "$OUT" --format mlx --bits 4 --dry-run -j 2 --json
    measure "dry-run --bits auto" $BIN "$SYN" "$OUT" --format mlx --bits auto --dry-run -j 2 --json
    measure "dry-run --bits auto --measure-error" \
        $BIN "$SYN" "$OUT" --format mlx --bits auto --measure-error --dry-run -j 2 --json
done

echo "== --checksums: bf16 -j2 with and without, $RUNS alternating runs"
for i in $(seq "$RUNS"); do
    measure "bf16 -j2" $BIN "$SYN" "$OUT" -j 2 --force --quiet --json
    rm -rf "$OUT"
    measure "bf16 -j2 --checksums" $BIN "$SYN" "$OUT" -j 2 --force --quiet --json --checksums
    cp "$DIR/last.json" "$DIR/bf16-checksums.json"
    [ "$i" = "$RUNS" ] || rm -rf "$OUT"
done
echo "== sha256 of the bf16 output just written (in the page cache), one thread"
(cd "$OUT" && "$ROOT/$EX/sha256_rate" model-*.safetensors > "$DIR/ours.sums" 2> "$DIR/sha2-rate.txt")
(cd "$OUT" && /usr/bin/time -f "%e" -o "$DIR/sha256sum-time.txt" sha256sum model-*.safetensors > "$DIR/coreutils.sums")
cat "$DIR/sha2-rate.txt"
cmp -s "$DIR/ours.sums" "$DIR/coreutils.sums" && echo "digests agree with sha256sum" || echo "DIGESTS DIFFER"
(cd "$OUT" && grep -F -f <(cut -d' ' -f3 "$DIR/ours.sums") SHA256SUMS | cmp -s - "$DIR/ours.sums") \
    && echo "and with the SHA256SUMS written by --checksums" || echo "SHA256SUMS DIFFERS"
SHARD_BYTES=$(du -cb "$OUT"/model-*.safetensors | tail -1 | cut -f1)
echo "sha256sum (coreutils $(sha256sum --version | head -1 | awk '{print $NF}')): $(cat "$DIR/sha256sum-time.txt") s for $SHARD_BYTES bytes"
echo "SHA-NI: $(grep -q -w sha_ni /proc/cpuinfo && echo present || echo absent) (/proc/cpuinfo)"
rm -rf "$OUT"

python3 - "$DIR" <<'PY'
import json, re, statistics, sys
d = sys.argv[1]
key = lambda name: re.search(r"layers\.(\d+)\.mlp\.(\w+_proj)", name).groups()
errors = {key(e["module"]): e for e in map(json.loads, open(f"{d}/errors.jsonl"))}
print(f"\n{len(errors)} coded linears, K: " + ", ".join(
    f"{k}: {sum(e['k'] == k for e in errors.values())}" for k in sorted({e['k'] for e in errors.values()})))

def row(label, report, widths):
    errs = [errors[m]["exact"][str(widths[m])] for m in errors]
    # The same errors as a fraction of each linear's trellis error 2^-K: the R they reach.
    reach = [e * 2 ** errors[m]["k"] for e, m in zip(errs, errors)]
    mix = ", ".join(f"{b}: {sum(w == b for w in widths.values())}" for b in sorted(set(widths.values())))
    print(f"| {label} | {report['bytes_written']:,} | {report['affine_bits_per_weight']:.3f} | "
          f"{statistics.mean(errs):.4f} | {max(errs):.4f} | {statistics.mean(reach):.3f} | {max(reach):.3f} | {mix} |")

print("\n| run | bytes_written | bits/weight (quantized) | added error, mean | max | "
      "error / 2^-K, mean | max | widths (linears) |")
print("|---|---|---|---|---|---|---|---|")
for b in (3, 4, 5):
    row(f"`--bits {b}`", json.load(open(f"{d}/uniform-{b}.json")), {m: b for m in errors})
for r in ("0.3", "0.5", "0.8"):
    rep = json.load(open(f"{d}/auto-{r}.json"))
    row(f"`--bits auto`, R = {r}", rep, {key(c["tensor"]): c["bits"] for c in rep["width_choices"]})

print("\n| R | budget K=2 / K=3 | estimate picks the exact width | max abs(predicted/actual - 1) | "
      "exact: bytes_written | max abs(actual - affine_errors) |")
print("|---|---|---|---|---|---|")
for r in ("0.3", "0.5", "0.8"):
    rep = json.load(open(f"{d}/exact-{r}.json"))
    ch = rep["width_choices"]
    agree = sum(c["estimate_bits"] == c["bits"] for c in ch)
    ratio = max(abs(c["predicted"] / c["actual"] - 1) for c in ch)
    check = max(abs(c["actual"] - errors[key(c["tensor"])]["exact"][str(c["bits"])]) for c in ch)
    budgets = " / ".join(f"{float(r) * 2 ** -k:.4f}" for k in (2, 3))
    diff = [f"{c['tensor']} K={c['k']}: exact {c['bits']} ({c['actual']:.5f}), estimate {c['estimate_bits']}"
            for c in ch if c["estimate_bits"] != c["bits"]]
    print(f"| {r} | {budgets} | {agree}/{len(ch)} | {ratio:.4f} | {rep['bytes_written']:,} | {check:.1e} |")
    for line in diff:
        print(f"|   | {line} | | | | |")

times = {}
for line in open(f"{d}/times.tsv"):
    label, wall, user, sys_, rss = line.rstrip("\n").split("\t")
    times.setdefault(label, []).append((float(wall), float(user) + float(sys_), float(user), float(sys_), int(rss)))
print(f"\n| run | wall, median | CPU (user + sys), median | peak RSS, median | runs |")
print("|---|---|---|---|---|")
med = {}
for label, runs in times.items():
    m = [statistics.median(x[i] for x in runs) for i in range(5)]
    med[label] = m
    print(f"| {label} | {m[0]:.2f} s | {m[1]:.2f} s ({m[2]:.2f} + {m[3]:.2f}) | {m[4] / 1024:.0f} MiB | "
          + ", ".join(f"{x[0]:.2f}" for x in runs) + " |")
w = json.load(open(f"{d}/uniform-4.json"))["weights"]
for label in ("dry-run --bits auto", "dry-run --bits auto --measure-error"):
    dw, dc = (med[label][i] - med["dry-run --bits 4"][i] for i in (0, 1))
    print(f"{label}: +{dw:.2f} s wall, +{dc:.2f} s CPU over --bits 4, {dc / w * 1e9:.1f} ns CPU per weight")
dw, dc = (med["bf16 -j2 --checksums"][i] - med["bf16 -j2"][i] for i in (0, 1))
written = json.load(open(f"{d}/bf16-checksums.json"))["bytes_written"]
print(f"--checksums: {dw:+.2f} s wall, {dc:+.2f} s CPU for {written:,} bytes written"
      + (f" ({written / dw / 1e9:.2f} GB/s of wall time)" if dw > 0 else ""))
PY
