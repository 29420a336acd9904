//! Test harness shared by node-monitor's integration tiers.
pub mod cgroup;
pub mod control_plane;
pub mod e2e;
pub mod helm;
pub mod kernel_probes;
pub mod manifests;
pub mod metrics;
pub mod pod;
pub mod procfs;
pub mod reaction;
pub mod real_node;
pub mod standin;
pub mod v2_crossing;
pub mod vm;
pub mod wait;
pub mod workload;

/// Runs `cargo xtask ARGS` in the workspace (stderr shown, stdout captured): the chores that build
/// the cached parts the tiers need (the guest image, the real node's binaries).
pub fn xtask(args: &[&str]) -> anyhow::Result<std::process::Output> {
    use anyhow::Context as _;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    std::process::Command::new(&cargo)
        .current_dir(&root)
        .arg("xtask")
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running cargo xtask {}", args.join(" ")))
}
