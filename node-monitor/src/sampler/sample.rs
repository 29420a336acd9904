//! The sampler: reads cgroupfs, statvfs and procfs and turns them into [`Observations`].

use std::{
    fs::File,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::Serialize;

use node_monitor_core::signals::{
    FsLayout, MemoryWorkingSet, Observations, PodUsage, Signal, SignalObservation,
};

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

mod node_signals;
mod pod_usage;

use self::node_signals::*;

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
    /// The active file pages the kernel can drop
    /// ([`node_monitor_core::signals::reclaimable_active_file`]) when the working set leaves
    /// them out (`memoryWorkingSet: reclaimable`); 0 with the kubelet's formula.
    pub reclaimable_active_file: u64,
    /// `usage − inactive_file − reclaimable_active_file`, clamped at 0
    /// ([`node_monitor_core::signals::memory_working_set`]).
    pub working_set: u64,
}

impl MemoryReading {
    /// What the cgroup can still allocate before its limit: `capacity − usage`, plus the page
    /// cache its working set leaves out (the kernel reclaims that first).
    pub fn headroom(&self) -> i64 {
        let free = i128::from(self.capacity) - i128::from(self.usage)
            + i128::from(self.file_outside_working_set());
        i64::try_from(free).unwrap_or(if free > 0 { i64::MAX } else { i64::MIN })
    }

    /// The page cache the working set leaves out: where a memcg threshold sits above
    /// `capacity − threshold` on `memory.usage_in_bytes`.
    pub fn file_outside_working_set(&self) -> u64 {
        self.inactive_file
            .saturating_add(self.reclaimable_active_file)
    }
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
    /// When the disk meter was last asked for a measurement outside a full pass.
    last_disk_request: Option<Instant>,
    last_node_memory: Option<MemoryReading>,
    last_kubepods_memory: Option<MemoryReading>,
    fs_layout: Option<FsLayout>,
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
                layer_roots: config.layer_roots(),
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
            last_disk_request: None,
            last_node_memory: None,
            last_kubepods_memory: None,
            fs_layout: None,
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
        self.fs_layout.map(|l| l.dedicated_image_fs)
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

        let meminfo = self.reader.parse_path(
            Some(&mut self.files.meminfo),
            &self.layout.proc.meminfo,
            parse::parse_meminfo,
        );
        let meminfo = self.note(W_MEMINFO, now, meminfo);
        let mem_total = meminfo.map(|(total, _)| total);

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
        // The predictor's input: the node cgroup's own headroom counts where its limit binds.
        let node_binds = !self.layout.node_is_root && self.node_unbounded == Some(false);
        out.kernel_headroom = compute::kernel_headroom(
            meminfo.and_then(|(_, available)| available),
            node.filter(|_| node_binds).map(|m| m.headroom()),
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
            self.sample_pods(kind, now, out, &mut || false);
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

#[cfg(test)]
mod tests;
