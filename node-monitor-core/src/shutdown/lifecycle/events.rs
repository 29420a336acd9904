//! The lifecycle's vocabulary: the events it takes, the actions it returns, the marks it
//! remembers.
use std::{collections::BTreeMap, time::Duration};

use crate::shutdown::{GroupOutcome, PlannedPod, RebootAction, RebootRequest, ShutdownPod};

/// Which marks node-monitor set on the node, so a cancellation undoes only those.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// The condition `NodeMonitorShuttingDown=True`.
    pub condition: bool,
    /// The shutdown taint.
    pub taint: bool,
    /// The cordon (node-monitor's own, not one it found).
    pub cordoned: bool,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The manager starts (before the first connection to logind).
    Started,
    /// Connected to logind, subscribed to its signals.
    LogindConnected,
    /// logind (re)appeared on the bus (`NameOwnerChanged` with a new owner).
    LogindRestarted,
    /// The connection to logind ended, or a logind call failed.
    LogindLost {
        /// The error, as text.
        error: String,
    },
    /// Answer to [`Action::ReadInhibitDelay`]: logind's `InhibitDelayMaxSec`, `None` when it
    /// could not be read.
    InhibitDelayRead(Option<Duration>),
    /// Answer to [`Action::RaiseInhibitDelay`]: the delay read back, `None` when raising failed.
    InhibitDelayRaised(Option<Duration>),
    /// Answer to [`Action::ListInhibitors`].
    InhibitorsListed {
        /// The kubelet holds a shutdown delay inhibitor.
        kubelet: bool,
    },
    /// logind's `PrepareForShutdown`: true before a shutdown, false when it was cancelled.
    PrepareForShutdown(bool),
    /// Answer to [`Action::ListPodsForPlan`]: the node's pods the plan takes.
    PodsListed(Vec<ShutdownPod>),
    /// Answer to [`Action::ListPresent`]: the node's pods as `(uid, finished)`, `None` when the
    /// API could not answer (every planned pod then counts as present).
    PodsPresent(Option<Vec<(String, bool)>>),
    /// Answer to [`Action::DeletePods`]: the UIDs deleted or already gone.
    PodsDeleted(Vec<String>),
    /// Answer to [`Action::AwaitMarks`]: the marks that took.
    NodeMarked(Marks),
    /// The running group's timer fired, or a signal that changes nothing came during a run.
    Wake,
    /// The retry timer at rest: API writes that failed are tried again.
    RetryTick,
    /// A reboot(2) seen by the kernel probe.
    Reboot(RebootRequest),
    /// Answer to [`Action::LastGasp`] (sent or not).
    LastGaspAnswered,
    /// Answer to [`Action::PublishAtRest`].
    AtRestPublished {
        /// It reached the API.
        ok: bool,
    },
    /// Answer to [`Action::ClearStaleTaint`].
    StaleTaintCleared {
        /// It reached the API.
        ok: bool,
    },
    /// Answer to [`Action::ReadCordonAnnotation`]: whether the node carries it, `None` when the
    /// node could not be read.
    CordonAnnotationRead(Option<bool>),
    /// Answer to [`Action::RemoveTaint`].
    TaintRemoved {
        /// It reached the API.
        ok: bool,
    },
    /// Answer to [`Action::Uncordon`].
    Uncordoned {
        /// It reached the API.
        ok: bool,
    },
    /// The agent stops.
    StopRequested,
}

/// What to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Remove the shutdown taint left by an earlier boot; answer [`Event::StaleTaintCleared`].
    ClearStaleTaint,
    /// Read the node's cordon annotation; answer [`Event::CordonAnnotationRead`].
    ReadCordonAnnotation,
    /// Uncordon the node and drop the cordon annotation; answer [`Event::Uncordoned`].
    Uncordon,
    /// Read logind's `InhibitDelayMaxSec`; answer [`Event::InhibitDelayRead`].
    ReadInhibitDelay,
    /// Write the drop-in raising it, reload logind, read it back; answer
    /// [`Event::InhibitDelayRaised`].
    RaiseInhibitDelay {
        /// The new `InhibitDelayMaxSec`.
        seconds: u64,
    },
    /// logind ends the shutdown delay before the groups can finish: report it (degraded).
    DelayTooShort(String),
    /// The agent is degraded (reported once per distinct message).
    Degraded(String),
    /// Ask logind who holds inhibitors; answer [`Event::InhibitorsListed`].
    ListInhibitors,
    /// Take a new delay inhibitor, then drop the old one (never a moment without one). A failure
    /// ends the connection.
    TakeLock,
    /// Release the lock (close the descriptor).
    ReleaseLock,
    /// The connection ended: the lock is gone with it.
    LockLost,
    /// Publish the condition at rest (`NodeMonitorShuttingDown=False`); answer
    /// [`Event::AtRestPublished`].
    PublishAtRest {
        /// The condition's reason.
        reason: &'static str,
        /// The condition's message.
        message: String,
    },
    /// A phase starts (metric `phase` label).
    PhaseStart(String),
    /// A phase ends.
    PhaseEnd(String),
    /// Post the shutdown Event and set the marks beside the run; answered later, by
    /// [`Action::AwaitMarks`].
    MarkNode {
        /// Cordon too.
        cordon: bool,
        /// The condition's message.
        message: String,
    },
    /// List the node's pods for the plan; answer [`Event::PodsListed`].
    ListPodsForPlan,
    /// The plan is made (for the log).
    Planned {
        /// Pods in the plan.
        pods: usize,
        /// Pods per group priority.
        groups: BTreeMap<i32, usize>,
    },
    /// A group started.
    GroupStarted {
        /// The group's lowest priority.
        priority: i32,
        /// Its pods.
        pods: usize,
    },
    /// A group ended.
    GroupEnded {
        /// The group's lowest priority.
        priority: i32,
        /// How.
        outcome: GroupOutcome,
    },
    /// Every group ran: end the total phase and release the lock; logind may proceed.
    Release {
        /// Since `PrepareForShutdown(true)`.
        total: Duration,
    },
    /// Delete these pods of the running group; answer [`Event::PodsDeleted`].
    DeletePods(Vec<PlannedPod>),
    /// Ask the API which of the node's pods are left; answer [`Event::PodsPresent`].
    ListPresent,
    /// The run was cancelled: no later group starts.
    RunCancelled,
    /// Wait for [`Action::MarkNode`] to finish; answer [`Event::NodeMarked`].
    AwaitMarks,
    /// Post a `NodeShutdown` node Event with this message.
    NodeEvent(&'static str),
    /// Remove the shutdown taint; answer [`Event::TaintRemoved`].
    RemoveTaint,
    /// Count or log a reboot request.
    Reboot(RebootAction),
    /// Send the last gasp; answer [`Event::LastGaspAnswered`].
    LastGasp,
    /// The node is still up long after a last gasp: say so, and remove the annotation when the
    /// last gasp is one.
    RetractLastGasp {
        /// Remove the last-gasp annotation.
        remove_annotation: bool,
    },
    /// Remove node-monitor's logind drop-in (when unchanged) and reload logind.
    RemoveDropin,
}

/// The node Event message when logind announces a shutdown.
pub const EVENT_DETECTED: &str = "Shutdown manager detected shutdown event";
/// The node Event message when the groups ran.
pub const EVENT_FINISHED: &str = "Shutdown manager finished terminating pods";
/// The node Event message when logind cancelled the shutdown.
pub const EVENT_CANCELLED: &str = "Shutdown manager detected shutdown cancellation";
