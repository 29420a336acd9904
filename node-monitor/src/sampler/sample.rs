//! The sampler: reads cgroupfs, statvfs and procfs and turns them into [`Observations`].

use std::{
    fs::File,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::Serialize;

use node_monitor_core::signals::{Observations, PodUsage, Signal, SignalObservation};

use super::{
    SamplerError,
    compute::{self, FsStat},
    config::{CgroupVersion, ConfigError, KubepodsDetection, Layout, SamplerConfig},
    disk::{DiskMeter, DiskPaths},
    parse::{self, MemoryLimit},
    pods::{self, PodTable},
    read::{CgroupFiles, Reader, Slot, is_gone},
    warn::WarnLimiter,
};

/// How much a sampling pass reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SampleKind {
    /// The node-level signals only; `Observations::pods` is left as it was. The cheapest pass
    /// (a few dozen file reads whatever the pod count): enough to decide whether a threshold is
    /// met; ranking then needs a [`SampleKind::Fast`] pass.
    Signals,
    /// Every signal and per-pod memory and processes; per-pod disk usage from the disk
    /// meter's last finished measurement.
    Fast,
    /// Also asks the disk meter for a new measurement of per-pod disk usage (a bounded
    /// directory walk on the meter's own thread: the pass never waits for it).
    Full,
}

/// One cgroup's memory, as the working-set formula uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryReading {
    /// What `available` is a share of: `MemTotal` at the root, the cgroup's limit otherwise.
    pub capacity: u64,
    /// `memory.usage_in_bytes` (v1), `memory.current` (v2), `anon + file` (v2 root). For a node
    /// cgroup whose limit does not bind (see [`compute::limit_binds`]), the machine's (root's).
    pub usage: u64,
    /// `total_inactive_file` (v1) or `inactive_file` (v2) from `memory.stat`.
    pub inactive_file: u64,
    /// `usage − inactive_file`, clamped at 0.
    pub working_set: u64,
}

/// What started a pass, as far as the sampler cares: when it happened (the start of the time
/// from wake-up to decision) and which pass it asks for. The sampler does not know what woke
/// the agent; the wake-ups (the `wakeup` module's `Wakeup`) implement this.
pub trait Trigger {
    /// When the pass was asked for (monotonic clock).
    fn at(&self) -> Instant;
    /// The pass asked for by [`Sampler::observe`].
    fn pass(&self) -> SampleKind;
}

/// One measured pass from a wake-up to observations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedObservations<W> {
    /// What started the pass.
    pub wakeup: W,
    pub kind: SampleKind,
    pub observations: Observations,
    /// Time spent reading and computing.
    pub sampling: Duration,
    /// From the wake-up's timestamp to the observations being ready: queueing plus sampling.
    /// What "wake-up to decision" measures, minus the (pure, fast) decision itself.
    pub since_wakeup: Duration,
}

const W_MEMINFO: &str = "meminfo";
const W_NODE_MEMORY: &str = "memory.available";
const W_ALLOCATABLE: &str = "allocatableMemory.available";
const W_NODEFS: &str = "nodefs";
const W_IMAGEFS: &str = "imagefs";
const W_CONTAINERFS: &str = "containerfs";
const W_PID: &str = "pid.available";
const W_KUBEPODS: &str = "kubepods pods";
const W_POD_MEMORY: &str = "pod memory";
const W_POD_PROCESSES: &str = "pod processes";
const W_POD_DISK: &str = "pod disk";

/// Reads the node. Holds reusable buffers and the pod table between passes; one per agent.
///
/// Reads of cgroupfs and procfs never wait on a disk; pod directories on nodefs are walked by the
/// disk meter's thread ([`super::disk`]), never by a pass. An async caller still runs passes with
/// `spawn_blocking` or `block_in_place` (they read files).
#[derive(Debug)]
pub struct Sampler {
    config: SamplerConfig,
    layout: Layout,
    reader: Reader,
    files: NodeFiles,
    warn: WarnLimiter,
    pods: PodTable,
    /// Per-pod disk usage, measured off the sampling path; `None` when disabled.
    disk: Option<DiskMeter>,
    last_full: Option<Instant>,
    last_node_memory: Option<MemoryReading>,
    last_kubepods_memory: Option<MemoryReading>,
    dedicated_image_fs: Option<bool>,
    /// The last full pass found no capacity for allocatableMemory.available.
    allocatable_missing: bool,
    /// The memory hierarchy's root: the machine, read in place of a node cgroup whose limit does
    /// not bind.
    machine_memory: PathBuf,
    /// Whether the last read found the node cgroup unbounded (logged when it changes).
    node_unbounded: Option<bool>,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Result<Self, ConfigError> {
        let layout = config.resolve()?;
        tracing::info!(
            version = ?layout.version,
            node_memory = %layout.node_memory.display(),
            kubepods = %layout.kubepods_memory.display(),
            image_fs = ?layout.image_fs,
            "sampler: layout resolved"
        );
        if layout.image_fs.is_none() {
            tracing::warn!(
                "sampler: no image filesystem configured or found \
                 (/var/lib/containerd, /var/lib/containers/storage); imagefs.* and \
                 containerfs.* are left out"
            );
        }
        let soft = nofile_soft_limit();
        let budget = config
            .max_open_files
            .min(usize::try_from(soft / 2).unwrap_or(usize::MAX));
        let keep_pods = budget / CgroupFiles::PER_POD;
        let machine_memory = match layout.version {
            CgroupVersion::V1 => config.cgroup_root.join("memory"),
            CgroupVersion::V2 => config.cgroup_root.clone(),
        };
        tracing::debug!(
            nofile_soft = soft,
            keep_pods,
            "sampler: pod files kept open"
        );
        let disk = config.pod_disk_usage.then(|| {
            DiskMeter::start(DiskPaths {
                pods_root: layout.kubelet_root.join("pods"),
                log_root: layout.pod_log_root.clone(),
                budget: config.pod_disk_budget,
                proc_root: config.proc_root.clone(),
                layer_roots: config.writable_layer_roots.clone(),
            })
        });
        Ok(Self {
            config,
            layout,
            reader: Reader::default(),
            files: NodeFiles::default(),
            warn: WarnLimiter::default(),
            pods: PodTable::new(keep_pods),
            disk,
            last_full: None,
            last_node_memory: None,
            last_kubepods_memory: None,
            dedicated_image_fs: None,
            allocatable_missing: false,
            machine_memory,
            node_unbounded: None,
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// The node cgroup's memory from the last pass (for arming memcg thresholds).
    pub fn last_node_memory(&self) -> Option<MemoryReading> {
        self.last_node_memory
    }

    /// The kubepods cgroup's memory from the last pass (for allocatable thresholds).
    pub fn last_kubepods_memory(&self) -> Option<MemoryReading> {
        self.last_kubepods_memory
    }

    /// Whether the image filesystem is a different filesystem from nodefs (the kubelet's
    /// `HasDedicatedImageFs`, which chooses the disk ranking and reclaim functions). `None`
    /// until both were read.
    pub fn has_dedicated_image_fs(&self) -> Option<bool> {
        self.dedicated_image_fs
    }

    /// One pass. See [`Sampler::sample_into`].
    pub fn sample(&mut self, kind: SampleKind) -> Observations {
        let mut out = Observations::default();
        self.sample_into(kind, &mut out);
        out
    }

    /// Runs the pass `wakeup` asks for ([`Trigger::pass`]) and measures it. A fast pass is
    /// promoted to full once [`SamplerConfig::full_sample_interval`] has passed since the last
    /// full one.
    pub fn observe<W: Trigger>(&mut self, wakeup: W) -> TimedObservations<W> {
        let kind = wakeup.pass();
        self.observe_as(wakeup, kind)
    }

    /// Like [`Sampler::observe`] with the pass kind chosen by the caller (e.g.
    /// [`SampleKind::Signals`] to decide first and read pods only when a threshold is met).
    pub fn observe_as<W: Trigger>(&mut self, wakeup: W, kind: SampleKind) -> TimedObservations<W> {
        let at = wakeup.at();
        let started = Instant::now();
        let mut observations = Observations::default();
        let kind = self.sample_into(kind, &mut observations);
        let done = Instant::now();
        TimedObservations {
            wakeup,
            kind,
            observations,
            sampling: done.saturating_duration_since(started),
            since_wakeup: done.saturating_duration_since(at),
        }
    }

    /// One pass into `out`, reusing its maps: keys that stay are updated in place, so a steady
    /// node costs no allocation here. Signals that cannot be read are removed from `out` (and
    /// logged once), never guessed. Returns the kind of pass that ran (a fast pass is promoted
    /// to full when the full-sample interval has passed).
    pub fn sample_into(&mut self, kind: SampleKind, out: &mut Observations) -> SampleKind {
        let now = Instant::now();
        let interval = self.config.full_sample_interval;
        let kind = match kind {
            SampleKind::Fast
                if self
                    .last_full
                    .is_none_or(|t| now.saturating_duration_since(t) >= interval) =>
            {
                SampleKind::Full
            }
            k => k,
        };
        if kind == SampleKind::Full {
            self.last_full = Some(now);
        }

        let mem_total = self.reader.parse_path(
            Some(&mut self.files.meminfo),
            &self.layout.proc.meminfo,
            parse::parse_meminfo_total,
        );
        let mem_total = self.note(W_MEMINFO, now, mem_total);

        // memory.available
        let node = mem_total.and_then(|total| {
            let r = self.read_node_memory(total);
            self.note(W_NODE_MEMORY, now, r)
        });
        self.last_node_memory = node;
        put(
            out,
            Signal::MemoryAvailable,
            node.map(|m| compute::memory_observation(m.capacity, m.working_set)),
        );

        // allocatableMemory.available. Without a capacity (no allocatable configured, kubepods
        // unlimited) the signal does not exist; that is re-checked on full passes only.
        let kubepods = if kind == SampleKind::Fast && self.allocatable_missing {
            None
        } else {
            mem_total.and_then(|_| {
                let r = self.read_kubepods_memory();
                let missing = matches!(r, Err(SamplerError::NoAllocatable { .. }));
                if missing {
                    // A node that does not enforce allocatable on kubepods: a configuration,
                    // not a failure (the kubelet has no such signal there either).
                    if !self.allocatable_missing {
                        tracing::info!(
                            kubepods = %self.layout.kubepods_memory.display(),
                            "sampler: kubepods has no memory limit and no allocatable is \
                             configured; allocatableMemory.available is not observed"
                        );
                    }
                    self.allocatable_missing = true;
                    return None;
                }
                self.allocatable_missing = false;
                self.note(W_ALLOCATABLE, now, r)
            })
        };
        self.last_kubepods_memory = kubepods;
        put(
            out,
            Signal::AllocatableMemoryAvailable,
            kubepods.map(|m| compute::memory_observation(m.capacity, m.working_set)),
        );

        self.sample_filesystems(now, out);

        // pid.available
        let pid = self.read_pids();
        let pid = self.note(W_PID, now, pid);
        put(out, Signal::PidAvailable, pid);

        if kind != SampleKind::Signals {
            self.sample_pods(kind, now, out);
        }
        kind
    }

    /// Records a result: clears or logs (rate-limited) the failure under `key`.
    fn note<T>(&mut self, key: &str, now: Instant, r: Result<T, SamplerError>) -> Option<T> {
        match r {
            Ok(v) => {
                self.warn.ok(key);
                Some(v)
            }
            Err(e) => {
                self.warn.warn(key, now, &e);
                None
            }
        }
    }

    fn read_node_memory(&mut self, mem_total: u64) -> Result<MemoryReading, SamplerError> {
        let l = &self.layout;
        let files = &mut self.files.node;
        let (capacity, unbounded) = if l.node_is_root {
            // The kubelet's capacity for the root: MemTotal (node.status.capacity[memory]).
            (mem_total, false)
        } else {
            let limit = read_limit(&mut self.reader, files, l.version, &l.node_memory)?;
            (
                compute::cgroup_capacity(limit, mem_total),
                !compute::limit_binds(limit, mem_total),
            )
        };
        let (usage, inactive) = if unbounded {
            // Memory outside the node cgroup is not available to its pods: the machine's working
            // set, as the kubelet reads it for the root.
            read_usage(
                &mut self.reader,
                &mut self.files.machine,
                l.version,
                &self.machine_memory,
                true,
            )?
        } else {
            read_usage(
                &mut self.reader,
                files,
                l.version,
                &l.node_memory,
                l.node_is_root,
            )?
        };
        if self.node_unbounded != Some(unbounded) && !l.node_is_root {
            // A limit of none or at least MemTotal leaves the node cgroup's pods the machine's
            // memory, shared with everything outside it.
            tracing::info!(
                node = %l.node_memory.display(),
                limit_binds = !unbounded,
                working_set_of = if unbounded { "machine" } else { "node cgroup" },
                "sampler: memory.available source"
            );
        }
        self.node_unbounded = Some(unbounded);
        Ok(MemoryReading {
            capacity,
            usage,
            inactive_file: inactive,
            working_set: compute::working_set(usage, inactive),
        })
    }

    fn read_kubepods_memory(&mut self) -> Result<MemoryReading, SamplerError> {
        let l = &self.layout;
        let dir = &l.kubepods_memory;
        let files = &mut self.files.kubepods;
        let (usage, inactive) = read_usage(&mut self.reader, files, l.version, dir, false)?;
        // The kubelet's capacity for allocatableMemory.available is the pods cgroup's limit
        // (cadvisor `AvailableBytes = limit − workingSet` for the "pods" system container);
        // a configured allocatable (the Node's status.allocatable) takes precedence.
        let capacity = match self.config.allocatable_memory {
            Some(a) => a,
            None => match read_limit(&mut self.reader, files, l.version, dir)? {
                MemoryLimit::Bytes(b) => b,
                MemoryLimit::Unlimited => {
                    return Err(SamplerError::NoAllocatable { path: dir.clone() });
                }
            },
        };
        Ok(MemoryReading {
            capacity,
            usage,
            inactive_file: inactive,
            working_set: compute::working_set(usage, inactive),
        })
    }

    fn sample_filesystems(&mut self, now: Instant, out: &mut Observations) {
        let nodefs = statvfs(&self.layout.kubelet_root);
        let nodefs = self.note(W_NODEFS, now, nodefs);
        let (bytes, inodes) = split(nodefs.as_ref());
        put(out, Signal::NodeFsAvailable, bytes);
        put(out, Signal::NodeFsInodesFree, inodes);

        // The kubelet always reports imagefs (CRI ImageFsInfo): on a node without a dedicated
        // image filesystem the runtime's directory is on nodefs and the values equal nodefs'.
        let imagefs = match self.layout.image_fs.as_ref() {
            Some((p, _)) => {
                let r = statvfs(p);
                self.note(W_IMAGEFS, now, r)
            }
            None => None,
        };
        let (bytes, inodes) = split(imagefs.as_ref());
        put(out, Signal::ImageFsAvailable, bytes);
        put(out, Signal::ImageFsInodesFree, inodes);
        if let (Some(n), Some(i)) = (nodefs.as_ref(), imagefs.as_ref()) {
            self.dedicated_image_fs = Some(n.device != i.device);
        }

        let containerfs = match (&self.config.container_fs, self.layout.container_fs.as_ref()) {
            // Not split: the kubelet reports the image filesystem as containerfs.
            (None, _) => imagefs,
            (Some(_), Some(p)) => {
                let r = statvfs(p);
                self.note(W_CONTAINERFS, now, r)
            }
            (Some(_), None) => None,
        };
        let (bytes, inodes) = split(containerfs.as_ref());
        put(out, Signal::ContainerFsAvailable, bytes);
        put(out, Signal::ContainerFsInodesFree, inodes);
    }

    fn read_pids(&mut self) -> Result<SignalObservation, SamplerError> {
        // pkg/kubelet/stats/pidlimit: the smaller of pid_max and threads-max; a sysctl that
        // cannot be read is skipped, as the kubelet skips it.
        let paths = &self.layout.proc;
        let pid_max = self
            .reader
            .parse_path(Some(&mut self.files.pid_max), &paths.pid_max, |t| {
                parse::parse_single_u64("pid_max", t)
            });
        let threads_max =
            self.reader
                .parse_path(Some(&mut self.files.threads_max), &paths.threads_max, |t| {
                    parse::parse_single_u64("threads-max", t)
                });
        let (pid_max, threads_max) = match (pid_max, threads_max) {
            (Err(e), Err(_)) => return Err(e),
            (a, b) => (a.ok(), b.ok()),
        };
        // The kubelet falls back to sysinfo(2) when /proc/loadavg cannot be read; sysinfo's
        // 16-bit process count is why it prefers loadavg (kubernetes#107107).
        let loadavg = self.reader.parse_path(
            Some(&mut self.files.loadavg),
            &paths.loadavg,
            parse::parse_loadavg_tasks,
        );
        let tasks = match loadavg {
            Ok(t) => t,
            Err(e) => match nix::sys::sysinfo::sysinfo() {
                Ok(info) => u64::from(info.process_count()),
                Err(_) => return Err(e),
            },
        };
        compute::pid_observation(pid_max, threads_max, tasks).ok_or_else(|| SamplerError::Parse {
            path: paths.pid_max.clone(),
            source: parse::ParseError::Missing { field: "pid_max" },
        })
    }

    /// With `kubepods_cgroup: auto` and nothing to tell the layout at start (the kubelet not yet
    /// up), looks again: the first kubepods cgroup or kubelet configuration decides it.
    fn redetect_kubepods(&mut self) {
        if self.layout.kubepods_detection != KubepodsDetection::Pending {
            return;
        }
        let Ok(layout) = self.config.resolve() else {
            return;
        };
        if layout.kubepods_detection != KubepodsDetection::Pending {
            tracing::info!(
                kubepods = %layout.kubepods_memory.display(),
                detection = ?layout.kubepods_detection,
                "sampler: kubepods layout detected"
            );
            self.pods = PodTable::new(self.pods.keep_limit());
            self.layout = layout;
        }
    }

    /// Re-lists the pod cgroups (cheap: a few directory reads) and says whether the pod with
    /// this UID has one. For the agent's check that it sees the pods the API lists.
    pub fn refresh_pod_cgroups(&mut self) -> Result<(), SamplerError> {
        self.redetect_kubepods();
        self.pods.refresh(&self.layout)
    }

    /// Whether the last relist found a cgroup for this pod UID.
    pub fn has_pod_cgroup(&self, uid: &str) -> bool {
        self.pods.contains_uid(uid)
    }

    fn sample_pods(&mut self, kind: SampleKind, now: Instant, out: &mut Observations) {
        self.redetect_kubepods();
        let refreshed = self.pods.refresh(&self.layout);
        if self.note(W_KUBEPODS, now, refreshed).is_none() {
            out.pods.clear();
            return;
        }
        if let Some(meter) = &self.disk {
            if kind == SampleKind::Full {
                meter.request(
                    self.pods
                        .iter()
                        .map(|p| (p.uid.as_str(), p.memory_dir.as_path())),
                );
            }
            self.take_pod_disk(now);
        }
        out.pods.retain(|uid, _| self.pods.contains_uid(uid));
        let version = self.layout.version;
        let mut memory_err = None;
        let mut process_err = None;
        let mut gone = Vec::new();
        for pod in self.pods.iter_mut() {
            let memory = match pod_memory(&mut self.reader, version, pod) {
                Ok(m) => Some(m),
                Err(e) if is_gone(&e) => {
                    gone.push(pod.uid.clone());
                    continue;
                }
                Err(e) => {
                    memory_err.get_or_insert(e);
                    None
                }
            };
            let processes = match pod_processes(&mut self.reader, version, pod) {
                Ok(p) => Some(p),
                Err(e) => {
                    if !is_gone(&e) {
                        process_err.get_or_insert(e);
                    }
                    None
                }
            };
            let usage = PodUsage {
                memory,
                disk: pod.disk,
                processes,
            };
            match out.pods.get_mut(pod.uid.as_str()) {
                Some(u) => *u = usage,
                None => {
                    out.pods.insert(pod.uid.clone(), usage);
                }
            }
        }
        for uid in &gone {
            out.pods.remove(uid);
        }
        for (key, err) in [(W_POD_MEMORY, memory_err), (W_POD_PROCESSES, process_err)] {
            match err {
                Some(e) => self.warn.warn(key, now, &e),
                None => self.warn.ok(key),
            }
        }
    }

    /// Copies the disk meter's last figures into the pod table, and reports its outcome once.
    fn take_pod_disk(&mut self, now: Instant) {
        let Some(meter) = &self.disk else { return };
        let pods = &mut self.pods;
        meter.latest(|usage| {
            for pod in pods.iter_mut() {
                pod.disk = usage.get(pod.uid.as_str()).copied();
            }
        });
        let Some((truncated, error)) = meter.take_outcome() else {
            return;
        };
        let budget = self.config.pod_disk_budget;
        let error = error.or_else(|| {
            (!truncated.is_empty()).then_some(SamplerError::DiskBudget {
                uids: truncated,
                budget,
            })
        });
        match error {
            Some(e) => self.warn.warn(W_POD_DISK, now, &e),
            None => self.warn.ok(W_POD_DISK),
        }
    }

    /// Measures per-pod disk usage now, on the caller's thread (tools and tests that need the
    /// figures of this instant rather than the meter's last).
    pub fn measure_pod_disk_now(&mut self) {
        if let Some(meter) = &self.disk {
            meter.measure_now(
                self.pods
                    .iter()
                    .map(|p| (p.uid.as_str(), p.memory_dir.as_path())),
            );
        }
    }

    /// The number of pod cgroups found by the last pass.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }
}

/// Usage and inactive_file of a memory cgroup.
fn read_usage(
    reader: &mut Reader,
    files: &mut CgroupFiles,
    version: CgroupVersion,
    dir: &Path,
    is_root: bool,
) -> Result<(u64, u64), SamplerError> {
    match version {
        CgroupVersion::V1 => {
            let usage =
                reader.parse(Some(&mut files.usage), dir, "memory.usage_in_bytes", |t| {
                    parse::parse_single_u64("memory.usage_in_bytes", t)
                })?;
            let stat = reader.parse(
                Some(&mut files.stat),
                dir,
                "memory.stat",
                parse::parse_memory_stat,
            )?;
            let inactive = stat
                .total_inactive_file
                .ok_or_else(|| missing(reader, "total_inactive_file"))?;
            Ok((usage, inactive))
        }
        CgroupVersion::V2 => {
            let stat = reader.parse(
                Some(&mut files.stat),
                dir,
                "memory.stat",
                parse::parse_memory_stat,
            )?;
            let inactive = stat
                .inactive_file
                .ok_or_else(|| missing(reader, "inactive_file"))?;
            let usage = if is_root {
                // The v2 root has no memory.current; runc (fs2 `rootStatsFromMeminfo`, used by
                // cadvisor) and the kubelet's v2 script take anon + file from memory.stat.
                let anon = stat.anon.ok_or_else(|| missing(reader, "anon"))?;
                let file = stat.file.ok_or_else(|| missing(reader, "file"))?;
                anon.saturating_add(file)
            } else {
                reader.parse(Some(&mut files.usage), dir, "memory.current", |t| {
                    parse::parse_single_u64("memory.current", t)
                })?
            };
            Ok((usage, inactive))
        }
    }
}

fn read_limit(
    reader: &mut Reader,
    files: &mut CgroupFiles,
    version: CgroupVersion,
    dir: &Path,
) -> Result<MemoryLimit, SamplerError> {
    let file = match version {
        CgroupVersion::V1 => "memory.limit_in_bytes",
        CgroupVersion::V2 => "memory.max",
    };
    reader.parse(Some(&mut files.limit), dir, file, |t| {
        parse::parse_memory_limit(file, t)
    })
}

/// A missing memory.stat field, naming the file that was read last.
fn missing(reader: &Reader, field: &'static str) -> SamplerError {
    SamplerError::Parse {
        path: reader.last_path().to_path_buf(),
        source: parse::ParseError::Missing { field },
    }
}

/// Node-level files, kept open between passes.
#[derive(Debug, Default)]
struct NodeFiles {
    meminfo: Option<File>,
    loadavg: Option<File>,
    pid_max: Option<File>,
    threads_max: Option<File>,
    node: CgroupFiles,
    kubepods: CgroupFiles,
    /// The hierarchy root, for a node cgroup whose limit does not bind.
    machine: CgroupFiles,
}

fn nofile_soft_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit};
    getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft)
}

/// Raises the process's open-file soft limit to its hard limit (as the Go runtime does at
/// start), so the sampler can keep every pod's cgroup files open. Call it once at start, before
/// [`Sampler::new`]; returns the new soft limit.
pub fn raise_nofile_limit() -> Result<u64, nix::Error> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

fn put(out: &mut Observations, signal: Signal, obs: Option<SignalObservation>) {
    match obs {
        Some(o) => {
            out.signals.insert(signal, o);
        }
        None => {
            out.signals.remove(&signal);
        }
    }
}

fn split(s: Option<&FsStat>) -> (Option<SignalObservation>, Option<SignalObservation>) {
    match s {
        Some(s) => {
            let (b, i) = compute::fs_observations(s);
            (Some(b), i)
        }
        None => (None, None),
    }
}

/// statvfs(2) plus the path's device, for the dedicated-imagefs test.
pub(crate) fn statvfs(path: &Path) -> Result<FsStat, SamplerError> {
    use std::os::unix::fs::MetadataExt as _;
    let st = nix::sys::statvfs::statvfs(path).map_err(|source| SamplerError::Statvfs {
        path: path.to_path_buf(),
        source,
    })?;
    let device = std::fs::metadata(path)
        .map_err(|source| SamplerError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .dev();
    Ok(FsStat {
        frsize: st.fragment_size(),
        blocks: st.blocks(),
        blocks_available: st.blocks_available(),
        files: st.files(),
        files_free: st.files_free(),
        device,
    })
}

/// A pod cgroup's working set (cadvisor: usage − total_inactive_file on v1, memory.current −
/// inactive_file on v2).
fn pod_memory(
    reader: &mut Reader,
    version: CgroupVersion,
    pod: &mut pods::PodEntry,
) -> Result<u64, SamplerError> {
    let (usage_file, inactive_key) = match version {
        CgroupVersion::V1 => ("memory.usage_in_bytes", "total_inactive_file"),
        CgroupVersion::V2 => ("memory.current", "inactive_file"),
    };
    let keep = pod.keep_files;
    let dir = &pod.memory_dir;
    let files = &mut pod.files;
    let usage = reader.parse(slot(keep, &mut files.usage), dir, usage_file, |t| {
        parse::parse_single_u64(usage_file, t)
    })?;
    let stat = reader.parse(
        slot(keep, &mut files.stat),
        dir,
        "memory.stat",
        parse::parse_memory_stat,
    )?;
    let inactive = match version {
        CgroupVersion::V1 => stat.total_inactive_file,
        CgroupVersion::V2 => stat.inactive_file,
    }
    .ok_or_else(|| SamplerError::Parse {
        path: reader.last_path().to_path_buf(),
        source: parse::ParseError::Missing {
            field: inactive_key,
        },
    })?;
    Ok(compute::working_set(usage, inactive))
}

/// Tasks in a pod: `pids.current` (v1 pids hierarchy or v2), which counts every thread of the
/// subtree; without the pids controller, the same count from `tasks` (v1) or `cgroup.threads`
/// (v2) summed over the pod's cgroups.
fn pod_processes(
    reader: &mut Reader,
    version: CgroupVersion,
    pod: &mut pods::PodEntry,
) -> Result<u64, SamplerError> {
    if let Some(dir) = &pod.pids_dir {
        let s = slot(pod.keep_files, &mut pod.files.pids);
        match reader.parse(s, dir, "pids.current", |t| {
            parse::parse_single_u64("pids.current", t)
        }) {
            Ok(n) => return Ok(n),
            Err(e) if !is_gone(&e) => return Err(e),
            // No pids controller here (v2 without it enabled, v1 without the hierarchy):
            // count the tasks instead.
            Err(_) => {}
        }
    }
    let file = match version {
        CgroupVersion::V1 => "tasks",
        CgroupVersion::V2 => "cgroup.threads",
    };
    count_tasks(reader, &pod.memory_dir, file, 0)
}

fn slot(keep: bool, s: &mut Option<File>) -> Slot<'_> {
    keep.then_some(s)
}

/// Pods nest at most pod → container (→ sandbox on some runtimes); deeper trees are not the
/// kubelet's layout and are not walked.
const MAX_TASK_DEPTH: u32 = 3;

fn count_tasks(
    reader: &mut Reader,
    dir: &Path,
    file: &'static str,
    depth: u32,
) -> Result<u64, SamplerError> {
    let mut n = reader.parse(None, dir, file, |t| parse::count_ids(file, t))?;
    if depth >= MAX_TASK_DEPTH {
        return Ok(n);
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(n);
    };
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            match count_tasks(reader, &e.path(), file, depth + 1) {
                Ok(c) => n += c,
                Err(e) if is_gone(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
