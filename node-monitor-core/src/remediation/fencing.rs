//! The fencing state machine ([`advance`]): isolation, then power management; release only once
//! a step confirmed the node off or isolated; recovery when the node is back.
//!
//! [`advance`] settles what holds whatever happened (the node is gone, or back), then hands the
//! event to one function each: a step's result (`on_step_done`), a release's
//! (`on_release_done`), the taint's removal (`on_taint_removed`), and the tick that starts
//! what is due (`on_tick`).
use std::time::Duration;

use super::{
    FenceOp, FencingPolicy, Notice, OpAction, OpContext, OpEvent, Phase, ReleaseSummary, Step,
    Transition,
};

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn notice(warning: bool, reason: &'static str, message: String) -> OpAction {
    OpAction::Notify(Notice {
        warning,
        reason,
        message,
    })
}

/// Moves to the next fencing step, or to `Unconfirmed` when none is left.
fn next_step(
    op: &mut FenceOp,
    from: Step,
    ctx: &OpContext,
    policy: &FencingPolicy,
) -> Vec<OpAction> {
    op.attempts = 0;
    op.running = None;
    if from == Step::Isolation && ctx.configured.power_management {
        op.phase = Phase::Fencing {
            step: Step::PowerManagement,
        };
        op.not_before = None;
        return Vec::new();
    }
    op.phase = Phase::Unconfirmed;
    op.cycles = op.cycles.saturating_add(1);
    op.not_before = Some(
        ctx.now
            .saturating_add(millis(policy.unconfirmed_retry_interval)),
    );
    vec![notice(
        true,
        "FencingUnconfirmed",
        format!(
            "no fencing step confirmed the node off or isolated (cycle {}{}); its workload is not released; trying again in {:.0}s",
            op.cycles,
            op.last_error
                .as_deref()
                .map(|e| format!(", last error: {e}"))
                .unwrap_or_default(),
            policy.unconfirmed_retry_interval.as_secs_f64()
        ),
    )]
}

/// The fencing state machine: isolation, then power management; release only once a step
/// confirmed the node off or isolated; recovery when the node is back. Every branch that leads to
/// [`OpAction::Release`] passes through a successful [`OpEvent::StepDone`] of a fencing step.
pub fn advance(
    op: &FenceOp,
    event: &OpEvent,
    ctx: &OpContext,
    policy: &FencingPolicy,
) -> Transition {
    let mut op = op.clone();
    let mut actions = Vec::new();

    if !ctx.node_present {
        if ctx.executing {
            actions.push(OpAction::Cancel);
        }
        actions.push(OpAction::Forget);
        return Transition { op, actions };
    }
    if ctx.node_back && !matches!(op.phase, Phase::Recovering { .. }) {
        if ctx.executing {
            actions.push(OpAction::Cancel);
        }
        actions.push(notice(
            false,
            "NodeBack",
            format!(
                "the node renewed its lease again (operation was {}); running recovery",
                op.phase.label()
            ),
        ));
        op.phase = Phase::Recovering { recovered: false };
        op.running = None;
        op.attempts = 0;
        op.not_before = None;
        return Transition { op, actions };
    }

    match event {
        OpEvent::StepDone { step, result } => {
            on_step_done(&mut op, &mut actions, *step, result, ctx, policy);
        }
        OpEvent::ReleaseDone { result } => {
            on_release_done(&mut op, &mut actions, result, ctx, policy);
        }
        OpEvent::TaintRemoved { result } => {
            on_taint_removed(&mut op, &mut actions, result, ctx, policy);
        }
        OpEvent::Tick => on_tick(&mut op, &mut actions, ctx, policy),
    }
    Transition { op, actions }
}

/// A step's methods finished. Only a result the operation waits for counts: a fencing step's
/// success confirms the fence and moves to the release, its failure is retried or gives way to
/// the next step; power management after an isolation release and recovery are retried until
/// they succeed.
fn on_step_done(
    op: &mut FenceOp,
    actions: &mut Vec<OpAction>,
    step: Step,
    result: &Result<(), String>,
    ctx: &OpContext,
    policy: &FencingPolicy,
) {
    if op.running != Some(step) {
        // A result for a step this operation no longer waits for.
        return;
    }
    op.running = None;
    match (op.phase, result) {
        (Phase::Fencing { step: s }, Ok(())) if s == step => {
            op.confirmed_by = Some(s);
            op.phase = Phase::Releasing;
            op.attempts = 0;
            op.not_before = None;
            op.last_error = None;
            actions.push(notice(
                true,
                "FencingConfirmed",
                format!(
                    "the {} step succeeded: the node is {}; releasing its workload",
                    s.as_str(),
                    if s == Step::Isolation {
                        "isolated"
                    } else {
                        "powered off"
                    }
                ),
            ));
        }
        (Phase::Fencing { step: s }, Err(e)) if s == step => {
            op.last_error = Some(e.clone());
            actions.push(notice(
                true,
                "FenceStepFailed",
                format!(
                    "the {} step failed (attempt {} of {}): {e}",
                    s.as_str(),
                    op.attempts,
                    policy.step_retries.saturating_add(1)
                ),
            ));
            if op.attempts <= policy.step_retries {
                op.not_before = Some(ctx.now.saturating_add(millis(policy.retry_backoff)));
            } else {
                actions.extend(next_step(op, s, ctx, policy));
            }
        }
        (Phase::Released, result) if step == Step::PowerManagement => {
            on_late_power_management_done(op, actions, result, ctx, policy);
        }
        (Phase::Recovering { .. }, result) if step == Step::Recovery => {
            on_recovery_done(op, actions, result, ctx, policy);
        }
        _ => {}
    }
}

/// Power management run after a release confirmed by isolation alone finished.
fn on_late_power_management_done(
    op: &mut FenceOp,
    actions: &mut Vec<OpAction>,
    result: &Result<(), String>,
    ctx: &OpContext,
    policy: &FencingPolicy,
) {
    match result {
        Ok(()) => {
            op.power_cycled = true;
            op.last_error = None;
            actions.push(notice(
                false,
                "PowerManagementDone",
                "the node stayed dead after isolation; the power management step succeeded"
                    .to_owned(),
            ));
        }
        Err(e) => {
            op.last_error = Some(e.clone());
            op.not_before = Some(
                ctx.now
                    .saturating_add(millis(policy.unconfirmed_retry_interval)),
            );
            actions.push(notice(
                true,
                "FenceStepFailed",
                format!("the power_management step after isolation failed: {e}"),
            ));
        }
    }
}

/// The recovery step finished: on success the taint comes off next; on failure it is retried,
/// after the backoff while retries are left, then at the unconfirmed-retry pace.
fn on_recovery_done(
    op: &mut FenceOp,
    actions: &mut Vec<OpAction>,
    result: &Result<(), String>,
    ctx: &OpContext,
    policy: &FencingPolicy,
) {
    match result {
        Ok(()) => {
            op.phase = Phase::Recovering { recovered: true };
            op.attempts = 0;
            op.not_before = None;
            op.last_error = None;
        }
        Err(e) => {
            op.last_error = Some(e.clone());
            let pause = if op.attempts <= policy.step_retries {
                policy.retry_backoff
            } else {
                policy.unconfirmed_retry_interval
            };
            op.not_before = Some(ctx.now.saturating_add(millis(pause)));
            actions.push(notice(
                true,
                "RecoveryFailed",
                format!(
                    "the recovery step failed (attempt {}); the out-of-service taint stays until it succeeds: {e}",
                    op.attempts
                ),
            ));
        }
    }
}

/// The release (taint, then pod deletion) finished: released, or retried after the backoff.
fn on_release_done(
    op: &mut FenceOp,
    actions: &mut Vec<OpAction>,
    result: &Result<ReleaseSummary, String>,
    ctx: &OpContext,
    policy: &FencingPolicy,
) {
    if op.phase != Phase::Releasing {
        return;
    }
    match result {
        Ok(s) => {
            op.phase = Phase::Released;
            op.released_at = Some(ctx.now);
            op.not_before = None;
            op.last_error = None;
            actions.push(notice(
                true,
                "NodeReleased",
                format!(
                    "out-of-service taint applied; {} pods deleted; {} volume attachments left for the attach-detach controller to detach",
                    s.pods_deleted, s.volume_attachments
                ),
            ));
        }
        Err(e) => {
            op.last_error = Some(e.clone());
            op.not_before = Some(ctx.now.saturating_add(millis(policy.retry_backoff)));
            actions.push(notice(
                true,
                "ReleaseFailed",
                format!("releasing the workload failed; retrying: {e}"),
            ));
        }
    }
}

/// The out-of-service taint was removed after recovery: the operation is over; a failure is
/// retried after the backoff.
fn on_taint_removed(
    op: &mut FenceOp,
    actions: &mut Vec<OpAction>,
    result: &Result<(), String>,
    ctx: &OpContext,
    policy: &FencingPolicy,
) {
    if op.phase != (Phase::Recovering { recovered: true }) {
        return;
    }
    match result {
        Ok(()) => {
            actions.push(notice(
                false,
                "NodeRecovered",
                "recovery done and the out-of-service taint removed".to_owned(),
            ));
            actions.push(OpAction::Forget);
        }
        Err(e) => {
            op.last_error = Some(e.clone());
            op.not_before = Some(ctx.now.saturating_add(millis(policy.retry_backoff)));
        }
    }
}

/// A tick: nothing while a step executes or before `not_before`; else start what the phase has
/// due.
fn on_tick(op: &mut FenceOp, actions: &mut Vec<OpAction>, ctx: &OpContext, policy: &FencingPolicy) {
    if op.running.is_some() && ctx.executing {
        return;
    }
    // A step recorded as running that nothing runs: the controller restarted meanwhile.
    op.running = None;
    if op.not_before.is_some_and(|t| ctx.now < t) {
        return;
    }
    op.not_before = None;
    match op.phase {
        Phase::Fencing { step } => {
            if !ctx.may_fence {
                return;
            }
            if !ctx.configured.has(step) {
                actions.extend(next_step(op, step, ctx, policy));
                return;
            }
            op.attempts = op.attempts.saturating_add(1);
            op.running = Some(step);
            actions.push(OpAction::Run(step));
        }
        Phase::Unconfirmed => {
            if ctx.may_fence {
                op.phase = Phase::Fencing {
                    step: Step::Isolation,
                };
                op.attempts = 0;
            }
        }
        Phase::Releasing => tick_releasing(op, actions, ctx),
        Phase::Released => tick_released(op, actions, ctx, policy),
        Phase::Recovering { recovered: false } => tick_recovering(op, actions, ctx),
        Phase::Recovering { recovered: true } => actions.push(OpAction::RemoveTaint),
    }
}

/// Releases, once more checking that a fencing step confirmed the node off or isolated: the
/// stored state alone never releases anything.
fn tick_releasing(op: &mut FenceOp, actions: &mut Vec<OpAction>, ctx: &OpContext) {
    if op.confirmed_by.is_none() {
        op.phase = Phase::Fencing {
            step: Step::Isolation,
        };
        op.attempts = 0;
        actions.push(notice(
            true,
            "ReleaseRefused",
            "the operation says releasing but records no confirmed fencing step; fencing again first".to_owned(),
        ));
        return;
    }
    if !ctx.may_fence {
        return;
    }
    actions.push(OpAction::Release);
}

/// After a release confirmed by isolation alone: power management once the node stayed dead
/// for `powerManagementAfterIsolation`.
fn tick_released(
    op: &mut FenceOp,
    actions: &mut Vec<OpAction>,
    ctx: &OpContext,
    policy: &FencingPolicy,
) {
    let due = op.confirmed_by == Some(Step::Isolation)
        && !op.power_cycled
        && ctx.configured.power_management
        && ctx.may_fence
        && match (policy.power_management_after_isolation, op.released_at) {
            (Some(d), Some(at)) => ctx.now >= at.saturating_add(millis(d)),
            _ => false,
        };
    if due {
        op.attempts = op.attempts.saturating_add(1);
        op.running = Some(Step::PowerManagement);
        actions.push(OpAction::Run(Step::PowerManagement));
    }
}

/// The node is back: run recovery, but only once the node confirms the released pods are gone.
fn tick_recovering(op: &mut FenceOp, actions: &mut Vec<OpAction>, ctx: &OpContext) {
    // Pods may have been released (confirmed_by is set on the way to Releasing): their
    // containers may still run on the node while their replacements run elsewhere. Nothing is
    // undone before the node confirms they are gone.
    if op.confirmed_by.is_some() && !ctx.kubelet.confirms_old_pods_gone() {
        if !op.recovery_held {
            op.recovery_held = true;
            actions.push(notice(
                false,
                "RecoveryHeld",
                format!(
                    "the node is back but recovery waits until it rebooted or its kubelet confirms the released pods are gone: {}",
                    ctx.kubelet.describe_wait()
                ),
            ));
        }
        return;
    }
    op.recovery_held = false;
    if ctx.configured.recovery {
        op.attempts = op.attempts.saturating_add(1);
        op.running = Some(Step::Recovery);
        actions.push(OpAction::Run(Step::Recovery));
    } else {
        op.phase = Phase::Recovering { recovered: true };
    }
}

#[cfg(test)]
mod tests {
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
            (
                OpEvent::Tick,
                back(ctx(120)),
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
        let mut op = new_op();
        op.phase = Phase::Released;
        op.confirmed_by = Some(Step::Isolation);
        op.released_at = Some(0);
        let k = |rebooted, ready_again, old_pods| KubeletReturn {
            rebooted,
            ready_again,
            old_pods,
        };
        // (what the node says once its Lease renews again, recovery runs?)
        let cases = [
            // The Lease renews but the kubelet has not reported Ready since: hold.
            (k(false, false, Some(0)), false),
            // Ready again but a pod of before the fence is still bound to it: hold.
            (k(false, true, Some(1)), false),
            // Ready again, pods unknown (the list failed): hold.
            (k(false, true, None), false),
            // Ready again and no pod of before is left: recover.
            (k(false, true, Some(0)), true),
            // Rebooted: nothing of before runs, whatever else.
            (k(true, false, None), true),
            (k(true, false, Some(3)), true),
        ];
        for (kubelet, runs) in cases {
            let mut c = back(ctx(120));
            c.kubelet = kubelet;
            let t = advance(&op, &OpEvent::Tick, &c, &policy());
            assert_eq!(t.op.phase, Phase::Recovering { recovered: false });
            let t = advance(&t.op, &OpEvent::Tick, &c, &policy());
            assert_eq!(
                t.actions.contains(&OpAction::Run(Step::Recovery)),
                runs,
                "{kubelet:?}: {:?}",
                t.actions
            );
            if !runs {
                assert_eq!(kinds(&t.actions), ["event:RecoveryHeld"], "{kubelet:?}");
                assert!(t.op.recovery_held);
                // Announced once; the taint is never removed while held.
                let again = advance(&t.op, &OpEvent::Tick, &c, &policy());
                assert!(again.actions.is_empty(), "{kubelet:?}: {:?}", again.actions);
            }
        }
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
}
