//! The shutdown manager's lifecycle as a pure state machine: [`Lifecycle::step`] takes one
//! [`Event`] (a logind signal, a kernel reboot request, a timer, the answer to an earlier
//! action) and the time, and returns the [`Action`]s to carry out, in order.
//!
//! The adapter (`node-monitor/src/shutdown/`) carries the actions out one after another. An
//! action with an answer (a lock taken, a pod list, an API write's outcome) is answered with its
//! event at once, and the actions that answer returns run before the rest of the list. A logind
//! call that fails ends the connection: the actions after it are dropped and
//! [`Event::LogindLost`] follows, as the kubelet reconnects to logind.
//!
//! The state it keeps, which the manager used to spread over flags: the role, whether a lock is
//! held, whether logind announced a shutdown (`preparing`), the marks node-monitor set, whether
//! the condition at rest and the clearing of stale marks reached the API, the last gasp's time,
//! the reboot requests' rate limits, and the running shutdown ([`ShutdownRun`]).
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use super::{
    PHASE_TOTAL, PlannedPod, RebootAction, RebootRequests, Role, ShutdownPod, ShutdownRun, Step,
    config::{LastGasp, ShutdownConfig},
    group_phase, plan, plan_summary, role,
};
use crate::units::clock::Timestamp;

mod events;
pub use events::*;

/// A last gasp is taken back when the node is still up this long after it.
pub const GASP_RETRACT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
enum Phase {
    /// No shutdown running.
    Idle,
    /// Waiting for the pod list of the plan.
    Listing,
    /// The groups run.
    Running(Box<Running>),
    /// The run ended (or was cancelled): waiting for the marks.
    AwaitingMarks,
}

#[derive(Debug, Clone)]
struct Running {
    run: ShutdownRun,
    /// UIDs deleted (or found gone) so far; failed deletions are retried.
    deleted: BTreeSet<String>,
    /// A cancellation came: the next pod list aborts the run.
    cancelling: bool,
}

/// The shutdown manager's state; see the module documentation.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    cfg: ShutdownConfig,
    role: Role,
    lock: bool,
    preparing: bool,
    marks: Marks,
    armed_published: bool,
    stale_cleared: bool,
    gasp_at: Option<Timestamp>,
    requests: RebootRequests,
    delay_current: Duration,
    phase: Phase,
}

impl Lifecycle {
    /// A manager at rest, before [`Event::Started`].
    pub fn new(cfg: ShutdownConfig) -> Self {
        Self {
            cfg,
            role: Role::Terminate,
            lock: false,
            preparing: false,
            marks: Marks::default(),
            armed_published: false,
            stale_cleared: false,
            gasp_at: None,
            requests: RebootRequests::default(),
            delay_current: Duration::ZERO,
            phase: Phase::Idle,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ShutdownConfig {
        &self.cfg
    }

    /// node-monitor's part in a shutdown (known once logind listed its inhibitors).
    pub fn role(&self) -> Role {
        self.role
    }

    /// logind announced a shutdown that was not cancelled since.
    pub fn preparing(&self) -> bool {
        self.preparing
    }

    /// A lock is held.
    pub fn holds_lock(&self) -> bool {
        self.lock
    }

    /// The marks node-monitor set.
    pub fn marks(&self) -> Marks {
        self.marks
    }

    /// A shutdown's groups are running (or their pods are being listed, or the marks awaited).
    pub fn running(&self) -> bool {
        !matches!(self.phase, Phase::Idle)
    }

    /// When the running group must be looked at again: its end, or one poll interval from
    /// `now`, whichever comes first. `None` outside a run.
    pub fn next_wake(&self, now: Timestamp) -> Option<Timestamp> {
        let Phase::Running(r) = &self.phase else {
            return None;
        };
        let poll = now + self.cfg.options.poll_interval;
        Some(r.run.deadline().map_or(poll, |d| d.min(poll)))
    }

    fn wants_lock(&self) -> bool {
        self.role != Role::Passive && !self.cfg.groups.is_empty()
    }

    /// The actions for `event` at `now`, in order.
    pub fn step(&mut self, event: Event, now: Timestamp) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Started => self.clear_stale(&mut out),
            Event::LogindConnected => {
                out.push(Action::ReadInhibitDelay);
                out.push(Action::ListInhibitors);
            }
            Event::InhibitorsListed { kubelet } => {
                self.role = role(self.cfg.options.kubelet_inhibitor_policy, kubelet);
                if self.wants_lock() && !self.preparing {
                    self.take_lock(&mut out);
                }
                out.push(self.publish_at_rest());
            }
            Event::LogindRestarted => {
                if self.wants_lock() && !self.preparing {
                    self.take_lock(&mut out);
                }
                out.push(Action::ReadInhibitDelay);
            }
            Event::LogindLost { error } => {
                self.lock = false;
                out.push(Action::LockLost);
                if !self.preparing {
                    out.push(Action::Degraded(format!("shutdown inhibitor: {error}")));
                }
            }
            Event::InhibitDelayRead(None) => {}
            Event::InhibitDelayRead(Some(current)) => self.on_delay(current, &mut out),
            Event::InhibitDelayRaised(now_delay) => {
                let allowed = now_delay.unwrap_or(self.delay_current);
                if now_delay.is_none_or(|d| d < self.cfg.needed_inhibit_delay()) {
                    self.delay_too_short(allowed, &mut out);
                }
            }
            Event::PrepareForShutdown(start) => self.on_prepare(start, now, &mut out),
            Event::PodsListed(pods) => self.on_pods_listed(&pods, now, &mut out),
            Event::PodsPresent(listing) => self.on_present(listing.as_deref(), now, &mut out),
            Event::PodsDeleted(uids) => {
                if let Phase::Running(r) = &mut self.phase {
                    r.deleted.extend(uids);
                }
            }
            Event::NodeMarked(marks) => {
                self.marks = marks;
                if matches!(self.phase, Phase::AwaitingMarks) {
                    self.phase = Phase::Idle;
                }
            }
            Event::Wake => self.look_again(now, &mut out),
            Event::RetryTick => self.on_retry(now, &mut out),
            Event::Reboot(req) => {
                for a in self.requests.on_request(req, self.preparing, now) {
                    out.push(match a {
                        RebootAction::LastGasp => Action::LastGasp,
                        other => Action::Reboot(other),
                    });
                }
                self.look_again(now, &mut out);
            }
            Event::LastGaspAnswered => self.gasp_at = Some(now),
            Event::AtRestPublished { ok } => self.armed_published = ok,
            Event::StaleTaintCleared { ok } => {
                if !ok {
                    self.stale_cleared = false;
                }
            }
            Event::CordonAnnotationRead(Some(true)) => {
                self.marks.cordoned = true;
                self.uncordon(&mut out);
            }
            Event::CordonAnnotationRead(Some(false)) => {}
            Event::CordonAnnotationRead(None) => self.stale_cleared = false,
            Event::TaintRemoved { ok } => {
                if ok {
                    self.marks.taint = false;
                }
            }
            Event::Uncordoned { ok } => {
                if ok {
                    self.marks.cordoned = false;
                }
            }
            Event::StopRequested => {
                self.lock = false;
                out.push(Action::ReleaseLock);
                if !self.preparing && self.cfg.options.manage_inhibit_delay {
                    out.push(Action::RemoveDropin);
                }
            }
        }
        out
    }

    fn take_lock(&mut self, out: &mut Vec<Action>) {
        // A failure ends the connection ([`Event::LogindLost`] clears it again).
        self.lock = true;
        out.push(Action::TakeLock);
    }

    fn clear_stale(&mut self, out: &mut Vec<Action>) {
        self.stale_cleared = true;
        out.push(Action::ClearStaleTaint);
        out.push(Action::ReadCordonAnnotation);
    }

    fn uncordon(&self, out: &mut Vec<Action>) {
        if self.marks.cordoned {
            out.push(Action::Uncordon);
        }
    }

    /// The condition at rest (False), saying whether shutdowns are delayed.
    fn publish_at_rest(&self) -> Action {
        let (reason, message) = match (self.role, self.lock) {
            (Role::Passive, _) => (
                "KubeletHandlesShutdown",
                "the kubelet holds a shutdown inhibitor; node-monitor only watches".to_owned(),
            ),
            (_, true) => (
                "InhibitorHeld",
                format!(
                    "node-monitor delays shutdowns up to {}s to terminate pods by priority",
                    self.cfg.budget().as_secs()
                ),
            ),
            (_, false) => (
                "NoInhibitor",
                "no shutdown groups configured; shutdowns are watched only".to_owned(),
            ),
        };
        Action::PublishAtRest { reason, message }
    }

    fn on_delay(&mut self, current: Duration, out: &mut Vec<Action>) {
        self.delay_current = current;
        let needed = self.cfg.needed_inhibit_delay();
        match super::inhibit_delay_check(needed, current, self.cfg.options.manage_inhibit_delay) {
            super::DelayCheck::Sufficient => {}
            super::DelayCheck::TooLow { allowed, .. } => self.delay_too_short(allowed, out),
            super::DelayCheck::Raise { seconds } => {
                out.push(Action::RaiseInhibitDelay { seconds });
            }
        }
    }

    fn delay_too_short(&self, allowed: Duration, out: &mut Vec<Action>) {
        if let Err(e) = super::check_inhibit_delay(self.cfg.needed_inhibit_delay(), allowed) {
            out.push(Action::DelayTooShort(e.to_string()));
        }
    }

    fn on_retry(&mut self, now: Timestamp, out: &mut Vec<Action>) {
        if !self.stale_cleared && !self.preparing {
            self.clear_stale(out);
        }
        if !self.armed_published && !self.preparing {
            out.push(self.publish_at_rest());
        }
        if self
            .gasp_at
            .is_some_and(|t| now.saturating_since(t) > GASP_RETRACT)
        {
            self.gasp_at = None;
            out.push(Action::RetractLastGasp {
                remove_annotation: self.cfg.options.last_gasp == LastGasp::Annotation,
            });
            out.push(self.publish_at_rest());
        }
    }

    fn on_prepare(&mut self, start: bool, now: Timestamp, out: &mut Vec<Action>) {
        if let Phase::Running(r) = &mut self.phase {
            if !start {
                r.cancelling = true;
            }
            self.look_again(now, out);
            return;
        }
        match (matches!(self.phase, Phase::Idle), start) {
            (true, true) => {
                self.preparing = true;
                if self.role == Role::Passive {
                    return;
                }
                self.phase = Phase::Listing;
                out.push(Action::PhaseStart(PHASE_TOTAL.to_owned()));
                out.push(Action::MarkNode {
                    cordon: self.cfg.options.cordon,
                    message: format!(
                        "systemd-logind announced a shutdown; node-monitor terminates pods by priority group within {}s",
                        self.cfg.budget().as_secs()
                    ),
                });
                out.push(Action::ListPodsForPlan);
            }
            (true, false) => self.on_cancel(out),
            // No signal is taken while the pods are listed or the marks awaited.
            (false, _) => {}
        }
    }

    /// `PrepareForShutdown(false)` outside a run: undo what node-monitor marked and take the
    /// lock again (first: the next shutdown may come at any moment).
    fn on_cancel(&mut self, out: &mut Vec<Action>) {
        self.preparing = false;
        if self.wants_lock() {
            self.take_lock(out);
        }
        if self.role != Role::Passive {
            out.push(Action::NodeEvent(EVENT_CANCELLED));
            if self.marks.taint {
                out.push(Action::RemoveTaint);
            }
            self.uncordon(out);
        }
        out.push(self.publish_at_rest());
        self.marks.condition = false;
    }

    fn on_pods_listed(&mut self, pods: &[ShutdownPod], now: Timestamp, out: &mut Vec<Action>) {
        if !matches!(self.phase, Phase::Listing) {
            return;
        }
        let plan = plan(&self.cfg.groups, pods);
        out.push(Action::Planned {
            pods: plan.pod_count(),
            groups: plan_summary(&plan),
        });
        self.phase = Phase::Running(Box::new(Running {
            run: ShutdownRun::new(plan, now),
            deleted: BTreeSet::new(),
            cancelling: false,
        }));
        self.advance(now, &BTreeSet::new(), out);
    }

    /// During a run: ask the API which of the running group's pods are left (with no pods to
    /// ask about, none are).
    fn look_again(&mut self, now: Timestamp, out: &mut Vec<Action>) {
        let Phase::Running(r) = &self.phase else {
            return;
        };
        if r.run.current_pods().is_empty() {
            self.on_present(Some(&[]), now, out);
        } else {
            out.push(Action::ListPresent);
        }
    }

    fn on_present(
        &mut self,
        listing: Option<&[(String, bool)]>,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) {
        let Phase::Running(r) = &mut self.phase else {
            return;
        };
        let all: BTreeSet<String> = r
            .run
            .current_pods()
            .iter()
            .map(|p| p.pod.uid.clone())
            .collect();
        let present = match listing {
            None => all,
            Some(pods) => {
                let live: BTreeMap<&str, bool> = pods
                    .iter()
                    .map(|(uid, done)| (uid.as_str(), *done))
                    .collect();
                // A pod the kubelet killed stays in the API as Failed: the observer waits for
                // the pods to finish, the terminator for them to go.
                all.into_iter()
                    .filter(|uid| match live.get(uid.as_str()) {
                        None => false,
                        Some(&done) => !(self.role == Role::Observe && done),
                    })
                    .collect()
            }
        };
        if r.cancelling {
            if let Some(Step::EndGroup { priority, .. }) = r.run.abort(now, &present) {
                out.push(Action::PhaseEnd(group_phase(priority)));
            }
            out.push(Action::PhaseEnd(PHASE_TOTAL.to_owned()));
            out.push(Action::RunCancelled);
            out.push(Action::AwaitMarks);
            self.phase = Phase::AwaitingMarks;
            return;
        }
        self.advance(now, &present, out);
    }

    /// Advances the run's phases and deletes what the running group still needs deleted.
    fn advance(&mut self, now: Timestamp, present: &BTreeSet<String>, out: &mut Vec<Action>) {
        let Phase::Running(r) = &mut self.phase else {
            return;
        };
        for step in r.run.advance(now, present) {
            match step {
                Step::StartGroup { priority, pods, .. } => {
                    out.push(Action::PhaseStart(group_phase(priority)));
                    out.push(Action::GroupStarted {
                        priority,
                        pods: pods.len(),
                    });
                }
                Step::EndGroup {
                    priority, outcome, ..
                } => {
                    out.push(Action::PhaseEnd(group_phase(priority)));
                    out.push(Action::GroupEnded { priority, outcome });
                }
                Step::Release => {
                    self.lock = false;
                    out.push(Action::Release {
                        total: now.saturating_since(r.run.started()),
                    });
                }
            }
        }
        if r.run.is_finished() {
            out.push(Action::AwaitMarks);
            out.push(Action::NodeEvent(EVENT_FINISHED));
            self.phase = Phase::AwaitingMarks;
            return;
        }
        if self.role == Role::Terminate {
            let todo: Vec<PlannedPod> = r
                .run
                .current_pods()
                .iter()
                .filter(|p| !r.deleted.contains(&p.pod.uid))
                .cloned()
                .collect();
            if !todo.is_empty() {
                out.push(Action::DeletePods(todo));
            }
        }
    }
}

#[cfg(test)]
mod tests;
