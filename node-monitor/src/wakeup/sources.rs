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
        let _enter = self.handle.enter();
        self.thresholds
            .arm(&self.sink, target, thresholds, capacity, inactive);
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
mod tests {
    use std::{
        io::{Seek as _, Write as _},
        time::Instant,
    };

    use super::*;
    use crate::{sampler::parse::MemoryEvents, wakeup::PsiTrigger};

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

    #[test]
    fn wakeups_can_move_to_blocking_threads() {
        fn send<T: Send + 'static>() {}
        send::<Wakeups>();
        send::<crate::sampler::TimedObservations<Wakeup>>();
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
}
