#!/usr/bin/env bash
# The project's test command: the Rust suite, then the Python tests against real MLX, mlx-lm,
# PyTorch, transformers and llama.cpp, run on the binary the Rust suite built.
#
# The Python packages live in a virtual environment inside the repository (.venv/, git-ignored), made
# with `python3 -m venv` on the first run; the Python on PATH is never modified. Packages are
# (re)installed only when tests/python/requirements.txt or the interpreter changed, so later runs
# skip pip entirely. Set PYTHON to choose the interpreter the venv is made from (default python3;
# 3.11 or newer). Delete .venv/ to start from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="$PWD/.venv"
REQUIREMENTS=tests/python/requirements.txt
STAMP="$VENV/.requirements-stamp"
PYTHON="${PYTHON:-python3}"

# Prints how long the phase that just ended took (stderr), e.g. "scripts/test.sh: cargo test: 95 s".
phase_start=$SECONDS
phase_done() {
    printf 'scripts/test.sh: %s: %d s\n' "$1" $((SECONDS - phase_start)) >&2
    phase_start=$SECONDS
}

die() {
    printf 'scripts/test.sh: %s\n' "$*" >&2
    exit 1
}

venv_hint() {
    case "$(uname -s)" in
        Darwin) echo "Homebrew's python includes venv and pip: brew install python" ;;
        *) echo "on Debian/Ubuntu install the venv module: sudo apt install python3-venv (Ubuntu may name it python3.X-venv, X from \`$PYTHON --version\`)" ;;
    esac
}

# True when $VENV holds a working interpreter with pip.
venv_ok() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1
}

if ! venv_ok; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install Python 3.11 or newer, or set PYTHON"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        die "$PYTHON is $("$PYTHON" -c 'import platform; print(platform.python_version())'); the pinned test packages (torch 2.15, numpy 2.4) need Python 3.11 or newer: set PYTHON to one"
    # A half-made venv (Debian without python3-venv leaves one behind) or one whose interpreter has
    # gone away (a Homebrew upgrade) is replaced.
    rm -rf "$VENV"
    echo "scripts/test.sh: creating $VENV from $(command -v "$PYTHON")" >&2
    if ! "$PYTHON" -m venv "$VENV" || ! venv_ok; then
        rm -rf "$VENV"
        die "\`$PYTHON -m venv\` could not make a virtual environment with pip; $(venv_hint)"
    fi
fi

# What the installed packages were made from: the requirements file and the interpreter.
want="$("$VENV/bin/python" -c '
import hashlib, platform, sys
h = hashlib.sha256(open(sys.argv[1], "rb").read())
h.update(f"{sys.version} {platform.machine()} {sys.base_prefix}".encode())
print(h.hexdigest())' "$REQUIREMENTS")"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]; then
    echo "scripts/test.sh: installing $REQUIREMENTS into $VENV" >&2
    rm -f "$STAMP"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
    echo "$want" >"$STAMP"
fi
phase_done "Python venv and packages"

# llama.cpp for the GGUF tests, built once into a cache outside the checkout (scripts/llama-cpp.sh);
# its env file exports ESCHA_LLAMA_CPP (the sources: the Rust suite compiles ggml-quants.c from them,
# test_gguf.py runs convert_hf_to_gguf.py) and ESCHA_LLAMA_BIN (llama-quantize, llama_logits).
bash scripts/llama-cpp.sh
# shellcheck source=/dev/null
. "$(bash scripts/llama-cpp.sh --print-env)"
phase_done "llama.cpp"

cargo test --locked
phase_done "cargo test"
# The binary cargo test built (the test profile is optimised). test_wheel.py alone builds the
# release profile, to package the Python wheel: the build `cargo build --release` makes, which
# scripts/test-aarch64.sh then reuses.
ESCHA_CONVERT="${CARGO_TARGET_DIR:-$PWD/target}/debug/escha-convert" "$VENV/bin/python" -m pytest tests/python -q
phase_done "pytest"
