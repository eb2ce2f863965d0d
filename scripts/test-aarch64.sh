#!/usr/bin/env bash
# The aarch64 (64-bit ARM Linux) checks, on an x86_64 Debian/Ubuntu machine, under qemu-user:
#
#   1. set-up, idempotent: the Rust target, the cross gcc/g++ (linker; build.rs compiles the Metal
#      kernel shim for the tests) and qemu-user, each installed only when missing;
#   2. clippy with -D warnings for the target (the NEON code is compiled only there), then the Rust
#      tests, cross-built and run under qemu-user (.cargo/config.toml names the linker and
#      the runner): every test except the encoder's (tests/it/encoder.rs), see below;
#   3. scripts/output-digests.sh (SHA-256 of every file written for both bundled fixtures,
#      fixtures/dense and fixtures/moe, under its matrix of option sets: bf16, f16, MLX, EXL3, GGUF
#      with every --gguf-type, shards, --only, ...) gives the same list for the aarch64 release
#      binary under qemu-user as for the native x86_64 release binary: same files, same bytes, same
#      FAIL lines, shown as a diff where they differ;
#   4. `verify fixtures/dense --base fixtures/dense-base` passes under qemu-user, with the NEON
#      decoder.
#
# Left out of step 2: tests/it/encoder.rs, the Viterbi encoder's round trips. It is target-independent
# scalar code (the decoders it calls are covered by decoder_props, golden and reconstruct) and
# takes about 23 minutes emulated, against about a minute for all the other tests together.
# `cargo test --locked --target aarch64-unknown-linux-gnu` runs everything.
#
# Prints each step; exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu # Debian's libc6-arm64-cross, a dependency of the cross gcc
target_dir=${CARGO_TARGET_DIR:-target}

step() { printf '\n== test-aarch64: %s\n' "$*"; }
die() {
    echo "test-aarch64: FAILED: $*" >&2
    exit 1
}
trap 'echo "test-aarch64: FAILED (line $LINENO: $BASH_COMMAND)" >&2' ERR
start=$SECONDS

step "set-up"
{ command -v cargo && command -v rustup; } >/dev/null || die "needs cargo and rustup"
if rustup target list --installed | grep -qx "$TARGET"; then
    echo "rust target $TARGET: present"
else
    echo "rust target $TARGET: adding"
    rustup target add "$TARGET"
fi
missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if ((${#missing[@]})); then
    echo "installing ${missing[*]}"
    command -v apt-get >/dev/null || die "missing ${missing[*]}, and no apt-get to install them"
    sudo=()
    if [[ $(id -u) != 0 ]]; then
        command -v sudo >/dev/null || die "missing ${missing[*]}; installing them needs root or sudo"
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -q || die "apt-get update"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
        || die "apt-get install ${missing[*]}"
fi
for tool in aarch64-linux-gnu-gcc aarch64-linux-gnu-g++ qemu-aarch64; do
    command -v "$tool" >/dev/null || die "$tool still missing after the set-up"
done
[[ -e $SYSROOT/lib/ld-linux-aarch64.so.1 ]] || die "no aarch64 C library in $SYSROOT (package libc6-arm64-cross)"
echo "$(aarch64-linux-gnu-gcc --version | head -n 1); $(qemu-aarch64 --version | head -n 1)"

step "lints of the aarch64-only code (NEON paths): clippy for $TARGET with -D warnings"
cargo clippy --locked --target "$TARGET" --all-targets -- -D warnings

step "Rust tests for $TARGET under qemu-user (all but the encoder tests)"
# The ggml encoders' comparison compiles ggml-quants.c from the cached llama.cpp sources.
bash scripts/llama-cpp.sh
# shellcheck disable=SC1090
. "$(bash scripts/llama-cpp.sh --print-env)"
t0=$SECONDS
cargo test --locked --target "$TARGET" --no-run
echo "build: $((SECONDS - t0)) s"
# qemu-user can deadlock a child forked from a multi-threaded guest before it execs (a stuck child at
# 0% CPU, the test waiting on it for ever), and can kill a guest with a signal the program never
# raised. The same tests ran natively in scripts/test.sh, so a run that outlives its bound is
# reported and tried once more, and the tests that failed are named and run once more by name; a
# second failure fails the step.
tests_log=$(mktemp)
trap 'rm -f "$tests_log"' EXIT
for try in 1 2; do
    echo "cargo test --locked --target $TARGET -- --skip encoder:: (try $try, at most 25 min)"
    t0=$SECONDS
    status=0
    timeout --kill-after=30s 25m cargo test --locked --target "$TARGET" -- --skip encoder:: 2>&1 \
        | tee "$tests_log" || status=${PIPESTATUS[0]}
    echo "tests: $((SECONDS - t0)) s, exit $status"
    ((status == 124 || status == 137)) || break
    echo "test-aarch64: the emulated tests outlived 25 minutes (a qemu-user fork deadlock?)"
done
if ((status != 0 && status != 124 && status != 137)); then
    mapfile -t failed < <(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$tests_log")
    ((${#failed[@]})) || die "the Rust tests under qemu-user (exit $status, no failing test named)"
    echo "test-aarch64: ${#failed[@]} test(s) failed under qemu-user: ${failed[*]}; running them once more"
    status=0
    timeout --kill-after=30s 25m cargo test --locked --target "$TARGET" -- --exact "${failed[@]}" || status=$?
    ((status == 0)) && echo "test-aarch64: passed when run again under qemu-user: ${failed[*]}"
fi
rm -f "$tests_log"
((status == 0)) || die "the Rust tests under qemu-user (exit $status)"

step "release binaries: native and $TARGET"
cargo build --release --locked
cargo build --release --locked --target "$TARGET"
native=$target_dir/release/escha-convert
arm=$target_dir/$TARGET/release/escha-convert
if command -v file >/dev/null; then
    file -L "$arm" | grep -q 'ARM aarch64' || die "$arm is not an aarch64 binary"
fi
arm_run() { qemu-aarch64 -L "$SYSROOT" "$arm" "$@"; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# output-digests.sh runs the binary it is given (after realpath): for the aarch64 one, a wrapper that
# starts it under qemu-user.
arm_wrapper=$work/escha-convert-aarch64
printf '#!/usr/bin/env bash\nexec qemu-aarch64 -L %q %q "$@"\n' "$SYSROOT" "$(realpath "$arm")" >"$arm_wrapper"
chmod +x "$arm_wrapper"

step "scripts/output-digests.sh: native x86_64"
t0=$SECONDS
bash scripts/output-digests.sh "$native" >"$work/digests-x86_64.txt"
echo "  $(wc -l <"$work/digests-x86_64.txt") lines in $((SECONDS - t0)) s"

step "scripts/output-digests.sh: $TARGET under qemu-user"
t0=$SECONDS
bash scripts/output-digests.sh "$arm_wrapper" >"$work/digests-aarch64.txt"
echo "  $(wc -l <"$work/digests-aarch64.txt") lines in $((SECONDS - t0)) s"

step "digests: native x86_64 vs $TARGET under qemu-user"
if ! cmp -s "$work/digests-x86_64.txt" "$work/digests-aarch64.txt"; then
    echo "diff (- x86_64, + aarch64), at most 200 lines:"
    diff -u --label x86_64 --label "$TARGET" "$work/digests-x86_64.txt" "$work/digests-aarch64.txt" \
        | head -n 200 || true
    die "the aarch64 build's output digests differ from the native build's"
fi
grep -v ' FAIL$' "$work/digests-x86_64.txt" >"$work/digests-ok.txt" || die "no digests at all"
# The formats the earlier file-by-file comparison covered, each written for both fixtures.
# GGUF with q4_k_m runs the K-quant kernels (AVX2 here, NEON there) end to end.
for model in dense moe; do
    for format in "bf16" "mlx" "gguf --gguf-type q4_k_m"; do
        grep -qF "$model [--format $format] " "$work/digests-ok.txt" \
            || die "no digest for fixtures/$model in --format $format"
    done
done
fails=$(grep -c ' FAIL$' "$work/digests-x86_64.txt" || true)
echo "  identical: $(wc -l <"$work/digests-ok.txt") file digests, $fails FAIL lines on both"

step "verify fixtures/dense --base fixtures/dense-base under qemu-user"
arm_run verify fixtures/dense --base fixtures/dense-base | tee "$work/verify.txt"
grep -q 'decoder neon' "$work/verify.txt" || die "verify did not use the NEON decoder"

step "all aarch64 checks passed in $((SECONDS - start)) s"
