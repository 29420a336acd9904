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
    // Confirmed by isolation and never powered off: only a reboot tells the containers gone.
    let isolated_only = op.confirmed_by == Some(Step::Isolation) && !op.power_cycled;
    if op.confirmed_by.is_some() && !ctx.kubelet.confirms_old_pods_gone(isolated_only) {
        if !op.recovery_held {
            op.recovery_held = true;
            actions.push(notice(
                false,
                "RecoveryHeld",
                format!(
                    "the node is back but recovery waits until it rebooted or its kubelet confirms the released pods are gone: {}",
                    ctx.kubelet.describe_wait(isolated_only)
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
mod tests;
