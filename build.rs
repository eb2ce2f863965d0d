//! Build script: compiles the Metal kernel (`kernels/trellis_decode.metal`) as C++20 for the CPU,
//! through `kernels/shim/metal_shim.h`, so `tests/it/metal_kernel_shim.rs` can run the kernel thread
//! by thread against the scalar decoder on any machine.
//!
//! It also records what `escha-convert --version` reports of the build (`ESCHA_BUILD_*`): the git
//! commit it came from (`ESCHA_BUILD_COMMIT` in the environment wins; else `git rev-parse --short
//! HEAD` when the package is the top of a git checkout; else "unknown": a build without git never
//! fails for it), the enabled cargo features, the target triple and the profile.
//!
//! The object is passed to the linker of test targets only (`rustc-link-arg-tests`); the library
//! and the binary never contain it. A C++ compiler without `_Float16` support is not an error for
//! the build: the `escha_kernel_shim` cfg stays unset, and the shim test then fails and says why.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rustc-check-cfg=cfg(escha_kernel_shim)");
    // Set by scripts/check-metal-on-linux.sh so the macOS-only Metal tests are type-checked too.
    println!("cargo:rustc-check-cfg=cfg(escha_metal_typecheck)");
    // A cross build (e.g. aarch64 on x86_64, tests run under qemu-user): the CLI tests start the
    // binary through the emulator (tests/it/common.rs, .cargo/config.toml).
    println!("cargo:rustc-check-cfg=cfg(escha_cross)");
    if std::env::var("TARGET").ok() != std::env::var("HOST").ok() {
        println!("cargo:rustc-cfg=escha_cross");
    }

    build_info();

    let apple = std::env::var("CARGO_CFG_TARGET_VENDOR").as_deref() == Ok("apple");
    if std::env::var_os("CARGO_FEATURE_METAL").is_some() && !apple {
        println!(
            "cargo:warning=the `metal` feature runs on macOS only; on this target it type-checks but does not link"
        );
    }

    match compile_kernel_shim() {
        Ok(objects) => {
            for object in objects {
                println!("cargo:rustc-link-arg-tests={}", object.display());
            }
            println!("cargo:rustc-cfg=escha_kernel_shim");
        }
        Err(e) => {
            println!("cargo:warning=the Metal kernel was not compiled for the CPU tests ({e}); tests/it/metal_kernel_shim.rs will fail");
        }
    }
}

fn compile_kernel_shim() -> Result<Vec<std::path::PathBuf>, cc::Error> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shim = root.join("kernels/shim/metal_shim.h");
    let kernel = root.join("kernels/trellis_decode.metal");
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .cargo_metadata(false)
        .warnings(true)
        // The same arithmetic as written: no contraction into FMA, no fast math.
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        // `[[buffer(0)]]` and friends are unknown attributes to a C++ compiler.
        .flag_if_supported("-Wno-attributes")
        .flag_if_supported("-Wno-unknown-attributes")
        .flag("-include")
        .flag(shim.to_str().expect("UTF-8 path"))
        // The source has a .metal extension: say what language it is.
        .flag("-x")
        .flag("c++")
        .file(kernel)
        .try_compile_intermediates()
}

/// Sets `ESCHA_BUILD_COMMIT`, `ESCHA_BUILD_FEATURES`, `ESCHA_BUILD_TARGET` and `ESCHA_BUILD_PROFILE`
/// for `--version`.
fn build_info() {
    println!("cargo:rerun-if-env-changed=ESCHA_BUILD_COMMIT");
    let commit = match std::env::var("ESCHA_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git_commit().unwrap_or_else(|| "unknown".into()),
    };
    println!("cargo:rustc-env=ESCHA_BUILD_COMMIT={commit}");

    // Cargo passes each enabled feature as CARGO_FEATURE_<NAME> (upper case, `-` as `_`).
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(|f| f.to_lowercase().replace('_', "-")))
        .collect();
    features.sort();
    let features = if features.is_empty() { "none".to_string() } else { features.join(", ") };
    println!("cargo:rustc-env=ESCHA_BUILD_FEATURES={features}");

    println!("cargo:rustc-env=ESCHA_BUILD_TARGET={}", std::env::var("TARGET").unwrap_or_default());
    // The profile's own name is the directory cargo builds it in (target/[TRIPLE/]PROFILE/build/
    // PKG-HASH/out): `release`, `debug` (dev and test), or a custom profile's name. PROFILE only
    // says debug or release.
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let profile = out_dir
        .ancestors()
        .nth(3)
        .and_then(Path::file_name)
        .map_or_else(|| std::env::var("PROFILE").unwrap_or_default(), |n| n.to_string_lossy().into_owned());
    let opt = std::env::var("OPT_LEVEL").unwrap_or_default();
    println!("cargo:rustc-env=ESCHA_BUILD_PROFILE={profile} (opt-level {opt})");
}

/// `git rev-parse --short HEAD` of the checkout this package is the top of, with the files whose
/// change means another commit registered for a rerun; `None` without git, outside a checkout, or
/// inside a checkout of something else (a packaged crate unpacked in another repository).
fn git_commit() -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").arg("-C").arg(root).args(args).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
    };
    let top = PathBuf::from(git(&["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != root.canonicalize().ok()? {
        return None;
    }
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    // HEAD, the branch it points to (a loose ref, or packed-refs): only files that exist, since a
    // missing one would rerun this script on every build.
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watch.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watch {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if Path::new(&path).is_file() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    Some(commit)
}
