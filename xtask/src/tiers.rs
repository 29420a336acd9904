//! The test tiers, the demo and the benchmarks, each as one command.
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Result, bail};
use clap::ValueEnum;

use crate::{
    gobuild,
    image::{self, ImageArgs, Profile, Which},
    remap,
    setup::{self, SetupArgs},
    sh::{self, cache_dir, cargo, log, run, target_dir, workspace_root},
};

/// The lock the guest VM tiers take, so two runs never share qemu's ports and the guest's disk.
const VM_LOCK: &str = "/tmp/nm-vm.lock";

/// A test tier (docs/testing.md, "Tiers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Tier {
    /// Format and lints: rustfmt --check, clippy -D warnings on every host crate, the layering,
    /// and the kubectl plugin type-checked for macOS (`cargo check --target`).
    Lint,
    /// The default members' tests: pure logic, the CLI, the docs held to the code. No root.
    Unit,
    /// The eBPF programs, the sampler and the reboot gate against the real kernel (root).
    Kernel,
    /// The agent and the actuator against a real control plane (root).
    ControlPlane,
    /// The shipped manifests: rendered, applied server-side, RBAC and alerts (root, promtool).
    Deploy,
    /// The whole path on this machine: stand-in node, real pods, the agent binary (root).
    E2e,
    /// The systemd guest: logind shutdown, cgroup v2 (qemu).
    Vm,
    /// The real kubelet and containerd in the guest, node-monitor from its manifests (qemu).
    RealNode,
    /// The control-plane and RBAC tests again, against the oldest supported API server (root).
    Skew,
}

impl Tier {
    /// The tier's integration test binary (`--test NAME`, `tests/tests/NAME/main.rs` in the
    /// `node-monitor-tests` crate); `None` for the tiers that are not integration tests.
    fn binary(self) -> Option<&'static str> {
        match self {
            Tier::Lint | Tier::Unit => None,
            Tier::Kernel => Some("kernel"),
            Tier::ControlPlane | Tier::Skew => Some("control_plane"),
            Tier::Deploy => Some("deploy"),
            Tier::E2e => Some("e2e"),
            Tier::Vm => Some("vm"),
            Tier::RealNode => Some("real_node"),
        }
    }

    /// The integration test binaries of the tier: its own, and for the skew tier the binaries
    /// that hold [`SKEW_TESTS`].
    fn binaries(self) -> Vec<&'static str> {
        match self {
            Tier::Skew => vec!["control_plane", "deploy"],
            t => t.binary().into_iter().collect(),
        }
    }

    /// The filters of the tier's run: the skew tier runs only [`SKEW_TESTS`]' modules.
    fn filters(self) -> Vec<String> {
        match self {
            Tier::Skew => SKEW_TESTS.iter().map(|m| format!("{m}::")).collect(),
            _ => Vec::new(),
        }
    }

    fn needs_vm(self) -> bool {
        matches!(self, Tier::Vm | Tier::RealNode)
    }
}

/// What the version-skew tier runs against the oldest supported API server
/// ([`gobuild::SKEW_K8S_VERSION`]): the agent's API calls (evictions, conditions, taints,
/// Events, Leases), the manifests applied server-side with their RBAC, admission policies and
/// API Priority and Fairness objects.
/// Modules of the control-plane and deploy binaries.
const SKEW_TESTS: &[&str] = &[
    "control_plane",
    "eviction_api",
    "deploy_rbac",
    "deploy_flowcontrol",
];

/// `cargo xtask test [TIER...]`.
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// Tiers to run; none means every tier, as CI runs them (setup, lints, the binaries, the
    /// image archives, then every test of the workspace one at a time).
    #[arg(value_enum)]
    pub tiers: Vec<Tier>,
    /// Skip the setup step (toolchains, control plane, guest image): for a machine already set up.
    #[arg(long)]
    pub no_setup: bool,
}

/// Runs the tiers. Root-only and VM tiers fail loudly when they cannot run; none skips.
pub fn test(args: &TestArgs) -> Result<()> {
    let all = args.tiers.is_empty();
    let needs_vm = all || args.tiers.iter().any(|t| t.needs_vm());
    let needs_cp = all
        || args
            .tiers
            .iter()
            .any(|t| !matches!(t, Tier::Lint | Tier::Unit));
    if !args.no_setup {
        setup::setup(SetupArgs {
            with_control_plane: needs_cp,
            with_vm: needs_vm,
        })?;
    }
    if all {
        return every_tier();
    }
    for &tier in &args.tiers {
        log("test", format!("== {tier:?}"));
        match tier {
            Tier::Lint => lint()?,
            Tier::Unit => run(cargo().args(["test", "--locked"]))?,
            _ => {
                run(cargo().args(BUILD_BINS))?;
                if tier == Tier::RealNode {
                    images()?;
                }
                run(&mut integration_tests(tier))?;
            }
        }
    }
    Ok(())
}

/// The CI run: lints, the binaries the integration tiers run, the image archives of the real-node
/// tier, then every test of the workspace, one at a time (cgroups, probes and memory pressure are
/// machine-wide state).
fn every_tier() -> Result<()> {
    disk("before the build");
    log("test", "== format and lints");
    lint()?;
    log("test", "== build (the integration tiers run the binaries)");
    run(cargo().args(BUILD_BINS))?;
    log(
        "test",
        "== images for the real-node tier: OCI archives built offline (target/images/)",
    );
    images()?;
    log(
        "test",
        "== unit, kernel, control-plane, end-to-end, guest VM and real-node tiers",
    );
    let result = run(cargo()
        .env("KUBEBUILDER_ASSETS", kubebuilder_assets())
        .arg("test")
        .args(HOST_CRATES)
        .args(["--locked", "--", "--test-threads=1"]));
    disk("after the tests");
    result?;
    log(
        "test",
        format!(
            "== version skew: {} against Kubernetes {}",
            SKEW_TESTS.join(", "),
            gobuild::SKEW_K8S_VERSION
        ),
    );
    run(&mut integration_tests(Tier::Skew))
}

/// `cargo test` of the tier's integration tests, one at a time, against its control plane; the
/// guest tiers under the VM lock.
fn integration_tests(tier: Tier) -> Command {
    let mut cmd = if tier.needs_vm() {
        let mut c = Command::new("flock");
        c.arg(VM_LOCK)
            .arg(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .current_dir(workspace_root())
            .env("PATH", sh::path_with_cargo_bin());
        c
    } else {
        cargo()
    };
    let assets = if tier == Tier::Skew {
        skew_assets()
    } else {
        kubebuilder_assets()
    };
    cmd.env("KUBEBUILDER_ASSETS", assets)
        .args(["test", "--locked", "-p", "node-monitor-tests"]);
    for t in tier.binaries() {
        cmd.args(["--test", t]);
    }
    cmd.args(["--", "--test-threads=1"]).args(tier.filters());
    cmd
}

/// Logs the free space where target/ lives and the size of target/: a run needs about 8 GB
/// (docs/testing.md, "Disk"), and a full disk otherwise shows up only as a compiler's I/O error.
fn disk(when: &str) {
    let root = workspace_root();
    let free = Command::new("df")
        .args(["-h", "--output=avail"])
        .arg(&root)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .nth(1)
                .map(|l| l.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let used = Command::new("du")
        .args(["-sh"])
        .arg(target_dir())
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "none yet".to_owned());
    log(
        "test",
        format!("disk {when}: {free} free, target/ {used} (a run needs about 8 GB)"),
    );
}

/// Every crate built for the host: the eBPF crate is built for the BPF target by node-monitor's
/// build script, never for the host; the `tests` crate is named here (it is not a default member).
const HOST_CRATES: [&str; 3] = ["--workspace", "--exclude", "node-monitor-ebpf"];

/// Every host binary: the agent, the harness's stand-in and workloads, the benchmarks (`cargo
/// bins`, an alias in .cargo/config.toml).
const BUILD_BINS: [&str; 6] = [
    "build",
    "--workspace",
    "--exclude",
    "node-monitor-ebpf",
    "--bins",
    "--locked",
];

fn lint() -> Result<()> {
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    crate::layers::check(&workspace_root())?;
    run(cargo().arg("clippy").args(HOST_CRATES).args([
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]))?;
    crate::layers::check_apart(&workspace_root())?;
    crate::plugin_targets::check_macos()
}

/// The real-node tier's image archives: pause (the node's own static binary), the workload
/// (debug build), the agent, and remediate with its QMP fence agent for the failover pair (release
/// builds, as shipped; remediate's after the agent's, whose dependencies it shares).
fn images() -> Result<()> {
    image::image(&ImageArgs {
        which: Which::Pause,
        profile: Profile::Release,
        binary: vec![cache_dir().join("node/current/pause")],
        name: None,
        out: None,
    })?;
    image::image(&ImageArgs {
        which: Which::Workload,
        profile: Profile::Debug,
        binary: vec![],
        name: None,
        out: None,
    })?;
    image::image(&ImageArgs {
        which: Which::NodeMonitor,
        profile: Profile::Release,
        binary: vec![],
        name: None,
        out: None,
    })?;
    image::image(&ImageArgs {
        which: Which::NodeMonitorRemediate,
        profile: Profile::Release,
        binary: vec![],
        name: None,
        out: None,
    })
}

/// The oldest supported control plane, which setup links (`control-plane/skew`).
fn skew_assets() -> PathBuf {
    cache_dir().join("control-plane/skew")
}

fn kubebuilder_assets() -> PathBuf {
    env::var_os("KUBEBUILDER_ASSETS")
        .filter(|v| !v.is_empty())
        .map_or_else(|| cache_dir().join("control-plane/current"), PathBuf::from)
}

/// The main job: a real control plane on loopback, this machine as a node through the kubelet
/// stand-in, pods, the real agent, one pod's memory driven up (root).
pub fn demo() -> Result<()> {
    setup::setup(SetupArgs {
        with_control_plane: true,
        with_vm: false,
    })?;
    if !sh::is_root() {
        bail!("demo: run as root (it creates cgroups and loads eBPF programs)");
    }
    run(cargo().args(BUILD_BINS).arg("-q"))?;
    run(Command::new(target_dir().join("debug/nm-demo"))
        .env("KUBEBUILDER_ASSETS", kubebuilder_assets()))
}

/// A benchmark (docs/benchmarks.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Bench {
    /// The decision core: signals, ranking, the decision (no root).
    Decision,
    /// The sampler: one pass, threshold crossings, PSI (root).
    Sampler,
    /// eBPF overhead and drops under a kernel event rate (root, release build).
    Ebpf,
    /// Threshold crossing → eviction at the API server (root).
    Reaction,
    /// The agent's RSS and CPU with many pods (root).
    AgentLoad,
    /// Dead node → replacement pods running, with and without remediate (root).
    Failover,
    /// API load per agent: N agent processes against one real API server (root, the release
    /// agent).
    ApiLoad,
    /// remediate with thousands of simulated Nodes and Leases: cost, detection, churn, a zone
    /// killed, failover (the release binaries).
    RemediateScale,
    /// A fast memory spike in the guest: node-monitor against the kubelet (qemu).
    Spike,
    /// Memory ramps in a real container on the real node: the kubelet alone, then with
    /// node-monitor (qemu, the node binaries, the image archives).
    RealSpike,
    /// The kubelet's own graceful node shutdown on the real node, on the pods of node-monitor's
    /// drain (qemu, the node binaries, the image archives).
    RealShutdown,
    /// What reports a `memory.available` crossing on cgroup v2, and the v2 root's figure
    /// against /proc/meminfo (qemu).
    V2Crossing,
    /// Crossing → eviction on cgroup v1 and v2 in one guest, with N idle pods (qemu, the
    /// release agent).
    GuestReaction,
}

/// `cargo xtask bench NAME [-- ARGS]`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub bench: Bench,
    /// Run the release build of the binaries the benchmark drives (reaction).
    #[arg(long)]
    pub release: bool,
    /// Arguments for the benchmark binary (after `--`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    let debug = target_dir().join("debug");
    let release = target_dir().join("release");
    match args.bench {
        Bench::Decision => run(cargo()
            .args(["bench", "-p", "node-monitor", "--bench", "decision", "--"])
            .args(&args.args)),
        Bench::Sampler => {
            build_release(&["bench-sampler"])?;
            run(Command::new(release.join("bench-sampler")).args(&args.args))
        }
        Bench::Ebpf => {
            build_release(&["node-monitor", "bench-ebpf", "nm-memhog"])?;
            run(Command::new(release.join("bench-ebpf")).args(&args.args))
        }
        Bench::Reaction if args.release => {
            build_release(&["node-monitor", "bench-reaction", "nm-workload"])?;
            run(with_assets(&release, "bench-reaction")
                .env("NODE_MONITOR_PROFILE", "release")
                .args(&args.args))
        }
        Bench::Reaction | Bench::AgentLoad | Bench::Failover => {
            run(cargo().args(BUILD_BINS))?;
            let bin = match args.bench {
                Bench::Reaction => "bench-reaction",
                Bench::AgentLoad => "bench-agent-load",
                _ => "bench-failover",
            };
            run(with_assets(&debug, bin).args(&args.args))
        }
        Bench::ApiLoad => {
            run(cargo().args(BUILD_BINS))?;
            build_release(&["node-monitor"])?;
            run(with_assets(&debug, "bench-api-load")
                .env("NODE_MONITOR_AGENT_PROFILE", "release")
                .args(&args.args))
        }
        Bench::RemediateScale => {
            build_release(&["node-monitor", "bench-remediate-scale"])?;
            run(with_assets(&release, "bench-remediate-scale")
                .env("NODE_MONITOR_PROFILE", "release")
                .args(&args.args))
        }
        Bench::Spike => {
            run(cargo().args(BUILD_BINS))?;
            build_release(&["node-monitor", "nm-kubelet-standin", "nm-workload"])?;
            run(Command::new("flock")
                .arg(VM_LOCK)
                .arg(debug.join("bench-spike"))
                .env("KUBEBUILDER_ASSETS", kubebuilder_assets())
                .args(&args.args))
        }
        Bench::V2Crossing => {
            run(cargo().args(BUILD_BINS))?;
            run(Command::new("flock")
                .arg(VM_LOCK)
                .arg(debug.join("bench-v2-crossing"))
                .args(&args.args))
        }
        Bench::GuestReaction => {
            run(cargo().args(BUILD_BINS))?;
            build_release(&["node-monitor"])?;
            run(Command::new("flock")
                .arg(VM_LOCK)
                .arg(debug.join("bench-guest-reaction"))
                .env("KUBEBUILDER_ASSETS", kubebuilder_assets())
                .env("NODE_MONITOR_AGENT_PROFILE", "release")
                .args(&args.args))
        }
        Bench::RealSpike | Bench::RealShutdown => {
            run(cargo().args(BUILD_BINS))?;
            images()?;
            let bin = if matches!(args.bench, Bench::RealSpike) {
                "bench-real-spike"
            } else {
                "bench-real-shutdown"
            };
            run(Command::new("flock")
                .arg(VM_LOCK)
                .arg(debug.join(bin))
                .env("KUBEBUILDER_ASSETS", kubebuilder_assets())
                .args(&args.args))
        }
    }
}

/// Builds these binaries with the release profile, from whichever host crate holds them, with the
/// path remapping of the image's release build (crate::remap), so the two share one build cache.
fn build_release(bins: &[&str]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["build", "--locked", "--release"])
        .args(HOST_CRATES);
    for b in bins {
        cmd.args(["--bin", b]);
    }
    remap::apply(&mut cmd)?;
    run(&mut cmd)
}

fn with_assets(dir: &Path, bin: &str) -> Command {
    let mut cmd = Command::new(dir.join(bin));
    cmd.current_dir(workspace_root())
        .env("KUBEBUILDER_ASSETS", kubebuilder_assets());
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every integration test binary is one tier's, and every tier of integration tests has
    /// one, so `cargo xtask test TIER` runs all of them between the tiers; the skew tier's
    /// modules are in the binaries it runs.
    #[test]
    fn every_integration_test_binary_is_one_tiers() {
        let dir = workspace_root().join("tests/tests");
        let mut binaries: Vec<String> = std::fs::read_dir(&dir)
            .expect("tests/tests")
            .filter_map(|e| {
                let e = e.ok()?;
                e.path()
                    .join("main.rs")
                    .is_file()
                    .then(|| e.file_name().into_string().ok())?
            })
            .collect();
        binaries.sort();
        let mut tiers: Vec<String> = Tier::value_variants()
            .iter()
            .filter(|t| **t != Tier::Skew)
            .filter_map(|t| t.binary().map(str::to_owned))
            .collect();
        tiers.sort();
        assert_eq!(binaries, tiers);
        let loose: Vec<_> = std::fs::read_dir(&dir)
            .expect("tests/tests")
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "rs"))
            .collect();
        assert!(loose.is_empty(), "a test file outside a tier: {loose:?}");
        for t in SKEW_TESTS {
            let found = Tier::Skew
                .binaries()
                .iter()
                .any(|b| dir.join(b).join(format!("{t}.rs")).is_file());
            assert!(found, "the skew tier's {t} is in none of its binaries");
        }
    }
}
