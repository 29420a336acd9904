//! Container images built offline, as OCI archives (no daemon, no registry).
//!
//! `cargo xtask image node-monitor` builds the agent's container image: the release binary and
//! the shared libraries it links, on an empty root, as an OCI archive that containerd
//! (`ctr -n k8s.io images import`), podman (`podman load`) or skopeo import. The same command
//! builds the image the real-node test tier runs (with `--profile debug`). `deploy/Dockerfile`
//! is the equivalent for a machine with a registry and a container builder.
//! `cargo xtask image node-monitor-remediate` builds remediate's, from its own crate.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::ValueEnum;

use crate::{
    oci, remap,
    sh::{self, workspace_root},
};

/// The agent's image, as deploy/kustomize/base/daemonset.yaml names it.
const AGENT_IMAGE: &str = "ghcr.io/node-monitor/node-monitor:0.1.0";
/// remediate's image, as deploy/remediate/deployment.yaml names it.
const REMEDIATE_IMAGE: &str = "ghcr.io/node-monitor/node-monitor-remediate:0.1.0";
/// The test workload image of the real-node tier.
const WORKLOAD_IMAGE: &str = "node-monitor.local/workload:0.1.0";
/// The sandbox image containerd is configured with on the real-node tier.
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";

#[derive(Clone, Copy, ValueEnum)]
pub enum Which {
    /// The agent: `node-monitor` and its shared libraries.
    NodeMonitor,
    /// remediate: `node-monitor-remediate` and its shared libraries (no eBPF object, aya or zbus),
    /// with the QMP fence agent `fence_qmp` and without ClusterLabs' fence agents
    /// (deploy/remediate/Dockerfile.fence-agents adds those).
    NodeMonitorRemediate,
    /// The real-node tier's workload: `nm-workload`, `nm-memhog`, `nm-reboot-caller` and their
    /// libraries.
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

/// Builds `bins` of `package` with cargo and returns their paths. A release build remaps the
/// build machine's paths (crate::remap), so the same commit gives the same bytes in any checkout.
fn cargo_build(package: &str, bins: &[&str], profile: Profile) -> Result<Vec<PathBuf>> {
    let mut cmd = sh::cargo();
    cmd.args(["build", "--locked", "--package", package]);
    for b in bins {
        cmd.args(["--bin", b]);
    }
    if profile == Profile::Release {
        cmd.arg("--release");
        remap::apply(&mut cmd)?;
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

/// `SOURCE_DATE_EPOCH`, the time stamped on every entry (0 when unset).
fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds")),
        Err(_) => Ok(0),
    }
}

/// The labels every image carries.
fn labels() -> BTreeMap<String, String> {
    [
        ("org.opencontainers.image.title", "node-monitor"),
        (
            "org.opencontainers.image.version",
            env!("CARGO_PKG_VERSION"),
        ),
        ("org.opencontainers.image.licenses", "Apache-2.0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// `--binary` when given, else `bins` of `package` built with cargo.
fn binaries(args: &ImageArgs, package: &str, bins: &[&str]) -> Result<Vec<PathBuf>> {
    if args.binary.is_empty() {
        cargo_build(package, bins, args.profile)
    } else {
        Ok(args.binary.clone())
    }
}

/// What `args` asks for: the archive's file stem and the image, its binaries built.
fn spec(args: &ImageArgs, mtime: u64) -> Result<(&'static str, oci::Image)> {
    let base = |default_name: &str, entrypoint: &str, user: &str| oci::Image {
        name: args.name.clone().unwrap_or_else(|| default_name.into()),
        entrypoint: vec![entrypoint.into()],
        user: user.into(),
        env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_owned()],
        labels: labels(),
        files: BTreeMap::new(),
        dirs: BTreeMap::from([
            (PathBuf::from("/tmp"), 0o1777),
            (PathBuf::from("/etc"), 0o755),
        ]),
        mtime,
    };
    Ok(match args.which {
        Which::NodeMonitor => {
            let bins = binaries(args, "node-monitor", &["node-monitor"])?;
            // The DaemonSet runs it as root with a dropped capability set.
            let mut image = base(AGENT_IMAGE, "/usr/local/bin/node-monitor", "0");
            image.files = binaries_with_libraries(&bins)?;
            ("node-monitor", image)
        }
        Which::NodeMonitorRemediate => {
            // With the QMP fence agent for QEMU machines (`fence_qmp`, docs/remediate.md).
            let bins = binaries(
                args,
                "node-monitor-remediate",
                &["node-monitor-remediate", "fence_qmp"],
            )?;
            // The Deployment runs it as a non-root user with every capability dropped.
            let mut image = base(
                REMEDIATE_IMAGE,
                "/usr/local/bin/node-monitor-remediate",
                "65532",
            );
            image.files = binaries_with_libraries(&bins)?;
            ("node-monitor-remediate", image)
        }
        Which::Workload => {
            let bins = binaries(
                args,
                "node-monitor-tests",
                &["nm-workload", "nm-memhog", "nm-reboot-caller"],
            )?;
            let mut image = base(WORKLOAD_IMAGE, "/usr/local/bin/nm-workload", "65534");
            image.files = binaries_with_libraries(&bins)?;
            ("workload", image)
        }
        Which::Pause => {
            let [bin] = args.binary.as_slice() else {
                bail!(
                    "image pause: give the static pause binary with --binary (`cargo xtask build node` builds it)"
                );
            };
            let mut image = base(PAUSE_IMAGE, "/pause", "65535:65535");
            image.files = BTreeMap::from([(PathBuf::from("/pause"), read_entry(bin)?)]);
            image.dirs = BTreeMap::new();
            ("pause", image)
        }
    })
}

/// Writes `bytes` to `out` through a temporary file, so a reader never sees half an archive.
fn write_atomically(out: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = out.with_extension("tmp");
    fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, out).with_context(|| format!("renaming to {}", out.display()))
}

/// Builds the image `args` names and writes its archive; prints the path, the reference and the
/// manifest digest.
pub fn image(args: &ImageArgs) -> Result<()> {
    let mtime = source_date_epoch()?;
    let (key, image) = spec(args, mtime)?;
    let built = oci::build(&image)?;
    let archive = oci::archive(&built, mtime)?;
    let out = args.out.clone().unwrap_or_else(|| {
        workspace_root()
            .join("target/images")
            .join(format!("{key}.oci.tar"))
    });
    write_atomically(&out, &archive)?;
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
