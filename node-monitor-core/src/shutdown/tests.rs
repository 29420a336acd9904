use super::*;
use crate::units::clock::Timestamp;
use node_monitor_common::logic::{RebootCaller, RebootGate};

fn pod(name: &str, priority: i32, tgp: Option<i64>) -> ShutdownPod {
    ShutdownPod {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        priority,
        termination_grace_period_seconds: tgp,
    }
}

fn by_priority(entries: &[(i32, i64)]) -> ShutdownSettings {
    ShutdownSettings {
        shutdown_grace_period_by_pod_priority: entries
            .iter()
            .map(|&(priority, s)| PriorityPeriod {
                priority,
                shutdown_grace_period_seconds: s,
            })
            .collect(),
        ..ShutdownSettings::default()
    }
}

fn legacy(total: GoDuration, critical: GoDuration) -> ShutdownSettings {
    ShutdownSettings {
        shutdown_grace_period: total,
        shutdown_grace_period_critical_pods: critical,
        ..ShutdownSettings::default()
    }
}

#[test]
fn legacy_fields_become_two_groups() {
    let s = legacy(GoDuration::from_secs(30), GoDuration::from_secs(10));
    assert_eq!(
        s.groups(),
        Ok(vec![
            Group {
                priority: 0,
                period: Duration::from_secs(20)
            },
            Group {
                priority: SYSTEM_CRITICAL_PRIORITY,
                period: Duration::from_secs(10)
            },
        ])
    );
    assert_eq!(s.budget(), Ok(Duration::from_secs(30)));
    assert_eq!(ShutdownSettings::default().groups(), Ok(vec![]));
    // Sub-second remainders are truncated per group, as Go's int64(d / time.Second) does.
    let s = legacy(GoDuration::from_millis(2500), GoDuration::from_millis(1200));
    let periods: Vec<u64> = s
        .groups()
        .expect("valid")
        .iter()
        .map(|g| g.period.as_secs())
        .collect();
    assert_eq!(periods, vec![1, 1]);
}

/// The kubelet's field names and formats: Go duration strings and the priority list.
#[test]
fn serde_uses_kubelet_configuration_names() {
    let yaml = "shutdownGracePeriod: 1m30s\nshutdownGracePeriodCriticalPods: 30s\n";
    let s: ShutdownSettings = serde_norway::from_str(yaml).expect("legacy form");
    assert_eq!(
        s,
        legacy(GoDuration::from_secs(90), GoDuration::from_secs(30))
    );
    let yaml = "shutdownGracePeriodByPodPriority:\n  - priority: 100000\n    shutdownGracePeriodSeconds: 10\n  - priority: 0\n    shutdownGracePeriodSeconds: 60\n";
    let s: ShutdownSettings = serde_norway::from_str(yaml).expect("priority form");
    assert_eq!(s, by_priority(&[(100_000, 10), (0, 60)]));
    let json =
        serde_json::to_value(legacy(GoDuration::from_secs(90), GoDuration::ZERO)).expect("json");
    assert_eq!(json["shutdownGracePeriod"], "1m30s");
    assert_eq!(json["shutdownGracePeriodCriticalPods"], "0s");
    let err = serde_norway::from_str::<ShutdownSettings>("shutdownGracePeriod: 30\n")
        .expect_err("a number without a unit is not a Go duration");
    assert!(
        err.to_string().contains("missing unit in duration \"30\""),
        "{err}"
    );
    assert_eq!(GoDuration::from_secs(-5).to_string(), "-5s");
}

/// The seed's example: 100000→10 s, 10000→180 s, 1000→120 s, 0→60 s.
#[test]
fn seed_example_groups_and_periods() {
    let s = by_priority(&[(100_000, 10), (10_000, 180), (1_000, 120), (0, 60)]);
    let groups = s.groups().expect("valid");
    assert_eq!(
        groups.iter().map(|g| g.priority).collect::<Vec<_>>(),
        vec![0, 1_000, 10_000, 100_000]
    );
    assert_eq!(s.budget(), Ok(Duration::from_secs(370)));
    let pods = [
        pod("custom-class-a", 2_000, Some(600)), // 1000 ≤ 2000 < 10000 → 120 s group
        pod("custom-class-b", 20_000, Some(5)),  // own 5 s < 180 s
        pod("low", -5, None),                    // below every group → lowest; no own period → 60 s
        pod("critical", 2_000_000_000, Some(60)), // → 100000 group, capped at 10 s
    ];
    let p = plan(&groups, &pods);
    type Row<'a> = (i32, Vec<(&'a str, i64)>, u64);
    let got: Vec<Row<'_>> = p
        .groups
        .iter()
        .map(|g| {
            (
                g.priority,
                g.pods
                    .iter()
                    .map(|pp| (pp.pod.name.as_str(), pp.grace_period_seconds))
                    .collect(),
                g.latest_start.as_secs(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, vec![("low", 60)], 0),
            (1_000, vec![("custom-class-a", 120)], 60),
            (10_000, vec![("custom-class-b", 5)], 180),
            (100_000, vec![("critical", 10)], 360),
        ]
    );
    assert_eq!(p.pod_count(), 4);
    assert_eq!(plan_summary(&p).get(&1_000), Some(&1));
}

#[test]
fn empty_groups_are_skipped_and_take_no_time() {
    let s = by_priority(&[(0, 20), (1_000, 30), (10_000, 40)]);
    let p = plan(
        &s.groups().expect("valid"),
        &[pod("a", 0, Some(5)), pod("c", 50_000, Some(100))],
    );
    let got: Vec<(i32, u64)> = p
        .groups
        .iter()
        .map(|g| (g.priority, g.latest_start.as_secs()))
        .collect();
    assert_eq!(got, vec![(0, 0), (10_000, 20)]);
    assert_eq!(p.groups[1].pods[0].grace_period_seconds, 40);
}

#[test]
fn invalid_configurations_name_the_field() {
    let cases: Vec<(ShutdownSettings, ShutdownConfigError, &str)> = vec![
        (
            legacy(GoDuration::from_secs(-1), GoDuration::ZERO),
            ShutdownConfigError::Negative {
                field: "shutdownGracePeriod",
                value: "-1s".into(),
            },
            "shutdownGracePeriod: -1s is negative",
        ),
        (
            legacy(GoDuration::from_millis(500), GoDuration::ZERO),
            ShutdownConfigError::SubSecond {
                field: "shutdownGracePeriod",
                value: "500ms".into(),
            },
            ">= 1s",
        ),
        (
            legacy(GoDuration::from_secs(10), GoDuration::from_millis(200)),
            ShutdownConfigError::SubSecond {
                field: "shutdownGracePeriodCriticalPods",
                value: "200ms".into(),
            },
            "shutdownGracePeriodCriticalPods: 200ms",
        ),
        (
            legacy(GoDuration::from_secs(10), GoDuration::from_secs(20)),
            ShutdownConfigError::CriticalExceedsTotal {
                critical: "20s".into(),
                total: "10s".into(),
            },
            "20s exceeds shutdownGracePeriod: 10s",
        ),
        (
            by_priority(&[(0, 10), (0, 20)]),
            ShutdownConfigError::DuplicatePriority(0),
            "priority 0",
        ),
        (
            by_priority(&[(0, -3)]),
            ShutdownConfigError::Negative {
                field: "shutdownGracePeriodByPodPriority.shutdownGracePeriodSeconds",
                value: "-3".into(),
            },
            "shutdownGracePeriodSeconds: -3 is negative",
        ),
        (
            ShutdownSettings {
                shutdown_grace_period: GoDuration::from_secs(5),
                ..by_priority(&[(0, 10)])
            },
            ShutdownConfigError::BothForms,
            "both set",
        ),
        // Each entry is valid, the sum is more than logind can wait (and more than a
        // Duration sum could hold).
        (
            by_priority(&[(0, i64::MAX), (1, i64::MAX), (2, i64::MAX)]),
            ShutdownConfigError::BudgetTooLong {
                field: "shutdownGracePeriodByPodPriority",
                needed_seconds: 3 * u128::from(i64::MAX.unsigned_abs()),
                max_seconds: 18_446_744_073_709,
            },
            "need 27670116110564327421s in total",
        ),
        (
            by_priority(&[(0, 18_446_744_073_710)]),
            ShutdownConfigError::BudgetTooLong {
                field: "shutdownGracePeriodByPodPriority",
                needed_seconds: 18_446_744_073_710,
                max_seconds: 18_446_744_073_709,
            },
            "(18446744073709s)",
        ),
    ];
    for (s, want, text) in cases {
        assert_eq!(s.groups(), Err(want.clone()), "{s:?}");
        assert!(
            want.to_string().contains(text),
            "{want} should contain {text:?}"
        );
    }
}

/// The longest budget logind can hold is accepted, and its plan's offsets do not overflow.
#[test]
fn the_longest_budget_logind_holds_is_accepted() {
    let max = LOGIND_MAX_DELAY.as_secs();
    let half = i64::try_from(max / 2).expect("fits");
    let rest = i64::try_from(max).expect("fits") - half;
    let s = by_priority(&[(0, half), (1, rest)]);
    let groups = s.groups().expect("within logind's limit");
    assert_eq!(s.budget(), Ok(Duration::from_secs(max)));
    let p = plan(&groups, &[pod("a", 0, None), pod("b", 1, None)]);
    assert_eq!(p.groups[1].latest_start, Duration::from_secs(max / 2));
    // One second more is refused.
    assert!(matches!(
        by_priority(&[(0, half), (1, rest + 1)]).groups(),
        Err(ShutdownConfigError::BudgetTooLong { .. })
    ));
}

#[test]
fn budget_must_fit_logind_delay() {
    assert_eq!(
        check_inhibit_delay(Duration::from_secs(30), Duration::from_secs(30)),
        Ok(())
    );
    let err =
        check_inhibit_delay(Duration::from_secs(30), Duration::from_secs(5)).expect_err("too long");
    assert_eq!(
        err,
        ShutdownConfigError::ExceedsInhibitDelay {
            needed: 30,
            allowed: 5
        }
    );
    assert!(
        err.to_string().contains("InhibitDelayMaxSec allows 5s"),
        "{err}"
    );
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn uids(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| format!("uid-{n}")).collect()
}

fn three_groups() -> ShutdownPlan {
    let groups = by_priority(&[(0, 10), (1_000, 20), (100_000, 5)])
        .groups()
        .expect("valid");
    plan(
        &groups,
        &[
            pod("low-a", 0, Some(3)),
            pod("low-b", 10, Some(30)),
            pod("mid", 5_000, Some(3)),
            pod("top", 200_000, Some(3)),
        ],
    )
}

/// Steps of a run, as short strings, for table-driven checks.
fn describe(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|s| match s {
            Step::StartGroup { priority, pods, .. } => format!(
                "start {priority} [{}]",
                pods.iter()
                    .map(|p| format!("{}:{}", p.pod.name, p.grace_period_seconds))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Step::EndGroup {
                priority,
                outcome: GroupOutcome::AllGone,
                ..
            } => {
                format!("end {priority} gone")
            }
            Step::EndGroup {
                priority,
                outcome: GroupOutcome::PeriodElapsed { remaining },
                ..
            } => {
                format!("end {priority} elapsed {}", remaining.join(","))
            }
            Step::Release => "release".into(),
        })
        .collect()
}

/// The run with a fixed clock: (time ms, pods the API still shows, expected steps, deadline ms).
#[test]
fn run_goes_group_by_group_until_gone_or_elapsed() {
    let mut run = ShutdownRun::new(three_groups(), t(0));
    type Case = (
        u64,
        &'static [&'static str],
        &'static [&'static str],
        Option<u64>,
    );
    let cases: &[Case] = &[
        (
            0,
            &["low-a", "low-b", "mid", "top"],
            &["start 0 [low-a:3,low-b:10]"],
            Some(10_000),
        ),
        // One low pod gone: the group goes on.
        (2_000, &["low-b", "mid", "top"], &[], Some(10_000)),
        // Period elapsed with low-b still there: end, and the next group starts at once.
        (
            10_000,
            &["low-b", "mid", "top"],
            &["end 0 elapsed ns/low-b", "start 1000 [mid:3]"],
            Some(30_000),
        ),
        // mid gone well before its 20 s: the top group starts without waiting.
        (
            12_500,
            &["low-b", "top"],
            &["end 1000 gone", "start 100000 [top:3]"],
            Some(17_500),
        ),
        (13_000, &["low-b", "top"], &[], Some(17_500)),
        (14_000, &["low-b"], &["end 100000 gone", "release"], None),
        // Nothing after the release.
        (20_000, &[], &[], None),
    ];
    for &(now, present, want, deadline) in cases {
        let steps = run.advance(t(now), &uids(present));
        assert_eq!(describe(&steps), want, "at {now} ms");
        assert_eq!(run.deadline(), deadline.map(t), "deadline at {now} ms");
    }
    assert!(run.is_finished());
    assert_eq!(run.released(), Some(t(14_000)));
    let rec: Vec<(i32, u64, Option<u64>)> = run
        .records()
        .iter()
        .map(|r| {
            (
                r.priority,
                r.started.since_origin().as_millis() as u64,
                r.ended.map(|e| e.since_origin().as_millis() as u64),
            )
        })
        .collect();
    assert_eq!(
        rec,
        vec![
            (0, 0, Some(10_000)),
            (1_000, 10_000, Some(12_500)),
            (100_000, 12_500, Some(14_000))
        ]
    );
}

#[test]
fn run_without_pods_releases_at_once_and_abort_stops_early() {
    let mut run = ShutdownRun::new(ShutdownPlan::default(), t(5));
    assert_eq!(
        describe(&run.advance(t(5), &BTreeSet::new())),
        vec!["release"]
    );
    assert_eq!(run.released(), Some(t(5)));

    let mut run = ShutdownRun::new(three_groups(), t(0));
    run.advance(t(0), &uids(&["low-a", "low-b", "mid", "top"]));
    assert_eq!(run.current_pods().len(), 2);
    let step = run.abort(t(1_000), &uids(&["low-b", "mid", "top"]));
    assert_eq!(
        describe(&step.into_iter().collect::<Vec<_>>()),
        vec!["end 0 elapsed ns/low-b"]
    );
    assert!(run.is_finished());
    assert_eq!(run.deadline(), None);
    assert!(
        run.advance(t(2_000), &BTreeSet::new()).is_empty(),
        "no group starts after an abort"
    );
    assert!(run.abort(t(3_000), &BTreeSet::new()).is_none());
}

/// Pods gone before their group starts (deleted by someone else) end the group on the next
/// call, without waiting for its period.
#[test]
fn pods_gone_early_do_not_hold_their_group() {
    let mut run = ShutdownRun::new(three_groups(), t(0));
    assert_eq!(
        describe(&run.advance(t(0), &uids(&["low-a", "low-b"]))),
        vec!["start 0 [low-a:3,low-b:10]"]
    );
    assert_eq!(
        describe(&run.advance(t(100), &uids(&[]))),
        vec!["end 0 gone", "start 1000 [mid:3]"]
    );
    assert_eq!(
        describe(&run.advance(t(200), &uids(&[]))),
        vec!["end 1000 gone", "start 100000 [top:3]"]
    );
    assert_eq!(
        describe(&run.advance(t(300), &uids(&[]))),
        vec!["end 100000 gone", "release"]
    );
}

#[test]
fn role_follows_policy_only_when_the_kubelet_holds_a_lock() {
    use KubeletInhibitorPolicy::*;
    let cases = [
        (TakeOver, false, Role::Terminate),
        (Cooperate, false, Role::Terminate),
        (StandAside, false, Role::Terminate),
        (TakeOver, true, Role::Terminate),
        (Cooperate, true, Role::Observe),
        (StandAside, true, Role::Passive),
    ];
    for (policy, kubelet, want) in cases {
        assert_eq!(role(policy, kubelet), want, "{policy:?} kubelet={kubelet}");
    }
}

#[test]
fn kubelet_inhibitor_is_recognised() {
    let inh = |what: &str, who: &str, mode: &str| Inhibitor {
        what: what.into(),
        who: who.into(),
        why: "Kubelet needs time to handle node shutdown".into(),
        mode: mode.into(),
        uid: 0,
        pid: 42,
    };
    let cases = [
        (vec![inh("shutdown", "kubelet", "delay")], true),
        (vec![inh("sleep:shutdown", "kubelet", "delay")], true),
        (vec![inh("shutdown", "kubelet", "block")], false),
        (vec![inh("sleep", "kubelet", "delay")], false),
        (
            vec![
                inh("shutdown", "node-monitor", "delay"),
                inh("handle-power-key", "kubelet", "block"),
            ],
            false,
        ),
        (vec![], false),
    ];
    for (list, want) in cases {
        assert_eq!(kubelet_holds_inhibitor(&list), want, "{list:?}");
    }
}

#[test]
fn inhibit_delay_decisions() {
    let s = Duration::from_secs;
    let cases = [
        (s(30), s(30), true, DelayCheck::Sufficient),
        (s(30), s(60), false, DelayCheck::Sufficient),
        (s(30), s(5), true, DelayCheck::Raise { seconds: 30 }),
        (
            Duration::from_millis(30_200),
            s(5),
            true,
            DelayCheck::Raise { seconds: 31 },
        ),
        (
            s(30),
            s(5),
            false,
            DelayCheck::TooLow {
                needed: s(30),
                allowed: s(5),
            },
        ),
    ];
    for (needed, current, manage, want) in cases {
        assert_eq!(
            inhibit_delay_check(needed, current, manage),
            want,
            "{needed:?} {current:?} {manage}"
        );
    }
    let dropin = logind_dropin(23);
    assert!(
        dropin.contains("[Login]\nInhibitDelayMaxSec=23\n"),
        "{dropin}"
    );
}

#[test]
fn own_dropin_is_told_from_an_edited_one() {
    let own = logind_dropin(29);
    let cases = [
        (own.clone(), true),
        (logind_dropin(0), true),
        (own.replace("=29", "=30"), true),
        (own.replace("=29", "=29s"), false),
        (format!("{own}HandlePowerKey=ignore\n"), false),
        (own.replace("# Written by node-monitor", "# Mine"), false),
        ("[Login]\nInhibitDelayMaxSec=29\n".to_owned(), false),
        (String::new(), false),
    ];
    for (text, want) in cases {
        assert_eq!(is_own_dropin(&text), want, "{text:?}");
    }
}

#[test]
fn reboot_classification() {
    let cases = [
        (true, false, RebootVerdict::BypassedInhibitor),
        (true, true, RebootVerdict::Graceful),
        (false, false, RebootVerdict::NotShutdown),
        (false, true, RebootVerdict::NotShutdown),
    ];
    for (down, preparing, want) in cases {
        assert_eq!(
            classify_reboot(down, preparing),
            want,
            "down={down} preparing={preparing}"
        );
    }
    assert_eq!(group_phase(1_000), "priority_1000");
}

fn req(gate: RebootGate, suppressed: u32) -> RebootRequest {
    RebootRequest { gate, suppressed }
}

#[test]
fn refused_and_unverified_requests_never_become_a_last_gasp() {
    use RebootAction::*;
    let t = Timestamp::from_secs(1000);
    // (verdict, suppressed, preparing, actions of a first request)
    let cases = [
        (RebootGate::Allowed, 0, false, vec![Bypassed, LastGasp]),
        (RebootGate::Allowed, 5, true, vec![Graceful]),
        (
            RebootGate::RefusedPidNs,
            0,
            false,
            vec![
                CountRefused {
                    reason: "pid_namespace",
                    n: 1,
                },
                Log {
                    gate: RebootGate::RefusedPidNs,
                    unlogged: 0,
                },
            ],
        ),
        (
            RebootGate::RefusedUserNs,
            0,
            true,
            vec![
                CountRefused {
                    reason: "user_namespace",
                    n: 1,
                },
                Log {
                    gate: RebootGate::RefusedUserNs,
                    unlogged: 0,
                },
            ],
        ),
        (
            // The probe withheld 9 before this one: all ten are counted and said.
            RebootGate::RefusedCap,
            9,
            false,
            vec![
                CountRefused {
                    reason: "capability",
                    n: 10,
                },
                Log {
                    gate: RebootGate::RefusedCap,
                    unlogged: 9,
                },
            ],
        ),
        (
            RebootGate::RefusedMagic,
            0,
            false,
            vec![
                CountRefused {
                    reason: "magic",
                    n: 1,
                },
                Log {
                    gate: RebootGate::RefusedMagic,
                    unlogged: 0,
                },
            ],
        ),
        (
            RebootGate::Unverified,
            2,
            false,
            vec![
                CountUnverified { n: 3 },
                Log {
                    gate: RebootGate::Unverified,
                    unlogged: 2,
                },
            ],
        ),
        (
            RebootGate::NotShutdown,
            0,
            false,
            vec![Log {
                gate: RebootGate::NotShutdown,
                unlogged: 0,
            }],
        ),
    ];
    for (gate, suppressed, preparing, want) in cases {
        let mut state = RebootRequests::default();
        assert_eq!(
            state.on_request(req(gate, suppressed), preparing, t),
            want,
            "{gate:?} suppressed={suppressed} preparing={preparing}"
        );
    }
}

#[test]
fn a_flood_of_refused_requests_is_counted_and_logged_once_per_interval() {
    let mut state = RebootRequests::default();
    let t0 = Timestamp::from_secs(50);
    let mut logs = Vec::new();
    let mut counted = 0;
    // 1000 refused calls, one every 100 ms, over 100 s.
    for i in 0..1000u64 {
        let now = t0 + Duration::from_millis(100 * i);
        for a in state.on_request(req(RebootGate::RefusedCap, 0), false, now) {
            match a {
                RebootAction::CountRefused { n, .. } => counted += n,
                RebootAction::Log { unlogged, .. } => logs.push((now, unlogged)),
                other => panic!("a refused request must not do {other:?}"),
            }
        }
    }
    assert_eq!(counted, 1000);
    // At t0, t0 + 60 s: the second line says 599 went unlogged.
    assert_eq!(logs, vec![(t0, 0), (t0 + Duration::from_secs(60), 599)]);
    // Another verdict has its own interval.
    let actions = state.on_request(
        req(RebootGate::RefusedPidNs, 0),
        false,
        t0 + Duration::from_secs(1),
    );
    assert!(actions.contains(&RebootAction::Log {
        gate: RebootGate::RefusedPidNs,
        unlogged: 0
    }));
}

#[test]
fn last_gasps_are_rate_limited() {
    use RebootAction::*;
    let mut state = RebootRequests::default();
    let t0 = Timestamp::from_secs(5);
    let allowed = req(RebootGate::Allowed, 0);
    assert_eq!(
        state.on_request(allowed, false, t0),
        vec![Bypassed, LastGasp]
    );
    // A privileged process calling again and again (the node stayed up): counted, no write.
    for s in [1, 30, 599] {
        assert_eq!(
            state.on_request(allowed, false, t0 + Duration::from_secs(s)),
            vec![Bypassed, LastGaspSuppressed { previous: t0 }],
            "{s}s later"
        );
    }
    // A graceful shutdown in between neither sends nor resets anything.
    assert_eq!(
        state.on_request(allowed, true, t0 + Duration::from_secs(300)),
        vec![Graceful]
    );
    // Refused requests never touch the last-gasp interval.
    let _ = state.on_request(
        req(RebootGate::RefusedCap, 0),
        false,
        t0 + Duration::from_secs(400),
    );
    let later = t0 + LAST_GASP_MIN_INTERVAL;
    assert_eq!(
        state.on_request(allowed, false, later),
        vec![Bypassed, LastGasp]
    );
    assert_eq!(
        state.on_request(allowed, false, later + Duration::from_secs(1)),
        vec![Bypassed, LastGaspSuppressed { previous: later }]
    );
}

#[test]
fn an_allowed_verdict_the_fields_contradict_is_not_trusted() {
    const RESTART: u32 = 0x0123_4567;
    let root = RebootCaller {
        cap_effective: 1 << 22,
        pid_ns_level: 0,
        user_ns_level: 0,
    };
    let child = RebootCaller {
        pid_ns_level: 1,
        ..root
    };
    let m1 = 0xfee1_dead;
    let m2 = 672_274_793;
    let cases = [
        (
            RebootGate::Allowed,
            Some(root),
            m1,
            m2,
            RESTART,
            RebootGate::Allowed,
        ),
        (
            RebootGate::Allowed,
            Some(child),
            m1,
            m2,
            RESTART,
            RebootGate::RefusedPidNs,
        ),
        (
            RebootGate::Allowed,
            None,
            m1,
            m2,
            RESTART,
            RebootGate::Unverified,
        ),
        (
            RebootGate::Allowed,
            Some(root),
            m1,
            3,
            RESTART,
            RebootGate::RefusedMagic,
        ),
        (
            RebootGate::Allowed,
            Some(root),
            m1,
            m2,
            0,
            RebootGate::NotShutdown,
        ),
        // A refusal is kept as reported.
        (
            RebootGate::RefusedCap,
            Some(root),
            m1,
            m2,
            RESTART,
            RebootGate::RefusedCap,
        ),
        (
            RebootGate::Unverified,
            None,
            m1,
            m2,
            RESTART,
            RebootGate::Unverified,
        ),
    ];
    for (reported, caller, a, b, cmd, want) in cases {
        assert_eq!(
            effective_gate(reported, caller, a, b, cmd),
            want,
            "{reported:?} {caller:?}"
        );
    }
}
