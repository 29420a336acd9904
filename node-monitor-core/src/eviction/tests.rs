use super::*;
use crate::{
    config::{ConfigSource, EvictionOverrides, load_sources},
    eviction::rank::tests::{mem, pod},
    kubelet::pod::ContainerUsage,
    signals::{FsLayout, PodUsage, SignalObservation},
};

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;

fn config(yaml: &str) -> EvictionConfig {
    load_sources(
        &[ConfigSource {
            name: "test",
            text: yaml,
        }],
        &EvictionOverrides::default(),
    )
    .expect("config")
}

fn observations(signals: &[(Signal, i64, i64)], pods: &[(String, PodUsage)]) -> Observations {
    Observations {
        signals: signals
            .iter()
            .map(|(s, available, capacity)| {
                (
                    *s,
                    SignalObservation {
                        available: *available,
                        capacity: *capacity,
                    },
                )
            })
            .collect(),
        pods: pods.iter().cloned().collect(),
        ..Default::default()
    }
}

fn memory_obs(available: i64) -> Observations {
    observations(&[(Signal::MemoryAvailable, available, 10 * GI)], &[])
}

fn at(secs: u64) -> Timestamp {
    Timestamp::from_secs(secs)
}

fn condition(d: &Decision, c: NodeConditionType) -> bool {
    d.conditions.iter().any(|r| r.condition == c && r.status)
}

#[test]
fn nothing_met_nothing_done() {
    let c = config("evictionHard:\n  memory.available: 1Gi\n");
    let mut s = EvictionState::new();
    let d = synchronize(&mut s, &c, &memory_obs(2 * GI), &[pod("a", 0, "")], at(0));
    assert!(d.thresholds_met.is_empty());
    assert!(d.reclaim.is_none() && d.evict.is_empty() && d.ranked.is_empty());
    assert!(s.conditions().is_empty());
}

/// The docs: 10GiB of memory and memory.available<10% (1Gi): below it, the hard threshold
/// evicts at once with the 1 s grace period.
#[test]
fn hard_threshold_evicts_immediately() {
    let c = config("evictionHard:\n  memory.available: 10%\n");
    let mut s = EvictionState::new();
    let pods = [pod("hog", 0, ""), pod("small", 0, "1Gi")];
    let obs = observations(
        &[(Signal::MemoryAvailable, 900 * MI, 10 * GI)],
        &[mem("hog", (3 * GI) as u64), mem("small", (100 * MI) as u64)],
    );
    let d = synchronize(&mut s, &c, &obs, &pods, at(0));
    assert_eq!(d.thresholds_met.len(), 1);
    let t = &d.thresholds_met[0];
    assert_eq!(
        (t.quantity, t.available, t.hard),
        (1_073_741_840, 900 * MI, true)
    );
    assert!(t.grace_period_elapsed);
    assert!(condition(&d, NodeConditionType::MemoryPressure));
    let r = d.reclaim.as_ref().expect("reclaim");
    assert_eq!(
        (r.signal, r.resource, r.hard),
        (Signal::MemoryAvailable, Resource::Memory, true)
    );
    assert_eq!(r.shortfall, 1_073_741_840 - 900 * MI);
    assert_eq!(d.ranked[0].name, "hog");
    assert_eq!(d.evict.len(), 1, "one pod per cycle by default");
    assert_eq!(d.evict[0].name, "hog");
    assert_eq!(d.evict[0].grace_period_seconds, 1);
    assert_eq!(d.evict[0].reason, "Evicted");
    // Unobserved signals are listed, not guessed.
    assert!(
        d.unobserved_signals
            .contains(&Signal::AllocatableMemoryAvailable)
    );
}

/// Soft threshold memory.available<1.5Gi held for 1m30s before anything is evicted; the
/// grace clock restarts if the signal recovers in between.
#[test]
fn soft_threshold_waits_for_its_grace_period() {
    let c = config(
        "evictionHard: {}\nevictionSoft:\n  memory.available: 1.5Gi\nevictionSoftGracePeriod:\n  memory.available: 1m30s\nevictionMaxPodGracePeriod: 60\n",
    );
    let pods = [pod("a", 0, "")];
    let low = || {
        observations(
            &[(Signal::MemoryAvailable, GI, 10 * GI)],
            &[mem("a", GI as u64)],
        )
    };
    let mut s = EvictionState::new();
    let steps: &[(u64, bool, bool, f64)] = &[
        // (t, evicts, condition, grace remaining)
        (0, false, true, 90.0),
        (60, false, true, 30.0),
        (89, false, true, 1.0),
        (90, true, true, 0.0),
        (100, true, true, 0.0),
    ];
    for (t, evicts, cond, remaining) in steps {
        let d = synchronize(&mut s, &c, &low(), &pods, at(*t));
        assert_eq!(!d.evict.is_empty(), *evicts, "t={t}");
        assert_eq!(
            condition(&d, NodeConditionType::MemoryPressure),
            *cond,
            "t={t}"
        );
        assert_eq!(
            d.thresholds_met[0].grace_remaining_seconds, *remaining,
            "t={t}"
        );
        assert_eq!(d.thresholds_met[0].met_for_seconds, *t as f64, "t={t}");
        if *evicts {
            assert!(!d.evict[0].hard);
            assert_eq!(d.evict[0].grace_period_seconds, 30, "min(pod 30s, max 60s)");
        }
    }
    // Recovery resets the first-observed time: the grace period starts over.
    let mut s = EvictionState::new();
    synchronize(&mut s, &c, &low(), &pods, at(0));
    synchronize(&mut s, &c, &memory_obs(2 * GI), &pods, at(60));
    let d = synchronize(&mut s, &c, &low(), &pods, at(100));
    assert!(d.evict.is_empty());
    assert_eq!(d.thresholds_met[0].met_for_seconds, 0.0);
    let d = synchronize(&mut s, &c, &low(), &pods, at(190));
    assert_eq!(d.evict.len(), 1);
}

/// The condition stays true for the transition period after the last time a threshold was
/// met, so an oscillating signal does not flap the condition.
#[test]
fn transition_period_hysteresis() {
    let c =
        config("evictionHard:\n  memory.available: 1Gi\nevictionPressureTransitionPeriod: 5m\n");
    let mut s = EvictionState::new();
    let steps: &[(u64, i64, bool, Option<f64>)] = &[
        (0, GI / 2, true, None),
        (10, 2 * GI, true, Some(290.0)),
        (200, GI / 2, true, None),
        (210, 2 * GI, true, Some(290.0)),
        (499, 2 * GI, true, Some(1.0)),
        (500, 2 * GI, false, None),
        (600, 2 * GI, false, None),
    ];
    for (t, available, status, remaining) in steps {
        let d = synchronize(&mut s, &c, &memory_obs(*available), &[], at(*t));
        let r = &d.conditions[0];
        assert_eq!(r.condition, NodeConditionType::MemoryPressure);
        assert_eq!(r.status, *status, "t={t}");
        assert_eq!(r.transition_remaining_seconds, *remaining, "t={t}");
        assert_eq!(s.has_condition(NodeConditionType::MemoryPressure), *status);
    }
}

/// Minimum reclaim: the docs' nodefs.available<1Gi with 500Mi minimum reclaim keeps
/// reclaiming until 1.5Gi is available.
#[test]
fn minimum_reclaim_keeps_the_threshold_active() {
    let c = config(
        "evictionHard:\n  nodefs.available: 1Gi\nevictionMinimumReclaim:\n  nodefs.available: 500Mi\n",
    );
    let nodefs = |available| observations(&[(Signal::NodeFsAvailable, available, 100 * GI)], &[]);
    let pods = [pod("a", 0, "")];
    let mut s = EvictionState::new();
    // Not met before it is first crossed, even inside the reclaim band.
    let d = synchronize(&mut s, &c, &nodefs(GI + 100 * MI), &pods, at(0));
    assert!(d.thresholds_met.is_empty());
    let d = synchronize(&mut s, &c, &nodefs(GI - MI), &pods, at(10));
    assert_eq!(d.thresholds_met[0].reason, MetReason::BelowThreshold);
    assert_eq!(d.reclaim.as_ref().map(|r| r.shortfall), Some(500 * MI + MI));
    assert_eq!(d.evict.len(), 1);
    let d = synchronize(&mut s, &c, &nodefs(GI + 100 * MI), &pods, at(20));
    assert_eq!(d.thresholds_met[0].reason, MetReason::MinimumReclaimPending);
    assert_eq!(d.evict.len(), 1, "still reclaiming");
    assert_eq!(d.evict[0].resource, Resource::EphemeralStorage);
    let d = synchronize(&mut s, &c, &nodefs(GI + 500 * MI), &pods, at(30));
    assert!(
        d.thresholds_met.is_empty() && d.evict.is_empty(),
        "target reached"
    );
    assert!(
        condition(&d, NodeConditionType::DiskPressure),
        "transition period"
    );
}

#[test]
fn critical_pods_are_never_evicted() {
    let c = config("evictionHard:\n  memory.available: 1Gi\n");
    let mut critical = pod("etcd", 0, "");
    critical.critical = true;
    critical.mirror_pod = true;
    let mut system = pod("dns", 2_000_000_000, "");
    system.critical = true;
    let obs = observations(
        &[(Signal::MemoryAvailable, GI / 2, 10 * GI)],
        &[
            mem("etcd", (8 * GI) as u64),
            mem("dns", (GI) as u64),
            mem("app", 10 * MI as u64),
        ],
    );
    let mut s = EvictionState::new();
    let d = synchronize(&mut s, &c, &obs, &[critical.clone(), system.clone()], at(0));
    assert_eq!(d.ranked.len(), 2);
    assert!(d.evict.is_empty(), "only critical pods: nothing evicted");
    let d = synchronize(
        &mut s,
        &c,
        &obs,
        &[critical, system, pod("app", 0, "1Gi")],
        at(1),
    );
    assert_eq!(d.ranked[0].name, "etcd", "ranked first, skipped");
    assert_eq!(
        d.evict.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["app"]
    );
}

#[test]
fn reclaim_order_memory_then_disk_then_pids() {
    let c = config(
        "evictionHard:\n  memory.available: 1Gi\n  nodefs.available: 1Gi\n  pid.available: \"100\"\n",
    );
    let all = observations(
        &[
            (Signal::MemoryAvailable, 1, 10 * GI),
            (Signal::NodeFsAvailable, 1, 10 * GI),
            (Signal::PidAvailable, 1, 1000),
        ],
        &[],
    );
    let mut s = EvictionState::new();
    let d = synchronize(&mut s, &c, &all, &[], at(0));
    assert_eq!(d.reclaim.map(|r| r.signal), Some(Signal::MemoryAvailable));
    assert_eq!(d.conditions.iter().filter(|c| c.status).count(), 3);
    let disk_and_pid = observations(
        &[
            (Signal::MemoryAvailable, 2 * GI, 10 * GI),
            (Signal::NodeFsAvailable, 1, 10 * GI),
            (Signal::PidAvailable, 1, 1000),
        ],
        &[],
    );
    let d = synchronize(&mut s, &c, &disk_and_pid, &[], at(1));
    assert_eq!(d.reclaim.map(|r| r.signal), Some(Signal::NodeFsAvailable));
    let pid = observations(&[(Signal::PidAvailable, 1, 1000)], &[]);
    let d = synchronize(&mut s, &c, &pid, &[], at(2));
    assert_eq!(
        d.reclaim.map(|r| (r.signal, r.resource)),
        Some((Signal::PidAvailable, Resource::Pids))
    );
}

#[test]
fn hard_before_soft_for_the_same_signal() {
    let c = config(
        "evictionHard:\n  memory.available: 500Mi\nevictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 0s\n",
    );
    let mut s = EvictionState::new();
    let d = synchronize(&mut s, &c, &memory_obs(100 * MI), &[pod("a", 0, "")], at(0));
    let r = d.reclaim.expect("reclaim");
    assert_eq!(r.source, ThresholdSource::EvictionHard);
    assert_eq!(r.quantity, 500 * MI);
}

#[test]
fn grace_periods_hard_and_soft() {
    let hard = config("evictionHard:\n  memory.available: 1Gi\n").thresholds[0].clone();
    let soft = config("evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1m\n")
            .thresholds
            .into_iter()
            .find(|t| t.source == ThresholdSource::EvictionSoft)
            .expect("soft");
    let mut p = pod("p", 0, "");
    let cases: &[(&Threshold, Option<i64>, i32, i64)] = &[
        (&hard, Some(30), 60, 1),
        (&hard, Some(0), 0, 1),
        (&soft, Some(30), 60, 30),
        (&soft, Some(120), 60, 60),
        (&soft, None, 60, 60),
        // evictionMaxPodGracePeriod 0 (the default): the kubelet ends up at 1 s.
        (&soft, Some(30), 0, 1),
        (&soft, Some(30), -1, 1),
        (&soft, Some(0), 60, 1),
    ];
    for (t, pod_grace, max, want) in cases {
        p.termination_grace_period_seconds = *pod_grace;
        assert_eq!(
            eviction_grace_period(t, &p, *max),
            *want,
            "hard={} pod={pod_grace:?} max={max}",
            t.is_hard()
        );
    }
}

/// The kubelet's message, word for word, and its event annotations.
#[test]
fn eviction_message_format() {
    let c = config("evictionHard:\n  memory.available: 100Mi\n");
    let mut p = pod("web", 0, "1Gi");
    p.containers[0].name = "x".into();
    p.containers[0].usage = ContainerUsage {
        memory: Some(2 << 30),
        disk: None,
    };
    let mut sidecar = p.containers[0].clone();
    sidecar.name = "y".into();
    sidecar.usage.memory = Some(10 << 20);
    p.containers.push(sidecar);
    let obs = observations(
        &[(Signal::MemoryAvailable, 12345 * 1024, 10 * GI)],
        &[mem("web", (3 * GI) as u64)],
    );
    let mut s = EvictionState::new();
    let d = synchronize(&mut s, &c, &obs, &[p.clone()], at(0));
    let e = &d.evict[0];
    assert_eq!(
        e.message,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 12345Ki. \
             Container x was using 2Gi, request is 1Gi, has larger consumption of memory. "
    );
    assert_eq!(e.annotations["offending_containers"], "x");
    assert_eq!(e.annotations["offending_containers_usage"], "2Gi");
    assert_eq!(e.annotations["starved_resource"], "memory");

    // Percentage thresholds print the resolved amount; without a usage sample the message
    // stops after the threshold and carries no annotations.
    let c = config("evictionHard:\n  memory.available: 10%\n");
    let obs = observations(&[(Signal::MemoryAvailable, GI / 2, 10 * GI)], &[]);
    let (msg, ann) = eviction_message(
        Resource::Memory,
        &p,
        None,
        &c.thresholds.iter().collect::<Vec<_>>(),
        &obs,
    );
    assert_eq!(
        msg,
        "The node was low on resource: memory. Threshold quantity: 1073741840, available: 512Mi. "
    );
    assert!(ann.is_empty());

    // Pod-level resources name the pod; PIDs print in decimal SI and never blame containers.
    p.pod_memory_request = Some(Quantity::parse("2Gi").expect("q"));
    let obs = observations(
        &[(Signal::MemoryAvailable, GI / 2, 10 * GI)],
        &[mem("web", (3 * GI) as u64)],
    );
    let usage = obs.pods.get("uid-web");
    let (msg, ann) = eviction_message(Resource::Memory, &p, usage, &[], &obs);
    assert_eq!(
        msg,
        "The node was low on resource: memory. Pod web was using 3Gi, request is 2Gi, has larger consumption of memory. \
             Container x was using 2Gi, request is 1Gi, has larger consumption of memory. "
    );
    assert_eq!(ann["offending_pod"], "web");
    assert_eq!(ann["offending_pod_usage"], "3Gi");
    let c = config("evictionHard:\n  pid.available: 10%\n");
    let obs = observations(
        &[(Signal::PidAvailable, 12_000, 4_194_304)],
        &[mem("web", 1)],
    );
    let (msg, ann) = eviction_message(
        Resource::Pids,
        &p,
        obs.pods.get("uid-web"),
        &c.thresholds.iter().collect::<Vec<_>>(),
        &obs,
    );
    assert_eq!(
        msg,
        "The node was low on resource: pids. Threshold quantity: 419430, available: 12k. "
    );
    assert_eq!(ann["offending_containers"], "");
    assert_eq!(ann["starved_resource"], "pids");
}

#[test]
fn more_pods_per_cycle_only_until_the_shortfall_is_covered() {
    let c = config("evictionHard:\n  memory.available: 1Gi\nnodeMonitor:\n  maxPodsPerCycle: 3\n");
    let pods = [
        pod("a", 0, ""),
        pod("b", 0, ""),
        pod("c", 0, ""),
        pod("d", 0, ""),
    ];
    let usage = [
        mem("a", (400 * MI) as u64),
        mem("b", (300 * MI) as u64),
        mem("c", (200 * MI) as u64),
        mem("d", (100 * MI) as u64),
    ];
    let mut s = EvictionState::new();
    // Short by 500Mi: a (400Mi) and b (300Mi) cover it.
    let obs = observations(&[(Signal::MemoryAvailable, GI - 500 * MI, 10 * GI)], &usage);
    let d = synchronize(&mut s, &c, &obs, &pods, at(0));
    assert_eq!(
        d.evict.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    // Short by almost 1Gi: a, b and c (900Mi) do not cover it; capped at three.
    let obs = observations(&[(Signal::MemoryAvailable, 1, 10 * GI)], &usage);
    let d = synchronize(&mut s, &c, &obs, &pods, at(1));
    assert_eq!(d.evict.len(), 3);
}

#[test]
fn deadline_for_waiting_soft_thresholds() {
    let c = config(
        "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 2m\n",
    );
    let mut s = EvictionState::new();
    assert_eq!(next_grace_deadline(&s, &c, at(0)), None);
    synchronize(&mut s, &c, &memory_obs(GI / 2), &[], at(30));
    assert_eq!(next_grace_deadline(&s, &c, at(30)), Some(at(150)));
    assert_eq!(next_grace_deadline(&s, &c, at(149)), Some(at(150)));
}

/// Once a soft threshold's grace has passed and nothing can be evicted (only critical pods,
/// every candidate backing off, a dry run), the threshold stays tracked: its deadline must not
/// come back as a timer in the past, which would wake the loop at once, for ever.
#[test]
fn an_elapsed_grace_period_schedules_no_timer() {
    let c = config(
        "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 2m\n",
    );
    let mut critical = pod("etcd", 0, "");
    critical.critical = true;
    let mut s = EvictionState::new();
    // (now, deadline)
    let steps = [(30, Some(150)), (150, None), (151, None), (3600, None)];
    for (now, want) in steps {
        let d = synchronize(
            &mut s,
            &c,
            &memory_obs(GI / 2),
            &[critical.clone()],
            at(now),
        );
        assert!(d.evict.is_empty(), "t={now}: only a critical pod");
        assert_eq!(
            next_grace_deadline(&s, &c, at(now)),
            want.map(at),
            "t={now}"
        );
    }
}

/// Whatever the timers say, the next wake-up is never sooner than the minimum interval.
#[test]
fn the_next_timer_is_never_in_the_past() {
    let min = MIN_TIMER_INTERVAL;
    let now = at(100);
    let ms = |m: u64| Timestamp::from_millis(m);
    // (timers, want)
    let cases: &[(&[Option<Timestamp>], Option<Timestamp>)] = &[
        (&[], None),
        (&[None, None], None),
        (&[Some(at(50))], Some(now + min)),
        (&[Some(now)], Some(now + min)),
        (&[Some(at(50)), Some(at(200))], Some(now + min)),
        (&[None, Some(at(200)), Some(at(300))], Some(at(200))),
        (&[Some(ms(100_050))], Some(now + min)),
        (&[Some(ms(100_150))], Some(ms(100_150))),
    ];
    for (timers, want) in cases {
        let got = next_timer(timers.iter().copied(), now, min);
        assert_eq!(got, *want, "{timers:?}");
        assert!(got.is_none_or(|t| t >= now + min), "{timers:?}");
    }
}

/// A dry run reports the same pod and signal once per interval, whatever the wake-up rate;
/// other pods and other signals are reported on their own.
#[test]
fn dry_run_reports_are_rate_limited_per_pod_and_signal() {
    let mut l = ReportLimiter::new(Duration::from_secs(300));
    let ms = Timestamp::from_millis;
    // (uid, signal, now ms, allowed)
    let steps = [
        ("a", Signal::MemoryAvailable, 0, true),
        ("a", Signal::MemoryAvailable, 100, false),
        ("a", Signal::MemoryAvailable, 200, false),
        ("a", Signal::NodeFsAvailable, 200, true),
        ("b", Signal::MemoryAvailable, 300, true),
        ("a", Signal::MemoryAvailable, 299_999, false),
        ("a", Signal::MemoryAvailable, 300_000, true),
        ("a", Signal::MemoryAvailable, 300_100, false),
    ];
    for (uid, signal, now, want) in steps {
        assert_eq!(
            l.allow(uid, signal, ms(now)),
            want,
            "{uid} {signal} at {now} ms"
        );
    }
    // Ten minutes of 10 Hz decisions for one pod: two reports.
    let mut l = ReportLimiter::new(Duration::from_secs(300));
    let reports = (0..6000)
        .filter(|i| l.allow("a", Signal::MemoryAvailable, ms(i * 100)))
        .count();
    assert_eq!(reports, 2);
    assert_eq!(l.len(), 1, "old entries are dropped");
}

/// Evictions named otherwise than by a signal (the local-storage limits) are limited the same
/// way, apart from the signals.
#[test]
fn dry_run_reports_of_named_evictions_are_rate_limited_per_pod_and_name() {
    let mut l = ReportLimiter::new(Duration::from_secs(300));
    let ms = Timestamp::from_millis;
    assert!(l.allow_named("a", "emptydirfs.limit", ms(0)));
    assert!(!l.allow_named("a", "emptydirfs.limit", ms(10_000)));
    assert!(l.allow_named("a", "ephemeralpodfs.limit", ms(10_000)));
    assert!(l.allow("a", Signal::MemoryAvailable, ms(10_000)));
    assert!(!l.allow_named("a", "memory.available", ms(20_000)));
    assert!(l.allow_named("a", "emptydirfs.limit", ms(300_000)));
}

#[test]
fn state_follows_configuration_changes() {
    let old = config("evictionHard:\n  memory.available: 1Gi\n");
    let new = config("evictionHard:\n  memory.available: 100Mi\n");
    let mut s = EvictionState::new();
    synchronize(&mut s, &old, &memory_obs(GI / 2), &[pod("a", 0, "")], at(0));
    // The same key survives a reload; with the new threshold the signal is fine.
    let d = synchronize(
        &mut s,
        &new,
        &memory_obs(GI / 2),
        &[pod("a", 0, "")],
        at(10),
    );
    assert!(d.thresholds_met.is_empty() && d.evict.is_empty());
    assert!(
        condition(&d, NodeConditionType::MemoryPressure),
        "still within 5m of the last"
    );
}

#[test]
fn decision_serializes() {
    let c = config("evictionHard:\n  memory.available: 1Gi\n");
    let mut s = EvictionState::new();
    let obs = observations(
        &[(Signal::MemoryAvailable, GI / 2, 10 * GI)],
        &[mem("a", (2 * GI) as u64)],
    );
    let d = synchronize(&mut s, &c, &obs, &[pod("a", 0, "")], at(0));
    let v = serde_json::to_value(&d).expect("json");
    assert_eq!(v["thresholds_met"][0]["signal"], "memory.available");
    assert_eq!(v["thresholds_met"][0]["reason"], "below_threshold");
    assert_eq!(v["conditions"][0]["type"], "MemoryPressure");
    assert_eq!(v["reclaim"]["resource"], "memory");
    assert_eq!(v["ranked"][0]["qos"], "BestEffort");
    assert_eq!(v["evict"][0]["grace_period_seconds"], 1);
    assert!(v["ranked"][0].get("index").is_none());
}

/// On a node with a dedicated image filesystem, nodefs pressure evicts by volumes and logs and
/// imagefs pressure by writable layers: the same two pods, opposite choices.
#[test]
fn a_dedicated_image_filesystem_splits_disk_ranking_by_signal() {
    let c = config("evictionHard:\n  nodefs.available: 1Gi\n  imagefs.available: 1Gi\n");
    let pods = [pod("volume", 0, ""), pod("layer", 0, "")];
    let usage = |total: i64, layers: i64| PodUsage {
        disk: Some((total * MI) as u64),
        writable_layers: Some((layers * MI) as u64),
        ..PodUsage::default()
    };
    let pod_usage = [
        ("uid-volume".to_owned(), usage(600, 10)),
        ("uid-layer".to_owned(), usage(700, 500)),
    ];
    let dedicated = FsLayout {
        dedicated_image_fs: true,
        split_container_image_fs: false,
    };
    let cases = [
        (Signal::NodeFsAvailable, FsLayout::default(), "layer"),
        (Signal::NodeFsAvailable, dedicated, "volume"),
        (Signal::ImageFsAvailable, dedicated, "layer"),
    ];
    for (signal, layout, want) in cases {
        let mut obs = observations(&[(signal, 1, 100 * GI)], &pod_usage);
        obs.filesystem = layout;
        let d = synchronize(&mut EvictionState::new(), &c, &obs, &pods, at(0));
        let evicted: Vec<_> = d.evict.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(evicted, [want], "{signal:?} on {layout:?}");
    }
}

/// `TestDiskPressureNodeFs`' pods: (rootfs, logs, local volume) in MiB.
fn kubelet_disk_pods() -> (Vec<PodInfo>, Vec<(String, PodUsage)>) {
    let (low, high) = (-1, 1);
    let pods = vec![
        pod("low-priority-high-usage", low, "1Gi"),
        pod("below-requests", 0, "100Mi"),
        pod("above-requests", 0, "100Mi"),
        pod("high-priority-high-usage", high, ""),
        pod("low-priority-low-usage", low, ""),
    ];
    let usage = |name: &str, root: i64, logs: i64, volume: i64| {
        (
            format!("uid-{name}"),
            PodUsage {
                disk: Some(((root + logs + volume) * MI) as u64),
                writable_layers: Some((root * MI) as u64),
                ..PodUsage::default()
            },
        )
    };
    let pod_usage = vec![
        usage("low-priority-high-usage", 900, 0, 0),
        usage("below-requests", 0, 50, 0),
        usage("above-requests", 400, 0, 0),
        usage("high-priority-high-usage", 0, 0, 400),
        usage("low-priority-low-usage", 100, 0, 0),
    ];
    (pods, pod_usage)
}

/// `makeDiskStats`: every filesystem with 16Gi available of 32Gi but `pressured`, which has
/// `available` when given.
fn kubelet_disk_obs(
    pod_usage: &[(String, PodUsage)],
    layout: FsLayout,
    pressured: Signal,
    available: Option<i64>,
) -> Observations {
    let fs = |s: Signal| {
        let a = match available {
            Some(a) if s == pressured => a,
            _ => 16 * GI,
        };
        (s, a, 32 * GI)
    };
    let mut o = observations(
        &[
            fs(Signal::NodeFsAvailable),
            fs(Signal::ImageFsAvailable),
            fs(Signal::ContainerFsAvailable),
        ],
        pod_usage,
    );
    o.filesystem = layout;
    o
}

/// The kubelet's `TestDiskPressureNodeFs`, each case: no image filesystem (nodefs pressure),
/// a dedicated image filesystem (imagefs pressure) and a split containerfs (containerfs
/// pressure, with the thresholds the kubelet derives from the nodefs ones). Soft pressure
/// raises the condition at once and evicts after the grace period with the maximum pod grace
/// period; hard pressure evicts at once with 1 s; the condition outlives the pressure by the
/// transition period. The evicted pod is the low-priority one with the large writable layer.
#[test]
fn kubelet_disk_pressure_nodefs_imagefs_containerfs() {
    let thresholds = |signal: &str| {
        config(&format!(
            "evictionHard:\n  {signal}: 1Gi\nevictionSoft:\n  {signal}: 2Gi\n\
             evictionSoftGracePeriod:\n  {signal}: 2m\nevictionMaxPodGracePeriod: 5\n\
             evictionPressureTransitionPeriod: 5m\n"
        ))
    };
    let (pods, pod_usage) = kubelet_disk_pods();
    let image = FsLayout {
        dedicated_image_fs: true,
        split_container_image_fs: false,
    };
    let split = FsLayout {
        dedicated_image_fs: true,
        split_container_image_fs: true,
    };
    let cases = [
        (
            "no image fs",
            "nodefs.available",
            FsLayout::default(),
            Signal::NodeFsAvailable,
        ),
        (
            "image fs",
            "imagefs.available",
            image,
            Signal::ImageFsAvailable,
        ),
        (
            "container fs",
            "nodefs.available",
            split,
            Signal::ContainerFsAvailable,
        ),
    ];
    for (name, configured, layout, pressured) in cases {
        let c = thresholds(configured).with_fs_layout(layout);
        let obs = |available| kubelet_disk_obs(&pod_usage, layout, pressured, available);
        let disk_pressure = |d: &Decision| condition(d, NodeConditionType::DiskPressure);
        let evicted = |d: &Decision| d.evict.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        let mut s = EvictionState::new();
        let mut t = 0;
        let d = synchronize(&mut s, &c, &obs(None), &pods, at(t));
        assert!(!disk_pressure(&d), "{name}: no pressure at start");
        // Soft threshold (1.5Gi < 2Gi): condition, no eviction within the grace period.
        t += 60;
        let soft = obs(Some(3 * GI / 2));
        let d = synchronize(&mut s, &c, &soft, &pods, at(t));
        assert!(disk_pressure(&d), "{name}: soft pressure");
        assert!(d.evict.is_empty(), "{name}: within the grace period");
        t += 180;
        let d = synchronize(&mut s, &c, &soft, &pods, at(t));
        assert!(disk_pressure(&d), "{name}: soft pressure held");
        assert_eq!(evicted(&d), ["low-priority-high-usage"], "{name}: soft");
        assert_eq!(d.evict[0].grace_period_seconds, 5, "{name}: max pod grace");
        assert_eq!(d.evict[0].signal, pressured, "{name}: soft signal");
        // Relieved, past the transition period.
        t += 1200;
        let d = synchronize(&mut s, &c, &obs(None), &pods, at(t));
        assert!(!disk_pressure(&d), "{name}: relieved");
        // Hard threshold (750Mi < 1Gi): evicts at once.
        t += 60;
        let d = synchronize(&mut s, &c, &obs(Some(750 * MI)), &pods, at(t));
        assert!(disk_pressure(&d), "{name}: hard pressure");
        assert_eq!(evicted(&d), ["low-priority-high-usage"], "{name}: hard");
        assert_eq!(d.evict[0].grace_period_seconds, 1, "{name}: hard grace");
        // Relieved: the condition stays for the transition period, then goes.
        t += 60;
        let d = synchronize(&mut s, &c, &obs(None), &pods, at(t));
        assert!(
            disk_pressure(&d) && d.evict.is_empty(),
            "{name}: transition"
        );
        t += 300;
        let d = synchronize(&mut s, &c, &obs(None), &pods, at(t));
        assert!(!disk_pressure(&d) && d.evict.is_empty(), "{name}: cleared");
    }
}

/// Inode pressure ranks by the inodes each pod uses (`rankDiskPressureFunc` with inodes): the
/// pod with many small files goes first, not the pod with the large request-free volume.
#[test]
fn inode_pressure_evicts_the_pod_with_the_most_inodes() {
    let c = config("evictionHard:\n  nodefs.inodesFree: 5%\n");
    let pods = [pod("big-file", 0, ""), pod("many-files", 0, "")];
    let pod_usage = [
        (
            "uid-big-file".to_owned(),
            PodUsage {
                disk: Some((10 * GI) as u64),
                inodes: Some(12),
                ..PodUsage::default()
            },
        ),
        (
            "uid-many-files".to_owned(),
            PodUsage {
                disk: Some((100 * MI) as u64),
                inodes: Some(400_000),
                ..PodUsage::default()
            },
        ),
    ];
    let obs = observations(&[(Signal::NodeFsInodesFree, 1_000, 1_000_000)], &pod_usage);
    let d = synchronize(&mut EvictionState::new(), &c, &obs, &pods, at(0));
    let evicted: Vec<_> = d.evict.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(evicted, ["many-files"]);
    assert_eq!(d.ranked[0].usage, Some(400_000));
}
