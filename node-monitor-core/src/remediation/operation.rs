//! The fencing operation: the record kept in the API for each node being fenced ([`FenceOp`]),
//! and the vocabulary of its state machine (the world around it, the events it reacts to, the
//! actions it asks for).
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::node_is_back;
use super::{DeathEvidence, NodeFacts, ReadyStatus, UnixMillis, WallMicros};

/// A fencing step (the proposal's three lists of methods).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Step {
    /// Cut the node off its storage and network (the proposal's isolation methods).
    Isolation,
    /// Power the node off or reset it (the proposal's power management methods).
    PowerManagement,
    /// Undo the isolation once the node is back (the proposal's recovery methods).
    Recovery,
}

impl Step {
    /// Every step, in the order they run.
    pub const ALL: [Step; 3] = [Step::Isolation, Step::PowerManagement, Step::Recovery];

    /// The key in `config.properties` and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Isolation => "isolation",
            Step::PowerManagement => "power_management",
            Step::Recovery => "recovery",
        }
    }
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "name")]
pub enum Phase {
    /// Running, or about to run, the methods of a fencing step.
    Fencing {
        /// The step.
        step: Step,
    },
    /// No step confirmed the node off or isolated: nothing is released; the cycle starts again
    /// after `unconfirmedRetryInterval`.
    Unconfirmed,
    /// Fencing confirmed: taint the node and delete its pods.
    Releasing,
    /// The workload is released; waiting for the node to come back.
    Released,
    /// The node is back: run recovery, then remove the taint and forget the operation.
    Recovering {
        /// The recovery step succeeded (or none is configured): the taint comes off next.
        recovered: bool,
    },
}

impl Phase {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Phase::Fencing { .. } => "fencing",
            Phase::Unconfirmed => "unconfirmed",
            Phase::Releasing => "releasing",
            Phase::Released => "released",
            Phase::Recovering { .. } => "recovering",
        }
    }

    /// Every value of [`Phase::label`], for initialising the metric's series.
    pub const LABELS: [&'static str; 5] = [
        "fencing",
        "unconfirmed",
        "releasing",
        "released",
        "recovering",
    ];
}

/// One node's fencing operation: the proposal's NodeFence, kept in the API so a restarted or newly
/// elected controller carries on where the last one stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FenceOp {
    /// The Node's name.
    pub node: String,
    /// The Node's UID: a Node re-created under the same name is another node.
    pub node_uid: String,
    /// Where the operation stands.
    pub phase: Phase,
    /// A step whose methods were started and whose outcome is not recorded. Written before they
    /// start: a controller that finds it set without running the step itself runs it again, so
    /// fence methods must be idempotent (fence agents are: `off` on an off machine succeeds).
    #[serde(default)]
    pub running: Option<Step>,
    /// Attempts of the current step.
    #[serde(default)]
    pub attempts: u32,
    /// Fencing cycles that ended unconfirmed.
    #[serde(default)]
    pub cycles: u32,
    /// Nothing new starts before this time.
    #[serde(default)]
    pub not_before: Option<UnixMillis>,
    /// When the node was found dead (controller clock).
    pub detected_at: UnixMillis,
    /// Why it was found dead ([`DeathEvidence::describe`]).
    pub evidence: String,
    /// The Lease's renewTime when the node was found dead: a newer one means it is back.
    pub lease_renew_time: Option<WallMicros>,
    #[serde(default)]
    /// The fencing step that confirmed the node off or isolated; nothing is released without one.
    pub confirmed_by: Option<Step>,
    #[serde(default)]
    /// When the workload was released (controller clock).
    pub released_at: Option<UnixMillis>,
    #[serde(default)]
    /// Power management ran after a release confirmed by isolation alone.
    pub power_cycled: bool,
    #[serde(default)]
    /// The last step or release failure, for Events and status.
    pub last_error: Option<String>,
    /// The node's `bootID` when it was found dead: a different one later means it rebooted.
    #[serde(default)]
    pub boot_id: Option<String>,
    /// The `Ready` condition's heartbeat when the node was found dead: only a newer one says the
    /// kubelet is back.
    #[serde(default)]
    pub ready_heartbeat: Option<WallMicros>,
    /// Recovery is held until the kubelet confirms the released pods are gone (the hold was
    /// announced).
    #[serde(default)]
    pub recovery_held: bool,
}

impl FenceOp {
    /// A new operation for a node found dead, recording what the node last said (its Lease
    /// renewal, its Ready heartbeat, its bootID) to tell later whether it came back.
    pub fn new(
        facts: &NodeFacts,
        node_uid: &str,
        evidence: &DeathEvidence,
        now: UnixMillis,
    ) -> FenceOp {
        FenceOp {
            node: facts.name.clone(),
            node_uid: node_uid.to_owned(),
            phase: Phase::Fencing {
                step: Step::Isolation,
            },
            running: None,
            attempts: 0,
            cycles: 0,
            not_before: None,
            detected_at: now,
            evidence: evidence.describe(),
            lease_renew_time: facts.lease.and_then(|l| l.renew_time),
            confirmed_by: None,
            released_at: None,
            power_cycled: false,
            last_error: None,
            boot_id: facts.boot_id.clone().filter(|b| !b.is_empty()),
            ready_heartbeat: facts.ready_heartbeat,
            recovery_held: false,
        }
    }
}

/// Which steps have methods configured for the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConfiguredSteps {
    /// Isolation methods are configured.
    pub isolation: bool,
    /// Power management methods are configured.
    pub power_management: bool,
    /// Recovery methods are configured.
    pub recovery: bool,
}

impl ConfiguredSteps {
    /// Whether `step` has methods configured.
    pub fn has(&self, step: Step) -> bool {
        match step {
            Step::Isolation => self.isolation,
            Step::PowerManagement => self.power_management,
            Step::Recovery => self.recovery,
        }
    }
}

/// What the node says about the pods of before the fence once it is back. A release
/// force-deletes pods whose containers may still run on the node (isolated, not stopped) while
/// their replacements run elsewhere; only the node's kubelet can stop them, and it does so once it
/// syncs with the API. Recovery (storage access back on, unfencing) must wait for that, or the old
/// containers write next to their replacements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KubeletReturn {
    /// The node's `bootID` differs from the one recorded at fencing: the machine rebooted, nothing
    /// of before runs on it.
    pub rebooted: bool,
    /// The kubelet posted `Ready=True` after the node was found dead (the Ready heartbeat is newer
    /// than both the Lease renewal and the Ready heartbeat recorded then; all written by the
    /// node's clock).
    pub ready_again: bool,
    /// Pods still bound to the node that a release would delete (none of them can have been
    /// scheduled there since: the taint keeps them off); `None`: not known.
    pub old_pods: Option<u32>,
}

impl KubeletReturn {
    /// From the node's facts now and the operation's record; `old_pods` counted by the caller.
    pub fn observe(op: &FenceOp, facts: &NodeFacts, old_pods: Option<u32>) -> KubeletReturn {
        let rebooted = match (op.boot_id.as_deref(), facts.boot_id.as_deref()) {
            (Some(then), Some(now)) => !now.is_empty() && now != then,
            _ => false,
        };
        // Newer than anything the node wrote before it was found dead (all node clock).
        let before = op.lease_renew_time.max(op.ready_heartbeat);
        let ready_again = facts.ready == ReadyStatus::True
            && match (facts.ready_heartbeat, before) {
                (Some(hb), Some(before)) => hb > before,
                (Some(_), None) => true,
                (None, _) => false,
            };
        KubeletReturn {
            rebooted,
            ready_again,
            old_pods,
        }
    }

    /// The released pods' containers are known to be gone: the machine rebooted; or, when it was
    /// powered off (`isolated_only` false), its kubelet is Ready again and no pod of before the
    /// fence is left bound to it. A node confirmed by storage isolation alone never powered off:
    /// its released pods were force-deleted from the API, so none is left bound to it whatever
    /// still runs, and a Ready kubelet need not have stopped their containers yet. Only a new
    /// boot ID proves them gone.
    pub fn confirms_old_pods_gone(&self, isolated_only: bool) -> bool {
        self.rebooted || (!isolated_only && self.ready_again && self.old_pods == Some(0))
    }

    pub(super) fn describe_wait(&self, isolated_only: bool) -> String {
        if isolated_only {
            return "its storage was isolated and it has not rebooted since (its bootID is the one \
                    of before the fence): containers of the released pods may still run on it; \
                    reboot the node"
                .to_owned();
        }
        let mut missing = Vec::new();
        if !self.ready_again {
            missing.push("its kubelet has not reported Ready since".to_owned());
        }
        match self.old_pods {
            Some(0) => {}
            Some(n) => missing.push(format!(
                "{n} pods of before the fence are still bound to it"
            )),
            None => missing.push("its pods could not be listed".to_owned()),
        }
        missing.join("; ")
    }
}

/// The world around an operation at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpContext {
    /// The controller's wall clock.
    pub now: UnixMillis,
    /// The Node object still exists.
    pub node_present: bool,
    /// The node renewed its Lease since it was found dead ([`node_is_back`]).
    pub node_back: bool,
    /// The step in `running` is executing in this process right now.
    pub executing: bool,
    /// Storm protection lets new fencing attempts start.
    pub may_fence: bool,
    /// Which steps have methods for this node.
    pub configured: ConfiguredSteps,
    /// What the node says about the pods of before the fence (see [`KubeletReturn`]).
    pub kubelet: KubeletReturn,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpEvent {
    /// Time passed: start whatever is due.
    Tick,
    /// A step's methods finished: all succeeded, or the first failure.
    StepDone {
        /// The step that ran.
        step: Step,
        /// `Ok`, or the first failure's message.
        result: Result<(), String>,
    },
    /// The release (taint, then pod deletion) finished.
    ReleaseDone {
        /// What the release did, or why it failed.
        result: Result<ReleaseSummary, String>,
    },
    /// The out-of-service taint was removed (or was not there).
    TaintRemoved {
        /// `Ok`, or why the taint could not be removed.
        result: Result<(), String>,
    },
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReleaseSummary {
    /// Pods force-deleted from the node.
    pub pods_deleted: u32,
    /// VolumeAttachments of the node, left for the attach-detach controller to detach.
    pub volume_attachments: u32,
}

/// An Event to record on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// A `Warning` Event (else `Normal`).
    pub warning: bool,
    /// The Event's reason (`FencingConfirmed`, `NodeReleased`, …).
    pub reason: &'static str,
    /// The Event's message.
    pub message: String,
}

/// What the controller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpAction {
    /// Run the step's methods (after persisting the operation); report [`OpEvent::StepDone`].
    Run(Step),
    /// Stop the step executing now; its outcome no longer matters.
    Cancel,
    /// Apply the out-of-service taint, then delete the node's pods; report
    /// [`OpEvent::ReleaseDone`].
    Release,
    /// Remove the out-of-service taint; report [`OpEvent::TaintRemoved`].
    RemoveTaint,
    /// Delete the operation: nothing is left to do.
    Forget,
    /// Record an Event on the node.
    Notify(Notice),
}

/// The next state of an operation and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The operation after the event.
    pub op: FenceOp,
    /// What to do, in order.
    pub actions: Vec<OpAction>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remediation::{test_support::*, *};

    #[test]
    fn the_kubelet_return_is_read_from_node_written_facts() {
        // Recorded when found dead: Lease renewal 1_000, Ready heartbeat 1_500, bootID "boot-1".
        let mut op = new_op();
        op.ready_heartbeat = Some(1_500);
        let f = |ready: ReadyStatus, hb: Option<i64>, boot: Option<&str>| {
            let mut n = facts("n1", Some(5_000));
            n.ready = ready;
            n.ready_heartbeat = hb;
            n.boot_id = boot.map(str::to_owned);
            n
        };
        // (facts, rebooted, ready_again)
        let cases = [
            // Ready, but its heartbeat predates the death: a stale condition.
            (
                f(ReadyStatus::True, Some(900), Some("boot-1")),
                false,
                false,
            ),
            // Newer than the last renewal, not newer than the heartbeat posted before the death.
            (
                f(ReadyStatus::True, Some(1_001), Some("boot-1")),
                false,
                false,
            ),
            (
                f(ReadyStatus::True, Some(1_500), Some("boot-1")),
                false,
                false,
            ),
            (
                f(ReadyStatus::True, Some(1_501), Some("boot-1")),
                false,
                true,
            ),
            (
                f(ReadyStatus::Unknown, Some(2_000), Some("boot-1")),
                false,
                false,
            ),
            (
                f(ReadyStatus::True, Some(2_000), Some("boot-2")),
                true,
                true,
            ),
            (f(ReadyStatus::False, None, Some("boot-2")), true, false),
            // An unknown or empty bootID is no reboot.
            (f(ReadyStatus::False, None, None), false, false),
            (f(ReadyStatus::False, None, Some("")), false, false),
        ];
        for (n, rebooted, ready_again) in cases {
            let k = KubeletReturn::observe(&op, &n, Some(0));
            assert_eq!(
                (k.rebooted, k.ready_again),
                (rebooted, ready_again),
                "{n:?}"
            );
        }
        // No bootID recorded at fencing: a reboot cannot be told.
        let mut old = op.clone();
        old.boot_id = None;
        let k = KubeletReturn::observe(&old, &f(ReadyStatus::False, None, Some("boot-2")), None);
        assert!(!k.rebooted && !k.confirms_old_pods_gone(false));
    }
}
