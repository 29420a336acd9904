//! The kubelet's eviction signals (`pkg/kubelet/eviction/api/types.go`) and what the sampler
//! observes for them. Values are in base units: bytes, inodes or process IDs.

pub mod threshold;
use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    str::FromStr,
};

use serde::{Deserialize, Serialize};

/// An eviction signal, spelled as the kubelet spells it (`memory.available`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Signal {
    /// Node memory not in the working set: capacity (`MemTotal`, or the node cgroup's limit) minus
    /// the node cgroup's working set.
    #[serde(rename = "memory.available")]
    MemoryAvailable,
    /// Memory left for pods: the kubepods cgroup's capacity (the Node's allocatable memory, or the
    /// kubepods limit) minus its working set. The kubelet evaluates it only with
    /// `enforceNodeAllocatable: [pods]`.
    #[serde(rename = "allocatableMemory.available")]
    AllocatableMemoryAvailable,
    /// Free bytes on nodefs, the filesystem of the kubelet's root directory (`/var/lib/kubelet`).
    #[serde(rename = "nodefs.available")]
    NodeFsAvailable,
    /// Free inodes on nodefs.
    #[serde(rename = "nodefs.inodesFree")]
    NodeFsInodesFree,
    /// Free bytes on imagefs, the filesystem the container runtime keeps images on (equal to
    /// nodefs' when the two are shared).
    #[serde(rename = "imagefs.available")]
    ImageFsAvailable,
    /// Free inodes on imagefs.
    #[serde(rename = "imagefs.inodesFree")]
    ImageFsInodesFree,
    /// Free bytes on containerfs, the filesystem of the containers' writable layers (KEP-4191);
    /// equal to imagefs' unless the runtime splits the two.
    #[serde(rename = "containerfs.available")]
    ContainerFsAvailable,
    /// Free inodes on containerfs.
    #[serde(rename = "containerfs.inodesFree")]
    ContainerFsInodesFree,
    /// Process IDs left: `min(pid_max, threads-max)` minus the tasks on the host.
    #[serde(rename = "pid.available")]
    PidAvailable,
}

impl Signal {
    /// Every signal, in declaration order.
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The kubelet's name, used verbatim in configuration, messages and the `eviction_signal` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::AllocatableMemoryAvailable => "allocatableMemory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::ContainerFsAvailable => "containerfs.available",
            Self::ContainerFsInodesFree => "containerfs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown signal name; the message names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction signal {0:?}")]
pub struct UnknownSignal(pub String);

impl FromStr for Signal {
    type Err = UnknownSignal;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Signal::ALL
            .into_iter()
            .find(|sig| sig.as_str() == s)
            .ok_or_else(|| UnknownSignal(s.to_owned()))
    }
}

/// How `memory.available` and `allocatableMemory.available` count a cgroup's working set
/// (`nodeMonitor.memoryWorkingSet`). Pods are ranked by their working set as the kubelet
/// computes it whichever is chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum MemoryWorkingSet {
    /// The kubelet's (cadvisor's): `usage − inactive_file`. Active page cache counts as used.
    #[default]
    Kubelet,
    /// Also leaves out the active file pages the kernel can reclaim: clean, not shmem/tmpfs,
    /// not under writeback. See [`memory_working_set`].
    Reclaimable,
}

impl MemoryWorkingSet {
    /// Both choices, with their names in the configuration.
    pub const ALL: [(&'static str, MemoryWorkingSet); 2] = [
        ("kubelet", MemoryWorkingSet::Kubelet),
        ("reclaimable", MemoryWorkingSet::Reclaimable),
    ];

    /// The name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kubelet => "kubelet",
            Self::Reclaimable => "reclaimable",
        }
    }

    /// The formula, as `explain` and the documentation print it.
    pub fn formula(self) -> &'static str {
        match self {
            Self::Kubelet => "working_set = usage - inactive_file",
            Self::Reclaimable => {
                "working_set = usage - inactive_file - reclaimable_active_file; \
                 reclaimable_active_file = min(active_file, file - shmem - inactive_file) \
                 - (dirty + writeback)"
            }
        }
    }
}

/// The `memory.stat` figures of one cgroup that the working-set formulas read, in bytes. On
/// cgroup v1 the hierarchical `total_*` fields (`total_cache` is `file`, `total_dirty` is
/// `dirty`), on cgroup v2 the fields of the same names (`file_dirty`, `file_writeback`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemoryStatFigures {
    /// `memory.usage_in_bytes` (v1), `memory.current` (v2), `anon + file` (v2 root).
    pub usage: u64,
    /// File pages on the inactive LRU list.
    pub inactive_file: u64,
    /// File pages on the active LRU list.
    pub active_file: u64,
    /// Every page-cache page, shmem/tmpfs included (v1 `total_cache`, v2 `file`).
    pub file: u64,
    /// shmem and tmpfs pages: counted in `file`, reclaimable only by swapping.
    pub shmem: u64,
    /// Dirty file pages: they must be written back before they can be dropped.
    pub dirty: u64,
    /// File pages under writeback.
    pub writeback: u64,
}

/// The active file pages the kernel can drop without writing anything: the active file pages,
/// at most the page cache that is neither shmem nor inactive (shmem sits on the anon lists on
/// current kernels; the bound keeps the formula safe where it would not), less every dirty
/// and writeback page (which list they are on is not reported, so all are assumed active).
pub fn reclaimable_active_file(m: &MemoryStatFigures) -> u64 {
    let not_shmem_nor_inactive = m
        .file
        .saturating_sub(m.shmem)
        .saturating_sub(m.inactive_file);
    m.active_file
        .min(not_shmem_nor_inactive)
        .saturating_sub(m.dirty.saturating_add(m.writeback))
}

/// A cgroup's working set under `mode`, clamped at 0 as cadvisor clamps it.
///
/// - [`MemoryWorkingSet::Kubelet`]: `usage − inactive_file`.
/// - [`MemoryWorkingSet::Reclaimable`]: `usage − inactive_file − reclaimable_active_file`
///   ([`reclaimable_active_file`]).
pub fn memory_working_set(mode: MemoryWorkingSet, m: &MemoryStatFigures) -> u64 {
    m.usage.saturating_sub(file_outside_working_set(mode, m))
}

/// The page cache `mode` leaves out of the working set: `inactive_file`, plus
/// [`reclaimable_active_file`] with [`MemoryWorkingSet::Reclaimable`]. A cgroup v1 memcg
/// threshold must sit this far above `capacity − threshold` on `memory.usage_in_bytes` to fire
/// when the working set reaches it.
pub fn file_outside_working_set(mode: MemoryWorkingSet, m: &MemoryStatFigures) -> u64 {
    match mode {
        MemoryWorkingSet::Kubelet => m.inactive_file,
        MemoryWorkingSet::Reclaimable => m.inactive_file.saturating_add(reclaimable_active_file(m)),
    }
}

/// One signal's observed value: what is available and the capacity it is a share of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalObservation {
    /// What is left, in the signal's base unit; negative when usage exceeds capacity.
    pub available: i64,
    /// The total `available` is a share of, in the same unit (the base of percentage thresholds).
    pub capacity: i64,
}

/// A pod's resource usage as the sampler reads it from the kubelet's cgroup layout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodUsage {
    /// Memory working set in bytes (usage − inactive_file).
    pub memory: Option<u64>,
    /// Local ephemeral storage in bytes (logs, writable layers, emptyDir).
    pub disk: Option<u64>,
    /// The part of `disk` in the containers' writable layers, bytes: on a node with a dedicated
    /// image filesystem the kubelet ranks `nodefs` pressure without it and `imagefs` pressure by
    /// it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writable_layers: Option<u64>,
    /// Inodes used by the same local volumes, logs and writable layers (every file, directory
    /// and symlink once, hard links once), as the kubelet's stats provider counts them; `None`
    /// when not measured, which ranks like 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// The part of `inodes` in the containers' writable layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writable_layer_inodes: Option<u64>,
    /// Number of processes (threads count as the kubelet counts them: pids.current).
    pub processes: Option<u64>,
}

/// The filesystems the container runtime uses, as the kubelet discovers them at run time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FsLayout {
    /// Images live on a filesystem of their own (`HasDedicatedImageFs`).
    pub dedicated_image_fs: bool,
    /// Writable layers live apart from images (`IsContainerFsSeparateFromImageFs`).
    pub split_container_image_fs: bool,
}

impl FsLayout {
    /// The layout the kubelet derives from the filesystems (their device numbers) of its root
    /// directory (nodefs), the runtime's image store (imagefs) and, when the runtime reports one
    /// apart, its writable layers (containerfs).
    ///
    /// - `IsContainerFsSeparateFromImageFs`: containerfs is reported and is not imagefs.
    /// - `HasDedicatedImageFs` (KEP-4191): imagefs is not nodefs, or imagefs is nodefs but
    ///   containerfs is elsewhere. So a split writable-layer filesystem always comes with a
    ///   "dedicated" image filesystem, even when images stay on nodefs.
    pub fn detect(nodefs: u64, imagefs: u64, containerfs: Option<u64>) -> FsLayout {
        let split = containerfs.is_some_and(|c| c != imagefs);
        FsLayout {
            dedicated_image_fs: imagefs != nodefs || split,
            split_container_image_fs: split,
        }
    }
}

/// Everything one sampling pass saw. Signals the sampler could not read are absent, never guessed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observations {
    /// The signals that could be read; a signal absent here was not observed.
    pub signals: BTreeMap<Signal, SignalObservation>,
    /// Per-pod usage, keyed by pod UID.
    pub pods: HashMap<String, PodUsage>,
    /// The filesystems the runtime uses, as far as the sampler could tell: they choose which
    /// part of a pod's disk ranks it for each disk signal.
    #[serde(default)]
    pub filesystem: FsLayout,
    /// What the node can still allocate before the kernel must OOM-kill, bytes: the kernel's
    /// `MemAvailable`, bounded by the node cgroup's own headroom where its limit binds. The
    /// predictor's input ([`crate::eviction::predict`]); `None` when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_headroom: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `HasDedicatedImageFs` and `IsContainerFsSeparateFromImageFs` for every placement of the
    /// three filesystems (devices 1, 2, 3).
    #[test]
    fn the_layout_follows_the_kubelets_filesystem_detection() {
        let layout = |dedicated_image_fs, split_container_image_fs| FsLayout {
            dedicated_image_fs,
            split_container_image_fs,
        };
        let cases = [
            // One filesystem for everything; the runtime reports no containerfs, or the same.
            ((1, 1, None), layout(false, false)),
            ((1, 1, Some(1)), layout(false, false)),
            // Images and writable layers together on a dedicated filesystem.
            ((1, 2, None), layout(true, false)),
            ((1, 2, Some(2)), layout(true, false)),
            // Images apart, writable layers on nodefs (KEP-4191's split layout).
            ((1, 2, Some(1)), layout(true, true)),
            // Three filesystems.
            ((1, 2, Some(3)), layout(true, true)),
            // Images on nodefs, writable layers apart: the kubelet still calls imagefs dedicated.
            ((1, 1, Some(3)), layout(true, true)),
        ];
        for ((node, image, container), want) in cases {
            assert_eq!(
                FsLayout::detect(node, image, container),
                want,
                "nodefs {node}, imagefs {image}, containerfs {container:?}"
            );
        }
    }

    const MIB: u64 = 1 << 20;

    fn stat(
        usage: u64,
        inactive_file: u64,
        active_file: u64,
        file: u64,
        shmem: u64,
        dirty: u64,
        writeback: u64,
    ) -> MemoryStatFigures {
        MemoryStatFigures {
            usage: usage * MIB,
            inactive_file: inactive_file * MIB,
            active_file: active_file * MIB,
            file: file * MIB,
            shmem: shmem * MIB,
            dirty: dirty * MIB,
            writeback: writeback * MIB,
        }
    }

    /// Working sets, in MiB, under both formulas.
    #[test]
    fn the_working_set_leaves_out_only_reclaimable_cache_when_asked() {
        let cases = [
            // (name, figures, kubelet, reclaimable)
            (
                "anonymous memory only",
                stat(500, 0, 0, 0, 0, 0, 0),
                500,
                500,
            ),
            (
                "clean cache: inactive and active both left out",
                stat(1000, 200, 300, 500, 0, 0, 0),
                800,
                500,
            ),
            (
                "dirty and writeback pages stay in",
                stat(1000, 200, 300, 500, 0, 50, 30),
                800,
                580,
            ),
            (
                "more dirty than active: nothing more is left out",
                stat(1000, 200, 100, 300, 0, 150, 0),
                800,
                800,
            ),
            (
                "tmpfs on the anon lists: counted in file, never left out",
                stat(1000, 100, 200, 700, 400, 0, 0),
                900,
                700,
            ),
            (
                "tmpfs that would sit on the file lists is bounded out",
                stat(1000, 100, 500, 600, 400, 0, 0),
                900,
                800,
            ),
            (
                "all cache is shmem",
                stat(1000, 0, 300, 300, 300, 0, 0),
                1000,
                1000,
            ),
            (
                "clamped at zero as cadvisor clamps",
                stat(100, 80, 50, 130, 0, 0, 0),
                20,
                0,
            ),
        ];
        for (name, m, kubelet, reclaimable) in cases {
            assert_eq!(
                memory_working_set(MemoryWorkingSet::Kubelet, &m),
                kubelet * MIB,
                "kubelet: {name}"
            );
            assert_eq!(
                memory_working_set(MemoryWorkingSet::Reclaimable, &m),
                reclaimable * MIB,
                "reclaimable: {name}"
            );
            // The memcg threshold offset agrees with the working set wherever it is not
            // clamped.
            for mode in [MemoryWorkingSet::Kubelet, MemoryWorkingSet::Reclaimable] {
                let out = file_outside_working_set(mode, &m);
                if out <= m.usage {
                    assert_eq!(m.usage - out, memory_working_set(mode, &m), "{name}");
                }
            }
        }
    }

    #[test]
    fn the_settings_names_and_formulas() {
        for (name, mode) in MemoryWorkingSet::ALL {
            assert_eq!(mode.as_str(), name);
            assert_eq!(
                serde_json::to_string(&mode).expect("serialize"),
                format!("\"{name}\"")
            );
            assert!(
                mode.formula()
                    .starts_with("working_set = usage - inactive_file")
            );
        }
        assert_eq!(MemoryWorkingSet::default(), MemoryWorkingSet::Kubelet);
    }

    #[test]
    fn names_round_trip() {
        for s in Signal::ALL {
            assert_eq!(s.as_str().parse::<Signal>(), Ok(s));
            assert_eq!(
                serde_json::to_string(&s).expect("serialize"),
                format!("\"{s}\"")
            );
        }
        assert_eq!(
            "memory.free".parse::<Signal>(),
            Err(UnknownSignal("memory.free".into()))
        );
    }
}
