#!/usr/bin/env bash
# Type-checks the Metal backend (cargo feature `metal`) on a machine without Metal, e.g. Linux CI.
#
# objc2, block2 and objc2-foundation compile for GNUstep's Objective-C runtime through their `gnustep-*`
# features; objc2-metal does not, only because of one unconditional
# `#[link(name = "Metal", kind = "framework")]`. So this script
#   1. copies the objc2-metal source that Cargo.lock pins out of the Cargo registry into
#      $TARGET/objc2-metal-patched and makes that `#[link]` Apple-only;
#   2. copies the crate (its git-listed files, fixtures left out) into $TARGET/metal-check, so the
#      repository's Cargo.toml and Cargo.lock (the ones a Mac uses) are never touched;
#   3. runs `cargo check --all-targets --features metal` there, with the patched objc2-metal passed
#      as `--config 'patch.crates-io.objc2-metal.path="..."'`, the GNUstep features switched on, and
#      cfg `escha_metal_typecheck` set so the macOS-only tests (tests/it/metal_gpu.rs) are checked too.
# Nothing is linked or run: `cargo check` stops after type-checking.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target}
mkdir -p "$target"
target=$(cd "$target" && pwd)
gnustep=gnustep-2-1

cargo fetch --locked --quiet
manifest=$(cargo metadata --locked --format-version 1 --all-features 2>/dev/null \
    | grep -o '"manifest_path":"[^"]*/objc2-metal-[0-9][^"/]*/Cargo.toml"' | head -n 1 | cut -d'"' -f4)
if [[ -z "$manifest" || ! -f "$manifest" ]]; then
    echo "check-metal-on-linux: cannot find the objc2-metal source in the Cargo registry" >&2
    exit 1
fi
src=$(dirname "$manifest")

patched=$target/objc2-metal-patched
rm -rf "$patched"
mkdir -p "$patched"
cp -R "$src/." "$patched/"
chmod -R u+w "$patched"
link='#[link(name = "Metal", kind = "framework")]'
apple_only='#[cfg_attr(target_vendor = "apple", link(name = "Metal", kind = "framework"))]'
grep -qF "$link" "$patched/src/generated/mod.rs" || {
    echo "check-metal-on-linux: $(basename "$src") no longer has the expected #[link] line; update this script" >&2
    exit 1
}
sed -i.orig "s|$(printf '%s' "$link" | sed 's/[][\.*^$/]/\\&/g')|$apple_only|" "$patched/src/generated/mod.rs"
grep -qF "$apple_only" "$patched/src/generated/mod.rs"
if grep -rn --include='*.rs' '^#\[link(' "$patched/src" >/dev/null; then
    echo "check-metal-on-linux: $(basename "$src") has another unconditional #[link]:" >&2
    grep -rn --include='*.rs' '^#\[link(' "$patched/src" >&2
    exit 1
fi

work=$target/metal-check
rm -rf "$work"
mkdir -p "$work"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard \
        | grep -zv '^fixtures/' \
        | while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done \
        | tar --null -T - -cf - | tar -xf - -C "$work"
else
    tar --exclude=./target --exclude=./fixtures --exclude=./.git -cf - . | tar -xf - -C "$work"
fi

cd "$work"
echo "check-metal-on-linux: cargo check --features metal with $(basename "$src") patched (GNUstep runtime features: $gnustep)"
cargo check --all-targets \
    --features "metal,objc2/$gnustep,block2/$gnustep,objc2-foundation/$gnustep" \
    --config "patch.crates-io.objc2-metal.path=\"$patched\"" \
    --config 'build.rustflags=["--cfg", "escha_metal_typecheck"]'
echo "check-metal-on-linux: ok"
