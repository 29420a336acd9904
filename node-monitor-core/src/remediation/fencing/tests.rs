use super::*;
use crate::remediation::{test_support::*, *};

fn policy() -> FencingPolicy {
    FencingPolicy {
        method_timeout: Duration::from_secs(60),
        step_retries: 1,
        retry_backoff: Duration::from_secs(5),
        unconfirmed_retry_interval: Duration::from_secs(60),
        power_management_after_isolation: Some(Duration::from_secs(300)),
    }
}

fn ctx(now_s: i64) -> OpContext {
    OpContext {
        now: now_s * 1000,
        node_present: true,
        node_back: false,
        executing: false,
        may_fence: true,
        configured: ConfiguredSteps {
            isolation: true,
            power_management: true,
            recovery: true,
        },
        // The kubelet is back and no pod of before the fence is left.
        kubelet: KubeletReturn {
            rebooted: false,
            ready_again: true,
            old_pods: Some(0),
        },
    }
}

fn kinds(actions: &[OpAction]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            OpAction::Run(s) => format!("run:{}", s.as_str()),
            OpAction::Notify(n) => format!("event:{}", n.reason),
            other => format!("{other:?}").to_lowercase(),
        })
        .collect()
}

/// Drives an operation through a script of (event, context) and checks the phase and the
/// actions after each.
fn script(steps: &[(OpEvent, OpContext, &str, &[&str])]) -> FenceOp {
    let mut op = new_op();
    for (i, (ev, c, phase, want)) in steps.iter().enumerate() {
        let t = advance(&op, ev, c, &policy());
        assert_eq!(t.op.phase.label(), *phase, "step {i}: {ev:?} → {:?}", t.op);
        assert_eq!(kinds(&t.actions), *want, "step {i}: {ev:?}");
        op = t.op;
    }
    op
}

fn ok(step: Step) -> OpEvent {
    OpEvent::StepDone {
        step,
        result: Ok(()),
    }
}

fn fail(step: Step) -> OpEvent {
    OpEvent::StepDone {
        step,
        result: Err("exit status 1".into()),
    }
}

fn executing(mut c: OpContext) -> OpContext {
    c.executing = true;
    c
}

fn back(mut c: OpContext) -> OpContext {
    c.node_back = true;
    c
}

/// The node's bootID changed since it was found dead.
fn rebooted(mut c: OpContext) -> OpContext {
    c.kubelet.rebooted = true;
    c
}

#[test]
fn isolation_success_releases_then_recovery_when_the_node_is_back() {
    let released = OpEvent::ReleaseDone {
        result: Ok(ReleaseSummary {
            pods_deleted: 2,
            volume_attachments: 1,
        }),
    };
    let op = script(&[
        (OpEvent::Tick, ctx(0), "fencing", &["run:isolation"]),
        (OpEvent::Tick, executing(ctx(1)), "fencing", &[]),
        (
            ok(Step::Isolation),
            ctx(2),
            "releasing",
            &["event:FencingConfirmed"],
        ),
        (OpEvent::Tick, ctx(2), "releasing", &["release"]),
        (released, ctx(2), "released", &["event:NodeReleased"]),
        (OpEvent::Tick, ctx(100), "released", &[]),
        (
            OpEvent::Tick,
            back(ctx(120)),
            "recovering",
            &["event:NodeBack"],
        ),
        // Isolated, never powered off: back without a reboot is held.
        (
            OpEvent::Tick,
            back(ctx(120)),
            "recovering",
            &["event:RecoveryHeld"],
        ),
        (
            OpEvent::Tick,
            rebooted(back(ctx(121))),
            "recovering",
            &["run:recovery"],
        ),
        (ok(Step::Recovery), back(ctx(121)), "recovering", &[]),
        (
            OpEvent::Tick,
            back(ctx(121)),
            "recovering",
            &["removetaint"],
        ),
        (
            OpEvent::TaintRemoved { result: Ok(()) },
            back(ctx(121)),
            "recovering",
            &["event:NodeRecovered", "forget"],
        ),
    ]);
    assert_eq!(op.confirmed_by, Some(Step::Isolation));
    assert_eq!(op.released_at, Some(2_000));
}

#[test]
fn failing_steps_never_release_and_end_unconfirmed() {
    let op = script(&[
        (OpEvent::Tick, ctx(0), "fencing", &["run:isolation"]),
        (
            fail(Step::Isolation),
            ctx(1),
            "fencing",
            &["event:FenceStepFailed"],
        ),
        (OpEvent::Tick, ctx(3), "fencing", &[]), // backoff: 5 s
        (OpEvent::Tick, ctx(6), "fencing", &["run:isolation"]),
        // Retries exhausted (1 retry): power management next.
        (
            fail(Step::Isolation),
            ctx(7),
            "fencing",
            &["event:FenceStepFailed"],
        ),
        (OpEvent::Tick, ctx(7), "fencing", &["run:power_management"]),
        (
            fail(Step::PowerManagement),
            ctx(8),
            "fencing",
            &["event:FenceStepFailed"],
        ),
        (OpEvent::Tick, ctx(13), "fencing", &["run:power_management"]),
        (
            fail(Step::PowerManagement),
            ctx(14),
            "unconfirmed",
            &["event:FenceStepFailed", "event:FencingUnconfirmed"],
        ),
        (OpEvent::Tick, ctx(30), "unconfirmed", &[]),
        // A new cycle after the unconfirmed pause.
        (OpEvent::Tick, ctx(74), "fencing", &[]),
        (OpEvent::Tick, ctx(74), "fencing", &["run:isolation"]),
    ]);
    assert_eq!(op.cycles, 1);
    assert_eq!(op.released_at, None);
    assert_eq!(op.confirmed_by, None);
}

#[test]
fn power_management_confirms_when_isolation_is_not_configured() {
    let mut c = ctx(0);
    c.configured.isolation = false;
    script(&[
        (OpEvent::Tick, c, "fencing", &[]),
        (OpEvent::Tick, c, "fencing", &["run:power_management"]),
        (
            ok(Step::PowerManagement),
            c,
            "releasing",
            &["event:FencingConfirmed"],
        ),
    ]);
}

#[test]
fn no_steps_configured_is_never_released() {
    let mut c = ctx(0);
    c.configured = ConfiguredSteps::default();
    let op = script(&[
        (
            OpEvent::Tick,
            c,
            "unconfirmed",
            &["event:FencingUnconfirmed"],
        ),
        (OpEvent::Tick, c, "unconfirmed", &[]),
    ]);
    assert_eq!(op.released_at, None);
}

#[test]
fn storm_protection_holds_new_attempts_and_releases() {
    let mut hold = ctx(0);
    hold.may_fence = false;
    let mut hold8 = ctx(8);
    hold8.may_fence = false;
    script(&[
        (OpEvent::Tick, hold, "fencing", &[]),
        (OpEvent::Tick, ctx(1), "fencing", &["run:isolation"]),
        (
            ok(Step::Isolation),
            hold,
            "releasing",
            &["event:FencingConfirmed"],
        ),
        // Confirmed, but storm protection blocks now: the release waits.
        (OpEvent::Tick, hold, "releasing", &[]),
        (OpEvent::Tick, ctx(2), "releasing", &["release"]),
        // A failed release is retried only while storm protection allows it.
        (
            OpEvent::ReleaseDone {
                result: Err("conflict".into()),
            },
            ctx(2),
            "releasing",
            &["event:ReleaseFailed"],
        ),
        (OpEvent::Tick, hold8, "releasing", &[]),
        (OpEvent::Tick, ctx(8), "releasing", &["release"]),
    ]);
}

#[test]
fn a_stored_release_without_a_confirmed_step_is_refused() {
    // State written by someone else (or an older version): releasing, nothing confirmed.
    let mut op = new_op();
    op.phase = Phase::Releasing;
    op.confirmed_by = None;
    let t = advance(&op, &OpEvent::Tick, &ctx(0), &policy());
    assert_eq!(kinds(&t.actions), ["event:ReleaseRefused"]);
    assert_eq!(
        t.op.phase,
        Phase::Fencing {
            step: Step::Isolation
        }
    );
    let t = advance(&t.op, &OpEvent::Tick, &ctx(0), &policy());
    assert_eq!(kinds(&t.actions), ["run:isolation"]);
}

#[test]
fn node_back_while_fencing_cancels_and_recovers_without_release() {
    let op = script(&[
        (OpEvent::Tick, ctx(0), "fencing", &["run:isolation"]),
        (
            OpEvent::Tick,
            executing(back(ctx(1))),
            "recovering",
            &["cancel", "event:NodeBack"],
        ),
        // The cancelled step's late result is ignored.
        (ok(Step::Isolation), back(ctx(2)), "recovering", &[]),
        (OpEvent::Tick, back(ctx(2)), "recovering", &["run:recovery"]),
        (
            fail(Step::Recovery),
            back(ctx(3)),
            "recovering",
            &["event:RecoveryFailed"],
        ),
        (OpEvent::Tick, back(ctx(4)), "recovering", &[]),
        (OpEvent::Tick, back(ctx(8)), "recovering", &["run:recovery"]),
    ]);
    assert_eq!(op.released_at, None);
}

#[test]
fn a_step_interrupted_by_a_restart_runs_again() {
    let mut op = new_op();
    op.running = Some(Step::Isolation);
    op.attempts = 1;
    let t = advance(&op, &OpEvent::Tick, &ctx(10), &policy());
    assert_eq!(kinds(&t.actions), ["run:isolation"]);
    assert_eq!(t.op.attempts, 2);
    // Round trip through the stored form.
    let json = serde_json::to_string(&t.op).expect("serialize");
    let back: FenceOp = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, t.op);
    assert!(json.contains("\"phase\":{\"name\":\"fencing\""), "{json}");
}

#[test]
fn power_management_follows_an_isolation_release_when_the_node_stays_dead() {
    let mut op = new_op();
    op.phase = Phase::Released;
    op.confirmed_by = Some(Step::Isolation);
    op.released_at = Some(0);
    let cases = [(299, false), (300, true)];
    for (s, runs) in cases {
        let t = advance(&op, &OpEvent::Tick, &ctx(s), &policy());
        assert_eq!(
            t.actions == [OpAction::Run(Step::PowerManagement)],
            runs,
            "at {s}s"
        );
    }
    op.running = Some(Step::PowerManagement);
    let t = advance(&op, &ok(Step::PowerManagement), &ctx(301), &policy());
    assert!(t.op.power_cycled);
    let t = advance(&t.op, &OpEvent::Tick, &ctx(1000), &policy());
    assert!(t.actions.is_empty(), "once only");
}

#[test]
fn a_deleted_node_is_forgotten() {
    let mut c = executing(ctx(0));
    c.node_present = false;
    let t = advance(&new_op(), &OpEvent::Tick, &c, &policy());
    assert_eq!(kinds(&t.actions), ["cancel", "forget"]);
}

#[test]
fn release_failure_is_retried_after_the_backoff() {
    let mut op = new_op();
    op.phase = Phase::Releasing;
    op.confirmed_by = Some(Step::Isolation);
    let t = advance(
        &op,
        &OpEvent::ReleaseDone {
            result: Err("forbidden".into()),
        },
        &ctx(0),
        &policy(),
    );
    assert_eq!(t.op.phase, Phase::Releasing);
    assert!(
        advance(&t.op, &OpEvent::Tick, &ctx(4), &policy())
            .actions
            .is_empty()
    );
    assert_eq!(
        advance(&t.op, &OpEvent::Tick, &ctx(5), &policy()).actions,
        [OpAction::Release]
    );
}

#[test]
fn recovery_after_a_release_waits_until_the_kubelet_confirms_the_old_pods_gone() {
    let k = |rebooted, ready_again, old_pods| KubeletReturn {
        rebooted,
        ready_again,
        old_pods,
    };
    // (the step that confirmed the node, power management ran after it, what the node says once
    // its Lease renews again, recovery runs?)
    let cases = [
        // Powered off: the Lease renews but the kubelet has not reported Ready since: hold.
        (
            Step::PowerManagement,
            false,
            k(false, false, Some(0)),
            false,
        ),
        // Ready again but a pod of before the fence is still bound to it: hold.
        (Step::PowerManagement, false, k(false, true, Some(1)), false),
        // Ready again, pods unknown (the list failed): hold.
        (Step::PowerManagement, false, k(false, true, None), false),
        // Ready again and no pod of before is left: recover.
        (Step::PowerManagement, false, k(false, true, Some(0)), true),
        // Isolated, then powered off by the power management step: the same.
        (Step::Isolation, true, k(false, true, Some(0)), true),
        (Step::Isolation, true, k(false, false, Some(0)), false),
        // Isolated only: the released pods were force-deleted, so none is left bound to the
        // node whatever still runs on it; Ready and no pod left is no proof: hold until reboot.
        (Step::Isolation, false, k(false, true, Some(0)), false),
        (Step::Isolation, false, k(false, false, Some(0)), false),
        // Rebooted: nothing of before runs, whatever else.
        (Step::Isolation, false, k(true, false, None), true),
        (Step::PowerManagement, false, k(true, false, None), true),
        (Step::Isolation, false, k(true, false, Some(3)), true),
    ];
    for (confirmed_by, power_cycled, kubelet, runs) in cases {
        let mut op = new_op();
        op.phase = Phase::Released;
        op.confirmed_by = Some(confirmed_by);
        op.power_cycled = power_cycled;
        op.released_at = Some(0);
        let mut c = back(ctx(120));
        c.kubelet = kubelet;
        let t = advance(&op, &OpEvent::Tick, &c, &policy());
        assert_eq!(t.op.phase, Phase::Recovering { recovered: false });
        let t = advance(&t.op, &OpEvent::Tick, &c, &policy());
        let case = format!("{confirmed_by:?} power_cycled={power_cycled} {kubelet:?}");
        assert_eq!(
            t.actions.contains(&OpAction::Run(Step::Recovery)),
            runs,
            "{case}: {:?}",
            t.actions
        );
        if !runs {
            assert_eq!(kinds(&t.actions), ["event:RecoveryHeld"], "{case}");
            assert!(t.op.recovery_held);
            let isolated_only = confirmed_by == Step::Isolation && !power_cycled;
            let OpAction::Notify(Notice { message, .. }) = &t.actions[0] else {
                panic!("{case}: {:?}", t.actions)
            };
            assert_eq!(
                message.contains("reboot the node"),
                isolated_only,
                "{case}: {message}"
            );
            // Announced once; the taint is never removed while held.
            let again = advance(&t.op, &OpEvent::Tick, &c, &policy());
            assert!(again.actions.is_empty(), "{case}: {:?}", again.actions);
        }
    }
    let mut op = new_op();
    op.phase = Phase::Released;
    op.confirmed_by = Some(Step::Isolation);
    op.released_at = Some(0);
    // Without recovery methods the taint removal waits the same way.
    let mut c = back(ctx(120));
    c.configured.recovery = false;
    c.kubelet = k(false, false, Some(0));
    let t = advance(&op, &OpEvent::Tick, &c, &policy());
    let t = advance(&t.op, &OpEvent::Tick, &c, &policy());
    let t = advance(&t.op, &OpEvent::Tick, &c, &policy());
    assert!(
        !t.actions.contains(&OpAction::RemoveTaint),
        "{:?}",
        t.actions
    );
    // Nothing released (the node came back while a step was still failing): no hold.
    let mut unreleased = new_op();
    unreleased.phase = Phase::Recovering { recovered: false };
    let t = advance(&unreleased, &OpEvent::Tick, &c, &policy());
    assert_eq!(t.op.phase, Phase::Recovering { recovered: true });
}

#[test]
fn attempt_and_cycle_counters_saturate() {
    let mut op = new_op();
    op.attempts = u32::MAX;
    op.cycles = u32::MAX;
    let mut p = policy();
    p.step_retries = u32::MAX;
    let failed = fail_running(&mut op);
    let t = advance(&op, &failed, &ctx(0), &p);
    assert_eq!(t.op.attempts, u32::MAX);
    let t = advance(&t.op, &OpEvent::Tick, &ctx(100), &p);
    assert_eq!(t.op.attempts, u32::MAX);
    let mut c = ctx(0);
    c.configured = ConfiguredSteps::default();
    let t = advance(&new_op_with_cycles(u32::MAX), &OpEvent::Tick, &c, &p);
    assert_eq!(t.op.cycles, u32::MAX);
}

fn fail_running(op: &mut FenceOp) -> OpEvent {
    op.running = Some(Step::Isolation);
    fail(Step::Isolation)
}

fn new_op_with_cycles(cycles: u32) -> FenceOp {
    let mut op = new_op();
    op.cycles = cycles;
    op
}
