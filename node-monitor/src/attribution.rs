//! Attribution of kernel events to pods: cgroup id → cgroup path → pod.
//!
//! The probes report cgroup v2 ids: `bpf_get_current_cgroup_id()` and `kernfs_node.id` of a
//! cgroup, which is the inode number of its directory in the cgroup2 hierarchy (kernfs uses the
//! node id as inode number on 64-bit, fs/kernfs/inode.c). [`CgroupPaths`] walks that hierarchy
//! (`/sys/fs/cgroup` on a v2 host, `/sys/fs/cgroup/unified` on a hybrid one) to map inodes to
//! paths, keeps the result, and walks again on a miss (rate-limited, bounded). A container that
//! dies of an OOM kill is often gone before its event is read (the runtime removes its scope at
//! once), so [`CgroupPaths::watch`] also notes every cgroup the moment it is created (inotify on
//! the hierarchy's directories) and keeps what it learned for [`CREATED_RETENTION`] after the
//! cgroup is removed. The path then goes
//! through the kubelet-layout parser ([`node_monitor_core::kubelet::layout::parse_cgroup_path`]) for the
//! pod UID, QoS class and container id, and optionally through the API for namespace and name.
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::future::BoxFuture;
use serde::Serialize;
use tracing::{debug, warn};

use node_monitor_core::kubelet::layout::{PodCgroup, parse_cgroup_path};

#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no cgroup2 hierarchy is mounted (none in /proc/self/mountinfo)")]
    NoCgroup2,
    #[error("connecting to the Kubernetes API")]
    Api(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The cgroup2 mount point from `/proc/self/mountinfo` text: `/sys/fs/cgroup` when it is the
/// cgroup2 mount (a v2 host), else `/sys/fs/cgroup/unified` (a hybrid host), else the first one.
pub fn find_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    // Fields: id parent major:minor root mount-point options [optional…] - fstype source super.
    let mounts: Vec<&str> = mountinfo
        .lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let fstype = post.split_whitespace().next()?;
            (fstype == "cgroup2").then(|| pre.split_whitespace().nth(4))?
        })
        .collect();
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .find(|p| mounts.contains(p))
        .or_else(|| mounts.first().copied())
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
}

/// Mount points escape space, tab, newline and backslash as octal (`\040`).
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')));
        match octal.and_then(|v| u8::try_from(v).ok()) {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How long a cgroup noted at creation stays resolvable: long enough for an OOM event of a
/// container that lived a moment to be read and attributed.
pub const CREATED_RETENTION: Duration = Duration::from_secs(600);
/// At most this many cgroups noted at creation are kept (the oldest go first).
const CREATED_MAX: usize = 50_000;

/// Cgroups noted at creation by the watcher thread: id → (path, when noted).
type Created = Arc<Mutex<HashMap<u64, (String, Instant)>>>;

/// cgroup id → path (relative to the cgroup2 root, with a leading `/`), from walks of the
/// hierarchy and, with [`CgroupPaths::watch`], from cgroups noted as they are created.
#[derive(Debug)]
pub struct CgroupPaths {
    root: PathBuf,
    by_id: HashMap<u64, String>,
    created: Created,
    /// A walk stops after this many cgroups (the map is rebuilt by each walk, so it stays bounded).
    max_entries: usize,
    /// Misses do not walk again sooner than this after the last walk.
    min_rescan: Duration,
    last_scan: Option<Instant>,
    scans: u64,
}

impl CgroupPaths {
    pub const DEFAULT_MAX_ENTRIES: usize = 100_000;
    pub const DEFAULT_MIN_RESCAN: Duration = Duration::from_millis(100);

    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            by_id: HashMap::new(),
            created: Arc::default(),
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            min_rescan: Self::DEFAULT_MIN_RESCAN,
            last_scan: None,
            scans: 0,
        }
    }

    /// The cgroup2 hierarchy of this host.
    pub fn detect() -> Result<Self, AttributionError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = std::fs::read_to_string(path).map_err(|source| AttributionError::Read {
            path: path.to_owned(),
            source,
        })?;
        find_cgroup2_mount(&text)
            .map(Self::new)
            .ok_or(AttributionError::NoCgroup2)
    }

    pub fn with_limits(mut self, max_entries: usize, min_rescan: Duration) -> Self {
        self.max_entries = max_entries;
        self.min_rescan = min_rescan;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Walks done so far.
    pub fn scans(&self) -> u64 {
        self.scans
    }

    /// Entries in the cache.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The path of cgroup `id`, walking the hierarchy again on a miss unless the last walk was
    /// less than `min_rescan` ago. `None` for unknown ids (e.g. a cgroup already removed).
    pub fn path(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.by_id.get(&id) {
            return Some(p.clone());
        }
        if let Some(p) = self.created_path(id) {
            return Some(p);
        }
        if self
            .last_scan
            .is_some_and(|t| t.elapsed() < self.min_rescan)
        {
            return None;
        }
        if let Err(e) = self.rescan() {
            warn!(root = %self.root.display(), error = %e, "walking the cgroup hierarchy failed");
        }
        self.by_id.get(&id).cloned()
    }

    fn created_path(&self, id: u64) -> Option<String> {
        let created = self
            .created
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        created.get(&id).map(|(p, _)| p.clone())
    }

    /// Starts a thread that notes every cgroup created under the root from now on (inotify on
    /// each directory of the hierarchy, added as directories appear), so that a cgroup removed
    /// before its event is attributed still resolves. Without inotify (a limit reached, an
    /// unusual file system) attribution falls back to walks, with a warning.
    pub fn watch(&mut self) -> Result<(), AttributionError> {
        let watcher = CreationWatcher::new(self.root.clone(), self.created.clone())?;
        std::thread::Builder::new()
            .name("cgroup-watch".into())
            .stack_size(crate::SMALL_THREAD_STACK_BYTES)
            .spawn(move || watcher.run())
            .map_err(|source| AttributionError::Read {
                path: self.root.clone(),
                source,
            })?;
        Ok(())
    }

    /// Rebuilds the map from a walk. Returns the number of cgroups found.
    pub fn rescan(&mut self) -> Result<usize, AttributionError> {
        self.last_scan = Some(Instant::now());
        self.scans += 1;
        let root_meta = std::fs::metadata(&self.root).map_err(|source| AttributionError::Read {
            path: self.root.clone(),
            source,
        })?;
        let mut by_id = HashMap::new();
        by_id.insert(root_meta.ino(), "/".to_owned());
        let mut stack = vec![(self.root.clone(), String::new(), 0u32)];
        'walk: while let Some((dir, rel, depth)) = stack.pop() {
            // A cgroup removed during the walk is not an error.
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(ft) = entry.file_type() else { continue };
                if !ft.is_dir() {
                    continue;
                }
                let Ok(meta) = entry.metadata() else { continue };
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                let child_rel = format!("{rel}/{name}");
                by_id.insert(meta.ino(), child_rel.clone());
                if by_id.len() >= self.max_entries {
                    warn!(
                        root = %self.root.display(),
                        max = self.max_entries,
                        "cgroup walk stopped at its bound"
                    );
                    break 'walk;
                }
                if depth < 64 {
                    stack.push((entry.path(), child_rel, depth + 1));
                }
            }
        }
        debug!(root = %self.root.display(), cgroups = by_id.len(), "cgroup hierarchy walked");
        self.by_id = by_id;
        Ok(self.by_id.len())
    }
}

/// The inotify side of [`CgroupPaths::watch`].
struct CreationWatcher {
    root: PathBuf,
    inotify: nix::sys::inotify::Inotify,
    /// Watch descriptor → the directory's path relative to the root ("" for the root).
    dirs: HashMap<nix::sys::inotify::WatchDescriptor, String>,
    created: Created,
}

impl CreationWatcher {
    const MAX_WATCHES: usize = 50_000;

    fn new(root: PathBuf, created: Created) -> Result<Self, AttributionError> {
        use nix::sys::inotify::{InitFlags, Inotify};
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC).map_err(|e| AttributionError::Read {
            path: root.clone(),
            source: e.into(),
        })?;
        let mut w = Self {
            root,
            inotify,
            dirs: HashMap::new(),
            created,
        };
        w.add_tree(String::new(), false);
        if w.dirs.is_empty() {
            return Err(AttributionError::Read {
                path: w.root.clone(),
                source: std::io::Error::other("no directory of the hierarchy could be watched"),
            });
        }
        debug!(root = %w.root.display(), watches = w.dirs.len(), "watching cgroup creation");
        Ok(w)
    }

    /// Watches `rel` and every directory below it; with `note`, also records each (they were
    /// created after the watch began).
    fn add_tree(&mut self, rel: String, note: bool) {
        use nix::sys::inotify::AddWatchFlags;
        let mut stack = vec![rel];
        while let Some(rel) = stack.pop() {
            if self.dirs.len() >= Self::MAX_WATCHES {
                warn!(
                    max = Self::MAX_WATCHES,
                    "cgroup creation watches at their bound"
                );
                return;
            }
            let path = self.root.join(rel.trim_start_matches('/'));
            let flags = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_ONLYDIR;
            let Ok(wd) = self.inotify.add_watch(&path, flags) else {
                // Removed meanwhile, or a limit: the walks still cover it.
                continue;
            };
            if note && let Ok(meta) = std::fs::metadata(&path) {
                self.note(meta.ino(), &rel);
            }
            self.dirs.insert(wd, rel.clone());
            // Children created before the watch took effect are found by listing.
            let Ok(entries) = std::fs::read_dir(&path) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir())
                    && let Some(name) = entry.file_name().to_str()
                {
                    stack.push(format!("{rel}/{name}"));
                }
            }
        }
    }

    fn note(&self, id: u64, rel: &str) {
        let now = Instant::now();
        let mut created = self
            .created
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        created.retain(|_, (_, at)| now.duration_since(*at) < CREATED_RETENTION);
        if created.len() >= CREATED_MAX
            && let Some(oldest) = created
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| *k)
        {
            created.remove(&oldest);
        }
        created.insert(id, (rel.to_owned(), now));
    }

    fn run(mut self) {
        use nix::sys::inotify::AddWatchFlags;
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) => events,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    warn!(error = %e, "cgroup creation watch ended; attribution falls back to walks");
                    return;
                }
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    self.dirs.remove(&ev.wd);
                    continue;
                }
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    warn!("cgroup creation events overflowed; attribution falls back to walks");
                    continue;
                }
                if !ev.mask.contains(AddWatchFlags::IN_ISDIR) {
                    continue;
                }
                let (Some(parent), Some(name)) = (
                    self.dirs.get(&ev.wd).cloned(),
                    ev.name.as_ref().and_then(|n| n.to_str().map(str::to_owned)),
                ) else {
                    continue;
                };
                self.add_tree(format!("{parent}/{name}"), true);
            }
        }
    }
}

/// A pod's API identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

/// Looks pods up by UID in the Kubernetes API (or nowhere).
pub trait PodDirectory: Send {
    fn lookup<'a>(&'a mut self, pod_uid: &'a str) -> BoxFuture<'a, Option<PodRef>>;
}

/// No API access: pods are known by UID only.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoApi;

impl PodDirectory for NoApi {
    fn lookup<'a>(&'a mut self, _pod_uid: &'a str) -> BoxFuture<'a, Option<PodRef>> {
        Box::pin(async { None })
    }
}

/// Pods of this node from the API, listed again on a miss (at most every `min_refresh`).
pub struct KubePods {
    api: ::kube::Api<k8s_openapi::api::core::v1::Pod>,
    node_name: Option<String>,
    by_uid: HashMap<String, PodRef>,
    last_refresh: Option<Instant>,
    min_refresh: Duration,
}

impl KubePods {
    /// From a kubeconfig file, or in-cluster / the default kubeconfig when `None`.
    pub async fn connect(
        kubeconfig: Option<&Path>,
        node_name: Option<String>,
    ) -> Result<Self, AttributionError> {
        let boxed = |e: Box<dyn std::error::Error + Send + Sync>| AttributionError::Api(e);
        let config = match kubeconfig {
            Some(path) => {
                let kc =
                    ::kube::config::Kubeconfig::read_from(path).map_err(|e| boxed(e.into()))?;
                ::kube::Config::from_custom_kubeconfig(
                    kc,
                    &::kube::config::KubeConfigOptions::default(),
                )
                .await
                .map_err(|e| boxed(e.into()))?
            }
            None => ::kube::Config::infer().await.map_err(|e| boxed(e.into()))?,
        };
        let client = ::kube::Client::try_from(config).map_err(|e| boxed(e.into()))?;
        Ok(Self {
            api: ::kube::Api::all(client),
            node_name,
            by_uid: HashMap::new(),
            last_refresh: None,
            min_refresh: Duration::from_secs(5),
        })
    }

    async fn refresh(&mut self) {
        self.last_refresh = Some(Instant::now());
        let mut params = ::kube::api::ListParams::default();
        if let Some(node) = &self.node_name {
            params = params.fields(&format!("spec.nodeName={node}"));
        }
        match self.api.list(&params).await {
            Ok(list) => {
                self.by_uid = list
                    .items
                    .into_iter()
                    .filter_map(|p| {
                        let m = p.metadata;
                        Some((
                            m.uid?,
                            PodRef {
                                namespace: m.namespace.unwrap_or_default(),
                                name: m.name?,
                            },
                        ))
                    })
                    .collect();
            }
            Err(e) => warn!(error = %e, "listing pods for attribution failed"),
        }
    }
}

impl PodDirectory for KubePods {
    fn lookup<'a>(&'a mut self, pod_uid: &'a str) -> BoxFuture<'a, Option<PodRef>> {
        Box::pin(async move {
            if let Some(p) = self.by_uid.get(pod_uid) {
                return Some(p.clone());
            }
            if self
                .last_refresh
                .is_some_and(|t| t.elapsed() < self.min_refresh)
            {
                return None;
            }
            self.refresh().await;
            self.by_uid.get(pod_uid).cloned()
        })
    }
}

/// What a cgroup id says about the workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attribution {
    pub cgroup_id: u64,
    /// Relative to the cgroup2 root, e.g. `/kubepods/burstable/pod<uid>/<container>`.
    pub cgroup_path: Option<String>,
    /// `None` when the cgroup is not a pod's.
    pub pod: Option<PodCgroup>,
    /// Namespace and name, when the API is reachable and knows the pod.
    pub pod_ref: Option<PodRef>,
}

/// cgroup id → [`Attribution`].
pub struct Attributor {
    paths: CgroupPaths,
    directory: Box<dyn PodDirectory>,
}

impl Attributor {
    pub fn new(paths: CgroupPaths, directory: Box<dyn PodDirectory>) -> Self {
        Self { paths, directory }
    }

    pub fn paths(&self) -> &CgroupPaths {
        &self.paths
    }

    pub async fn attribute(&mut self, cgroup_id: u64) -> Attribution {
        let cgroup_path = self.paths.path(cgroup_id);
        let pod = cgroup_path.as_deref().and_then(parse_cgroup_path);
        let pod_ref = match &pod {
            Some(p) => self.directory.lookup(&p.pod_uid).await,
            None => None,
        };
        Attribution {
            cgroup_id,
            cgroup_path,
            pod,
            pod_ref,
        }
    }
}

#[cfg(test)]
mod tests;
