//! node-monitor's chores, in Rust: `cargo xtask --help`.
//!
//! - `setup`: Debian packages, the pinned toolchains, bpf-linker, and with flags the control
//!   plane, the guest image and the real node's binaries (idempotent, cached by version).
//! - `build`: one cached part (control plane, node binaries, guest image); prints its directory.
//! - `image`: a container image as an OCI archive, offline.
//! - `test`: the test tiers (all of them by default, as CI runs them).
//! - `demo`: the main job.
//! - `bench`: the benchmarks of docs/benchmarks.md.
//! - `alerts`: the agent's alert rules rendered from their template and a thresholds file.
//!
//! `scripts/` holds the thin entry points a fresh machine starts from (they check for rustup and a
//! C linker, which compiling this crate needs, then call it).
mod alert_rules;
mod gobuild;
mod guest;
mod image;
mod layers;
mod oci;
mod plugin_targets;
mod remap;
mod setup;
mod sh;
mod tiers;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(about = "node-monitor's chores")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install and build what the tests and the demo need (idempotent).
    Setup(setup::SetupArgs),
    /// Build one cached part and print the directory that holds it.
    Build {
        #[arg(value_enum)]
        part: Part,
    },
    /// Build a container image as an OCI archive, offline (no daemon, no registry).
    Image(image::ImageArgs),
    /// Run test tiers (every tier, as CI does, when none is named).
    Test(tiers::TestArgs),
    /// Run the self-contained demo (root).
    Demo,
    /// Run a benchmark (docs/benchmarks.md).
    Bench(tiers::BenchArgs),
    /// Check that the product crates' modules import each other without a circle and never
    /// upward, as docs/architecture.md's layer table draws them (run with the lints).
    Layers {
        /// The workspace to check (default: this one).
        #[arg(long)]
        root: Option<std::path::PathBuf>,
    },
    /// Render the agent's alert rules (deploy/prometheus/node-monitor-rules.template.yaml) with a
    /// thresholds file: by default the shipped one into the shipped rules file.
    Alerts(AlertsArgs),
}

#[derive(clap::Args)]
struct AlertsArgs {
    /// The thresholds file (default: deploy/prometheus/thresholds.yaml).
    #[arg(long)]
    thresholds: Option<std::path::PathBuf>,
    /// Where to write the rules (default: deploy/prometheus/node-monitor-rules.yaml; `-` for stdout).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Do not write: fail when the output file differs from what would be written.
    #[arg(long)]
    check: bool,
}

fn alerts(args: &AlertsArgs) -> Result<()> {
    use anyhow::{Context as _, bail};
    let dir = sh::workspace_root().join("deploy/prometheus");
    let thresholds = args
        .thresholds
        .clone()
        .unwrap_or_else(|| dir.join("thresholds.yaml"));
    let template_path = dir.join("node-monitor-rules.template.yaml");
    let template = std::fs::read_to_string(&template_path)
        .with_context(|| format!("reading {}", template_path.display()))?;
    let values = std::fs::read_to_string(&thresholds)
        .with_context(|| format!("reading {}", thresholds.display()))?;
    let values = alert_rules::parse_thresholds(&values)
        .map_err(|e| anyhow::anyhow!("{}: {e}", thresholds.display()))?;
    let rules = alert_rules::render(&template, &values)
        .map_err(|e| anyhow::anyhow!("{}: {e}", template_path.display()))?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| dir.join("node-monitor-rules.yaml"));
    if out.as_os_str() == "-" {
        print!("{rules}");
    } else if args.check {
        let current =
            std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
        if current != rules {
            bail!(
                "{} is not the template rendered with {}: run `cargo xtask alerts`",
                out.display(),
                thresholds.display()
            );
        }
    } else {
        std::fs::write(&out, rules).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

#[derive(Clone, Copy, ValueEnum)]
enum Part {
    /// etcd, kube-apiserver, kube-controller-manager (usable as KUBEBUILDER_ASSETS).
    ControlPlane,
    /// The real node's kubelet, kube-scheduler, containerd, ctr, runc shim and pause.
    Node,
    /// The oldest supported control plane (the version-skew tier's): as `control-plane`, at the
    /// skew release.
    ControlPlaneSkew,
    /// The real node's binaries with the skew release's kubelet and kube-scheduler.
    NodeSkew,
    /// The Debian guest image of the VM tiers.
    GuestImage,
    /// helm (v3, from its Go module), for the chart's tests.
    Helm,
    /// kustomize (v5, from its Go module), for the Kustomize variants' tests.
    Kustomize,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Setup(args) => setup::setup(args),
        Cmd::Build { part } => {
            let dir = match part {
                Part::ControlPlane => gobuild::control_plane()?,
                Part::Node => gobuild::node()?,
                Part::ControlPlaneSkew => gobuild::control_plane_at(gobuild::SKEW_K8S_VERSION)?,
                Part::NodeSkew => gobuild::node_at(gobuild::SKEW_K8S_VERSION)?,
                Part::GuestImage => guest::image()?,
                Part::Helm => gobuild::helm()?,
                Part::Kustomize => gobuild::kustomize()?,
            };
            println!("{}", dir.display());
            Ok(())
        }
        Cmd::Image(args) => image::image(&args),
        Cmd::Test(args) => tiers::test(&args),
        Cmd::Demo => tiers::demo(),
        Cmd::Bench(args) => tiers::bench(&args),
        Cmd::Alerts(args) => alerts(&args),
        Cmd::Layers { root } => {
            let root = root.unwrap_or_else(sh::workspace_root);
            layers::check(&root)?;
            layers::check_apart(&root)
        }
    }
}
