//! Wake-up sources merged into one queue. The sampler runs when one of them fires, not on a
//! timer: eBPF events, cgroup v1 memcg threshold and OOM eventfds, cgroup v2 `memory.events`
//! changes, PSI triggers; a housekeeping tick (10 s, like the kubelet's) is the fallback and
//! the cadence of the expensive reads.
//!
//! Every source is optional. One that cannot be armed (missing file, no permission, a v2 file on
//! a v1 host) is logged and reported by [`Wakeups::source_states`]; the others keep working.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use serde::Serialize;
use tokio::{io::Interest, runtime::Handle, sync::mpsc, task::JoinHandle};

use super::{
    compute,
    config::{CgroupVersion, Layout},
    notify::{self, Sink},
    parse::MemoryEvents,
};

/// What the eBPF adapter saw (the kinds of its kernel events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelWakeKind {
    OomKill,
    ReclaimStall,
    KswapdWake,
    Reboot,
}

impl KernelWakeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OomKill => "oom_kill",
            Self::ReclaimStall => "reclaim_stall",
            Self::KswapdWake => "kswapd_wake",
            Self::Reboot => "reboot",
        }
    }
}

/// Which memory cgroup a memcg threshold watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemcgTarget {
    /// The node cgroup (`memory.available`).
    Node,
    /// The kubepods cgroup (`allocatableMemory.available`).
    Allocatable,
}

/// What woke the sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WakeSource {
    Kernel(KernelWakeKind),
    /// A cgroup v1 memory threshold was crossed (either way) at `usage_bytes`.
    MemcgThreshold {
        target: MemcgTarget,
        usage_bytes: u64,
    },
    /// The node cgroup hit its memory limit and went OOM (cgroup v1 `memory.oom_control`).
    MemcgOom,
    /// cgroup v2 `memory.events` changed; the counter increases since the previous change.
    MemoryEvents(MemoryEvents),
    /// A PSI memory trigger fired.
    Psi,
    Housekeeping,
}

impl WakeSource {
    pub fn kind(&self) -> SourceKind {
        match self {
            Self::Kernel(_) => SourceKind::Kernel,
            Self::MemcgThreshold { .. } => SourceKind::MemcgThreshold,
            Self::MemcgOom => SourceKind::MemcgOom,
            Self::MemoryEvents(_) => SourceKind::MemoryEvents,
            Self::Psi => SourceKind::Psi,
            Self::Housekeeping => SourceKind::Housekeeping,
        }
    }

    /// A metric label: the source kind, with the kernel event kind for eBPF wake-ups
    /// (`kernel_oom_kill`, `memcg_threshold`, `psi`, …).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Kernel(KernelWakeKind::OomKill) => "kernel_oom_kill",
            Self::Kernel(KernelWakeKind::ReclaimStall) => "kernel_reclaim_stall",
            Self::Kernel(KernelWakeKind::KswapdWake) => "kernel_kswapd_wake",
            Self::Kernel(KernelWakeKind::Reboot) => "kernel_reboot",
            other => other.kind().as_str(),
        }
    }
}

/// One wake-up: its source and when it was delivered (monotonic clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wakeup {
    pub source: WakeSource,
    pub at: Instant,
}

/// The kinds of wake-up source, for [`Wakeups::source_states`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Kernel,
    MemcgThreshold,
    MemcgOom,
    MemoryEvents,
    Psi,
    Housekeeping,
}

impl SourceKind {
    pub const ALL: [SourceKind; 6] = [
        Self::Kernel,
        Self::MemcgThreshold,
        Self::MemcgOom,
        Self::MemoryEvents,
        Self::Psi,
        Self::Housekeeping,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::MemcgThreshold => "memcg_threshold",
            Self::MemcgOom => "memcg_oom",
            Self::MemoryEvents => "memory_events",
            Self::Psi => "psi",
            Self::Housekeeping => "housekeeping",
        }
    }
}

/// Whether a source is working.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SourceState {
    /// Armed and delivering; `detail` says what is watched.
    Armed { detail: String },
    /// Not working (cannot be armed here, or stopped); `reason` says why.
    Unavailable { reason: String },
    /// Turned off by configuration.
    Disabled,
}

impl SourceState {
    pub fn is_armed(&self) -> bool {
        matches!(self, Self::Armed { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    pub source: SourceKind,
    #[serde(flatten)]
    pub state: SourceState,
}

/// Where a file-backed source reads from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSetting {
    Path(PathBuf),
    /// This host cannot have the source; the reason is reported as the source's state.
    NotApplicable(String),
    Disabled,
}

/// PSI stall kind: `some` (at least one task stalled) or `full` (all non-idle tasks stalled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PsiKind {
    Some,
    Full,
}

/// A PSI trigger: fire when tasks stalled on memory for `stall` within a `window`
/// (<https://docs.kernel.org/accounting/psi.html#monitoring-for-pressure-thresholds>).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PsiTrigger {
    pub kind: PsiKind,
    pub stall: Duration,
    /// At most 10 s (kernels before 6.4 also want at least 500 ms). Without CAP_SYS_RESOURCE
    /// the kernel accepts only multiples of 2 s; another window falls back to 2 s with a
    /// warning.
    pub window: Duration,
}

impl Default for PsiTrigger {
    /// The kernel documentation's example: 150 ms of partial stall within 1 s.
    fn default() -> Self {
        Self {
            kind: PsiKind::Some,
            stall: Duration::from_millis(150),
            window: Duration::from_secs(1),
        }
    }
}

/// What to arm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeupConfig {
    /// Housekeeping tick; the kubelet's default housekeeping interval is 10 s.
    pub housekeeping: Duration,
    /// Pending wake-ups at most; beyond it wake-ups are coalesced (counted, not queued).
    pub queue: usize,
    /// cgroup v1 node memory cgroup: thresholds for `memory.available`, `memory.oom_control`.
    pub memcg_node: SourceSetting,
    /// cgroup v1 kubepods memory cgroup: thresholds for `allocatableMemory.available`.
    pub memcg_kubepods: SourceSetting,
    /// Watch `memory.oom_control` of the node cgroup (cgroup v1).
    pub oom_control: bool,
    /// cgroup v2 `memory.events` to watch.
    pub memory_events: SourceSetting,
    /// PSI file for the trigger.
    pub psi: SourceSetting,
    pub psi_trigger: PsiTrigger,
    /// Threshold moves smaller than this do not re-arm a memcg threshold (the kernel checks
    /// thresholds every 128 page events per CPU, so finer placement is noise).
    pub rearm_tolerance: u64,
}

/// The largest PSI window the kernel accepts (`WINDOW_MAX_US`, kernel/sched/psi.c).
const PSI_WINDOW_MAX: Duration = Duration::from_secs(10);

impl WakeupConfig {
    /// Sources for the sampler's layout:
    /// - cgroup v1: memcg thresholds and `memory.oom_control` on the node (and kubepods)
    ///   cgroups; `memory.events` does not exist;
    /// - cgroup v2: `memory.events` of the node cgroup (of kubepods when the node is the root,
    ///   which has none; it counts every pod's events); memcg thresholds do not exist;
    /// - PSI: the node cgroup's `memory.pressure` on a cgroup2 hierarchy (on a v1 host, the
    ///   hybrid `unified` mount when present). For the root, the root cgroup's own
    ///   `memory.pressure` (the system-wide PSI group, the same figures as
    ///   `/proc/pressure/memory`) when it exists, since a DaemonSet mounts the host's /proc
    ///   read-only and /sys/fs/cgroup read-write, and a trigger is armed by writing; else
    ///   `/proc/pressure/memory`.
    pub fn for_layout(layout: &Layout) -> Self {
        let (memcg_node, memcg_kubepods, memory_events) = match layout.version {
            CgroupVersion::V1 => (
                SourceSetting::Path(layout.node_memory.clone()),
                SourceSetting::Path(layout.kubepods_memory.clone()),
                SourceSetting::NotApplicable(
                    "the memory controller is on cgroup v1; memory.events is a cgroup v2 file"
                        .into(),
                ),
            ),
            CgroupVersion::V2 => {
                let not_v2 = || {
                    SourceSetting::NotApplicable(
                        "cgroup v2 has no memory thresholds (the kubelet disables its memcg \
                         notifier on v2 too); memory.events and PSI cover it"
                            .into(),
                    )
                };
                let events_dir = if layout.node_is_root {
                    &layout.kubepods_memory
                } else {
                    &layout.node_memory
                };
                (
                    not_v2(),
                    not_v2(),
                    SourceSetting::Path(events_dir.join("memory.events")),
                )
            }
        };
        let psi = match (&layout.node_unified, layout.node_is_root) {
            (Some(dir), false) => SourceSetting::Path(dir.join("memory.pressure")),
            (Some(dir), true) if dir.join("memory.pressure").is_file() => {
                SourceSetting::Path(dir.join("memory.pressure"))
            }
            _ => SourceSetting::Path(layout.proc.pressure_memory.clone()),
        };
        Self {
            housekeeping: Duration::from_secs(10),
            queue: 64,
            memcg_node,
            memcg_kubepods,
            oom_control: true,
            memory_events,
            psi,
            psi_trigger: PsiTrigger::default(),
            rearm_tolerance: 1 << 20,
        }
    }

    fn validate(&self) -> Result<(), WakeupError> {
        if self.housekeeping.is_zero() {
            return Err(WakeupError::Config {
                field: "housekeeping",
                value: format!("{:?}", self.housekeeping),
                expected: "a positive duration",
            });
        }
        if self.queue == 0 {
            return Err(WakeupError::Config {
                field: "queue",
                value: "0".into(),
                expected: "at least 1",
            });
        }
        let t = &self.psi_trigger;
        if t.window.is_zero() || t.window > PSI_WINDOW_MAX {
            return Err(WakeupError::Config {
                field: "psi_trigger.window",
                value: format!("{:?}", t.window),
                expected: "a positive duration of at most 10s",
            });
        }
        if t.stall.is_zero() || t.stall > t.window {
            return Err(WakeupError::Config {
                field: "psi_trigger.stall",
                value: format!("{:?}", t.stall),
                expected: "positive and at most the window",
            });
        }
        Ok(())
    }
}

/// Why [`Wakeups::start`] refused to start. Sources that cannot be armed are not errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WakeupError {
    #[error("wake-up sources need a tokio runtime (call Wakeups::start inside one)")]
    NoRuntime,
    #[error("wake-up config {field} is {value}, expected {expected}")]
    Config {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// Where the eBPF adapter sends its wake-ups. Cheap to clone; never blocks.
#[derive(Debug, Clone)]
pub struct KernelSender {
    sink: Sink,
}

impl KernelSender {
    /// Wakes the sampler for a kernel event. Never waits: with a wake-up already pending this
    /// one is coalesced. Returns false once the [`Wakeups`] is gone.
    pub fn wake(&self, kind: KernelWakeKind) -> bool {
        self.sink.deliver(WakeSource::Kernel(kind))
    }
}

/// An armed memcg threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ArmedThreshold {
    pub target: MemcgTarget,
    /// The eviction threshold on `available`, in bytes.
    pub available_threshold: u64,
    /// Where it sits on `memory.usage_in_bytes`.
    pub usage_bytes: u64,
    #[serde(skip)]
    pub armed_at: Instant,
}

#[derive(Debug)]
struct ArmedTask {
    view: ArmedThreshold,
    task: JoinHandle<()>,
}

/// The merged wake-up queue and its sources. Dropping it disarms everything.
#[derive(Debug)]
pub struct Wakeups {
    config: WakeupConfig,
    handle: Handle,
    sink: Sink,
    rx: mpsc::Receiver<Wakeup>,
    tasks: Vec<JoinHandle<()>>,
    armed: Vec<ArmedTask>,
    /// Why the last arming of a target failed, by target.
    arm_errors: BTreeMap<MemcgTarget, String>,
    psi_window: Option<Duration>,
}

impl Wakeups {
    /// Arms every configured source it can and starts the housekeeping tick. Must run inside a
    /// tokio runtime. Fails only on an invalid configuration or without a runtime; sources that
    /// cannot be armed are logged and reported by [`Wakeups::source_states`].
    pub fn start(config: WakeupConfig) -> Result<Self, WakeupError> {
        config.validate()?;
        let handle = Handle::try_current().map_err(|_| WakeupError::NoRuntime)?;
        let (tx, rx) = mpsc::channel(config.queue);
        let sink = Sink {
            tx,
            coalesced: Arc::new(AtomicU64::new(0)),
            states: Arc::new(Mutex::new(BTreeMap::new())),
        };
        let mut this = Self {
            config,
            handle,
            sink,
            rx,
            tasks: Vec::new(),
            armed: Vec::new(),
            arm_errors: BTreeMap::new(),
            psi_window: None,
        };
        this.sink.set_state(
            SourceKind::Kernel,
            SourceState::Unavailable {
                reason: "no eBPF adapter connected".into(),
            },
        );
        this.start_housekeeping();
        this.start_oom_control();
        this.start_memory_events();
        this.start_psi();
        let threshold_state = match (&this.config.memcg_node, &this.config.memcg_kubepods) {
            (SourceSetting::NotApplicable(r), _) => SourceState::Unavailable { reason: r.clone() },
            (SourceSetting::Disabled, SourceSetting::Disabled) => SourceState::Disabled,
            _ => SourceState::Unavailable {
                reason: "no memory thresholds armed yet".into(),
            },
        };
        this.sink
            .set_state(SourceKind::MemcgThreshold, threshold_state);
        Ok(this)
    }

    /// The next wake-up. `None` never happens while `self` lives (it holds a sender); the
    /// `Option` is the channel's.
    pub async fn next(&mut self) -> Option<Wakeup> {
        self.rx.recv().await
    }

    /// A pending wake-up, without waiting (to drain the queue after a pass).
    pub fn try_next(&mut self) -> Option<Wakeup> {
        self.rx.try_recv().ok()
    }

    /// For the eBPF adapter: a sender for kernel wake-ups. Marks the kernel source armed.
    pub fn kernel_sender(&self) -> KernelSender {
        self.sink.set_state(
            SourceKind::Kernel,
            SourceState::Armed {
                detail: "eBPF adapter connected".into(),
            },
        );
        KernelSender {
            sink: self.sink.clone(),
        }
    }

    /// Wake-ups dropped because one was already pending.
    pub fn coalesced(&self) -> u64 {
        self.sink.coalesced.load(Ordering::Relaxed)
    }

    /// Every source kind with its state, in [`SourceKind::ALL`] order.
    pub fn source_states(&self) -> Vec<SourceStatus> {
        let states = match self.sink.states.lock() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        SourceKind::ALL
            .iter()
            .map(|k| SourceStatus {
                source: *k,
                state: states.get(k).cloned().unwrap_or(SourceState::Disabled),
            })
            .collect()
    }

    /// The PSI window the kernel accepted (the configured one, or 2 s without
    /// CAP_SYS_RESOURCE); `None` when the PSI source is not armed.
    pub fn psi_effective_window(&self) -> Option<Duration> {
        self.psi_window
    }

    /// The memcg thresholds currently armed.
    pub fn armed_thresholds(&self) -> Vec<ArmedThreshold> {
        self.armed.iter().map(|a| a.view).collect()
    }

    /// Arms cgroup v1 memory thresholds on the node cgroup for `memory.available` eviction
    /// thresholds (in bytes), like the kubelet's memoryThresholdNotifier: each at
    /// `capacity − threshold + inactive_file` on `memory.usage_in_bytes`, so the kernel
    /// notifies when the working set reaches `capacity − threshold`. Call it after every pass
    /// with the fresh `inactive_file` (the kubelet re-arms on each synchronize): thresholds
    /// that moved by more than the re-arm tolerance are re-registered, the others are kept.
    pub fn arm_memory_thresholds(
        &mut self,
        available_thresholds_bytes: &[u64],
        capacity: u64,
        inactive_file: u64,
    ) {
        self.arm(
            MemcgTarget::Node,
            available_thresholds_bytes,
            capacity,
            inactive_file,
        );
    }

    /// Like [`Wakeups::arm_memory_thresholds`], on the kubepods cgroup for
    /// `allocatableMemory.available` (capacity = allocatable).
    pub fn arm_allocatable_thresholds(
        &mut self,
        available_thresholds_bytes: &[u64],
        capacity: u64,
        inactive_file: u64,
    ) {
        self.arm(
            MemcgTarget::Allocatable,
            available_thresholds_bytes,
            capacity,
            inactive_file,
        );
    }

    fn arm(&mut self, target: MemcgTarget, thresholds: &[u64], capacity: u64, inactive: u64) {
        let setting = match target {
            MemcgTarget::Node => &self.config.memcg_node,
            MemcgTarget::Allocatable => &self.config.memcg_kubepods,
        };
        let SourceSetting::Path(dir) = setting else {
            return;
        };
        let tolerance = self.config.rearm_tolerance;
        let level = |t: u64| compute::memcg_usage_threshold(capacity, t, inactive);
        // The common case on every pass: nothing moved. Checked without allocating.
        let mine = || self.armed.iter().filter(|a| a.view.target == target);
        let unchanged = !self.arm_errors.contains_key(&target)
            && thresholds.iter().all(|&t| {
                mine().any(|a| {
                    a.view.available_threshold == t
                        && a.view.usage_bytes.abs_diff(level(t)) <= tolerance
                })
            })
            && mine().all(|a| thresholds.contains(&a.view.available_threshold));
        if unchanged {
            return;
        }

        let dir = dir.clone();
        let _enter = self.handle.enter();
        let mut keep: Vec<ArmedTask> = Vec::new();
        let mut error = None;
        let (mine, others): (Vec<ArmedTask>, Vec<ArmedTask>) = std::mem::take(&mut self.armed)
            .into_iter()
            .partition(|a| a.view.target == target);
        let mut mine: Vec<Option<ArmedTask>> = mine.into_iter().map(Some).collect();
        let mut wanted: Vec<u64> = thresholds.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        for t in wanted {
            let level = level(t);
            let existing = mine
                .iter_mut()
                .find(|a| a.as_ref().is_some_and(|a| a.view.available_threshold == t))
                .and_then(Option::take);
            match existing {
                Some(a) if a.view.usage_bytes.abs_diff(level) <= tolerance => keep.push(a),
                old => match self.arm_one(&dir, target, t, level) {
                    Ok(new) => {
                        if let Some(old) = old {
                            old.task.abort();
                        }
                        keep.push(new);
                    }
                    Err(e) => {
                        // Keep the old registration (if any): a stale level still wakes.
                        if let Some(old) = old {
                            keep.push(old);
                        }
                        error.get_or_insert(e);
                    }
                },
            }
        }
        for a in mine.into_iter().flatten() {
            a.task.abort();
        }
        self.armed = others;
        self.armed.extend(keep);
        match error {
            Some(e) => {
                let reason = super::warn::ErrorChain(&e).to_string();
                // Logged when it starts failing or fails differently, not on every pass.
                if self.arm_errors.get(&target) != Some(&reason) {
                    tracing::warn!(target_cgroup = ?target, %reason, "memcg threshold not armed");
                }
                self.arm_errors.insert(target, reason);
            }
            None => {
                if self.arm_errors.remove(&target).is_some() {
                    tracing::info!(target_cgroup = ?target, "memcg thresholds armed again");
                }
            }
        }
        self.sink
            .set_state(SourceKind::MemcgThreshold, self.threshold_state());
    }

    /// The memcg threshold source's state: armed when any threshold is, with the failures of
    /// the other target (if any) in the detail.
    fn threshold_state(&self) -> SourceState {
        let errors = self
            .arm_errors
            .iter()
            .map(|(t, r)| format!("{t:?}: {r}"))
            .collect::<Vec<_>>()
            .join("; ");
        if self.armed.is_empty() {
            return SourceState::Unavailable {
                reason: if errors.is_empty() {
                    "no memory thresholds armed".into()
                } else {
                    errors
                },
            };
        }
        let mut detail = self
            .armed
            .iter()
            .map(|a| {
                format!(
                    "{:?}: usage {} (available < {})",
                    a.view.target, a.view.usage_bytes, a.view.available_threshold
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        if !errors.is_empty() {
            detail.push_str("; not armed: ");
            detail.push_str(&errors);
        }
        SourceState::Armed { detail }
    }

    fn arm_one(
        &self,
        dir: &Path,
        target: MemcgTarget,
        available_threshold: u64,
        usage_bytes: u64,
    ) -> Result<ArmedTask, notify::ArmError> {
        let efd = notify::memcg_eventfd(dir, "memory.usage_in_bytes", Some(usage_bytes))?;
        let fd = notify::async_fd(efd, Interest::READABLE)?;
        let source = WakeSource::MemcgThreshold {
            target,
            usage_bytes,
        };
        let task = tokio::spawn(notify::eventfd_task(fd, source, self.sink.clone()));
        tracing::debug!(
            ?target,
            usage_bytes,
            available_threshold,
            "memcg threshold armed"
        );
        Ok(ArmedTask {
            view: ArmedThreshold {
                target,
                available_threshold,
                usage_bytes,
                armed_at: Instant::now(),
            },
            task,
        })
    }

    fn start_housekeeping(&mut self) {
        let period = self.config.housekeeping;
        let sink = self.sink.clone();
        self.tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if !sink.deliver(WakeSource::Housekeeping) {
                    return;
                }
            }
        }));
        self.sink.set_state(
            SourceKind::Housekeeping,
            SourceState::Armed {
                detail: format!("every {period:?}"),
            },
        );
    }

    fn start_oom_control(&mut self) {
        let state = match (&self.config.memcg_node, self.config.oom_control) {
            (_, false) | (SourceSetting::Disabled, _) => SourceState::Disabled,
            (SourceSetting::NotApplicable(r), _) => SourceState::Unavailable { reason: r.clone() },
            (SourceSetting::Path(dir), true) => {
                let armed = notify::memcg_eventfd(dir, "memory.oom_control", None)
                    .and_then(|efd| notify::async_fd(efd, Interest::READABLE));
                match armed {
                    Ok(fd) => {
                        self.tasks.push(tokio::spawn(notify::eventfd_task(
                            fd,
                            WakeSource::MemcgOom,
                            self.sink.clone(),
                        )));
                        SourceState::Armed {
                            detail: format!("{}/memory.oom_control", dir.display()),
                        }
                    }
                    Err(e) => unavailable(SourceKind::MemcgOom, &e),
                }
            }
        };
        self.sink.set_state(SourceKind::MemcgOom, state);
    }

    fn start_memory_events(&mut self) {
        let state = match &self.config.memory_events {
            SourceSetting::Disabled => SourceState::Disabled,
            SourceSetting::NotApplicable(r) => SourceState::Unavailable { reason: r.clone() },
            SourceSetting::Path(path) => {
                let armed = notify::watch_modify(path)
                    .and_then(|ino| notify::async_fd(ino, Interest::READABLE));
                match armed {
                    Ok(fd) => {
                        // The baseline is read after the watch exists, so no change between
                        // the two is missed.
                        let baseline = notify::read_memory_events(path).unwrap_or_default();
                        self.tasks.push(tokio::spawn(notify::memory_events_task(
                            fd,
                            path.clone(),
                            baseline,
                            self.sink.clone(),
                        )));
                        SourceState::Armed {
                            detail: format!("inotify on {}", path.display()),
                        }
                    }
                    Err(e) => unavailable(SourceKind::MemoryEvents, &e),
                }
            }
        };
        self.sink.set_state(SourceKind::MemoryEvents, state);
    }

    fn start_psi(&mut self) {
        let state = match &self.config.psi {
            SourceSetting::Disabled => SourceState::Disabled,
            SourceSetting::NotApplicable(r) => SourceState::Unavailable { reason: r.clone() },
            SourceSetting::Path(path) => {
                let trigger = self.config.psi_trigger;
                let armed = notify::arm_psi(path, &trigger).and_then(|(f, window)| {
                    notify::async_fd(f, Interest::PRIORITY | Interest::ERROR).map(|fd| (fd, window))
                });
                match armed {
                    Ok((fd, window)) => {
                        self.psi_window = Some(window);
                        self.tasks
                            .push(tokio::spawn(notify::psi_task(fd, self.sink.clone())));
                        SourceState::Armed {
                            detail: format!(
                                "{} {:?} {}us/{}us",
                                path.display(),
                                trigger.kind,
                                trigger.stall.min(window).as_micros(),
                                window.as_micros()
                            ),
                        }
                    }
                    Err(e) => unavailable(SourceKind::Psi, &e),
                }
            }
        };
        self.sink.set_state(SourceKind::Psi, state);
    }
}

fn unavailable(kind: SourceKind, e: &notify::ArmError) -> SourceState {
    let reason = super::warn::ErrorChain(e).to_string();
    tracing::warn!(source = kind.as_str(), %reason, "wake-up source unavailable");
    SourceState::Unavailable { reason }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for a in &self.armed {
            a.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Seek as _, Write as _};

    use super::*;

    fn config_with(events: SourceSetting) -> WakeupConfig {
        WakeupConfig {
            housekeeping: Duration::from_secs(3600),
            queue: 8,
            memcg_node: SourceSetting::Disabled,
            memcg_kubepods: SourceSetting::Disabled,
            oom_control: false,
            memory_events: events,
            psi: SourceSetting::Disabled,
            psi_trigger: PsiTrigger::default(),
            rearm_tolerance: 1 << 20,
        }
    }

    const EVENTS_0: &str = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n";
    const EVENTS_1: &str = "low 0\nhigh 3\nmax 1\noom 1\noom_kill 1\noom_group_kill 0\n";

    /// The memory.events plumbing on a regular file: inotify reports the write, the task reads
    /// the counters and delivers the increases.
    #[tokio::test]
    async fn memory_events_changes_wake_with_deltas() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("memory.events");
        std::fs::write(&path, EVENTS_0).expect("write");
        let mut w = Wakeups::start(config_with(SourceSetting::Path(path.clone()))).expect("start");
        let state = w
            .source_states()
            .into_iter()
            .find(|s| s.source == SourceKind::MemoryEvents)
            .expect("listed");
        assert!(state.state.is_armed(), "{state:?}");

        // One write from offset 0 (no truncation): one IN_MODIFY.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.seek(std::io::SeekFrom::Start(0)).expect("seek");
        f.write_all(EVENTS_1.as_bytes()).expect("write");
        drop(f);

        let wake = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("a wake-up within 10 s")
            .expect("queue open");
        assert_eq!(
            wake.source,
            WakeSource::MemoryEvents(MemoryEvents {
                high: 3,
                max: 1,
                oom: 1,
                oom_kill: 1,
                ..MemoryEvents::default()
            })
        );
        assert_eq!(wake.source.label(), "memory_events");

        // Removing the file stops the source and reports it.
        std::fs::remove_file(&path).expect("rm");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let st = w
                .source_states()
                .into_iter()
                .find(|s| s.source == SourceKind::MemoryEvents)
                .expect("listed");
            if matches!(st.state, SourceState::Unavailable { .. }) {
                break;
            }
            assert!(Instant::now() < deadline, "still {st:?} after removal");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn unarmable_sources_are_reported_not_fatal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = config_with(SourceSetting::NotApplicable("v1 host".into()));
        cfg.psi = SourceSetting::Path(dir.path().join("no-such-pressure"));
        cfg.memcg_node = SourceSetting::Path(dir.path().to_path_buf());
        cfg.oom_control = true;
        let mut w = Wakeups::start(cfg).expect("start");
        let states: BTreeMap<SourceKind, SourceState> = w
            .source_states()
            .into_iter()
            .map(|s| (s.source, s.state))
            .collect();
        assert_eq!(states.len(), SourceKind::ALL.len());
        assert_eq!(
            states[&SourceKind::MemoryEvents],
            SourceState::Unavailable {
                reason: "v1 host".into()
            }
        );
        let SourceState::Unavailable { reason } = &states[&SourceKind::Psi] else {
            panic!("psi: {:?}", states[&SourceKind::Psi]);
        };
        assert!(reason.contains("no-such-pressure"), "{reason}");
        let SourceState::Unavailable { reason } = &states[&SourceKind::MemcgOom] else {
            panic!("oom: {:?}", states[&SourceKind::MemcgOom]);
        };
        assert!(reason.contains("memory.oom_control"), "{reason}");
        assert!(states[&SourceKind::Housekeeping].is_armed());
        assert_eq!(w.psi_effective_window(), None);

        // Thresholds on a directory that is not a memory cgroup: reported, nothing armed.
        w.arm_memory_thresholds(&[100 << 20], 1 << 30, 0);
        assert!(w.armed_thresholds().is_empty());
        let st = w
            .source_states()
            .into_iter()
            .find(|s| s.source == SourceKind::MemcgThreshold)
            .expect("listed");
        let SourceState::Unavailable { reason } = st.state else {
            panic!("threshold: {st:?}");
        };
        assert!(reason.contains("memory.usage_in_bytes"), "{reason}");

        // The kernel sender marks the source armed and delivers.
        let k = w.kernel_sender();
        assert!(k.wake(KernelWakeKind::OomKill));
        let wake = w.try_next().expect("kernel wake-up queued");
        assert_eq!(wake.source, WakeSource::Kernel(KernelWakeKind::OomKill));
        assert_eq!(wake.source.label(), "kernel_oom_kill");
        assert!(
            w.source_states()
                .iter()
                .any(|s| s.source == SourceKind::Kernel && s.state.is_armed())
        );
    }

    #[tokio::test]
    async fn a_full_queue_coalesces() {
        let mut cfg = config_with(SourceSetting::Disabled);
        cfg.queue = 2;
        let mut w = Wakeups::start(cfg).expect("start");
        let k = w.kernel_sender();
        for _ in 0..5 {
            assert!(k.wake(KernelWakeKind::ReclaimStall));
        }
        assert_eq!(w.coalesced(), 3);
        assert!(w.try_next().is_some());
        assert!(w.try_next().is_some());
        assert!(w.try_next().is_none());
        drop(w);
        // The receiver is gone: the sender says so.
        assert!(!k.wake(KernelWakeKind::ReclaimStall));
    }

    #[test]
    fn bad_config_and_no_runtime() {
        let cases = [
            (
                WakeupConfig {
                    housekeeping: Duration::ZERO,
                    ..config_with(SourceSetting::Disabled)
                },
                "housekeeping",
            ),
            (
                WakeupConfig {
                    queue: 0,
                    ..config_with(SourceSetting::Disabled)
                },
                "queue",
            ),
            (
                WakeupConfig {
                    psi_trigger: PsiTrigger {
                        window: Duration::from_secs(20),
                        ..PsiTrigger::default()
                    },
                    ..config_with(SourceSetting::Disabled)
                },
                "psi_trigger.window",
            ),
            (
                WakeupConfig {
                    psi_trigger: PsiTrigger {
                        stall: Duration::from_secs(2),
                        ..PsiTrigger::default()
                    },
                    ..config_with(SourceSetting::Disabled)
                },
                "psi_trigger.stall",
            ),
        ];
        for (cfg, field) in cases {
            match Wakeups::start(cfg) {
                Err(WakeupError::Config { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(matches!(
            Wakeups::start(config_with(SourceSetting::Disabled)),
            Err(WakeupError::NoRuntime)
        ));
    }

    #[test]
    fn layouts_choose_sources() {
        use crate::sampler::config::SamplerConfig;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cgroup.controllers"), "memory\n").expect("write");
        let v2_root = SamplerConfig {
            cgroup_root: dir.path().to_path_buf(),
            ..SamplerConfig::default()
        }
        .resolve()
        .expect("resolves");
        let c = WakeupConfig::for_layout(&v2_root);
        assert_eq!(
            c.memory_events,
            SourceSetting::Path(dir.path().join("kubepods/memory.events"))
        );
        assert!(matches!(c.memcg_node, SourceSetting::NotApplicable(_)));
        assert_eq!(c.psi, SourceSetting::Path("/proc/pressure/memory".into()));
        let v2_node = SamplerConfig {
            cgroup_root: dir.path().to_path_buf(),
            node_cgroup: "sim/node".into(),
            ..SamplerConfig::default()
        }
        .resolve()
        .expect("resolves");
        let c = WakeupConfig::for_layout(&v2_node);
        assert_eq!(
            c.memory_events,
            SourceSetting::Path(dir.path().join("sim/node/memory.events"))
        );
        assert_eq!(
            c.psi,
            SourceSetting::Path(dir.path().join("sim/node/memory.pressure"))
        );
    }
}
