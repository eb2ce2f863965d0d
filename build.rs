//! Build script: compiles the Metal kernel (`kernels/trellis_decode.metal`) as C++20 for the CPU,
//! through `kernels/shim/metal_shim.h`, so `tests/it/metal_kernel_shim.rs` can run the kernel thread
//! by thread against the scalar decoder on any machine.
//!
//! The object is passed to the linker of test targets only (`rustc-link-arg-tests`); the library
//! and the binary never contain it. A C++ compiler without `_Float16` support is not an error for
//! the build: the `escha_kernel_shim` cfg stays unset, and the shim test then fails and says why.

use std::path::Path;

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
