//! Where the sampler reads from: the configuration and the resolved layout (cgroup version,
//! node cgroup, kubepods, filesystems).

use std::{
    path::{Component, Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use node_monitor_core::{
    kubelet::layout::{CgroupDriver, DriverEvidence, detect_driver},
    signals::MemoryWorkingSet,
};

pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";
pub const DEFAULT_PROC_ROOT: &str = "/proc";
pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";
pub const DEFAULT_POD_LOG_ROOT: &str = "/var/log/pods";
/// `kubepods_cgroup` value that detects the kubelet's layout (see [`KubepodsDetection`]).
pub const KUBEPODS_AUTO: &str = "auto";
/// The longest `kubepods_cgroup` accepted.
pub const MAX_KUBEPODS_PATH: usize = 1024;
/// The kubelet's configuration file as kubeadm writes it, under the kubelet root.
pub const KUBELET_CONFIG_FILE: &str = "config.yaml";
/// The kubelet's default housekeeping interval, also the cadence of the expensive part of
/// sampling (per-pod disk usage).
pub const DEFAULT_FULL_SAMPLE_INTERVAL: Duration = Duration::from_secs(10);
/// Directory entries walked per pod when measuring its disk usage, at most.
pub const DEFAULT_POD_DISK_BUDGET: u64 = 100_000;
/// Where containerd and CRI-O keep writable layers: a container's overlay upper directory is
/// walked only below one of these.
pub const DEFAULT_WRITABLE_LAYER_ROOTS: [&str; 4] = [
    "/var/lib/containerd",
    "/var/lib/containers",
    // k3s's and RKE2's embedded containerd
    "/var/lib/rancher/k3s/agent/containerd",
    "/var/lib/rancher/rke2/agent/containerd",
];
/// Descriptors kept open for pod cgroup files: enough for 1 000 pods.
pub const DEFAULT_MAX_OPEN_FILES: usize = 3_000;

/// Image filesystem candidates, in order: the first that exists is the image filesystem. The
/// snapshotter and storage directories are what the runtimes report through CRI `ImageFsInfo`
/// (containerd: the snapshotter root; CRI-O: the containers/storage graph root); statvfs of
/// either gives the filesystem that holds images and writable layers.
pub const IMAGE_FS_CANDIDATES: [(&str, ImageFsSource); 7] = [
    (
        "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs",
        ImageFsSource::Containerd,
    ),
    ("/var/lib/containerd", ImageFsSource::Containerd),
    // k3s's and RKE2's embedded containerd keeps its state under /var/lib/rancher.
    (
        "/var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs",
        ImageFsSource::Containerd,
    ),
    (
        "/var/lib/rancher/k3s/agent/containerd",
        ImageFsSource::Containerd,
    ),
    (
        "/var/lib/rancher/rke2/agent/containerd/io.containerd.snapshotter.v1.overlayfs",
        ImageFsSource::Containerd,
    ),
    (
        "/var/lib/rancher/rke2/agent/containerd",
        ImageFsSource::Containerd,
    ),
    ("/var/lib/containers/storage", ImageFsSource::CriO),
];

/// The cgroup version of the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

/// Where the image filesystem path came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFsSource {
    Configured,
    Containerd,
    CriO,
}

/// How the sampler reads the node. Every path is overridable so tests and simulated nodes can
/// point it at test cgroups and temporary directories.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Where the cgroup hierarchies are mounted.
    pub cgroup_root: PathBuf,
    /// `None` detects: cgroup2 mounted at `cgroup_root` (statfs magic, like runc's
    /// `IsCgroup2UnifiedMode`) is v2; a memory hierarchy at `cgroup_root/memory` is v1.
    pub cgroup_version: Option<CgroupVersion>,
    /// The node cgroup, relative to each hierarchy's root. Empty or `/` is the root: capacity is
    /// `MemTotal`, as the kubelet computes it. A non-root node cgroup (a simulated or nested node)
    /// takes capacity from its memory limit and usage from its own files.
    pub node_cgroup: PathBuf,
    /// The kubepods cgroup under the node cgroup: `kubepods` (cgroupfs driver) or
    /// `kubepods.slice` (systemd driver).
    pub kubepods_cgroup: String,
    /// The kubelet's configuration file, read for `cgroupDriver` when `kubepods_cgroup` is
    /// `auto` (default: `<kubelet_root>/config.yaml`). Unreadable is not an error.
    pub kubelet_config: Option<PathBuf>,
    /// procfs (meminfo, loadavg, pid sysctls, pressure).
    pub proc_root: PathBuf,
    /// The kubelet's root directory: its filesystem is nodefs.
    pub kubelet_root: PathBuf,
    /// `/var/log/pods`, for per-pod log usage.
    pub pod_log_root: PathBuf,
    /// The image filesystem path. `None` discovers it from [`IMAGE_FS_CANDIDATES`].
    pub image_fs: Option<PathBuf>,
    /// The container (writable layer) filesystem, for runtimes that split it from images
    /// (KEP-4191). `None`: the same as the image filesystem, which is what the kubelet reports
    /// when the runtime does not split them.
    pub container_fs: Option<PathBuf>,
    /// Allocatable memory in bytes (the Node's `status.allocatable.memory`). `None` uses the
    /// kubepods cgroup's memory limit, which is what the kubelet's own stats report.
    pub allocatable_memory: Option<u64>,
    /// How the node and kubepods working sets count page cache
    /// (`nodeMonitor.memoryWorkingSet`); per-pod working sets are always the kubelet's.
    pub memory_working_set: MemoryWorkingSet,
    /// A full sample (per-pod disk usage) runs at least this often, whatever woke the sampler.
    pub full_sample_interval: Duration,
    /// Measure per-pod disk usage (local volumes, logs and writable layers) on full samples.
    pub pod_disk_usage: bool,
    /// Directory entries walked per pod at most; beyond it the pod's disk usage is left out.
    pub pod_disk_budget: u64,
    /// Container writable layers (overlay upper directories, found from each container's
    /// `mountinfo`) count in pod disk usage only when they lie below one of these absolute
    /// directories. Empty: writable layers are not counted.
    pub writable_layer_roots: Vec<PathBuf>,
    /// File descriptors the sampler may keep open for pod cgroup files (three per pod),
    /// capped at half the process's `RLIMIT_NOFILE` soft limit. Pods beyond it are read with
    /// open/read/close each pass (slower, same values).
    pub max_open_files: usize,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            cgroup_root: DEFAULT_CGROUP_ROOT.into(),
            cgroup_version: None,
            node_cgroup: PathBuf::new(),
            kubepods_cgroup: "kubepods".into(),
            kubelet_config: None,
            proc_root: DEFAULT_PROC_ROOT.into(),
            kubelet_root: DEFAULT_KUBELET_ROOT.into(),
            pod_log_root: DEFAULT_POD_LOG_ROOT.into(),
            image_fs: None,
            container_fs: None,
            allocatable_memory: None,
            memory_working_set: MemoryWorkingSet::Kubelet,
            full_sample_interval: DEFAULT_FULL_SAMPLE_INTERVAL,
            pod_disk_usage: true,
            pod_disk_budget: DEFAULT_POD_DISK_BUDGET,
            writable_layer_roots: DEFAULT_WRITABLE_LAYER_ROOTS
                .iter()
                .map(PathBuf::from)
                .collect(),
            max_open_files: DEFAULT_MAX_OPEN_FILES,
        }
    }
}

/// A configuration the sampler cannot work with. Messages name the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("node_cgroup {value:?} must be a path inside the cgroup hierarchy (no \"..\")")]
    NodeCgroup { value: PathBuf },
    #[error(
        "kubepods_cgroup {value:?} must be a relative path of non-empty components without \
         \".\" or \"..\" (e.g. kubepods.slice, kubelet.slice/kubelet-kubepods.slice), at most \
         {MAX_KUBEPODS_PATH} bytes"
    )]
    KubepodsCgroup { value: String },
    #[error(
        "cgroup_root {root:?}: neither a cgroup2 mount nor a cgroup v1 memory hierarchy \
         ({root:?}/memory) was found"
    )]
    NoMemoryHierarchy { root: PathBuf },
    #[error("full_sample_interval must be positive, got {value:?}")]
    FullSampleInterval { value: Duration },
    #[error("allocatable_memory must be positive, got {value}")]
    AllocatableMemory { value: u64 },
    #[error(
        "writable_layer_roots entry {value:?} must be an absolute path without \".\" or \"..\" \
         components, and not /"
    )]
    WritableLayerRoot { value: PathBuf },
    #[error("pod_disk_budget must be positive, got {value}")]
    PodDiskBudget { value: u64 },
}

/// Files under procfs that the sampler reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcPaths {
    pub meminfo: PathBuf,
    pub loadavg: PathBuf,
    pub pid_max: PathBuf,
    pub threads_max: PathBuf,
    pub pressure_memory: PathBuf,
}

/// The configuration resolved against the host: concrete directories for every read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub version: CgroupVersion,
    pub node_is_root: bool,
    /// The node cgroup's directory in the memory hierarchy (v1: `<root>/memory/<node>`,
    /// v2: `<root>/<node>`).
    pub node_memory: PathBuf,
    /// The node cgroup in a pids hierarchy (v1: `<root>/pids/<node>` when mounted; v2: the same
    /// directory as `node_memory`).
    pub node_pids: Option<PathBuf>,
    /// The node cgroup in a cgroup2 hierarchy, for per-cgroup PSI: v2 `node_memory`; on a v1 host
    /// with a hybrid `<root>/unified` mount, the node cgroup there.
    pub node_unified: Option<PathBuf>,
    /// The kubepods cgroup name (one component).
    pub kubepods_name: String,
    /// How `kubepods_name` was chosen.
    pub kubepods_detection: KubepodsDetection,
    pub kubepods_memory: PathBuf,
    pub kubepods_pids: Option<PathBuf>,
    pub proc: ProcPaths,
    pub kubelet_root: PathBuf,
    pub pod_log_root: PathBuf,
    pub image_fs: Option<(PathBuf, ImageFsSource)>,
    pub container_fs: Option<PathBuf>,
}

/// How the kubepods cgroup was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubepodsDetection {
    /// Named by the configuration (`--kubepods-cgroup`).
    Configured,
    /// Detected (`auto`): the driver and what said so.
    Detected(CgroupDriver, DriverEvidence),
    /// `auto`, and nothing tells yet (no kubepods cgroup, no readable kubelet configuration):
    /// `kubepods_name` is the likelier layout for the cgroup version, and the sampler looks
    /// again on each pass until it knows.
    Pending,
}

impl KubepodsDetection {
    /// The driver, for the `node_monitor_kubepods_layout` metric and logs.
    pub fn driver_label(&self, kubepods_name: &str) -> &'static str {
        match self {
            KubepodsDetection::Detected(d, _) => d.as_str(),
            KubepodsDetection::Configured if kubepods_name.ends_with(".slice") => "systemd",
            KubepodsDetection::Configured => "cgroupfs",
            KubepodsDetection::Pending => "unknown",
        }
    }
}

/// `cgroupDriver` and `cgroupRoot` from a KubeletConfiguration file; `None` when the file is
/// unreadable or not YAML, and a field `None` when it has no valid value (the kubelet's default
/// driver, cgroupfs, is not assumed: a kubeadm node always writes it).
pub fn kubelet_config_layout(path: &Path) -> Option<(Option<CgroupDriver>, Option<String>)> {
    let text =
        crate::io::read_file_bounded(path, "the kubelet config file", crate::io::MAX_INPUT_BYTES)
            .ok()?;
    let value: serde_norway::Value = serde_norway::from_str(&text).ok()?;
    let driver = value
        .get("cgroupDriver")
        .and_then(|v| v.as_str())
        .and_then(CgroupDriver::parse);
    let root = value
        .get("cgroupRoot")
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    Some((driver, root))
}

/// `cgroupDriver` from a KubeletConfiguration file (see [`kubelet_config_layout`]).
pub fn kubelet_config_driver(path: &Path) -> Option<CgroupDriver> {
    kubelet_config_layout(path)?.0
}

/// A kubepods cgroup one level down, under a kubelet `cgroupRoot` (kind's `/kubelet`):
/// `<x>.slice/<x>-kubepods.slice` (systemd) or `<x>/kubepods` (cgroupfs), for the first child
/// `<x>` of `node_memory` that has one, in name order.
fn nested_kubepods(node_memory: &Path) -> Option<(String, CgroupDriver)> {
    let mut children: Vec<String> = std::fs::read_dir(node_memory)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    children.sort();
    children.into_iter().find_map(|c| {
        let candidate = match c.strip_suffix(".slice") {
            Some(stem) => (format!("{c}/{stem}-kubepods.slice"), CgroupDriver::Systemd),
            None => (format!("{c}/kubepods"), CgroupDriver::Cgroupfs),
        };
        node_memory.join(&candidate.0).is_dir().then_some(candidate)
    })
}

impl SamplerConfig {
    /// The directories writable layers are walked under: `writable_layer_roots`, and the
    /// writable-layer filesystem (`container_fs`) when one is named and layers are counted at
    /// all, since the runtime keeps them there.
    pub(crate) fn layer_roots(&self) -> Vec<PathBuf> {
        let mut roots = self.writable_layer_roots.clone();
        if let Some(c) = &self.container_fs
            && !roots.is_empty()
            && !roots.iter().any(|r| c.starts_with(r))
        {
            roots.push(c.clone());
        }
        roots
    }

    /// Validates the configuration and resolves it against the filesystem.
    pub fn resolve(&self) -> Result<Layout, ConfigError> {
        let node_rel = self.validate()?;
        let root = &self.cgroup_root;
        let version = match self.cgroup_version {
            Some(v) => v,
            None => detect_version(root)?,
        };
        let node_is_root = node_rel.as_os_str().is_empty();
        let (node_memory, node_pids, node_unified) = node_dirs(root, version, &node_rel);
        let (kp, kubepods_detection) = self.kubepods(version, &node_memory);
        let kubepods_memory = node_memory.join(&kp);
        let kubepods_pids = node_pids.as_ref().map(|p| p.join(&kp));
        let proc = &self.proc_root;
        let image_fs = match &self.image_fs {
            Some(p) => Some((p.clone(), ImageFsSource::Configured)),
            None => discover_image_fs(|p| p.exists()),
        };
        Ok(Layout {
            version,
            node_is_root,
            node_memory,
            node_pids,
            node_unified,
            kubepods_name: kp,
            kubepods_detection,
            kubepods_memory,
            kubepods_pids,
            proc: ProcPaths {
                meminfo: proc.join("meminfo"),
                loadavg: proc.join("loadavg"),
                pid_max: proc.join("sys/kernel/pid_max"),
                threads_max: proc.join("sys/kernel/threads-max"),
                pressure_memory: proc.join("pressure/memory"),
            },
            kubelet_root: self.kubelet_root.clone(),
            pod_log_root: self.pod_log_root.clone(),
            container_fs: self
                .container_fs
                .clone()
                .or_else(|| image_fs.as_ref().map(|(p, _)| p.clone())),
            image_fs,
        })
    }

    /// The checks that need no filesystem; returns the node cgroup relative to each hierarchy.
    fn validate(&self) -> Result<PathBuf, ConfigError> {
        let node_rel = node_relative(&self.node_cgroup)?;
        let kp = self.kubepods_cgroup.as_str();
        if kp != KUBEPODS_AUTO
            && (kp.is_empty()
                || kp.starts_with('/')
                || kp.len() > MAX_KUBEPODS_PATH
                || kp.split('/').any(|c| c.is_empty() || c == "." || c == ".."))
        {
            return Err(ConfigError::KubepodsCgroup {
                value: self.kubepods_cgroup.clone(),
            });
        }
        if self.full_sample_interval.is_zero() {
            return Err(ConfigError::FullSampleInterval {
                value: self.full_sample_interval,
            });
        }
        if self.allocatable_memory == Some(0) {
            return Err(ConfigError::AllocatableMemory { value: 0 });
        }
        if self.pod_disk_budget == 0 {
            return Err(ConfigError::PodDiskBudget { value: 0 });
        }
        if let Some(bad) = self.writable_layer_roots.iter().find(|r| {
            !r.is_absolute()
                || r.parent().is_none()
                || r.components()
                    .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        }) {
            return Err(ConfigError::WritableLayerRoot { value: bad.clone() });
        }
        Ok(node_rel)
    }

    /// The kubepods cgroup's name and how it was found: as configured, or (`auto`) detected
    /// from the cgroup tree under `node_memory` and the kubelet's configuration.
    ///
    /// In order: the kubepods cgroup at the node cgroup's root (`kubepods.slice`, `kubepods`);
    /// then, when the kubelet's configuration names a `cgroupRoot`, the kubepods cgroup the
    /// kubelet makes under it; then one nested a level down (kind's
    /// `kubelet.slice/kubelet-kubepods.slice`); then the configuration's driver alone.
    fn kubepods(&self, version: CgroupVersion, node_memory: &Path) -> (String, KubepodsDetection) {
        if self.kubepods_cgroup != KUBEPODS_AUTO {
            return (self.kubepods_cgroup.clone(), KubepodsDetection::Configured);
        }
        let config_path = self
            .kubelet_config
            .clone()
            .unwrap_or_else(|| self.kubelet_root.join(KUBELET_CONFIG_FILE));
        let (config_driver, config_root) = kubelet_config_layout(&config_path).unwrap_or_default();
        let slice = node_memory.join("kubepods.slice").is_dir();
        let plain = node_memory.join("kubepods").is_dir();
        let rooted = config_root
            .as_deref()
            .filter(|r| !r.trim_matches('/').is_empty());
        if !slice
            && !plain
            && let Some(root) = rooted
        {
            // The kubelet's own root: its driver from the file, else whichever exists.
            let drivers = match config_driver {
                Some(d) => vec![d],
                None => vec![CgroupDriver::Systemd, CgroupDriver::Cgroupfs],
            };
            let named: Vec<(CgroupDriver, String)> = drivers
                .into_iter()
                .filter_map(|d| {
                    node_monitor_core::kubelet::layout::kubepods_relative(root, d).map(|kp| (d, kp))
                })
                .collect();
            if let Some((d, kp)) = named.iter().find(|(_, kp)| node_memory.join(kp).is_dir()) {
                return (
                    kp.clone(),
                    KubepodsDetection::Detected(*d, DriverEvidence::KubeletConfig),
                );
            }
            // The kubelet has not made it yet: look again on the next pass.
            if let Some((_, kp)) = named.into_iter().next() {
                return (kp, KubepodsDetection::Pending);
            }
        }
        if !slice
            && !plain
            && let Some((kp, d)) = nested_kubepods(node_memory)
        {
            return (
                kp,
                KubepodsDetection::Detected(d, DriverEvidence::CgroupTree),
            );
        }
        match detect_driver(slice, plain, config_driver) {
            Some((d, evidence)) => (
                d.kubepods_name().to_owned(),
                KubepodsDetection::Detected(d, evidence),
            ),
            // systemd hosts (cgroup v2 nearly always) run the systemd driver by default
            // since kubeadm 1.22; cgroup v1 hosts mostly cgroupfs.
            None => (
                match version {
                    CgroupVersion::V2 => "kubepods.slice",
                    CgroupVersion::V1 => "kubepods",
                }
                .to_owned(),
                KubepodsDetection::Pending,
            ),
        }
    }
}

/// The node cgroup's directories: memory, pids (absent without a v1 pids hierarchy) and unified
/// (absent on cgroup v1 without a unified hierarchy).
fn node_dirs(
    root: &Path,
    version: CgroupVersion,
    node_rel: &Path,
) -> (PathBuf, Option<PathBuf>, Option<PathBuf>) {
    match version {
        CgroupVersion::V2 => {
            let dir = root.join(node_rel);
            (dir.clone(), Some(dir.clone()), Some(dir))
        }
        CgroupVersion::V1 => {
            let pids_root = root.join("pids");
            let unified_root = root.join("unified");
            (
                root.join("memory").join(node_rel),
                pids_root.is_dir().then(|| pids_root.join(node_rel)),
                unified_root
                    .join("cgroup.controllers")
                    .is_file()
                    .then(|| unified_root.join(node_rel)),
            )
        }
    }
}

/// The node cgroup as a relative path; `/`, `` and `.` are the root.
fn node_relative(p: &Path) -> Result<PathBuf, ConfigError> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(s) => out.push(s),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(ConfigError::NodeCgroup {
                    value: p.to_path_buf(),
                });
            }
        }
    }
    Ok(out)
}

/// cgroup2 mounted at `root` is a unified host (runc `IsCgroup2UnifiedMode`: statfs magic);
/// a memory hierarchy at `root/memory` is cgroup v1 (hybrid hosts included: the memory
/// controller is what matters). Directories that are not cgroup mounts (test fixtures) are told
/// apart by their files.
fn detect_version(root: &Path) -> Result<CgroupVersion, ConfigError> {
    use nix::sys::statfs::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, statfs};
    if statfs(root).is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC) {
        return Ok(CgroupVersion::V2);
    }
    let v1_memory = root.join("memory");
    if statfs(&v1_memory).is_ok_and(|s| s.filesystem_type() == CGROUP_SUPER_MAGIC)
        || v1_memory.join("memory.usage_in_bytes").is_file()
    {
        return Ok(CgroupVersion::V1);
    }
    if root.join("cgroup.controllers").is_file() {
        return Ok(CgroupVersion::V2);
    }
    Err(ConfigError::NoMemoryHierarchy {
        root: root.to_path_buf(),
    })
}

/// The image filesystem rule: the first of [`IMAGE_FS_CANDIDATES`] that exists.
pub fn discover_image_fs(exists: impl Fn(&Path) -> bool) -> Option<(PathBuf, ImageFsSource)> {
    IMAGE_FS_CANDIDATES
        .iter()
        .find(|(p, _)| exists(Path::new(p)))
        .map(|(p, s)| (PathBuf::from(p), *s))
}

#[cfg(test)]
mod tests;
