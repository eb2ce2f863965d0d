#!/usr/bin/env bash
# SHA-256 of every file a build writes for both fixtures under a matrix of output options.
# Run it with two builds and diff the results to show that a refactoring changed no byte:
#
#   bash scripts/output-digests.sh OLD_BINARY > before.txt
#   bash scripts/output-digests.sh target/release/escha-convert > after.txt
#   diff before.txt after.txt && echo identical
#
# A conversion that fails prints a FAIL line (so a difference in outcome shows in the diff too).
set -euo pipefail
bin=$(realpath "${1:?usage: output-digests.sh ESCHA_CONVERT_BINARY}")
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

option_sets=(
    "--format bf16"
    "--format f16"
    "--format bf16 --bias keep"
    "--format bf16 --mtp drop"
    "--format bf16 --max-shard-size 20000"
    "--format bf16 --only *layers.1.*"
    "--format mlx"
    "--format mlx --bits 2 --group-size 32"
    "--format mlx --bits 3 --group-size 128"
    "--format mlx --bits 5 --group-size 64"
    "--format mlx --bits 6 --group-size 32"
    "--format mlx --bits 8 --group-size 64 --int8 requant"
    "--format mlx --bits auto"
    "--format mlx --bias keep --max-shard-size 30000"
    "--format mlx --only *layers.1.mlp*"
    "--format exl3"
    "--format exl3 --bias keep --max-shard-size 200000"
    "--format gguf"
    "--format gguf --gguf-type f16"
    "--format gguf --gguf-type q8_0"
    "--format gguf --gguf-type q8_0 --max-shard-size 300000"
    "--format gguf --gguf-type q4_k"
    "--format gguf --gguf-type q5_k"
    "--format gguf --gguf-type q6_k"
    "--format gguf --gguf-type q4_k_m"
    "--format gguf --gguf-type q5_k_m --mtp drop"
    "--format gguf --gguf-type q4_k_m --int8 requant"
    "--format gguf --gguf-type auto"
    "--format gguf --gguf-type auto --measure-error --max-added-error 0.05"
    "--format gguf --gguf-type q2_k --int8 requant"
    "--format gguf --gguf-type q3_k_m"
    "--format gguf --gguf-type iq4_xs"
)

for fixture in dense moe; do
    for i in "${!option_sets[@]}"; do
        opts=${option_sets[$i]}
        out=$work/$fixture-$i
        # Word splitting of $opts is intended; the globs are for --only, not the shell.
        set -f
        # shellcheck disable=SC2086
        if ! "$bin" "$root/fixtures/$fixture" "$out" --quiet $opts 2>/dev/null; then
            echo "$fixture [$opts] FAIL"
        fi
        set +f
        if [ -d "$out" ]; then
            (cd "$out" && find . -type f | LC_ALL=C sort | xargs sha256sum) | sed "s|^|$fixture [$opts] |"
        fi
    done
done
