#!/usr/bin/env bash
# The project's test command: the Rust suite (unit, golden, integration tests).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked
