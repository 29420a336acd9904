//! Builds the eBPF programs with the pinned nightly (its LLVM must match bpf-linker's; see
//! scripts/setup.sh) and leaves the object in OUT_DIR for `include_bytes_aligned!`.
use aya_build::{Package, Toolchain};

/// The nightly that compiles the eBPF crate. Keep in step with `EBPF_TOOLCHAIN` in xtask/src/setup.rs (a unit test there checks).
const EBPF_TOOLCHAIN: &str = "nightly-2026-07-20";

fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../node-monitor-ebpf");
    println!("cargo::rerun-if-env-changed=NODE_MONITOR_EBPF_TOOLCHAIN");
    let toolchain =
        std::env::var("NODE_MONITOR_EBPF_TOOLCHAIN").unwrap_or_else(|_| EBPF_TOOLCHAIN.to_owned());
    aya_build::build_ebpf(
        [Package {
            name: "node-monitor-ebpf",
            root_dir,
            ..Default::default()
        }],
        Toolchain::Custom(&toolchain),
    )
}
