//! Per-pod disk usage (local volumes on nodefs, container logs under `/var/log/pods` and the
//! containers' writable layers), in bytes and inodes, measured on a thread of its own.
//!
//! A directory walk waits on the disk, and a pod may hold up to the walk budget in entries: on
//! the sampling path it would delay every memory decision that happens to fall on a full pass.
//! The sampler asks for a measurement ([`DiskMeter::request`]) and reads the figures of the last
//! finished one ([`DiskMeter::latest`]); a memory wake-up never waits for a walk.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use super::{
    SamplerError,
    layers::LayerCache,
    pods::{self, DiskWalk},
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
}

/// One finished measurement.
#[derive(Debug, Default)]
pub(crate) struct DiskReport {
    /// Figures by pod UID (pods with neither a pod directory nor logs are absent).
    pub usage: HashMap<String, PodDisk>,
    /// Pods whose figure is a lower bound (a walk hit its budget), by UID.
    pub truncated: Vec<String>,
    /// The first error met, if any (the pods it hit are left out of `usage`).
    pub error: Option<SamplerError>,
}

/// Measures `pods` once, synchronously.
pub(crate) fn measure(paths: &DiskPaths, pods: &[PodRef], layers: &mut LayerCache) -> DiskReport {
    let logs = pods::pod_log_dirs(&paths.log_root);
    let mut inodes = HashSet::new();
    let mut report = DiskReport::default();
    let mut walks = Vec::new();
    for (uid, cgroup) in pods {
        inodes.clear();
        walks.clear();
        let mut error = None;
        let mut trees: Vec<(PathBuf, bool)> = vec![(paths.pods_root.join(uid), false)];
        trees.extend(logs.get(uid.as_str()).map(|l| (l.clone(), false)));
        trees.extend(layers.upper_dirs(cgroup).into_iter().map(|l| (l, true)));
        let mut layer_bytes = 0u64;
        let mut layer_inodes = 0u64;
        for (tree, is_layer) in &trees {
            match pods::disk_usage(tree, paths.budget, &mut inodes) {
                Ok(w) => {
                    if let (true, Some(w)) = (*is_layer, &w) {
                        layer_bytes = layer_bytes.saturating_add(w.bytes);
                        layer_inodes = layer_inodes.saturating_add(w.inodes);
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
        if walks.iter().any(|w: &DiskWalk| !w.complete) {
            report.truncated.push(uid.clone());
        }
        report.usage.insert(
            uid.clone(),
            PodDisk {
                total: bytes,
                layers: layer_bytes.min(bytes),
                inodes: inode_count,
                layer_inodes: layer_inodes.min(inode_count),
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
