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
