//! Per-pod disk usage (local volumes on nodefs and container logs under `/var/log/pods`),
//! measured on a thread of its own.
//!
//! A directory walk waits on the disk, and a pod may hold up to the walk budget in entries: on
//! the sampling path it would delay every memory decision that happens to fall on a full pass.
//! The sampler asks for a measurement ([`DiskMeter::request`]) and reads the figures of the last
//! finished one ([`DiskMeter::latest`]); a memory wake-up never waits for a walk.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use super::{
    SamplerError,
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
}

/// One finished measurement.
#[derive(Debug, Default)]
pub(crate) struct DiskReport {
    /// Bytes by pod UID (pods with neither a pod directory nor logs are absent).
    pub usage: HashMap<String, u64>,
    /// Pods whose figure is a lower bound (a walk hit its budget), by UID.
    pub truncated: Vec<String>,
    /// The first error met, if any (the pods it hit are left out of `usage`).
    pub error: Option<SamplerError>,
}

/// Measures `uids` once, synchronously.
pub(crate) fn measure(paths: &DiskPaths, uids: &[String]) -> DiskReport {
    let logs = pods::pod_log_dirs(&paths.log_root);
    let mut inodes = HashSet::new();
    let mut report = DiskReport::default();
    for uid in uids {
        inodes.clear();
        let volumes = pods::disk_usage(&paths.pods_root.join(uid), paths.budget, &mut inodes);
        let logs = match logs.get(uid.as_str()) {
            Some(dir) => pods::disk_usage(dir, paths.budget, &mut inodes),
            None => Ok(None),
        };
        match (volumes, logs) {
            (Ok(None), Ok(None)) => {}
            (Ok(v), Ok(l)) => {
                let walks = [v, l];
                let bytes = walks
                    .iter()
                    .flatten()
                    .fold(0u64, |a, w| a.saturating_add(w.bytes));
                if walks.iter().flatten().any(|w: &DiskWalk| !w.complete) {
                    report.truncated.push(uid.clone());
                }
                report.usage.insert(uid.clone(), bytes);
            }
            (Err(e), _) | (_, Err(e)) => {
                report.error.get_or_insert(e);
            }
        }
    }
    report
}

#[derive(Debug, Default)]
struct State {
    /// The pods to measure on the next pass.
    wanted: Vec<String>,
    /// A pass is asked for.
    kicked: bool,
    stop: bool,
    /// The last finished measurement; its error and truncations are taken once by
    /// [`DiskMeter::take_outcome`].
    usage: HashMap<String, u64>,
    outcome: Option<(Vec<String>, Option<SamplerError>)>,
    passes: u64,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
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
        let shared = Arc::new(Shared::default());
        let for_thread = Arc::clone(&shared);
        let thread_paths = paths.clone();
        let spawned = std::thread::Builder::new()
            .name("pod-disk".into())
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
            shared: Arc::new(Shared::default()),
            paths,
            inline: false,
        }
    }

    /// The pods of the last request not yet taken by the thread (tests).
    #[cfg(test)]
    pub fn requested(&self) -> Vec<String> {
        self.shared.lock().wanted.clone()
    }

    /// Asks for a measurement of `uids` (a pass already asked for is replaced, not queued).
    pub fn request<'a>(&self, uids: impl Iterator<Item = &'a str>) {
        let wanted: Vec<String> = uids.map(str::to_owned).collect();
        if self.inline {
            self.shared.store(measure(&self.paths, &wanted));
            return;
        }
        let mut s = self.shared.lock();
        s.wanted = wanted;
        s.kicked = true;
        drop(s);
        self.shared.wake.notify_all();
    }

    /// Measures `uids` now, on the caller's thread, and stores the result as the latest.
    pub fn measure_now<'a>(&self, uids: impl Iterator<Item = &'a str>) {
        let wanted: Vec<String> = uids.map(str::to_owned).collect();
        self.shared.store(measure(&self.paths, &wanted));
    }

    /// Calls `f` with the figures of the last finished measurement, by pod UID.
    pub fn latest<R>(&self, f: impl FnOnce(&HashMap<String, u64>) -> R) -> R {
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
        shared.store(measure(paths, &wanted));
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use super::*;

    const UID_A: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    const UID_B: &str = "1a1b2c3d-4e5f-6789-abcd-ef0123456789";

    fn paths(root: &Path, budget: u64) -> DiskPaths {
        DiskPaths {
            pods_root: root.join("pods"),
            log_root: root.join("logs"),
            budget,
        }
    }

    #[test]
    fn volumes_and_logs_are_summed_and_a_budget_gives_a_lower_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vol = dir
            .path()
            .join("pods")
            .join(UID_A)
            .join("volumes/kubernetes.io~empty-dir/d");
        fs::create_dir_all(&vol).expect("mkdir");
        fs::write(vol.join("blob"), vec![1u8; 256 * 1024]).expect("write");
        let logs = dir.path().join(format!("logs/default_web_{UID_A}/web"));
        fs::create_dir_all(&logs).expect("mkdir");
        fs::write(logs.join("0.log"), vec![b'x'; 128 * 1024]).expect("write");
        // Pod B: many small files, more entries than the budget.
        let many = dir
            .path()
            .join("pods")
            .join(UID_B)
            .join("volumes/kubernetes.io~empty-dir/d");
        fs::create_dir_all(&many).expect("mkdir");
        for i in 0..50 {
            fs::write(many.join(format!("f{i}")), vec![2u8; 8 * 1024]).expect("write");
        }

        let uids = [UID_A.to_owned(), UID_B.to_owned(), "absent".to_owned()];
        let r = measure(&paths(dir.path(), 20), &uids);
        assert!(r.error.is_none(), "{:?}", r.error);
        assert!(r.usage[UID_A] >= 384 * 1024, "{}", r.usage[UID_A]);
        // Pod B's walk stopped at 20 entries: what it counted is kept, and flagged.
        assert!(r.usage[UID_B] >= 8 * 1024, "{}", r.usage[UID_B]);
        assert!(r.usage[UID_B] < 50 * 8 * 1024, "{}", r.usage[UID_B]);
        assert_eq!(r.truncated, vec![UID_B.to_owned()]);
        assert!(!r.usage.contains_key("absent"));

        let full = measure(&paths(dir.path(), 1000), &uids);
        assert!(full.truncated.is_empty());
        assert!(full.usage[UID_B] >= 50 * 8 * 1024, "{}", full.usage[UID_B]);
    }

    #[test]
    fn the_thread_measures_on_request_and_keeps_the_last_figures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vol = dir
            .path()
            .join("pods")
            .join(UID_A)
            .join("volumes/kubernetes.io~empty-dir/d");
        fs::create_dir_all(&vol).expect("mkdir");
        fs::write(vol.join("blob"), vec![1u8; 64 * 1024]).expect("write");
        let m = DiskMeter::start(paths(dir.path(), 1000));
        assert!(m.latest(|u| u.is_empty()));
        m.request([UID_A].into_iter());
        m.wait_passes(1);
        let first = m.latest(|u| u[UID_A]);
        assert!(first >= 64 * 1024, "{first}");
        let (truncated, error) = m.take_outcome().expect("an outcome");
        assert!(truncated.is_empty() && error.is_none());
        assert!(m.take_outcome().is_none(), "taken once");

        fs::write(vol.join("blob2"), vec![1u8; 64 * 1024]).expect("write");
        // Until the next pass finishes, the figures are the last ones.
        assert_eq!(m.latest(|u| u[UID_A]), first);
        m.request([UID_A].into_iter());
        m.wait_passes(2);
        assert!(m.latest(|u| u[UID_A]) >= first + 64 * 1024);
    }
}
