#!/usr/bin/env bash
# The project's test command: installs the Python test packages, then runs the Rust suite and the
# Python tests against real MLX and mlx-lm.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt

cargo test --locked
cargo build --release --locked
ESCHA_CONVERT="$PWD/target/release/escha-convert" python3 -m pytest tests/python -q
