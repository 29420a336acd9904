//! Carrying the lifecycle's actions out: each through a port, its outcome back as the answer
//! event, with the logs and metrics that go with it.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::{
    LastGasp, Manager, RebootSeen,
    logind::LogindError,
    node::{api_error, mark_node, plannable, shutdown_pod, terminal},
    ports::{LogindConn, LogindPort, NodeApi},
};
use crate::{
    cluster::actuator::{DeleteOutcome, NodeConditionUpdate},
    ebpf::RebootGate,
    metrics::{Metrics, PhaseLabels, ReasonLabels},
    telemetry::error_chain as chain,
};
use node_monitor_core::{
    contract::names::{
        CORDONED_ANNOTATION, LAST_GASP_ANNOTATION, NON_GRACEFUL_SHUTDOWN_REASON,
        SHUTTING_DOWN_CONDITION,
    },
    shutdown::{
        self as core_shutdown, GroupOutcome, PHASE_TOTAL, PlannedPod, RebootAction, ShutdownPod,
        lifecycle::{Action, Event, GASP_RETRACT, Marks},
    },
};

/// The pod list at the start of a shutdown is retried this long when the API fails.
const LIST_RETRY: Duration = Duration::from_secs(5);

impl<L: LogindPort, N: NodeApi> Manager<L, N> {
    /// Carries out one action; returns its answer, if it has one. `Err` only for a failed
    /// logind call that ends the connection.
    pub(super) async fn execute(
        &mut self,
        action: Action,
        conn: Option<&L::Conn>,
    ) -> Result<Option<Event>, LogindError> {
        let answer = match action {
            Action::ClearStaleTaint => {
                let ok = self.api.set_taint(false).await;
                if let Err(e) = &ok {
                    debug!(error = %chain(&**e), "could not clear a stale shutdown taint; retrying");
                }
                Event::StaleTaintCleared { ok: ok.is_ok() }
            }
            Action::ReadCordonAnnotation => {
                match self.api.node_annotation(CORDONED_ANNOTATION).await {
                    Ok(v) => Event::CordonAnnotationRead(Some(v.is_some())),
                    Err(e) => {
                        debug!(error = %chain(&*e), "could not read the node's annotations; retrying");
                        Event::CordonAnnotationRead(None)
                    }
                }
            }
            Action::Uncordon => Event::Uncordoned {
                ok: self.uncordon().await,
            },
            a @ (Action::ReadInhibitDelay
            | Action::RaiseInhibitDelay { .. }
            | Action::DelayTooShort(_)
            | Action::Degraded(_)
            | Action::ListInhibitors
            | Action::TakeLock) => return self.execute_logind(a, conn).await,
            Action::ReleaseLock => {
                self.release_lock();
                return Ok(None);
            }
            Action::LockLost => {
                self.lock = None;
                self.set_held(false);
                return Ok(None);
            }
            Action::PublishAtRest { reason, message } => {
                let ok = self.set_condition(false, reason, message).await;
                Event::AtRestPublished { ok }
            }
            a @ (Action::PhaseStart(_)
            | Action::PhaseEnd(_)
            | Action::MarkNode { .. }
            | Action::ListPodsForPlan
            | Action::Planned { .. }
            | Action::GroupStarted { .. }
            | Action::GroupEnded { .. }
            | Action::Release { .. }
            | Action::DeletePods(_)
            | Action::ListPresent
            | Action::RunCancelled
            | Action::AwaitMarks) => return Ok(self.execute_run(a).await),
            Action::NodeEvent(message) => {
                self.api.node_event(message).await;
                return Ok(None);
            }
            Action::RemoveTaint => {
                let ok = match self.api.set_taint(false).await {
                    Ok(()) => true,
                    Err(e) => {
                        warn!(error = %chain(&*e), "could not remove the shutdown taint");
                        self.api_error(crate::metrics::ApiOperation::patch_taint);
                        false
                    }
                };
                Event::TaintRemoved { ok }
            }
            Action::Reboot(action) => {
                self.on_reboot_action(action);
                return Ok(None);
            }
            Action::LastGasp => {
                let Some(seen) = self.seen.clone() else {
                    return Ok(None);
                };
                // The API first: the machine may be gone within milliseconds.
                let (sent, fast) = self.send_last_gasp(&seen).await;
                warn!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm, last_gasp = ?self.cfg().options.last_gasp,
                      last_gasp_sent = sent, fast_path = fast, "reboot(2) bypassed the shutdown inhibitor: non-graceful shutdown");
                Event::LastGaspAnswered
            }
            Action::RetractLastGasp { remove_annotation } => {
                warn!(after = ?GASP_RETRACT, "the node is still up after a reboot(2) that bypassed the inhibitor; it did not shut the node down");
                if remove_annotation
                    && let Err(e) = self.api.annotate_node(LAST_GASP_ANNOTATION, None).await
                {
                    warn!(error = %chain(&*e), "could not remove the last-gasp annotation");
                    self.api_error(crate::metrics::ApiOperation::patch_annotation);
                }
                return Ok(None);
            }
            Action::RemoveDropin => {
                self.logind.remove_dropin().await;
                return Ok(None);
            }
        };
        Ok(Some(answer))
    }

    /// The actions that call logind, and what they report.
    async fn execute_logind(
        &mut self,
        action: Action,
        conn: Option<&L::Conn>,
    ) -> Result<Option<Event>, LogindError> {
        let answer = match action {
            Action::ReadInhibitDelay => {
                let conn = connected(conn)?;
                match conn.inhibit_delay_max().await {
                    Ok(d) => {
                        self.set_delay_metric(d);
                        if d >= self.cfg().needed_inhibit_delay() {
                            debug!(needed = ?self.cfg().needed_inhibit_delay(), current = ?d, "logind's InhibitDelayMaxSec suffices");
                        }
                        Event::InhibitDelayRead(Some(d))
                    }
                    Err(e) => {
                        warn!(error = %chain(&e), "could not read logind's InhibitDelayMaxSec");
                        Event::InhibitDelayRead(None)
                    }
                }
            }
            Action::RaiseInhibitDelay { seconds } => {
                let conn = connected(conn)?;
                match conn.raise_inhibit_delay(seconds).await {
                    Ok(now) => {
                        if now >= self.cfg().needed_inhibit_delay() {
                            info!(
                                inhibit_delay_max_s = now.as_secs(),
                                "raised logind's InhibitDelayMaxSec"
                            );
                        }
                        self.set_delay_metric(now);
                        Event::InhibitDelayRaised(Some(now))
                    }
                    Err(e) => {
                        warn!(error = %chain(&e), "could not raise logind's InhibitDelayMaxSec");
                        Event::InhibitDelayRaised(None)
                    }
                }
            }
            Action::DelayTooShort(what) => {
                error!(error = %what, "logind ends the shutdown delay before the pods' groups can finish");
                self.degraded(what);
                return Ok(None);
            }
            Action::Degraded(what) => {
                self.degraded(what);
                return Ok(None);
            }
            Action::ListInhibitors => {
                let inhibitors = connected(conn)?.list_inhibitors().await?;
                let kubelet = core_shutdown::kubelet_holds_inhibitor(&inhibitors);
                let role =
                    core_shutdown::role(self.cfg().options.kubelet_inhibitor_policy, kubelet);
                info!(kubelet_inhibitor = kubelet, ?role, "shutdown role");
                Event::InhibitorsListed { kubelet }
            }
            Action::TakeLock => {
                // The new lock first, then the old one goes: never a moment without one.
                let lock = connected(conn)?.inhibit().await?;
                info!(fd = lock.fd, "shutdown delay inhibitor taken");
                self.lock = Some(lock);
                self.set_held(true);
                return Ok(None);
            }
            _ => return Ok(None),
        };
        Ok(Some(answer))
    }

    /// The actions of a shutdown run: its phases, its pods, its marks.
    async fn execute_run(&mut self, action: Action) -> Option<Event> {
        let answer = match action {
            Action::PhaseStart(phase) => {
                phase_start(&self.metrics, &phase, unix_now());
                return None;
            }
            Action::PhaseEnd(phase) => {
                phase_end(&self.metrics, &phase, unix_now());
                return None;
            }
            Action::MarkNode { cordon, message } => {
                self.marking = Some(tokio::spawn(mark_node(
                    self.api.clone(),
                    self.metrics.clone(),
                    message,
                    cordon,
                )));
                return None;
            }
            Action::ListPodsForPlan => Event::PodsListed(self.list_pods_for_plan().await),
            Action::Planned { pods, groups } => {
                info!(pods, ?groups, "shutdown plan");
                return None;
            }
            Action::GroupStarted { priority, pods } => {
                info!(priority, pods, "shutdown group started");
                return None;
            }
            Action::GroupEnded { priority, outcome } => {
                match outcome {
                    GroupOutcome::AllGone => info!(priority, "shutdown group done: all pods gone"),
                    GroupOutcome::PeriodElapsed { remaining } => warn!(
                        priority,
                        ?remaining,
                        "shutdown group period elapsed with pods left"
                    ),
                }
                return None;
            }
            Action::Release { total } => {
                // Metrics first: once the descriptor is closed the machine may go at once.
                phase_end(&self.metrics, PHASE_TOTAL, unix_now());
                self.release_lock();
                info!(
                    total_ms = total.as_millis() as u64,
                    "shutdown groups done; logind may proceed"
                );
                return None;
            }
            Action::DeletePods(pods) => Event::PodsDeleted(self.delete_pods(pods).await),
            Action::ListPresent => Event::PodsPresent(self.list_present().await),
            Action::RunCancelled => {
                info!("shutdown cancelled while terminating pods; no further group starts");
                return None;
            }
            Action::AwaitMarks => {
                let marks = match self.marking.take() {
                    Some(task) => task.await.unwrap_or_default(),
                    None => Marks::default(),
                };
                Event::NodeMarked(marks)
            }
            _ => return None,
        };
        Some(answer)
    }

    pub(super) fn set_held(&self, held: bool) {
        self.metrics.shutdown.inhibitor_held.set(i64::from(held));
    }

    fn release_lock(&mut self) {
        if self.lock.take().is_some() {
            info!("shutdown delay inhibitor released");
        }
        self.set_held(false);
    }

    fn set_delay_metric(&self, d: Duration) {
        self.metrics
            .shutdown
            .inhibit_delay_max_seconds
            .set(d.as_secs_f64());
    }

    /// Reports a degradation once per distinct message.
    fn degraded(&mut self, what: String) {
        if self.reported.insert(what.clone()) {
            self.metrics.degraded.set(1);
            self.health.report_degraded(what);
        }
    }

    fn api_error(&self, operation: crate::metrics::ApiOperation) {
        api_error(&self.metrics, operation);
    }

    async fn set_condition(&mut self, status: bool, reason: &str, message: String) -> bool {
        let update = NodeConditionUpdate {
            type_: SHUTTING_DOWN_CONDITION.into(),
            status,
            reason: reason.into(),
            message,
        };
        match self.api.set_condition(update).await {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %chain(&*e), reason, "could not set the shutdown condition");
                self.api_error(crate::metrics::ApiOperation::patch_conditions);
                false
            }
        }
    }

    /// Uncordons the node and drops the cordon annotation; true when the uncordon took.
    async fn uncordon(&mut self) -> bool {
        match self.api.set_unschedulable(false).await {
            Ok(_) => {
                if let Err(e) = self.api.annotate_node(CORDONED_ANNOTATION, None).await {
                    warn!(error = %chain(&*e), "could not remove the cordon annotation");
                }
                true
            }
            Err(e) => {
                warn!(error = %chain(&*e), "could not uncordon the node");
                self.api_error(crate::metrics::ApiOperation::patch_unschedulable);
                false
            }
        }
    }

    /// Deletes the pods together; returns the UIDs deleted or already gone (failures are
    /// retried while the group runs).
    async fn delete_pods(&self, pods: Vec<PlannedPod>) -> Vec<String> {
        let results = join_all(pods.iter().map(|p| {
            let grace = u32::try_from(p.grace_period_seconds).unwrap_or(u32::MAX);
            self.api.delete_pod(
                p.pod.namespace.clone(),
                p.pod.name.clone(),
                p.pod.uid.clone(),
                grace,
            )
        }))
        .await;
        let mut done = Vec::new();
        for (p, r) in pods.iter().zip(results) {
            let pod = format!("{}/{}", p.pod.namespace, p.pod.name);
            match r {
                Ok(DeleteOutcome::Deleted) => {
                    info!(%pod, grace = p.grace_period_seconds, "pod deleted for shutdown");
                    done.push(p.pod.uid.clone());
                }
                Ok(DeleteOutcome::Gone) => done.push(p.pod.uid.clone()),
                Err(e) => {
                    warn!(%pod, error = %chain(&*e), "pod deletion failed; retried while the group runs");
                    self.api_error(crate::metrics::ApiOperation::delete_pod);
                }
            }
        }
        done
    }

    /// This node's pods as the plan needs them: active, not node-monitor's own, not mirror pods
    /// (static pods belong to the kubelet). Retried briefly; an API that stays down gives an
    /// empty plan (the kubelet, if configured, still acts locally).
    async fn list_pods_for_plan(&self) -> Vec<ShutdownPod> {
        let deadline = Instant::now() + LIST_RETRY;
        loop {
            match self.api.list_node_pods().await {
                Ok(pods) => {
                    return pods
                        .iter()
                        .filter(|p| plannable(p, self.own_pod.as_ref()))
                        .filter_map(shutdown_pod)
                        .collect();
                }
                Err(e) if Instant::now() < deadline => {
                    debug!(error = %e, "listing the node's pods failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    error!(error = %e, "could not list the node's pods; no pod is terminated through the API");
                    self.api_error(crate::metrics::ApiOperation::list_pods);
                    return Vec::new();
                }
            }
        }
    }

    /// The node's pods as `(uid, finished)`; `None` when the API cannot answer.
    async fn list_present(&self) -> Option<Vec<(String, bool)>> {
        match self.api.list_node_pods().await {
            Ok(pods) => Some(
                pods.iter()
                    .filter_map(|p| Some((p.metadata.uid.clone()?, terminal(p))))
                    .collect(),
            ),
            Err(e) => {
                debug!(error = %e, "could not list the node's pods; assuming all still present");
                self.api_error(crate::metrics::ApiOperation::list_pods);
                None
            }
        }
    }

    fn on_reboot_action(&self, action: RebootAction) {
        let Some(seen) = &self.seen else {
            return;
        };
        match action {
            RebootAction::CountRefused { reason, n } => {
                self.metrics
                    .shutdown
                    .reboot_requests_refused
                    .get_or_create(&ReasonLabels {
                        reason: reason.to_owned(),
                    })
                    .inc_by(n);
            }
            RebootAction::CountUnverified { n } => {
                self.metrics.shutdown.reboot_requests_unverified.inc_by(n);
            }
            RebootAction::Log { gate, unlogged } => match gate {
                RebootGate::NotShutdown => {
                    debug!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm, unlogged, "reboot(2) that does not shut down");
                }
                RebootGate::Unverified => {
                    warn!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm, cgroup_id = seen.cgroup_id, unlogged,
                          "reboot(2) whose caller the probe cannot check (kernel offsets unavailable): not taken for a shutdown, no last gasp");
                }
                refused => {
                    info!(verdict = refused.as_str(), cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm,
                          cgroup_id = seen.cgroup_id, unlogged,
                          "reboot(2) the kernel refuses (or that only ends a container's PID namespace): not a shutdown");
                }
            },
            RebootAction::Graceful => {
                info!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm, "reboot(2) at the end of a graceful shutdown");
            }
            RebootAction::Bypassed => {
                self.metrics.shutdown.bypassing_inhibitor.inc();
            }
            RebootAction::LastGasp => {}
            RebootAction::LastGaspSuppressed { previous } => {
                self.metrics.shutdown.last_gasps_suppressed.inc();
                warn!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm,
                      previous_s_ago = self.now().saturating_since(previous).as_secs(),
                      "reboot(2) bypassed the shutdown inhibitor again; no second last gasp this soon");
            }
        }
    }

    /// One bounded request telling the API the node is going down without a graceful shutdown.
    /// The last gasp for `seen`: the fast path's answer when it sent it already (the moment the
    /// probe saw the call), else sent here. Whether it was sent, and whether by the fast path.
    async fn send_last_gasp(&self, seen: &RebootSeen) -> (bool, bool) {
        let timeout = self.cfg().options.last_gasp_timeout;
        let fast = match &self.fast {
            Some(f) => f.claim(seen, timeout).await,
            None => None,
        };
        match fast {
            Some(sent) => (sent, true),
            None => (self.last_gasp(seen).await, false),
        }
    }

    async fn last_gasp(&self, seen: &RebootSeen) -> bool {
        let message = super::gasp::condition_message(seen);
        let timeout = self.cfg().options.last_gasp_timeout;
        let result = match self.cfg().options.last_gasp {
            LastGasp::None => return false,
            LastGasp::Condition => {
                let update = NodeConditionUpdate {
                    type_: SHUTTING_DOWN_CONDITION.into(),
                    status: true,
                    reason: NON_GRACEFUL_SHUTDOWN_REASON.into(),
                    message,
                };
                tokio::time::timeout(timeout, self.api.set_condition(update)).await
            }
            LastGasp::Annotation => {
                let value = super::gasp::annotation_value(seen, unix_now());
                tokio::time::timeout(
                    timeout,
                    self.api.annotate_node(LAST_GASP_ANNOTATION, Some(value)),
                )
                .await
            }
        };
        match result {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                warn!(error = %chain(&*e), "last gasp failed");
                self.api_error(crate::metrics::ApiOperation::last_gasp);
                false
            }
            Err(_) => {
                warn!(?timeout, "last gasp timed out");
                self.api_error(crate::metrics::ApiOperation::last_gasp);
                false
            }
        }
    }
}

fn connected<C>(conn: Option<&C>) -> Result<&C, LogindError> {
    conn.ok_or(LogindError::Disconnected)
}

fn phase_start(metrics: &Metrics, phase: &str, at: f64) {
    let l = PhaseLabels {
        phase: phase.to_owned(),
    };
    metrics
        .shutdown
        .phase_start_time_seconds
        .get_or_create(&l)
        .set(at);
    // As the kubelet does for its end-time gauge: a new start clears the previous end.
    metrics
        .shutdown
        .phase_end_time_seconds
        .get_or_create(&l)
        .set(0.0);
}

fn phase_end(metrics: &Metrics, phase: &str, at: f64) {
    let l = PhaseLabels {
        phase: phase.to_owned(),
    };
    metrics
        .shutdown
        .phase_end_time_seconds
        .get_or_create(&l)
        .set(at);
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
