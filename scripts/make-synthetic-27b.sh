#!/usr/bin/env bash
# A synthetic checkpoint of random codes in the dense 27B's shape: 64 layers (hidden 5120, MLP
# 17408: gate K=2, up and down K=3; every layer a full-attention block with q/k/v/o at K=3, where
# the real model has three linear-attention blocks in four: about the same bytes), the int8
# embedding and head over the 248,320-token vocabulary, and the norms: 10.33 GB of safetensors
# (the release is 10.15 GB).
#
#     bash scripts/make-synthetic-27b.sh OUT_DIR [LAYERS] [VOCAB]    (defaults 64 and 248320)
#
# A smaller LAYERS / VOCAB makes the same shape in miniature, for a sanity run.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: make-synthetic-27b.sh OUT_DIR [LAYERS] [VOCAB]}
LAYERS=${2:-64}
VOCAB=${3:-248320}
cargo build --release --quiet --example make_synthetic
target/release/examples/make_synthetic "$OUT" --hybrid --layers "$LAYERS" --vocab "$VOCAB"
