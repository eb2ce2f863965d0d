#!/usr/bin/env bash
# llama.cpp for the GGUF tests (tests/python/test_gguf.py, and the Rust test that compiles
# ggml-quants.c): the sources of the PyPI source distribution of llama-cpp-python 0.3.36, whose
# vendor/llama.cpp holds convert_hf_to_gguf.py, gguf-py and the C/C++ sources, built for the CPU.
#
# Everything lives in a cache outside the checkout,
#     ${ESCHA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/escha-convert}/llama-cpp-0.3.36/
# and every step is skipped when it is already done, so a second run takes about a second:
#
#   1. dl/       the sdist, fetched with `pip download` (checked against its sha256);
#   2. src/      the sdist extracted (src/llama_cpp_python-0.3.36/vendor/llama.cpp);
#   3. build/    llama.cpp configured with cmake (Release, static libraries, no network code, no
#                tests, examples or server) and only the targets the tests use built: the `llama`
#                library, `llama-quantize` and `llama-imatrix` (the importance matrices of the
#                `--imatrix` tests). The first build took 942 s on a shared 2-core machine
#                busy with other jobs (8.8 CPU-minutes: roughly 4.5 minutes on 2 idle cores);
#   4. bin/      llama-quantize, llama-imatrix, and llama_logits built from tests/c/llama_logits.cpp against that
#                build's libllama (rebuilt when the source changes);
#   5. env.sh    exports ESCHA_LLAMA_CPP (the vendor/llama.cpp source directory) and ESCHA_LLAMA_BIN
#                (bin/). scripts/test.sh sources it; by hand:
#                    bash scripts/llama-cpp.sh && . "$(bash scripts/llama-cpp.sh --print-env)"
#
# Options: --print-env prints the path of env.sh and does nothing else (it need not exist yet).
# Needs: cmake, a C and C++ compiler (g++), make, and a Python with pip (the repository's .venv/ when
# it exists, else $PYTHON or python3). Delete the cache directory to start from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.36
SDIST=llama_cpp_python-$VERSION.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CACHE="${ESCHA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/escha-convert}/llama-cpp-$VERSION"
SRC="$CACHE/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$CACHE/build"
BIN="$CACHE/bin"
ENV_FILE="$CACHE/env.sh"
LOGITS_SRC="$PWD/tests/c/llama_logits.cpp"

if [[ ${1:-} == --print-env ]]; then
    echo "$ENV_FILE"
    exit 0
fi
[[ $# == 0 ]] || {
    echo "usage: bash scripts/llama-cpp.sh [--print-env]" >&2
    exit 2
}

say() { printf 'scripts/llama-cpp.sh: %s\n' "$*" >&2; }
die() {
    say "$*"
    exit 1
}

for tool in cmake make g++ tar; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (on Debian/Ubuntu: apt install cmake g++ make)"
done
if [[ -x .venv/bin/python ]]; then
    PY=.venv/bin/python
else
    PY="${PYTHON:-python3}"
fi

mkdir -p "$CACHE"
# One run at a time per cache (a second waits for the first).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.lock"
    flock 9
fi

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi
}
jobs="$(nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)"

# 1. The sdist.
if [[ ! -f $CACHE/dl/$SDIST ]] || [[ $(sha256 "$CACHE/dl/$SDIST") != "$SDIST_SHA256" ]]; then
    say "downloading $SDIST from PyPI"
    rm -rf "$CACHE/dl.tmp"
    timeout 1800 "$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$CACHE/dl.tmp"
    got="$(sha256 "$CACHE/dl.tmp/$SDIST")"
    [[ $got == "$SDIST_SHA256" ]] || die "$SDIST has sha256 $got, expected $SDIST_SHA256"
    rm -rf "$CACHE/dl"
    mv "$CACHE/dl.tmp" "$CACHE/dl"
    rm -f "$CACHE/src/.extracted"
fi

# 2. Extracted.
if [[ ! -f $CACHE/src/.extracted ]]; then
    say "extracting $SDIST"
    rm -rf "$CACHE/src"
    mkdir -p "$CACHE/src"
    tar -xzf "$CACHE/dl/$SDIST" -C "$CACHE/src"
    [[ -f $SRC/convert_hf_to_gguf.py ]] || die "$SDIST has no vendor/llama.cpp/convert_hf_to_gguf.py"
    touch "$CACHE/src/.extracted"
    rm -rf "$BUILD"
fi

# 3. The build. GGML_NATIVE=OFF with the x86 baseline ggml then picks (SSE4.2, AVX, AVX2, BMI2, FMA,
# F16C) keeps a cached build usable on another machine of the same architecture; the tests compare
# two models under the same build, so its speed and rounding choices do not matter.
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF
    -DGGML_CCACHE=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_TOOLS=ON # llama-quantize lives under tools/
)
TARGETS=(llama llama-quantize llama-imatrix)
build_id="$(printf '%s\n' "$VERSION" "${CMAKE_FLAGS[@]}" "${TARGETS[@]}" "$(command -v g++)" "$(g++ --version | head -1)")"
if [[ $(cat "$BUILD/.built" 2>/dev/null || true) != "$build_id" ]]; then
    say "building llama.cpp (${TARGETS[*]}) with $jobs jobs; the first build takes 5 to 15 minutes on 2 cores"
    start=$SECONDS
    rm -f "$BUILD/.built"
    cmake -S "$SRC" -B "$BUILD" "${CMAKE_FLAGS[@]}" >"$CACHE/cmake-configure.log" 2>&1 ||
        die "cmake configure failed; see $CACHE/cmake-configure.log"
    cmake --build "$BUILD" --config Release -j"$jobs" --target "${TARGETS[@]}" >"$CACHE/cmake-build.log" 2>&1 ||
        die "cmake build failed; see the end of $CACHE/cmake-build.log"
    printf '%s' "$build_id" >"$BUILD/.built"
    say "built llama.cpp in $((SECONDS - start)) s"
    rm -rf "$BIN"
fi

# 4. bin/: llama-quantize, llama-imatrix and our llama_logits.
mkdir -p "$BIN"
quantize="$(find "$BUILD/bin" "$BUILD" -maxdepth 1 -name llama-quantize -type f -perm -u+x 2>/dev/null | head -1)"
[[ -n $quantize ]] || die "no llama-quantize under $BUILD"
cmp -s "$quantize" "$BIN/llama-quantize" || cp "$quantize" "$BIN/llama-quantize"
imatrix="$(find "$BUILD/bin" "$BUILD" -maxdepth 1 -name llama-imatrix -type f -perm -u+x 2>/dev/null | head -1)"
[[ -n $imatrix ]] || die "no llama-imatrix under $BUILD"
cmp -s "$imatrix" "$BIN/llama-imatrix" || cp "$imatrix" "$BIN/llama-imatrix"

libs=()
for lib in src/libllama.a ggml/src/libggml.a ggml/src/libggml-cpu.a ggml/src/libggml-base.a; do
    [[ -f $BUILD/$lib ]] || die "$BUILD/$lib missing: the build did not make the static libraries"
    libs+=("$BUILD/$lib")
done
logits_id="$(sha256 "$LOGITS_SRC") $build_id"
if [[ ! -x $BIN/llama_logits ]] || [[ $(cat "$BIN/.llama_logits" 2>/dev/null || true) != "$logits_id" ]]; then
    say "building llama_logits from tests/c/llama_logits.cpp"
    extra=()
    grep -q '^GGML_OPENMP:BOOL=ON' "$BUILD/CMakeCache.txt" && extra+=(-fopenmp)
    g++ -std=c++17 -O2 -Wall -Wextra -o "$BIN/llama_logits.tmp" "$LOGITS_SRC" \
        -I"$SRC/include" -I"$SRC/ggml/include" "${libs[@]}" "${extra[@]}" -lpthread -ldl -lm
    mv "$BIN/llama_logits.tmp" "$BIN/llama_logits"
    printf '%s' "$logits_id" >"$BIN/.llama_logits"
fi

# 5. env.sh.
{
    echo "# Written by scripts/llama-cpp.sh: llama.cpp $VERSION (from llama-cpp-python's sdist) for the GGUF tests."
    printf 'export ESCHA_LLAMA_CPP=%q\n' "$SRC"
    printf 'export ESCHA_LLAMA_BIN=%q\n' "$BIN"
} >"$ENV_FILE.tmp"
mv "$ENV_FILE.tmp" "$ENV_FILE"
say "ready; source $ENV_FILE (ESCHA_LLAMA_CPP=$SRC, ESCHA_LLAMA_BIN=$BIN)"
