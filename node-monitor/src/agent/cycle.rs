//! One agent cycle, in stages: observe (the signals, the pod figures when a ranking needs them,
//! then the arming of the memcg thresholds and the memory push), decide (the core's
//! `synchronize`, with the agent's own holds), act (the eviction requests), then the recorders on
//! the cycle's report ([`super::recorders`]), the Events and the wait for cleanup. Through the
//! ports of [`super::ports`] (the node, the pods, the cluster writes, the memcg thresholds), so it
//! runs the same against the sampler and the API as against the fakes of its unit tests. The
//! loop keeps only what the next decision needs; what is recorded is the recorders'.
use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use node_monitor_core::{
    arming::mem_push::PushPolicy,
    config::{EvictionConfig, FsLayout, LayoutConfig},
    eviction::headroom::{Headroom, HeadroomPolicy},
    eviction::pod_figures::{NEAR_REFRESH, RANK_MAX_AGE, RankFigures, rank_figures, refresh_due},
    eviction::reclaim::PendingReclaim,
    eviction::{DRY_RUN_REPORT_INTERVAL, Decision, EvictionState, ReportLimiter, synchronize},
    kubelet::pod::{POD_CGROUP_SETTLE, PodInfo, PodPresence, blind_to_pods},
    signals::Observations,
    units::clock::Timestamp,
};

pub(super) use super::report::CycleEnd;
use pod_refresh::PodRefresh;

use super::{
    backoff::{self, Backoff},
    mem_push::{MemPush, PushArm},
    ports::{Arming, ClusterWrites, NodeSignals, NodeView, PodSource, PodView, StopSignal},
    recorders::{Outputs, Recorders},
    report::{CycleReport, PodFigures},
};
use crate::{
    cluster::actuator::{EvictOutcome, EvictionRequest},
    http::Health,
    live::{EvictionRecord, LiveView},
    metrics::Metrics,
    sampler::{SampleKind, TimedObservations},
    wakeup::Wakeup,
};

/// The agent loop's state across cycles, and its ports.
pub(super) struct Loop<C, P> {
    pub(super) start: Instant,
    /// The configuration for the filesystem layout last sampled (its `containerfs.*`
    /// thresholds derived as the kubelet derives them), rebuilt from `layout_config`.
    pub(super) config: EvictionConfig,
    pub(super) layout_config: LayoutConfig,
    pub(super) state: EvictionState,
    pub(super) metrics: Arc<Metrics>,
    pub(super) actuator: C,
    pub(super) store: P,
    pub(super) backoff: Backoff,
    /// The API server throttled an eviction (its Retry-After) or was unavailable (the retry
    /// delay): no eviction request before this.
    pub(super) evictions_held_until: Option<Timestamp>,
    /// A dry run decides the same pods on every wake-up: report each once per interval.
    pub(super) dry_run_reports: ReportLimiter,
    pub(super) retry_delay: Duration,
    /// Adaptive sampling: the headroom seen per threshold, and when to look again.
    pub(super) headroom: Headroom,
    pub(super) headroom_policy: Option<HeadroomPolicy>,
    pub(super) next_sample_at: Option<Timestamp>,
    pub(super) health: Arc<Health>,
    /// Whether the last look found the agent blind to the pods' cgroups, and when it looked.
    pub(super) blind: Option<usize>,
    pub(super) sight_checked: Option<Instant>,
    pub(super) kubepods_reported: Option<(String, String)>,
    /// Disk that pods evicted for disk pressure still hold until the kubelet's container
    /// garbage collection frees it, credited back to the disk signals meanwhile.
    pub(super) pending_reclaim: PendingReclaim,
    /// The per-pod figures of the last pass that read them, and when: a ranking at a crossing
    /// uses them if they are recent enough (see [`node_monitor_core::eviction::pod_figures`]).
    pub(super) pod_figures: Option<PodFigures>,
    /// Whether the last pass wants those figures refreshed, beside the decisions.
    pub(super) pod_refresh: PodRefresh,
    /// The eBPF memory push, armed while a memory threshold is near (see
    /// [`node_monitor_core::arming::mem_push`]); `None` without it.
    pub(super) mem_push: Option<MemPush>,
    /// What runs on each cycle's report: metrics, the live view and flight record, conditions
    /// and taints, the kubelet cross-check.
    pub(super) recorders: Recorders,
}

/// How often the agent checks that it sees the cgroups of the pods the API lists.
const SIGHT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Retry delays after failed eviction requests (API server unreachable, 5xx): 250 ms doubling to 5 s.
const RETRY_INITIAL: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);

impl<C: ClusterWrites, P: PodSource> Loop<C, P> {
    /// A loop at its start: no pressure, nothing published, nothing backing off.
    pub(super) fn new(
        config: EvictionConfig,
        metrics: Arc<Metrics>,
        actuator: C,
        store: P,
        health: Arc<Health>,
        headroom_policy: Option<HeadroomPolicy>,
    ) -> Self {
        Loop {
            start: Instant::now(),
            layout_config: LayoutConfig::new(config.clone()),
            config,
            state: EvictionState::new(),
            metrics,
            actuator,
            store,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            evictions_held_until: None,
            retry_delay: RETRY_INITIAL,
            dry_run_reports: ReportLimiter::new(DRY_RUN_REPORT_INTERVAL),
            headroom: Headroom::new(),
            headroom_policy,
            next_sample_at: None,
            pending_reclaim: PendingReclaim::new(),
            health,
            blind: None,
            sight_checked: None,
            kubepods_reported: None,
            pod_figures: None,
            pod_refresh: PodRefresh::default(),
            mem_push: None,
            recorders: Recorders::new(Arc::new(LiveView::new(""))),
        }
    }

    /// Arms `control` near memory thresholds, with batches sized by `policy`.
    pub(super) fn with_mem_push(mut self, control: Box<dyn PushArm>, policy: PushPolicy) -> Self {
        self.mem_push = Some(MemPush::new(control, policy));
        self
    }

    /// The arming stage, after each observation: the memcg thresholds re-armed at the fresh
    /// readings, and the memory push for the memory thresholds near in `observations`; both
    /// pure policies of the core ([`node_monitor_core::arming`], [`node_monitor_core::arming::mem_push`]).
    fn arm<N: NodeView, A: Arming>(
        &mut self,
        sampler: &N,
        wakeups: &mut A,
        observations: &Observations,
    ) {
        self.rearm(sampler, wakeups);
        let now = self.now();
        if let Some(push) = self.mem_push.as_mut() {
            push.arm(observations, &self.config.thresholds, now);
        }
    }

    /// Reads the kubelet's configuration file at `path` (empty: off) and compares its
    /// thresholds with the agent's on each cycle.
    pub(super) fn with_kubelet_config(mut self, path: &str, proc_root: &std::path::Path) -> Self {
        self.recorders.kubelet = super::kubelet_config::KubeletThresholds::new(path, proc_root);
        self
    }

    /// Shows the loop's decisions and evictions in `live`.
    pub(super) fn with_live(mut self, live: Arc<LiveView>) -> Self {
        self.recorders.live = live;
        self
    }

    pub(super) fn now(&self) -> Timestamp {
        Timestamp::from_duration(self.start.elapsed())
    }

    pub(super) fn instant_of(&self, t: Timestamp) -> Instant {
        self.start + t.since_origin()
    }

    /// One wake-up received, by source (`timer` and `headroom` for the agent's own timers).
    pub(super) fn count_wakeup(&self, label: &str) {
        self.metrics.wakeups.count(label);
    }

    /// Cycles for one wake-up: a refusal or failure makes the next candidate eligible at once, so
    /// the loop decides again without waiting for the next wake-up (bounded: each refusal puts
    /// one more pod into backoff). A stop (SIGTERM, SIGINT) ends it mid-cycle, whatever call or
    /// wait is in flight: the cycle is dropped there, and the marks it may have half written are
    /// for the release on stop to take back. Returns whether a stop did.
    pub(super) async fn cycles<N: NodeView, A: Arming, S: StopSignal>(
        &mut self,
        sampler: &mut N,
        wakeups: &mut A,
        mut wakeup: Wakeup,
        label: &'static str,
        stop: &mut S,
    ) -> bool {
        loop {
            let end = tokio::select! {
                report = self.cycle(sampler, wakeups, wakeup, label) => Some(report.end),
                signal = stop.stopped() => { info!(signal, "stop during a decision: stopping"); None }
            };
            let Some(end) = end else {
                return true;
            };
            self.health.progress();
            if end != CycleEnd::Refused {
                return false;
            }
            wakeup = Wakeup {
                source: wakeup.source,
                at: std::time::Instant::now(),
            };
        }
    }

    /// One pass: observe, decide, act; then the recorders on its report, the Events and the wait
    /// for cleanup. Returns the report.
    pub(super) async fn cycle<N: NodeView, A: Arming>(
        &mut self,
        sampler: &mut N,
        wakeups: &mut A,
        wakeup: Wakeup,
        // What woke the agent, as in `node_monitor_wakeups_total` (`headroom`, `timer`, …).
        label: &'static str,
    ) -> CycleReport {
        // A wake-up that arrived while the previous cycle was still running (acting, waiting for
        // an evicted pod to go) has queued since; reported apart from this cycle's own work.
        let started = std::time::Instant::now();
        let pods = self.candidate_pods(self.now());
        let (mut timed, figures) = self.observe(sampler, wakeup, &pods);
        self.arm(sampler, wakeups, &timed.observations);
        let now = self.now();
        let decision = self.decide(sampler, &mut timed, &pods, now);
        super::cycle_metrics::decided(&self.metrics, &timed, figures, wakeup, label, started);
        // Eviction requests first: the recorders, the Events and the wait for cleanup follow, so
        // neither their work nor an API round trip of theirs delays an eviction.
        let (end, answered) = self.send_evictions(&decision, wakeup, label, now).await;
        self.refresh_pod_figures(sampler, &mut timed.observations, figures, &wakeup, now);
        let report = CycleReport {
            now,
            pods,
            observations: timed.observations,
            decision,
            answered,
            pod_figures: self.pod_figures.clone(),
            end,
        };
        super::disk_reclaim::note_evictions(
            &mut self.pending_reclaim,
            &report.decision,
            &report.answered,
            &report.observations,
            now,
        );
        let outputs = Outputs {
            config: &self.config,
            metrics: &self.metrics,
            actuator: &self.actuator,
            health: &self.health,
        };
        self.recorders.record(&report, outputs).await;
        self.after_evictions(sampler, &report).await;
        if report.decision.evict.is_empty() {
            self.enforce_storage_limits(sampler, report.observations.filesystem)
                .await;
        }
        report
    }

    /// After the requests: an OOM kill's wake-up reads the pods now, for its flight record; a
    /// ranking from an earlier pass's figures, or a threshold near with figures due, asks for the
    /// refresh the loop makes beside the decisions (`pod_refresh`), which gives way to the next
    /// wake-up.
    fn refresh_pod_figures<N: PodView>(
        &mut self,
        sampler: &mut N,
        observations: &mut Observations,
        figures: Option<RankFigures>,
        wakeup: &Wakeup,
        now: Timestamp,
    ) {
        match figures {
            Some(RankFigures::Earlier { .. }) => self.pod_refresh.want(),
            None if read_pods_for(&wakeup.source) => self.read_pods(sampler, observations),
            None if refresh_due(
                self.pod_figures.as_ref().map(|(t, _)| *t),
                now,
                self.next_sample_at,
                NEAR_REFRESH,
            ) =>
            {
                self.pod_refresh.want();
            }
            _ => {}
        }
    }

    /// The evictions' Events, then the wait for each evicted pod's cleanup.
    async fn after_evictions<N: NodeView>(&mut self, sampler: &mut N, report: &CycleReport) {
        for (req, outcome) in &report.answered {
            self.actuator.record_eviction_events(req, outcome).await;
            self.health.progress();
        }
        for (req, outcome) in &report.answered {
            if !outcome.took_effect() {
                continue;
            }
            let exited = super::cleanup::wait_for_cleanup(
                sampler,
                &self.actuator,
                &self.health,
                self.config.node_monitor.pod_cleanup_timeout,
                req,
            )
            .await;
            // From the decision to the pod's cgroup gone: the predictor's lead.
            let took = exited.then(|| self.now().saturating_since(report.now));
            self.state.note_eviction(took);
        }
    }

    /// The signals first (tens of µs whatever the pod count); per-pod usage only when a
    /// threshold is met or a condition still holds, since ranking is the only thing that needs
    /// it: from the last pass that read the pods if it is recent enough, from a pass made now
    /// otherwise (while a threshold is near, the cycle reads them after its decision, so that
    /// they are recent at the crossing). The arming stage follows ([`Self::arm`]).
    /// Returns where the ranking's pod figures come from (`None`: no ranking needed).
    fn observe<N: NodeView>(
        &mut self,
        sampler: &mut N,
        wakeup: Wakeup,
        pods: &[PodInfo],
    ) -> (TimedObservations<Wakeup>, Option<RankFigures>) {
        let mut timed = sampler.observe(wakeup, SampleKind::Signals);
        self.follow_fs_layout(timed.observations.filesystem);
        let now = self.now();
        let pressure = !self.state.conditions().is_empty()
            || self.config.thresholds.iter().any(|t| {
                timed
                    .observations
                    .signals
                    .get(&t.signal)
                    .is_some_and(|o| t.is_met(o, true))
            })
            || self.state.predicts(&self.config, &timed.observations, now);
        let taken = self.pod_figures.as_ref().map(|(t, _)| *t);
        let figures = if pressure {
            let cover = self
                .pod_figures
                .as_ref()
                .is_some_and(|(_, figures)| pods.iter().all(|p| figures.contains_key(&p.uid)));
            let figures = rank_figures(taken, now, RANK_MAX_AGE, cover);
            match (figures, &self.pod_figures) {
                (RankFigures::Earlier { .. }, Some((_, pods))) => {
                    timed.observations.pods = pods.as_ref().clone();
                }
                _ => self.read_pods(sampler, &mut timed.observations),
            }
            self.metrics
                .eviction
                .rank_pod_figures_age_seconds
                .observe(match figures {
                    RankFigures::Earlier { age } => age.as_secs_f64(),
                    RankFigures::ReadNow => 0.0,
                });
            Some(figures)
        } else {
            None
        };
        (timed, figures)
    }

    /// A pass that reads every pod (and every signal again) into `out`, kept as the latest pod
    /// figures.
    fn read_pods<N: PodView>(&mut self, sampler: &mut N, out: &mut Observations) {
        sampler.sample_into(SampleKind::Fast, out);
        self.pod_figures = Some((self.now(), Arc::new(out.pods.clone())));
    }

    /// The `containerfs.*` thresholds for the filesystems the sampler found (the kubelet's
    /// `UpdateContainerFsThresholds` once it knows them), rebuilt when that layout changes.
    fn follow_fs_layout(&mut self, layout: FsLayout) {
        if let Some(config) = self.layout_config.update(layout) {
            info!(
                dedicated_image_fs = layout.dedicated_image_fs,
                split_container_image_fs = layout.split_container_image_fs,
                thresholds = config.thresholds.len(),
                "filesystem layout: containerfs thresholds follow it"
            );
            self.config = config;
        }
    }

    /// The core's decision on this instant's observations and the pods that may be ranked, with
    /// the agent's own holds: none while it is blind to the pods' cgroups.
    fn decide<N: NodeView>(
        &mut self,
        sampler: &mut N,
        timed: &mut TimedObservations<Wakeup>,
        pods: &[PodInfo],
        now: Timestamp,
    ) -> Decision {
        if let Some(mut policy) = self.headroom_policy {
            // The lead as learnt from this node's evictions, where the prediction will be.
            policy.lead = policy
                .lead
                .map(|_| self.state.prediction_lead(&self.config));
            self.next_sample_at = self
                .headroom
                .observe(now, &timed.observations, &self.config.thresholds, policy)
                .map(|d| now + d);
        }
        self.backoff.prune(now);
        self.check_pod_sight(sampler);
        let credited = super::disk_reclaim::credit(
            &mut self.pending_reclaim,
            &self.metrics,
            &timed.observations,
            now,
        );
        let mut decision = synchronize(&mut self.state, &self.config, &credited, pods, now);
        // Pod disk usage comes from a meter that walks the pods' directories off the critical
        // path, so its figures can predate the pressure (a pod that filled the disk since the
        // last walk ranks as small). Before a disk-ranked eviction, measure now and decide again
        // on the figures of this instant, as a ranking by stale usage could pick a bystander.
        if decision
            .evict
            .iter()
            .any(|e| node_monitor_core::signals::threshold::ranks_by_disk(e.signal))
        {
            sampler.measure_pod_disk_now();
            self.read_pods(sampler, &mut timed.observations);
            let credited = super::disk_reclaim::credit(
                &mut self.pending_reclaim,
                &self.metrics,
                &timed.observations,
                now,
            );
            decision = synchronize(&mut self.state, &self.config, &credited, pods, now);
        }
        if self.blind.is_some() && !decision.evict.is_empty() {
            warn!(
                held = decision.evict.len(),
                "eviction held: the agent sees none of the pods' cgroups, so ranking has no usage"
            );
            decision.evict.clear();
        }
        decision
    }

    /// Sends the decision's evictions in order, unless the API server asked to wait; stops at
    /// the first answer that says the rest would fail the same way. Returns how the cycle ends
    /// and the answered requests (for their Events and the wait for cleanup).
    async fn send_evictions(
        &mut self,
        decision: &Decision,
        wakeup: Wakeup,
        label: &'static str,
        now: Timestamp,
    ) -> (CycleEnd, Vec<(EvictionRequest, EvictOutcome)>) {
        let mut end = CycleEnd::Done;
        let mut answered = Vec::with_capacity(decision.evict.len());
        if let Some(until) = self.evictions_held_until.filter(|t| *t > now)
            && !decision.evict.is_empty()
        {
            debug!(held = decision.evict.len(), resume_in = ?until.saturating_since(now),
                   "evictions held: the API server throttled or failed the last one");
            return (end, answered);
        }
        for e in &decision.evict {
            let req = EvictionRequest {
                namespace: e.namespace.clone(),
                name: e.name.clone(),
                uid: e.uid.clone(),
                grace_period_seconds: u32::try_from(e.grace_period_seconds.max(1))
                    .unwrap_or(u32::MAX),
                hard: e.hard,
                signal: e.signal.as_str().to_owned(),
                message: e.message.clone(),
                annotations: e.annotations.clone(),
            };
            // A dry run repeats the same decision on every wake-up: its log line, Event and
            // count are reported once per pod and signal per DRY_RUN_REPORT_INTERVAL.
            let report = !self.config.node_monitor.dry_run
                || self.dry_run_reports.allow(&e.uid, e.signal, now);
            if report {
                info!(pod = %format!("{}/{}", e.namespace, e.name), signal = %e.signal, hard = e.hard,
                      grace = e.grace_period_seconds, wake_source = label,
                      message = %e.message, dry_run = self.config.node_monitor.dry_run, "evicting");
            }
            let outcome = self.actuator.evict(&req).await;
            self.health.progress();
            let reaction_time = wakeup.at.elapsed();
            if !report {
                continue;
            }
            self.recorders
                .live
                .record_eviction(EvictionRecord::answered(&req, &outcome));
            let reaction = self.take_answer(&req, &outcome, reaction_time);
            if reaction.next_candidate_now {
                end = CycleEnd::Refused;
            }
            let stop = reaction.retry_later || reaction.hold_evictions.is_some();
            answered.push((req, outcome));
            if stop {
                // The rest of this decision would fail the same way.
                break;
            }
        }
        (end, answered)
    }

    /// Counts an eviction's answer and applies what it means for the next ones: the pod's
    /// backoff, a retry after an unavailable API server, a hold after throttling.
    fn take_answer(
        &mut self,
        req: &EvictionRequest,
        outcome: &EvictOutcome,
        reaction_time: Duration,
    ) -> backoff::Reaction {
        info!(pod = %format!("{}/{}", req.namespace, req.name), outcome = outcome.label(),
              reaction_ms = reaction_time.as_secs_f64() * 1e3, "eviction answered");
        let reaction = backoff::react(outcome);
        super::cycle_metrics::eviction_answered(&self.metrics, req, outcome, &reaction);
        if reaction.back_off_pod {
            let delay = self.backoff.refused(&req.uid, self.now());
            debug!(uid = %req.uid, outcome = outcome.label(), ?delay,
                   "pod backs off; the next candidate is considered meanwhile");
        }
        if reaction.retry_later {
            // No eviction request before the retry: the pod keeps its rank, and the wake-ups of
            // a node near its threshold (every 100 ms) must not each call a server that is down.
            // The hold's timer wakes the loop then, not at the next tick.
            let at = self.now() + self.retry_delay;
            self.evictions_held_until = self.evictions_held_until.max(Some(at));
            self.retry_delay = (self.retry_delay * 2).min(RETRY_MAX);
            debug!(delay = ?self.retry_delay, "API server unavailable; deciding again later");
        }
        if let Some(hold) = reaction.hold_evictions {
            self.evictions_held_until = Some(self.now() + hold);
        }
        if reaction.took_effect {
            self.retry_delay = RETRY_INITIAL;
            self.metrics
                .eviction
                .detection_to_eviction_seconds
                .observe(reaction_time.as_secs_f64());
            self.backoff.forget(&req.uid);
        }
        reaction
    }

    /// Pods the core may rank: this node's active pods, less those backing off after a refused or
    /// failed eviction.
    fn candidate_pods(&self, now: Timestamp) -> Vec<PodInfo> {
        let mut out = Vec::new();
        for pod in self.store.pods() {
            if !node_monitor_core::kubelet::pod::pod_is_active(&pod) {
                continue;
            }
            match PodInfo::from_pod(&pod) {
                Ok(info) if !self.backoff.active(&info.uid, now) => out.push(info),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "pod skipped: cannot derive its eviction facts"),
            }
        }
        out
    }

    /// Re-arms the memcg thresholds for `memory.available` (node cgroup) and
    /// `allocatableMemory.available` (kubepods) at the fresh inactive_file, as the kubelet does
    /// on each synchronize.
    fn rearm<N: NodeSignals, A: Arming>(&self, sampler: &N, wakeups: &mut A) {
        wakeups.rearm(
            &self.config.thresholds,
            sampler.last_node_memory(),
            sampler.last_kubepods_memory(),
        );
    }
}

mod pod_refresh;
mod sight;
mod storage_limits;

#[cfg(test)]
mod tests;

/// Whether the pass woken by `source` reads every pod's figures, though no threshold is met or
/// near: an OOM kill's, so that its flight record shows the pods' working sets (no poller of its
/// own; one pod pass per OOM kill wake-up).
fn read_pods_for(source: &crate::wakeup::WakeSource) -> bool {
    matches!(
        source,
        crate::wakeup::WakeSource::Kernel(crate::wakeup::KernelWakeKind::OomKill)
    )
}
