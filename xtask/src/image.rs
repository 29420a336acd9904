//! Container images built offline, as OCI archives (no daemon, no registry).
//!
//! `cargo xtask image node-monitor` builds the agent's container image: the release binary and
//! the shared libraries it links, on an empty root, as an OCI archive that containerd
//! (`ctr -n k8s.io images import`), podman (`podman load`) or skopeo import. The same command
//! builds the image the real-node test tier runs (with `--profile debug`). `deploy/Dockerfile`
//! is the equivalent for a machine with a registry and a container builder.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::ValueEnum;

use crate::{
    oci,
    sh::{self, workspace_root},
};

/// The agent's image, as deploy/kustomize/base/daemonset.yaml names it.
const AGENT_IMAGE: &str = "ghcr.io/node-monitor/node-monitor:0.1.0";
/// The test workload image of the real-node tier.
const WORKLOAD_IMAGE: &str = "node-monitor.local/workload:0.1.0";
/// The sandbox image containerd is configured with on the real-node tier.
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";

#[derive(Clone, Copy, ValueEnum)]
pub enum Which {
    /// The agent: `node-monitor` and its shared libraries.
    NodeMonitor,
    /// The real-node tier's workload: `nm-workload` and `nm-memhog` and their libraries.
    Workload,
    /// The pod sandbox: a static `pause` binary (`--binary`), e.g. from `cargo xtask build node`.
    Pause,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Profile {
    /// `--release`.
    Release,
    /// The dev profile.
    Debug,
}

#[derive(clap::Args)]
pub struct ImageArgs {
    pub which: Which,
    /// Cargo profile of the binaries packed (node-monitor, workload).
    #[arg(long, value_enum, default_value = "release")]
    pub profile: Profile,
    /// Pack these binaries as they are instead of building them (pause requires it).
    #[arg(long)]
    pub binary: Vec<PathBuf>,
    /// Image reference (default: the one the manifests and the tests use).
    #[arg(long)]
    pub name: Option<String>,
    /// Output archive (default: target/images/<which>.oci.tar).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Builds `bins` of `package` with cargo and returns their paths.
fn cargo_build(package: &str, bins: &[&str], profile: Profile) -> Result<Vec<PathBuf>> {
    let mut cmd = sh::cargo();
    cmd.args(["build", "--locked", "--package", package]);
    for b in bins {
        cmd.args(["--bin", b]);
    }
    if profile == Profile::Release {
        cmd.arg("--release");
    }
    sh::run(&mut cmd)?;
    let dir = sh::target_dir().join(match profile {
        Profile::Release => "release",
        Profile::Debug => "debug",
    });
    Ok(bins.iter().map(|b| dir.join(b)).collect())
}

/// A file with its permission bits as the build host has them: the dynamic loader must keep its
/// execute bit, since the kernel checks it even for root once the DaemonSet drops every capability.
fn read_entry(path: &Path) -> Result<oci::Entry> {
    use std::os::unix::fs::PermissionsExt as _;
    let contents = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mode = fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .permissions()
        .mode()
        & 0o7777;
    Ok(oci::Entry { contents, mode })
}

/// Each binary at `/usr/local/bin/<name>`, and every shared library `ldd` finds for it at the
/// path the build host resolved (the image's loader searches the same multiarch directories).
fn binaries_with_libraries(bins: &[PathBuf]) -> Result<BTreeMap<PathBuf, oci::Entry>> {
    let mut files = BTreeMap::new();
    for bin in bins {
        let name = bin
            .file_name()
            .with_context(|| format!("{} has no file name", bin.display()))?;
        files.insert(Path::new("/usr/local/bin").join(name), read_entry(bin)?);
        let out = Command::new("ldd")
            .arg(bin)
            .output()
            .context("running ldd")?;
        // ldd exits 1 for a static binary ("not a dynamic executable"); that means no libraries.
        for lib in oci::parse_ldd(&String::from_utf8_lossy(&out.stdout)) {
            files.insert(lib.clone(), read_entry(&lib)?);
        }
    }
    Ok(files)
}

pub fn image(args: &ImageArgs) -> Result<()> {
    let mtime = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds"))?,
        Err(_) => 0,
    };
    let labels = BTreeMap::from([
        (
            "org.opencontainers.image.title".to_owned(),
            "node-monitor".to_owned(),
        ),
        (
            "org.opencontainers.image.version".to_owned(),
            env!("CARGO_PKG_VERSION").to_owned(),
        ),
        (
            "org.opencontainers.image.licenses".to_owned(),
            "Apache-2.0".to_owned(),
        ),
    ]);
    let dirs = BTreeMap::from([
        (PathBuf::from("/tmp"), 0o1777),
        (PathBuf::from("/etc"), 0o755),
    ]);
    let path_env = "PATH=/usr/local/bin:/usr/bin:/bin".to_owned();
    let (key, image) = match args.which {
        Which::NodeMonitor => {
            let bins = if args.binary.is_empty() {
                cargo_build("node-monitor", &["node-monitor"], args.profile)?
            } else {
                args.binary.clone()
            };
            let image = oci::Image {
                name: args.name.clone().unwrap_or_else(|| AGENT_IMAGE.into()),
                entrypoint: vec!["/usr/local/bin/node-monitor".into()],
                // The DaemonSet runs it as root with a dropped capability set.
                user: "0".into(),
                env: vec![path_env],
                labels,
                files: binaries_with_libraries(&bins)?,
                dirs,
                mtime,
            };
            ("node-monitor", image)
        }
        Which::Workload => {
            let bins = if args.binary.is_empty() {
                cargo_build(
                    "node-monitor-tests",
                    &["nm-workload", "nm-memhog"],
                    args.profile,
                )?
            } else {
                args.binary.clone()
            };
            let image = oci::Image {
                name: args.name.clone().unwrap_or_else(|| WORKLOAD_IMAGE.into()),
                entrypoint: vec!["/usr/local/bin/nm-workload".into()],
                user: "65534".into(),
                env: vec![path_env],
                labels,
                files: binaries_with_libraries(&bins)?,
                dirs,
                mtime,
            };
            ("workload", image)
        }
        Which::Pause => {
            let [bin] = args.binary.as_slice() else {
                bail!(
                    "image pause: give the static pause binary with --binary (`cargo xtask build node` builds it)"
                );
            };
            let image = oci::Image {
                name: args.name.clone().unwrap_or_else(|| PAUSE_IMAGE.into()),
                entrypoint: vec!["/pause".into()],
                user: "65535:65535".into(),
                env: vec![path_env],
                labels,
                files: BTreeMap::from([(PathBuf::from("/pause"), read_entry(bin)?)]),
                dirs: BTreeMap::new(),
                mtime,
            };
            ("pause", image)
        }
    };
    let built = oci::build(&image)?;
    let archive = oci::archive(&built, mtime)?;
    let out = args.out.clone().unwrap_or_else(|| {
        workspace_root()
            .join("target/images")
            .join(format!("{key}.oci.tar"))
    });
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = out.with_extension("tmp");
    fs::write(&tmp, &archive).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, &out).with_context(|| format!("renaming to {}", out.display()))?;
    println!(
        "{} {} {} ({} files, {} bytes)",
        out.display(),
        image.name,
        built.manifest_digest,
        image.files.len(),
        archive.len()
    );
    Ok(())
}
