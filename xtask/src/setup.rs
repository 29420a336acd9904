//! One setup path for a fresh machine: Debian packages, the pinned Rust toolchains, bpf-linker,
//! the control-plane binaries and CRDs, the guest image and the real node's binaries.
//! Idempotent and cached: a second run checks versions and returns in seconds.
use std::process::Command;

use anyhow::{Result, bail};

use crate::{
    gobuild, guest,
    sh::{self, as_root, cache_dir, log, output, quiet_stdout, run, symlink_force},
};

/// The host toolchain; `rust-toolchain.toml` pins the same (checked by a unit test).
pub const HOST_TOOLCHAIN: &str = "1.99.0";
/// The eBPF toolchain: LLVM 22, like bpf-linker's; node-monitor/build.rs names the same (checked).
pub const EBPF_TOOLCHAIN: &str = "nightly-2026-07-20";
const BPF_LINKER_VERSION: &str = "0.13.0";
pub const LLVM_MAJOR: u32 = 22;
/// The prometheus-operator release whose CRDs (ServiceMonitor, PrometheusRule) the monitoring
/// manifests are applied against.
pub const PROMETHEUS_OPERATOR_VERSION: &str = "v0.85.0";

/// What to set up beyond the toolchains.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct SetupArgs {
    /// Also build the control plane (etcd, kube-apiserver, kube-controller-manager) and helm,
    /// and fetch the prometheus-operator CRDs.
    #[arg(long)]
    pub with_control_plane: bool,
    /// Also install qemu and mmdebstrap, build the guest image and the real node's binaries.
    #[arg(long)]
    pub with_vm: bool,
}

fn apt_packages(with_vm: bool) -> Vec<String> {
    let mut p = vec![
        // bpf-linker
        format!("llvm-{LLVM_MAJOR}-dev"),
        format!("libpolly-{LLVM_MAJOR}-dev"),
        "zlib1g-dev".into(),
        "libzstd-dev".into(),
        // the eBPF programs' C part (node-monitor-ebpf/c/task.c) is compiled to LLVM bitcode by
        // the clang of bpf-linker's LLVM; libbpf-sys, whose headers it includes, builds the
        // vendored libbpf against libelf and zlib
        format!("clang-{LLVM_MAJOR}"),
        "libelf-dev".into(),
        "make".into(),
        // build tooling
        "clang".into(),
        "pkg-config".into(),
        // benchmarks (bpf stats)
        "bpftool".into(),
        // memory pressure in tests
        "stress-ng".into(),
        // promtool, dashboard queries
        "prometheus".into(),
    ];
    if with_vm {
        // guest VM tier
        p.extend(["qemu-system-x86".into(), "mmdebstrap".into()]);
    }
    p
}

/// Runs every step; returns nothing but fails loudly on the first step that cannot be done.
pub fn setup(args: SetupArgs) -> Result<()> {
    packages(args.with_vm)?;
    toolchains()?;
    bpf_linker()?;
    if args.with_control_plane {
        let assets = gobuild::control_plane()?;
        symlink_force(&assets, &cache_dir().join("control-plane/current"))?;
        let skew = gobuild::control_plane_at(gobuild::SKEW_K8S_VERSION)?;
        symlink_force(&skew, &cache_dir().join("control-plane/skew"))?;
        let crds = gobuild::prometheus_operator_crds(PROMETHEUS_OPERATOR_VERSION)?;
        symlink_force(&crds, &cache_dir().join("prometheus-operator/current"))?;
        let helm = gobuild::helm()?;
        symlink_force(&helm, &cache_dir().join("helm/current"))?;
        let kustomize = gobuild::kustomize()?;
        symlink_force(&kustomize, &cache_dir().join("kustomize/current"))?;
    }
    if args.with_vm {
        guest::image()?;
        let node = gobuild::node()?;
        symlink_force(&node, &cache_dir().join("node/current"))?;
        let node_skew = gobuild::node_at(gobuild::SKEW_K8S_VERSION)?;
        symlink_force(&node_skew, &cache_dir().join("node/skew"))?;
    }
    log("setup", "ok");
    Ok(())
}

fn installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_ok_and(|s| s.contains("install ok installed"))
}

fn packages(with_vm: bool) -> Result<()> {
    let missing: Vec<String> = apt_packages(with_vm)
        .into_iter()
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    log(
        "setup",
        format!("installing Debian packages: {}", missing.join(" ")),
    );
    run(quiet_stdout(as_root("apt-get").args(["update", "-qq"])))?;
    // --no-remove: never let apt resolve a clash by removing packages the machine already has.
    run(quiet_stdout(
        as_root("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args([
                "install",
                "-y",
                "-qq",
                "--no-remove",
                "--no-install-recommends",
            ])
            .args(&missing),
    ))?;
    // The Debian prometheus package starts a server where an init system runs; the tests start
    // their own.
    if missing.iter().any(|p| p == "prometheus") && sh::have("systemctl") {
        let _ = as_root("systemctl")
            .args(["disable", "--now", "prometheus"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
    Ok(())
}

fn toolchains() -> Result<()> {
    if !sh::have("rustup") {
        bail!("rustup is required (https://rustup.rs)");
    }
    let list = output(Command::new("rustup").args(["toolchain", "list"]))?;
    let has = |t: &str| list.lines().any(|l| l.starts_with(&format!("{t}-")));
    if !has(HOST_TOOLCHAIN) {
        log("setup", format!("installing Rust {HOST_TOOLCHAIN}"));
        run(quiet_stdout(Command::new("rustup").args([
            "toolchain",
            "install",
            HOST_TOOLCHAIN,
            "--profile",
            "minimal",
            "--component",
            "clippy,rustfmt",
        ])))?;
    }
    let installed = output(Command::new("rustup").args([
        "target",
        "list",
        "--toolchain",
        HOST_TOOLCHAIN,
        "--installed",
    ]))?;
    let missing: Vec<&str> = crate::plugin_targets::MACOS_TARGETS
        .into_iter()
        .filter(|t| !installed.lines().any(|l| l.trim() == *t))
        .collect();
    if !missing.is_empty() {
        log(
            "setup",
            format!("adding the plugin's targets {}", missing.join(", ")),
        );
        run(quiet_stdout(
            Command::new("rustup")
                .args(["target", "add", "--toolchain", HOST_TOOLCHAIN])
                .args(&missing),
        ))?;
    }
    let has_src = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        EBPF_TOOLCHAIN,
        "--installed",
    ]))
    .is_ok_and(|c| c.lines().any(|l| l.starts_with("rust-src")));
    if !has(EBPF_TOOLCHAIN) || !has_src {
        log(
            "setup",
            format!("installing Rust {EBPF_TOOLCHAIN} with rust-src (eBPF)"),
        );
        run(quiet_stdout(Command::new("rustup").args([
            "toolchain",
            "install",
            EBPF_TOOLCHAIN,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ])))?;
    }
    Ok(())
}

/// bpf-linker, linked against the same LLVM as the eBPF nightly.
fn bpf_linker() -> Result<()> {
    let current = output(
        Command::new("bpf-linker")
            .arg("--version")
            .env("PATH", sh::path_with_cargo_bin()),
    )
    .unwrap_or_default();
    if current.contains(BPF_LINKER_VERSION) {
        return Ok(());
    }
    log(
        "setup",
        format!("installing bpf-linker {BPF_LINKER_VERSION} against LLVM {LLVM_MAJOR}"),
    );
    // Through rustup's proxy (`cargo +toolchain`), not the cargo that runs us.
    run(quiet_stdout(
        Command::new("cargo")
            .current_dir(sh::workspace_root())
            .env("PATH", sh::path_with_cargo_bin())
            .env("LLVM_PREFIX", format!("/usr/lib/llvm-{LLVM_MAJOR}"))
            .arg(format!("+{HOST_TOOLCHAIN}"))
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--locked", "--no-default-features", "--features"])
            .arg(format!("llvm-{LLVM_MAJOR}")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sh::workspace_root;

    #[test]
    fn toolchains_match_the_files_that_pin_them() {
        let pinned = std::fs::read_to_string(workspace_root().join("rust-toolchain.toml"))
            .expect("rust-toolchain.toml");
        assert!(
            pinned.contains(&format!("channel = \"{HOST_TOOLCHAIN}\"")),
            "rust-toolchain.toml does not pin {HOST_TOOLCHAIN}"
        );
        let build_rs = std::fs::read_to_string(workspace_root().join("node-monitor/build.rs"))
            .expect("node-monitor/build.rs");
        assert!(
            build_rs.contains(EBPF_TOOLCHAIN),
            "node-monitor/build.rs does not build with {EBPF_TOOLCHAIN}"
        );
    }

    #[test]
    fn the_vm_packages_come_only_with_the_vm() {
        assert!(!apt_packages(false).iter().any(|p| p == "mmdebstrap"));
        assert!(apt_packages(true).iter().any(|p| p == "mmdebstrap"));
    }

    #[test]
    fn the_ebpf_c_part_is_compiled_by_the_clang_that_setup_installs() {
        let clang = format!("llvm-{LLVM_MAJOR}/bin/clang");
        let build_rs = std::fs::read_to_string(workspace_root().join("node-monitor-ebpf/build.rs"))
            .expect("node-monitor-ebpf/build.rs");
        assert!(
            build_rs.contains(&clang),
            "node-monitor-ebpf/build.rs does not compile with {clang}"
        );
        let packages = apt_packages(false);
        for p in [format!("clang-{LLVM_MAJOR}"), "libelf-dev".to_owned()] {
            assert!(packages.contains(&p), "setup does not install {p}");
        }
    }
}
