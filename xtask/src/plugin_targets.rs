//! The kubectl plugin's other platforms: `cargo check --target` for macOS on Intel and Apple
//! silicon, from this Linux machine, without the macOS SDK.
//!
//! The plugin's Rust code, and every Rust crate under it, is type-checked for the target. One
//! dependency compiles C in its build script (ring, under rustls): it is compiled by the LLVM
//! clang that setup installs, freestanding, with ring's own switch for building without a C
//! library (`RING_CORE_NOSTDLIBINC`) and a stand-in for the one SDK header it reads
//! (`TargetConditionals.h`, the platform macros). Nothing is linked: a binary for macOS is built
//! on macOS (docs/install.md).
use std::fs;

use anyhow::{Context, Result};

use crate::{
    setup::LLVM_MAJOR,
    sh::{cargo, log, run, target_dir},
};

/// The macOS targets the plugin is checked for (setup adds them to the host toolchain).
pub const MACOS_TARGETS: [&str; 2] = ["x86_64-apple-darwin", "aarch64-apple-darwin"];

/// The SDK's platform macros for macOS, as `TargetConditionals.h` defines them there.
const TARGET_CONDITIONALS: &str = "\
/* Stand-in for the macOS SDK's header of the same name: the platform macros, for macOS. */
#pragma once
#define TARGET_OS_MAC 1
#define TARGET_OS_OSX 1
#define TARGET_OS_IPHONE 0
#define TARGET_OS_IOS 0
#define TARGET_OS_TV 0
#define TARGET_OS_WATCH 0
#define TARGET_OS_SIMULATOR 0
";

/// `cargo check -p kubectl-node-monitor --target <t>` for each macOS target.
pub fn check_macos() -> Result<()> {
    let shim = target_dir().join("macos-sdk-stand-in");
    fs::create_dir_all(&shim).with_context(|| format!("creating {}", shim.display()))?;
    fs::write(shim.join("TargetConditionals.h"), TARGET_CONDITIONALS)
        .with_context(|| format!("writing {}", shim.display()))?;
    let clang = format!("/usr/lib/llvm-{LLVM_MAJOR}/bin/clang");
    for target in MACOS_TARGETS {
        log("lint", format!("kubectl-node-monitor for {target}"));
        let var = target.replace('-', "_");
        run(cargo()
            .args([
                "check",
                "--locked",
                "-p",
                "kubectl-node-monitor",
                "--target",
            ])
            .arg(target)
            .env(format!("CC_{var}"), &clang)
            .env(
                format!("CFLAGS_{var}"),
                format!(
                    "-ffreestanding -nostdlibinc -DRING_CORE_NOSTDLIBINC -I{}",
                    shim.display()
                ),
            ))?;
    }
    Ok(())
}
