//! node-monitor's chores, in Rust: `cargo xtask --help`.
//!
//! - `setup`: Debian packages, the pinned toolchains, bpf-linker, and with flags the control
//!   plane, the guest image and the real node's binaries (idempotent, cached by version).
//! - `build`: one cached part (control plane, node binaries, guest image); prints its directory.
//! - `image`: a container image as an OCI archive, offline.
//! - `test`: the test tiers (all of them by default, as CI runs them).
//! - `demo`: the main job.
//! - `bench`: the benchmarks of docs/benchmarks.md.
//!
//! `scripts/` holds the thin entry points a fresh machine starts from (they check for rustup and a
//! C linker, which compiling this crate needs, then call it).
mod gobuild;
mod guest;
mod image;
mod oci;
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
}

#[derive(Clone, Copy, ValueEnum)]
enum Part {
    /// etcd, kube-apiserver, kube-controller-manager (usable as KUBEBUILDER_ASSETS).
    ControlPlane,
    /// The real node's kubelet, kube-scheduler, containerd, ctr, runc shim and pause.
    Node,
    /// The Debian guest image of the VM tiers.
    GuestImage,
    /// helm (v3, from its Go module), for the chart's tests.
    Helm,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Setup(args) => setup::setup(args),
        Cmd::Build { part } => {
            let dir = match part {
                Part::ControlPlane => gobuild::control_plane()?,
                Part::Node => gobuild::node()?,
                Part::GuestImage => guest::image()?,
                Part::Helm => gobuild::helm()?,
            };
            println!("{}", dir.display());
            Ok(())
        }
        Cmd::Image(args) => image::image(&args),
        Cmd::Test(args) => tiers::test(&args),
        Cmd::Demo => tiers::demo(),
        Cmd::Bench(args) => tiers::bench(&args),
    }
}
