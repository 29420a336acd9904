//! Per-pod disk usage (local volumes on nodefs, container logs under `/var/log/pods` and the
//! containers' writable layers), in bytes and inodes, measured on a thread of its own.
//!
//! A directory walk waits on the disk, and a pod may hold up to the walk budget in entries: on
//! the sampling path it would delay every memory decision that happens to fall on a full pass.
//! The sampler asks for a measurement ([`DiskMeter::request`]) and reads the figures of the last
//! finished one ([`DiskMeter::latest`]); a memory wake-up never waits for a walk.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use k8s_openapi::api::core::v1::Pod;
use node_monitor_core::eviction::local_storage::{ContainerStorage, StorageUsage};

use super::{
    SamplerError,
    layers::LayerCache,
    walk::{self, DiskWalk},
};

/// Where the meter looks, and how far.
#[derive(Debug, Clone)]
pub(crate) struct DiskPaths {
    /// `<kubelet root>/pods`: `<uid>/volumes/...` (and the pod's other local files).
    pub pods_root: PathBuf,
    /// `/var/log/pods`: `<namespace>_<name>_<uid>/<container>/<n>.log`.
    pub log_root: PathBuf,
    /// Entries walked per tree before the figure becomes a lower bound.
    pub budget: u64,
    /// procfs, for the `mountinfo` of a process of each container (its writable layer).
    pub proc_root: PathBuf,
    /// Writable layers are walked only under these directories (none: not counted).
    pub layer_roots: Vec<PathBuf>,
}

/// A pod to measure: its UID and its cgroup directory (whose children are its containers).
pub(crate) type PodRef = (String, PathBuf);

/// One pod's measured disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PodDisk {
    /// Local volumes, logs and writable layers, bytes (hard links counted once).
    pub total: u64,
    /// The part of `total` in its containers' writable layers.
    pub layers: u64,
    /// Inodes used by the same trees (hard links once).
    pub inodes: u64,
    /// The part of `inodes` in its containers' writable layers.
    pub layer_inodes: u64,
    /// A walk hit its budget: the figures are a lower bound, and the pod ranks as a pod without
    /// statistics for the disk signals (first, as the kubelet ranks one), so decoy files that
    /// use up the budget cannot hide a large file behind them.
    pub truncated: bool,
}

/// One pod's disk in parts, for the local-storage limits: its emptyDir volumes, and per
/// container its logs and writable layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDiskDetail {
    /// The pod's whole figure ([`PodDisk::total`]).
    pub total: u64,
    /// Bytes under each `volumes/kubernetes.io~empty-dir/<name>` on nodefs, by volume name.
    pub empty_dirs: BTreeMap<String, u64>,
    /// Bytes under each container's log directory (`/var/log/pods/<pod>/<container>`), by
    /// container name.
    pub logs: BTreeMap<String, u64>,
    /// Bytes of each container's writable layer, by container ID (from its cgroup's name).
    pub layers: BTreeMap<String, u64>,
}

impl PodDiskDetail {
    /// A pod's measured disk as the kubelet's summary has it: the pod's total, its emptyDir volumes
    /// by name, and per container (regular, init and ephemeral, by name) its logs and writable layer,
    /// the layer found by the container ID its status reports.
    pub fn storage_usage(&self, pod: &Pod) -> StorageUsage {
        let detail = self;
        let mut containers: Vec<ContainerStorage> = Vec::new();
        let status = pod.status.as_ref();
        let statuses = status
            .into_iter()
            .flat_map(|s| {
                [
                    s.container_statuses.as_deref(),
                    s.init_container_statuses.as_deref(),
                    s.ephemeral_container_statuses.as_deref(),
                ]
            })
            .flatten()
            .flatten();
        for cs in statuses {
            let id = cs
                .container_id
                .as_deref()
                .map(node_monitor_core::kubelet::pod::bare_container_id);
            let rootfs = id.and_then(|id| detail.layers.get(id).copied());
            let logs = detail.logs.get(&cs.name).copied();
            if rootfs.is_none() && logs.is_none() {
                continue;
            }
            containers.push(ContainerStorage {
                name: cs.name.clone(),
                logs,
                rootfs,
            });
        }
        // Containers with logs but no status yet.
        for (name, bytes) in &detail.logs {
            if !containers.iter().any(|c| c.name == *name) {
                containers.push(ContainerStorage {
                    name: name.clone(),
                    logs: Some(*bytes),
                    rootfs: None,
                });
            }
        }
        StorageUsage {
            pod: Some(detail.total),
            volumes: detail.empty_dirs.clone().into_iter().collect(),
            containers,
        }
    }
}

/// One finished measurement.
#[derive(Debug, Default)]
pub(crate) struct DiskReport {
    /// Figures by pod UID (pods with neither a pod directory nor logs are absent).
    pub usage: HashMap<String, PodDisk>,
    /// The same pods' figures in parts, by UID.
    pub detail: HashMap<String, PodDiskDetail>,
    /// Pods whose figure is a lower bound (a walk hit its budget), by UID.
    pub truncated: Vec<String>,
    /// The first error met, if any (the pods it hit are left out of `usage`).
    pub error: Option<SamplerError>,
}

/// The emptyDir plugin's directory under a pod's directory.
const EMPTY_DIR_PLUGIN: &str = "volumes/kubernetes.io~empty-dir";

/// What a tree is to the pod's detail.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// Counted in the total only.
    Whole,
    /// An emptyDir volume, by name.
    EmptyDir(String),
    /// A container's logs, by container name.
    Logs(String),
    /// A container's writable layer, by the name of its cgroup directory.
    Layer(String),
}

/// A tree to walk, what it is, the directories below it to skip, and the budget it shares
/// (`Some(group)`: with the other trees of that group; `None`: a budget of its own).
type Tree = (PathBuf, Part, Vec<PathBuf>, Option<usize>);

/// The trees of one pod, each counted once: the pod directory without its emptyDir volumes,
/// each emptyDir volume, the pod's log directory without its containers' directories, each
/// container's log directory, each writable layer. The directories left out of a tree are
/// returned to be skipped by its walk. The pod directory's trees share one walk budget, the
/// log directory's another, as when each was walked whole.
fn pod_trees(
    paths: &DiskPaths,
    uid: &str,
    log_dir: Option<&PathBuf>,
    layers: Vec<(String, PathBuf)>,
) -> Vec<Tree> {
    let pod_dir = paths.pods_root.join(uid);
    let empty_dirs = pod_dir.join(EMPTY_DIR_PLUGIN);
    let mut trees = vec![(pod_dir, Part::Whole, vec![empty_dirs.clone()], Some(0))];
    // The subdirectories of `dir` on its filesystem: a memory-backed emptyDir (a tmpfs mount)
    // is not local storage on nodefs, and a walk of the whole tree would not enter it either.
    let children = |dir: &Path| -> Vec<(String, PathBuf)> {
        let (Ok(meta), Ok(rd)) = (std::fs::metadata(dir), std::fs::read_dir(dir)) else {
            return Vec::new();
        };
        rd.flatten()
            .filter(|e| {
                e.metadata()
                    .is_ok_and(|m| m.is_dir() && m.dev() == meta.dev())
            })
            .filter_map(|e| Some((e.file_name().to_str()?.to_owned(), e.path())))
            .collect()
    };
    let volumes = children(&empty_dirs);
    trees.push((
        empty_dirs,
        Part::Whole,
        volumes.iter().map(|(_, p)| p.clone()).collect(),
        Some(0),
    ));
    trees.extend(
        volumes
            .into_iter()
            .map(|(name, p)| (p, Part::EmptyDir(name), Vec::new(), Some(0))),
    );
    if let Some(l) = log_dir {
        let containers = children(l);
        trees.push((
            l.clone(),
            Part::Whole,
            containers.iter().map(|(_, p)| p.clone()).collect(),
            Some(1),
        ));
        trees.extend(
            containers
                .into_iter()
                .map(|(name, p)| (p, Part::Logs(name), Vec::new(), Some(1))),
        );
    }
    trees.extend(
        layers
            .into_iter()
            .map(|(name, p)| (p, Part::Layer(name), Vec::new(), None)),
    );
    trees
}

/// Measures `pods` once, synchronously.
pub(crate) fn measure(paths: &DiskPaths, pods: &[PodRef], layers: &mut LayerCache) -> DiskReport {
    let logs = walk::pod_log_dirs(&paths.log_root);
    let mut inodes = HashSet::new();
    let mut report = DiskReport::default();
    let mut walks = Vec::new();
    for (uid, cgroup) in pods {
        inodes.clear();
        walks.clear();
        let mut error = None;
        let trees = pod_trees(
            paths,
            uid,
            logs.get(uid.as_str()),
            layers.upper_dirs(cgroup),
        );
        let mut layer_bytes = 0u64;
        let mut layer_inodes = 0u64;
        let mut detail = PodDiskDetail::default();
        // Entries walked so far in each group, counting the root of every tree but the first
        // (in a walk of the whole, that root is an entry of its parent).
        let mut spent: [Option<u64>; 2] = [None; 2];
        for (tree, part, skip, group) in &trees {
            let budget = match group {
                Some(g) => match spent[*g] {
                    Some(n) => paths.budget.saturating_sub(n.saturating_add(1)),
                    None => paths.budget,
                },
                None => paths.budget,
            };
            let walked = if skip.is_empty() {
                walk::disk_usage(tree, budget, &mut inodes)
            } else {
                walk::disk_usage_skipping(tree, budget, &mut inodes, |p| {
                    skip.iter().any(|s| s == p)
                })
            };
            match walked {
                Ok(w) => {
                    if let Some(w) = &w {
                        if let Some(g) = group {
                            spent[*g] = Some(match spent[*g] {
                                Some(n) => n.saturating_add(w.inodes),
                                None => w.inodes.saturating_sub(1),
                            });
                        }
                        match part {
                            Part::Whole => {}
                            Part::EmptyDir(name) => {
                                detail.empty_dirs.insert(name.clone(), w.bytes);
                            }
                            Part::Logs(name) => {
                                detail.logs.insert(name.clone(), w.bytes);
                            }
                            Part::Layer(name) => {
                                layer_bytes = layer_bytes.saturating_add(w.bytes);
                                layer_inodes = layer_inodes.saturating_add(w.inodes);
                                let id = super::layers::container_id_of(name).to_owned();
                                let e = detail.layers.entry(id).or_default();
                                *e = e.saturating_add(w.bytes);
                            }
                        }
                    }
                    walks.extend(w);
                }
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = error {
            report.error.get_or_insert(e);
            continue;
        }
        if walks.is_empty() {
            continue;
        }
        let bytes = walks.iter().fold(0u64, |a, w| a.saturating_add(w.bytes));
        let inode_count = walks.iter().fold(0u64, |a, w| a.saturating_add(w.inodes));
        let truncated = walks.iter().any(|w: &DiskWalk| !w.complete);
        if truncated {
            report.truncated.push(uid.clone());
        }
        detail.total = bytes;
        report.detail.insert(uid.clone(), detail);
        report.usage.insert(
            uid.clone(),
            PodDisk {
                total: bytes,
                layers: layer_bytes.min(bytes),
                inodes: inode_count,
                layer_inodes: layer_inodes.min(inode_count),
                truncated,
            },
        );
    }
    layers.end_pass();
    report
}

#[derive(Debug, Default)]
struct State {
    /// The pods to measure on the next pass.
    wanted: Vec<PodRef>,
    /// A pass is asked for.
    kicked: bool,
    stop: bool,
    /// The last finished measurement; its error and truncations are taken once by
    /// [`DiskMeter::take_outcome`].
    usage: HashMap<String, PodDisk>,
    /// The figures in parts of the last finished measurement, until taken.
    detail: Option<HashMap<String, PodDiskDetail>>,
    outcome: Option<(Vec<String>, Option<SamplerError>)>,
    passes: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Container cgroup → writable layer, kept between measurements (whichever thread runs
    /// them).
    layers: Mutex<LayerCache>,
}

impl Shared {
    fn new(paths: &DiskPaths) -> Self {
        Self {
            state: Mutex::default(),
            wake: Condvar::new(),
            layers: Mutex::new(LayerCache::new(paths.proc_root.clone(), &paths.layer_roots)),
        }
    }

    fn measure(&self, paths: &DiskPaths, pods: &[PodRef]) -> DiskReport {
        let mut layers = self.layers.lock().unwrap_or_else(|p| p.into_inner());
        measure(paths, pods, &mut layers)
    }

    /// The lock, even if a panicking holder poisoned it: the state is plain data, always whole.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn store(&self, report: DiskReport) {
        let mut s = self.lock();
        s.usage = report.usage;
        s.detail = Some(report.detail);
        s.outcome = Some((report.truncated, report.error));
        s.passes += 1;
        drop(s);
        self.wake.notify_all();
    }
}

/// The handle the sampler holds. Dropping it stops the thread after its current walk.
#[derive(Debug)]
pub(crate) struct DiskMeter {
    shared: Arc<Shared>,
    paths: DiskPaths,
    /// No thread could be started: [`DiskMeter::request`] measures in place.
    inline: bool,
}

impl DiskMeter {
    /// Starts the meter's thread (or, if the thread cannot be started, measures in place with a
    /// warning).
    pub fn start(paths: DiskPaths) -> Self {
        let shared = Arc::new(Shared::new(&paths));
        let for_thread = Arc::clone(&shared);
        let thread_paths = paths.clone();
        let spawned = std::thread::Builder::new()
            .name("pod-disk".into())
            .stack_size(crate::SMALL_THREAD_STACK_BYTES)
            .spawn(move || run(&for_thread, &thread_paths));
        let inline = match spawned {
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(error = %e, "sampler: no thread for pod disk usage; measuring on the sampling path");
                true
            }
        };
        Self {
            shared,
            paths,
            inline,
        }
    }

    /// A meter with no thread: requests are recorded and never measured (tests that show a
    /// pass does not walk).
    #[cfg(test)]
    pub fn parked(paths: DiskPaths) -> Self {
        Self {
            shared: Arc::new(Shared::new(&paths)),
            paths,
            inline: false,
        }
    }

    /// The pods of the last request not yet taken by the thread (tests).
    #[cfg(test)]
    pub fn requested(&self) -> Vec<String> {
        self.shared
            .lock()
            .wanted
            .iter()
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// Forgets the pending request, as the thread does when it takes one (tests).
    #[cfg(test)]
    pub fn clear_request(&self) {
        self.shared.lock().wanted.clear();
    }

    /// Asks for a measurement of `pods` (UID and pod cgroup directory; a pass already asked for
    /// is replaced, not queued).
    pub fn request<'a>(&self, pods: impl Iterator<Item = (&'a str, &'a Path)>) {
        let wanted = owned(pods);
        if self.inline {
            self.shared.store(self.shared.measure(&self.paths, &wanted));
            return;
        }
        let mut s = self.shared.lock();
        s.wanted = wanted;
        s.kicked = true;
        drop(s);
        self.shared.wake.notify_all();
    }

    /// Measures `pods` now, on the caller's thread, and stores the result as the latest.
    pub fn measure_now<'a>(&self, pods: impl Iterator<Item = (&'a str, &'a Path)>) {
        let wanted = owned(pods);
        self.shared.store(self.shared.measure(&self.paths, &wanted));
    }

    /// Calls `f` with the figures of the last finished measurement, by pod UID.
    pub fn latest<R>(&self, f: impl FnOnce(&HashMap<String, PodDisk>) -> R) -> R {
        f(&self.shared.lock().usage)
    }

    /// The figures in parts of the last finished measurement, by pod UID, once: `None` until
    /// another measurement finishes.
    pub fn take_detail(&self) -> Option<HashMap<String, PodDiskDetail>> {
        self.shared.lock().detail.take()
    }

    /// The truncated pods and the error of the last finished measurement, once.
    pub fn take_outcome(&self) -> Option<(Vec<String>, Option<SamplerError>)> {
        self.shared.lock().outcome.take()
    }

    /// How many measurements finished (tests).
    #[cfg(test)]
    pub fn passes(&self) -> u64 {
        self.shared.lock().passes
    }

    /// Waits until at least `passes` measurements finished (tests).
    #[cfg(test)]
    pub fn wait_passes(&self, passes: u64) {
        let s = self.shared.lock();
        let _s = self
            .shared
            .wake
            .wait_while(s, |s| s.passes < passes)
            .unwrap_or_else(|p| p.into_inner());
    }
}

impl Drop for DiskMeter {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
    }
}

fn owned<'a>(pods: impl Iterator<Item = (&'a str, &'a Path)>) -> Vec<PodRef> {
    pods.map(|(u, c)| (u.to_owned(), c.to_path_buf())).collect()
}

fn run(shared: &Shared, paths: &DiskPaths) {
    loop {
        let wanted = {
            let s = shared.lock();
            let mut s = shared
                .wake
                .wait_while(s, |s| !s.kicked && !s.stop)
                .unwrap_or_else(|p| p.into_inner());
            if s.stop {
                return;
            }
            s.kicked = false;
            std::mem::take(&mut s.wanted)
        };
        shared.store(shared.measure(paths, &wanted));
    }
}

#[cfg(test)]
mod tests;
