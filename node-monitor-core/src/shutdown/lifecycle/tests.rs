use super::*;
use crate::shutdown::{
    Group, GroupOutcome, KubeletInhibitorPolicy, RebootRequest, config::ShutdownOptions,
};
use node_monitor_common::logic::RebootGate;

fn t(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// Two groups: priority 0 for 20s, priority 1000 for 10s; budget 30s, needed 35s.
fn cfg(options: ShutdownOptions) -> ShutdownConfig {
    ShutdownConfig {
        groups: vec![
            Group {
                priority: 0,
                period: Duration::from_secs(20),
            },
            Group {
                priority: 1000,
                period: Duration::from_secs(10),
            },
        ],
        options,
        ..ShutdownConfig::default()
    }
}

fn opts() -> ShutdownOptions {
    ShutdownOptions {
        enabled: true,
        ..ShutdownOptions::default()
    }
}

fn pod(name: &str, priority: i32) -> ShutdownPod {
    ShutdownPod {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        priority,
        termination_grace_period_seconds: None,
    }
}

fn held() -> Action {
    Action::PublishAtRest {
        reason: "InhibitorHeld",
        message: "node-monitor delays shutdowns up to 30s to terminate pods by priority".into(),
    }
}

/// A manager connected to logind, with `kubelet` telling whether the kubelet holds a lock.
fn connected(options: ShutdownOptions, kubelet: bool) -> Lifecycle {
    let mut lc = Lifecycle::new(cfg(options));
    lc.step(Event::Started, t(0));
    lc.step(Event::LogindConnected, t(0));
    lc.step(Event::InhibitorsListed { kubelet }, t(0));
    lc
}

fn names(a: &Action) -> Vec<String> {
    match a {
        Action::DeletePods(pods) => pods.iter().map(|p| p.pod.name.clone()).collect(),
        _ => Vec::new(),
    }
}

fn present(names: &[&str]) -> Event {
    Event::PodsPresent(Some(
        names.iter().map(|n| (format!("uid-{n}"), false)).collect(),
    ))
}

#[test]
fn start_clears_stale_marks_and_retries_what_failed() {
    let mut lc = Lifecycle::new(cfg(opts()));
    assert_eq!(
        lc.step(Event::Started, t(0)),
        [Action::ClearStaleTaint, Action::ReadCordonAnnotation]
    );
    // The node carries node-monitor's cordon annotation: uncordon.
    assert_eq!(
        lc.step(Event::CordonAnnotationRead(Some(true)), t(0)),
        [Action::Uncordon]
    );
    assert!(lc.step(Event::Uncordoned { ok: false }, t(0)).is_empty());
    assert!(lc.marks().cordoned, "an uncordon that failed stays to do");
    assert!(
        lc.step(Event::StaleTaintCleared { ok: false }, t(0))
            .is_empty()
    );
    lc.step(Event::LogindConnected, t(0));
    lc.step(Event::InhibitorsListed { kubelet: false }, t(0));
    // The taint failed: the retry clears again (and publishes the condition, not yet answered).
    assert_eq!(
        lc.step(Event::RetryTick, t(2000)),
        [
            Action::ClearStaleTaint,
            Action::ReadCordonAnnotation,
            held()
        ]
    );
    lc.step(Event::StaleTaintCleared { ok: true }, t(2000));
    lc.step(Event::CordonAnnotationRead(Some(false)), t(2000));
    lc.step(Event::AtRestPublished { ok: true }, t(2000));
    assert!(lc.step(Event::RetryTick, t(4000)).is_empty());
    // A node that could not be read is retried too.
    let mut lc = Lifecycle::new(cfg(opts()));
    lc.step(Event::Started, t(0));
    lc.step(Event::StaleTaintCleared { ok: true }, t(0));
    lc.step(Event::CordonAnnotationRead(None), t(0));
    lc.step(Event::AtRestPublished { ok: true }, t(0));
    assert_eq!(
        lc.step(Event::RetryTick, t(2000)),
        [Action::ClearStaleTaint, Action::ReadCordonAnnotation]
    );
}

#[test]
fn connecting_takes_the_lock_by_role_and_publishes_the_condition_at_rest() {
    use KubeletInhibitorPolicy::*;
    let passive = Action::PublishAtRest {
        reason: "KubeletHandlesShutdown",
        message: "the kubelet holds a shutdown inhibitor; node-monitor only watches".into(),
    };
    let none = Action::PublishAtRest {
        reason: "NoInhibitor",
        message: "no shutdown groups configured; shutdowns are watched only".into(),
    };
    let cases = [
        (
            TakeOver,
            false,
            true,
            Role::Terminate,
            vec![Action::TakeLock, held()],
        ),
        (
            TakeOver,
            true,
            true,
            Role::Terminate,
            vec![Action::TakeLock, held()],
        ),
        (
            Cooperate,
            false,
            true,
            Role::Terminate,
            vec![Action::TakeLock, held()],
        ),
        (
            Cooperate,
            true,
            true,
            Role::Observe,
            vec![Action::TakeLock, held()],
        ),
        (
            StandAside,
            false,
            true,
            Role::Terminate,
            vec![Action::TakeLock, held()],
        ),
        (StandAside, true, true, Role::Passive, vec![passive]),
        // No groups: no lock.
        (Cooperate, false, false, Role::Terminate, vec![none]),
    ];
    for (policy, kubelet, groups, want_role, want) in cases {
        let mut c = cfg(ShutdownOptions {
            kubelet_inhibitor_policy: policy,
            ..opts()
        });
        if !groups {
            c.groups.clear();
        }
        let mut lc = Lifecycle::new(c);
        assert_eq!(
            lc.step(Event::LogindConnected, t(0)),
            [Action::ReadInhibitDelay, Action::ListInhibitors]
        );
        let got = lc.step(Event::InhibitorsListed { kubelet }, t(0));
        assert_eq!(got, want, "{policy:?} kubelet={kubelet} groups={groups}");
        assert_eq!(lc.role(), want_role);
        assert_eq!(lc.holds_lock(), got.contains(&Action::TakeLock));
    }
}

#[test]
fn the_inhibit_delay_is_raised_when_allowed_and_reported_when_short() {
    let s = Duration::from_secs;
    let short = |allowed: u64| {
        Action::DelayTooShort(format!(
            "the shutdown groups need 35s but logind's InhibitDelayMaxSec allows {allowed}s; raise it (nodeMonitor.shutdown.manageInhibitDelay) or shorten the groups"
        ))
    };
    // (manage, read, raised, actions on the read, actions on the raise's answer)
    type Case = (
        bool,
        Option<Duration>,
        Option<Option<Duration>>,
        Vec<Action>,
        Vec<Action>,
    );
    let cases: [Case; 6] = [
        (true, None, None, vec![], vec![]),
        (true, Some(s(35)), None, vec![], vec![]),
        (false, Some(s(5)), None, vec![short(5)], vec![]),
        (
            true,
            Some(s(5)),
            Some(Some(s(35))),
            vec![Action::RaiseInhibitDelay { seconds: 35 }],
            vec![],
        ),
        // A later drop-in overrides node-monitor's: still short after the reload.
        (
            true,
            Some(s(5)),
            Some(Some(s(30))),
            vec![Action::RaiseInhibitDelay { seconds: 35 }],
            vec![short(30)],
        ),
        // Raising failed: the delay read before counts.
        (
            true,
            Some(s(5)),
            Some(None),
            vec![Action::RaiseInhibitDelay { seconds: 35 }],
            vec![short(5)],
        ),
    ];
    for (manage, read, raised, on_read, on_raise) in cases {
        let mut lc = Lifecycle::new(cfg(ShutdownOptions {
            manage_inhibit_delay: manage,
            ..opts()
        }));
        assert_eq!(
            lc.step(Event::InhibitDelayRead(read), t(0)),
            on_read,
            "{read:?}"
        );
        if let Some(raised) = raised {
            assert_eq!(
                lc.step(Event::InhibitDelayRaised(raised), t(0)),
                on_raise,
                "{raised:?}"
            );
        }
    }
}

#[test]
fn a_shutdown_deletes_groups_in_priority_order_each_until_gone_or_its_period() {
    let mut lc = connected(opts(), false);
    assert_eq!(
        lc.step(Event::PrepareForShutdown(true), t(1000)),
        [
            Action::PhaseStart("total".into()),
            Action::MarkNode {
                cordon: false,
                message: "systemd-logind announced a shutdown; node-monitor terminates pods by priority group within 30s".into()
            },
            Action::ListPodsForPlan,
        ]
    );
    assert!(lc.preparing() && lc.running());
    let got = lc.step(
        Event::PodsListed(vec![pod("crit", 2000), pod("a", 0), pod("b", 5)]),
        t(1100),
    );
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(
        got[0],
        Action::Planned {
            pods: 3,
            groups: BTreeMap::from([(0, 2), (1000, 1)])
        }
    );
    assert_eq!(got[1], Action::PhaseStart("priority_0".into()));
    assert_eq!(
        got[2],
        Action::GroupStarted {
            priority: 0,
            pods: 2
        }
    );
    assert_eq!(names(&got[3]), ["a", "b"]);
    // One deletion failed: retried at the next look, the other is not sent again.
    lc.step(Event::PodsDeleted(vec!["uid-a".into()]), t(1200));
    assert_eq!(lc.next_wake(t(1200)), Some(t(1450)), "the poll interval");
    assert_eq!(lc.step(Event::Wake, t(1450)), [Action::ListPresent]);
    let got = lc.step(present(&["a", "b", "crit"]), t(1460));
    assert_eq!(got.iter().map(names).collect::<Vec<_>>(), [["b"]]);
    lc.step(Event::PodsDeleted(vec!["uid-b".into()]), t(1470));
    assert!(lc.step(present(&["a", "crit"]), t(1700)).is_empty());
    // Both gone: the next group starts at once.
    let got = lc.step(present(&["crit"]), t(2000));
    assert_eq!(
        got[..3],
        [
            Action::PhaseEnd("priority_0".into()),
            Action::GroupEnded {
                priority: 0,
                outcome: GroupOutcome::AllGone
            },
            Action::PhaseStart("priority_1000".into()),
        ]
    );
    assert_eq!(names(&got[4]), ["crit"]);
    lc.step(Event::PodsDeleted(vec!["uid-crit".into()]), t(2000));
    // The group's end is the next wake when it comes before the poll.
    assert_eq!(lc.next_wake(t(11_900)), Some(t(12_000)));
    lc.step(Event::Wake, t(12_000));
    let got = lc.step(present(&["crit"]), t(12_000));
    assert_eq!(
        got,
        [
            Action::PhaseEnd("priority_1000".into()),
            Action::GroupEnded {
                priority: 1000,
                outcome: GroupOutcome::PeriodElapsed {
                    remaining: vec!["ns/crit".into()]
                }
            },
            Action::Release {
                total: Duration::from_millis(10_900)
            },
            Action::AwaitMarks,
            Action::NodeEvent(EVENT_FINISHED),
        ]
    );
    assert!(!lc.holds_lock());
    let marks = Marks {
        condition: true,
        taint: true,
        cordoned: false,
    };
    assert!(lc.step(Event::NodeMarked(marks), t(12_000)).is_empty());
    assert!(!lc.running() && lc.preparing());
    assert_eq!(lc.marks(), marks);
    // Once the machine goes, a stop keeps the drop-in.
    assert_eq!(
        lc.step(Event::StopRequested, t(12_100)),
        [Action::ReleaseLock]
    );
}

#[test]
fn a_plan_without_pods_releases_at_once_and_an_unanswered_list_keeps_pods_present() {
    let mut lc = connected(opts(), false);
    lc.step(Event::PrepareForShutdown(true), t(0));
    assert_eq!(
        lc.step(Event::PodsListed(Vec::new()), t(10)),
        [
            Action::Planned {
                pods: 0,
                groups: BTreeMap::new()
            },
            // Counted from the plan, as the groups are.
            Action::Release {
                total: Duration::ZERO
            },
            Action::AwaitMarks,
            Action::NodeEvent(EVENT_FINISHED),
        ]
    );
    let mut lc = connected(opts(), false);
    lc.step(Event::PrepareForShutdown(true), t(0));
    lc.step(Event::PodsListed(vec![pod("a", 0)]), t(0));
    lc.step(Event::PodsDeleted(vec!["uid-a".into()]), t(0));
    // The API cannot answer: the pod counts as present until the period ends.
    assert!(lc.step(Event::PodsPresent(None), t(5000)).is_empty());
    let got = lc.step(Event::PodsPresent(None), t(20_000));
    assert!(got.contains(&Action::Release {
        total: Duration::from_secs(20)
    }));
}

#[test]
fn the_observer_deletes_nothing_and_waits_for_pods_to_finish() {
    let mut lc = connected(opts(), true);
    assert_eq!(lc.role(), Role::Observe);
    lc.step(Event::PrepareForShutdown(true), t(0));
    let got = lc.step(Event::PodsListed(vec![pod("a", 0)]), t(0));
    assert!(
        !got.iter().any(|a| matches!(a, Action::DeletePods(_))),
        "{got:?}"
    );
    // Failed in the API (the kubelet killed it): finished.
    let got = lc.step(
        Event::PodsPresent(Some(vec![("uid-a".into(), true)])),
        t(100),
    );
    assert!(got.contains(&Action::GroupEnded {
        priority: 0,
        outcome: GroupOutcome::AllGone
    }));
    // The terminator waits for a finished pod to be gone.
    let mut lc = connected(opts(), false);
    lc.step(Event::PrepareForShutdown(true), t(0));
    lc.step(Event::PodsListed(vec![pod("a", 0)]), t(0));
    lc.step(Event::PodsDeleted(vec!["uid-a".into()]), t(0));
    assert!(
        lc.step(
            Event::PodsPresent(Some(vec![("uid-a".into(), true)])),
            t(100)
        )
        .is_empty()
    );
}

#[test]
fn passive_marks_nothing_and_takes_no_lock_on_a_cancellation() {
    let mut lc = connected(
        ShutdownOptions {
            kubelet_inhibitor_policy: KubeletInhibitorPolicy::StandAside,
            ..opts()
        },
        true,
    );
    assert!(lc.step(Event::PrepareForShutdown(true), t(0)).is_empty());
    assert!(lc.preparing() && !lc.running());
    assert_eq!(
        lc.step(Event::PrepareForShutdown(false), t(10)),
        [Action::PublishAtRest {
            reason: "KubeletHandlesShutdown",
            message: "the kubelet holds a shutdown inhibitor; node-monitor only watches".into()
        }]
    );
    assert!(!lc.preparing());
}

#[test]
fn a_cancellation_during_the_run_stops_it_and_undoes_only_the_marks_that_took() {
    for cordoned in [true, false] {
        let mut lc = connected(
            ShutdownOptions {
                cordon: true,
                ..opts()
            },
            false,
        );
        lc.step(Event::PrepareForShutdown(true), t(0));
        lc.step(Event::PodsListed(vec![pod("a", 0), pod("c", 1000)]), t(0));
        assert_eq!(
            lc.step(Event::PrepareForShutdown(false), t(500)),
            [Action::ListPresent]
        );
        assert_eq!(
            lc.step(present(&["a", "c"]), t(600)),
            [
                Action::PhaseEnd("priority_0".into()),
                Action::PhaseEnd("total".into()),
                Action::RunCancelled,
                Action::AwaitMarks,
            ]
        );
        // A cordon found on the node is someone else's: not claimed, not undone.
        let marks = Marks {
            condition: true,
            taint: true,
            cordoned,
        };
        assert!(lc.step(Event::NodeMarked(marks), t(700)).is_empty());
        assert!(!lc.running());
        // The adapter delivers the cancellation again once the run ended.
        let mut want = vec![
            Action::TakeLock,
            Action::NodeEvent(EVENT_CANCELLED),
            Action::RemoveTaint,
        ];
        if cordoned {
            want.push(Action::Uncordon);
        }
        want.push(held());
        assert_eq!(lc.step(Event::PrepareForShutdown(false), t(800)), want);
        assert!(!lc.preparing() && lc.holds_lock());
        lc.step(Event::TaintRemoved { ok: true }, t(800));
        lc.step(Event::Uncordoned { ok: true }, t(800));
        assert!(!lc.marks().taint);
        assert!(!lc.marks().cordoned);
    }
}

#[test]
fn a_cancellation_at_rest_takes_the_lock_again_and_a_stop_removes_the_dropin() {
    let mut lc = connected(opts(), false);
    assert_eq!(
        lc.step(Event::PrepareForShutdown(false), t(0)),
        [Action::TakeLock, Action::NodeEvent(EVENT_CANCELLED), held()]
    );
    assert_eq!(
        lc.step(Event::StopRequested, t(10)),
        [Action::ReleaseLock, Action::RemoveDropin]
    );
    let mut lc = connected(
        ShutdownOptions {
            manage_inhibit_delay: false,
            ..opts()
        },
        false,
    );
    assert_eq!(lc.step(Event::StopRequested, t(10)), [Action::ReleaseLock]);
}

#[test]
fn a_bypassing_reboot_sends_one_last_gasp_in_ten_minutes_and_retracts_it_after_thirty_seconds() {
    for (mode, remove_annotation) in [(LastGasp::Condition, false), (LastGasp::Annotation, true)] {
        let mut lc = connected(
            ShutdownOptions {
                last_gasp: mode,
                ..opts()
            },
            false,
        );
        lc.step(Event::AtRestPublished { ok: true }, t(0));
        let allowed = Event::Reboot(RebootRequest {
            gate: RebootGate::Allowed,
            suppressed: 0,
        });
        assert_eq!(
            lc.step(allowed.clone(), t(1000)),
            [Action::Reboot(RebootAction::Bypassed), Action::LastGasp]
        );
        lc.step(Event::LastGaspAnswered, t(1500));
        assert_eq!(
            lc.step(allowed.clone(), t(2000)),
            [
                Action::Reboot(RebootAction::Bypassed),
                Action::Reboot(RebootAction::LastGaspSuppressed { previous: t(1000) })
            ]
        );
        assert!(
            lc.step(Event::RetryTick, t(31_500)).is_empty(),
            "30s not over"
        );
        assert_eq!(
            lc.step(Event::RetryTick, t(31_501)),
            [Action::RetractLastGasp { remove_annotation }, held()]
        );
        assert!(lc.step(Event::RetryTick, t(60_000)).is_empty());
    }
}

#[test]
fn reboots_during_a_shutdown_are_graceful_and_refused_ones_are_counted() {
    let mut lc = connected(opts(), false);
    let refused = Event::Reboot(RebootRequest {
        gate: RebootGate::RefusedPidNs,
        suppressed: 2,
    });
    assert_eq!(
        lc.step(refused, t(0)),
        [
            Action::Reboot(RebootAction::CountRefused {
                reason: "pid_namespace",
                n: 3
            }),
            Action::Reboot(RebootAction::Log {
                gate: RebootGate::RefusedPidNs,
                unlogged: 2
            })
        ]
    );
    lc.step(Event::PrepareForShutdown(true), t(0));
    lc.step(Event::PodsListed(vec![pod("a", 0)]), t(0));
    // During the run the running group is looked at again after the reboot.
    assert_eq!(
        lc.step(
            Event::Reboot(RebootRequest {
                gate: RebootGate::Allowed,
                suppressed: 0
            }),
            t(100)
        ),
        [Action::Reboot(RebootAction::Graceful), Action::ListPresent]
    );
    // A repeated PrepareForShutdown(true) changes nothing but a look.
    assert_eq!(
        lc.step(Event::PrepareForShutdown(true), t(200)),
        [Action::ListPresent]
    );
}

#[test]
fn logind_loss_degrades_outside_a_shutdown_and_a_restart_takes_the_lock_again() {
    let mut lc = connected(opts(), false);
    assert!(lc.holds_lock());
    assert_eq!(
        lc.step(
            Event::LogindLost {
                error: "the system bus connection ended".into()
            },
            t(0)
        ),
        [
            Action::LockLost,
            Action::Degraded("shutdown inhibitor: the system bus connection ended".into())
        ]
    );
    assert!(!lc.holds_lock());
    assert_eq!(
        lc.step(Event::LogindRestarted, t(1000)),
        [Action::TakeLock, Action::ReadInhibitDelay]
    );
    // During a shutdown the bus goes away with the machine: no degradation, no new lock.
    lc.step(Event::PrepareForShutdown(true), t(2000));
    assert_eq!(
        lc.step(
            Event::LogindLost {
                error: "gone".into()
            },
            t(3000)
        ),
        [Action::LockLost]
    );
    assert_eq!(
        lc.step(Event::LogindRestarted, t(4000)),
        [Action::ReadInhibitDelay]
    );
}
