//! Wake-up sources merged into one queue. The agent runs a pass when one of them fires, not on a
//! timer: eBPF events, cgroup v1 memcg threshold and OOM eventfds, cgroup v2 `memory.events`
//! changes, PSI triggers; a housekeeping tick (10 s, like the kubelet's) is the fallback and
//! the cadence of the expensive reads.
//!
//! Every source is optional. One that cannot be armed (missing file, no permission, a v2 file on
//! a v1 host) is logged and reported by [`Wakeups::source_states`]; the others keep working.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{io::Interest, runtime::Handle, sync::mpsc, task::JoinHandle};

use crate::sampler::ErrorChain;

use super::{
    config::{WakeupConfig, WakeupError},
    notify,
    sink::Sink,
    thresholds::{ArmedThreshold, MemcgThresholds},
    vocab::{
        KernelWakeKind, MemcgTarget, SourceKind, SourceSetting, SourceState, SourceStatus,
        WakeSource, Wakeup,
    },
};

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

/// The merged wake-up queue and its sources. Dropping it disarms everything.
#[derive(Debug)]
pub struct Wakeups {
    config: WakeupConfig,
    handle: Handle,
    sink: Sink,
    rx: mpsc::Receiver<Wakeup>,
    tasks: Vec<JoinHandle<()>>,
    thresholds: MemcgThresholds,
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
        let thresholds = MemcgThresholds::new(
            config.memcg_node.clone(),
            config.memcg_kubepods.clone(),
            config.rearm_tolerance,
        );
        let mut this = Self {
            config,
            handle,
            sink,
            rx,
            tasks: Vec::new(),
            thresholds,
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
        let threshold_state = this.thresholds.initial_state();
        this.sink
            .set_state(SourceKind::MemcgThreshold, threshold_state);
        Ok(this)
    }

    /// The next wake-up. `None` never happens while `self` lives (it holds a sender); the
    /// `Option` is the channel's.
    pub async fn next(&mut self) -> Option<Wakeup> {
        self.rx.recv().await
    }

    /// Whether a wake-up is queued (without taking it): what a pass that can wait gives way to.
    pub fn pending(&self) -> bool {
        !self.rx.is_empty()
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
        self.thresholds.armed()
    }

    /// Arms cgroup v1 memory thresholds on the node cgroup for `memory.available` eviction
    /// thresholds (in bytes), like the kubelet's memoryThresholdNotifier: each at
    /// `capacity − threshold + file_outside_working_set` on `memory.usage_in_bytes` (the page
    /// cache the working-set formula leaves out: `inactive_file` for the kubelet's), so the
    /// kernel notifies when the working set reaches `capacity − threshold`. Call it after every
    /// pass with fresh figures (the kubelet re-arms on each synchronize): thresholds that moved
    /// by more than the re-arm tolerance are re-registered, the others are kept.
    pub fn arm_memory_thresholds(
        &mut self,
        available_thresholds_bytes: &[u64],
        capacity: u64,
        file_outside_working_set: u64,
    ) {
        self.arm(
            MemcgTarget::Node,
            available_thresholds_bytes,
            capacity,
            file_outside_working_set,
        );
    }

    /// Like [`Wakeups::arm_memory_thresholds`], on the kubepods cgroup for
    /// `allocatableMemory.available` (capacity = allocatable).
    pub fn arm_allocatable_thresholds(
        &mut self,
        available_thresholds_bytes: &[u64],
        capacity: u64,
        file_outside_working_set: u64,
    ) {
        self.arm(
            MemcgTarget::Allocatable,
            available_thresholds_bytes,
            capacity,
            file_outside_working_set,
        );
    }

    fn arm(&mut self, target: MemcgTarget, thresholds: &[u64], capacity: u64, outside: u64) {
        let _enter = self.handle.enter();
        self.thresholds
            .arm(&self.sink, target, thresholds, capacity, outside);
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
    let reason = ErrorChain(e).to_string();
    tracing::warn!(source = kind.as_str(), %reason, "wake-up source unavailable");
    SourceState::Unavailable { reason }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests;
