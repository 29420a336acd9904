//! One pass of the remediation controller: observe every node, judge liveness and storm
//! protection (pure core), start fencing operations for dead nodes that may be fenced, and move
//! every operation along (pure state machine), carrying out what it asks: run fence steps in the
//! background, release the workload, run recovery, remove the taint. Every replica observes, so a
//! newly elected leader has the liveness history at once; only the leader acts.
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use k8s_openapi::api::coordination::v1::Lease;
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{info, warn};

use super::{
    ApiHealth,
    facts::node_facts,
    methods::{self, FenceConfigError, MethodSpec, NodeFencePlan},
    ports::Ports,
    store::{StoreError, StoredOp},
};
use crate::{
    metrics::{Port, PortErrorLabels, RemediateMetrics, StepOutcomeLabels},
    ports::StepError,
};
use node_monitor_service::metrics::ReasonLabels;
pub use node_monitor_service::telemetry::error_chain as chain;

use node_monitor_core::{
    contract::names::AGENT_LEASE_PREFIX,
    remediation::{
        Assessment, DeathEvidence, FenceOp, Liveness, LivenessTracker, NodeFacts, OpEvent,
        ReadyStatus, RemediationConfig, SkipReason, Step, ZoneLimiters, assess, node_is_back,
    },
    units::clock::Timestamp,
};

mod drive;
mod release;
mod report;
#[cfg(test)]
mod tests;

pub use release::keep_pod;

/// An operation is moved along at most this many times per pass (it converges in fewer).
const MAX_STEPS_PER_PASS: usize = 8;

struct StepResult {
    node: String,
    step: Step,
    attempt: u32,
    result: Result<(), StepError>,
}

struct Running {
    step: Step,
    attempt: u32,
    handle: JoinHandle<()>,
}

/// What one pass sees.
struct View {
    now: Timestamp,
    now_unix: i64,
    facts: BTreeMap<String, NodeFacts>,
    uids: BTreeMap<String, String>,
    liveness: BTreeMap<String, Liveness>,
    assessment: Assessment,
}

/// The remediation controller, on its ports ([`super::ports`]).
pub struct Controller<P> {
    ports: P,
    cfg: RemediationConfig,
    metrics: Arc<RemediateMetrics>,
    api_health: Arc<ApiHealth>,
    tracker: LivenessTracker,
    limiters: ZoneLimiters,
    ops: BTreeMap<String, StoredOp>,
    loaded: bool,
    running: HashMap<String, Running>,
    tx: mpsc::UnboundedSender<StepResult>,
    rx: mpsc::UnboundedReceiver<StepResult>,
    /// The skip reason last reported per node: each is reported once, not on every pass.
    skips: HashMap<String, &'static str>,
    last_liveness: HashMap<String, &'static str>,
    lease_view_fresh: bool,
}

impl<P: Ports> Controller<P> {
    pub fn new(
        ports: P,
        cfg: RemediationConfig,
        metrics: Arc<RemediateMetrics>,
        api_health: Arc<ApiHealth>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        for r in SkipReason::LABELS {
            let _ = metrics.skips.get_or_create(&ReasonLabels {
                reason: r.to_owned(),
            });
        }
        Self {
            ports,
            cfg,
            metrics,
            api_health,
            tracker: LivenessTracker::new(),
            limiters: ZoneLimiters::default(),
            ops: BTreeMap::new(),
            loaded: false,
            running: HashMap::new(),
            tx,
            rx,
            skips: HashMap::new(),
            last_liveness: HashMap::new(),
            lease_view_fresh: true,
        }
    }

    /// Stops acting: running steps are cancelled (their operations say they were running, so the
    /// next leader runs them again) and the operations are forgotten until leading again.
    pub fn stand_down(&mut self) {
        for (node, r) in self.running.drain() {
            r.handle.abort();
            info!(%node, step = r.step.as_str(), "fence step cancelled: no longer leading");
        }
        // Outcomes of steps run under the old leadership: the stored operations still say
        // those steps were running, so whoever leads next runs them again.
        while self.rx.try_recv().is_ok() {}
        self.ops.clear();
        self.loaded = false;
        self.skips.clear();
    }

    /// One pass.
    pub async fn tick(&mut self, leading: bool) {
        let view = self.observe();
        if !leading {
            if self.loaded {
                self.stand_down();
            }
            return;
        }
        if !self.loaded {
            match self.load().await {
                Ok(n) => {
                    self.loaded = true;
                    if n > 0 {
                        info!(operations = n, "resuming fencing operations");
                    }
                }
                Err(e) => {
                    warn!(error = %chain(&e), "could not read the fencing operations; retrying");
                    return;
                }
            }
        }
        while let Ok(r) = self.rx.try_recv() {
            if self
                .running
                .get(&r.node)
                .is_some_and(|x| x.step == r.step && x.attempt == r.attempt)
            {
                self.running.remove(&r.node);
            }
            let outcome = if r.result.is_ok() {
                "success"
            } else {
                "failure"
            };
            if let Err(e) = &r.result {
                self.port_error(Port::fence_runner, e.metric_label());
            }
            self.metrics
                .fence_steps
                .get_or_create(&StepOutcomeLabels {
                    step: r.step.as_str().to_owned(),
                    outcome: outcome.to_owned(),
                })
                .inc();
            let current = self
                .ops
                .get(&r.node)
                .is_some_and(|s| s.op.running == Some(r.step) && s.op.attempts == r.attempt);
            if current {
                self.drive(
                    &r.node,
                    OpEvent::StepDone {
                        step: r.step,
                        result: r.result.map_err(|e| e.to_string()),
                    },
                    &view,
                )
                .await;
            }
        }
        let dead: Vec<(NodeFacts, DeathEvidence)> = view
            .facts
            .values()
            .filter_map(|f| match view.liveness.get(&f.name) {
                Some(Liveness::Dead(e)) if !self.ops.contains_key(&f.name) => Some((f.clone(), *e)),
                _ => None,
            })
            .collect();
        self.skips
            .retain(|node, _| view.liveness.get(node).is_some_and(Liveness::is_dead));
        for (f, evidence) in dead {
            self.admit(&f, &evidence, &view).await;
        }
        let nodes: Vec<String> = self.ops.keys().cloned().collect();
        for node in nodes {
            self.drive(&node, OpEvent::Tick, &view).await;
        }
        self.record_ops();
    }

    fn observe(&mut self) -> View {
        let now = self.ports.now();
        let now_unix = self.ports.unix_millis();
        let leases: HashMap<String, Arc<Lease>> = self
            .ports
            .leases()
            .into_iter()
            .filter_map(|l| l.metadata.name.clone().map(|n| (n, l)))
            .collect();
        let agent_leases: HashMap<String, Arc<Lease>> = self
            .ports
            .agent_leases()
            .into_iter()
            .filter_map(|l| {
                let node = l
                    .metadata
                    .name
                    .as_deref()?
                    .strip_prefix(AGENT_LEASE_PREFIX)?;
                Some((node.to_owned(), l))
            })
            .collect();
        let mut facts = BTreeMap::new();
        let mut uids = BTreeMap::new();
        let wall_now = self.ports.unix_millis().saturating_mul(1000);
        for n in self.ports.nodes() {
            let Some(name) = n.metadata.name.clone() else {
                continue;
            };
            let f = node_facts(
                &n,
                leases.get(&name).map(AsRef::as_ref),
                agent_leases.get(&name).map(AsRef::as_ref),
                &self.cfg.node_selector,
                wall_now,
            );
            uids.insert(name.clone(), n.metadata.uid.clone().unwrap_or_default());
            facts.insert(name, f);
        }
        let list: Vec<NodeFacts> = facts.values().cloned().collect();
        // The Lease view must have been confirmed current within apiStaleAfter, or a watch that
        // stopped delivering would make every live node look dead.
        let lease_age = self.ports.lease_view_age();
        let lease_view_fresh = lease_age.is_some_and(|a| a <= self.cfg.storm.api_stale_after);
        if lease_view_fresh != self.lease_view_fresh {
            if lease_view_fresh {
                info!("node Lease view current again: nodes may be judged dead");
            } else {
                warn!(age = ?lease_age, "node Lease view not confirmed current: no node is judged dead");
            }
            self.lease_view_fresh = lease_view_fresh;
        }
        let liveness = self
            .tracker
            .observe(&list, now, &self.cfg.detection, lease_view_fresh);
        let assessment = assess(
            list.iter().map(|f| {
                let bad = f.ready != ReadyStatus::True
                    || liveness.get(&f.name).is_some_and(Liveness::is_unhealthy);
                (f.zone.clone(), bad)
            }),
            self.api_health.silent_for(),
            &self.cfg.storm,
        );
        self.limiters.update(&assessment, now);
        self.record_liveness(&liveness);
        self.record_zones(&assessment);
        View {
            now,
            now_unix,
            facts,
            uids,
            liveness,
            assessment,
        }
    }

    async fn load(&mut self) -> Result<usize, StoreError> {
        let items = self.ports.list_ops().await?;
        self.api_health.ok();
        self.ops.clear();
        for item in items {
            match item {
                Ok(s) => {
                    info!(node = %s.op.node, phase = s.op.phase.label(), running = ?s.op.running,
                          "fencing operation loaded");
                    self.ops.insert(s.op.node.clone(), s);
                }
                Err(e) => {
                    warn!(error = %chain(&e), "fencing operation ignored; inspect or delete it")
                }
            }
        }
        Ok(self.ops.len())
    }

    /// The node's fence plan: its own `fence-config-<node>`, else `fence-config-default`.
    fn plan(&self, node: &str) -> Result<Option<NodeFencePlan>, FenceConfigError> {
        for name in methods::plan_candidates(node) {
            if let Some(data) = self.ports.configmap(&name) {
                return methods::parse_plan(&name, &data, node).map(Some);
            }
        }
        Ok(None)
    }

    /// A dead node without an operation: start one if every rule allows it.
    async fn admit(&mut self, f: &NodeFacts, evidence: &DeathEvidence, view: &View) {
        let node = f.name.as_str();
        let uid = view.uids.get(node).cloned().unwrap_or_default();
        let skip = if !f.eligible {
            Some(SkipReason::NotEligible)
        } else if self.cfg.dry_run {
            Some(SkipReason::DryRun)
        } else if let Err(r) = view.assessment.admits(&f.zone) {
            Some(r)
        } else {
            match self.plan(node) {
                Ok(None) => Some(SkipReason::NoFenceConfig),
                Err(e) => Some(SkipReason::FenceConfigError {
                    error: e.to_string(),
                }),
                Ok(Some(_)) if !self.limiters.try_take(&f.zone, view.now) => {
                    Some(SkipReason::RateLimited {
                        zone: f.zone.label(),
                    })
                }
                Ok(Some(_)) => None,
            }
        };
        if let Some(reason) = skip {
            self.note_skip(node, &uid, &reason).await;
            return;
        }
        let op = FenceOp::new(f, &uid, evidence, view.now_unix);
        match self.ports.create_op(&op).await {
            Ok(stored) => {
                self.api_health.ok();
                self.skips.remove(node);
                self.ops.insert(node.to_owned(), stored);
                warn!(%node, evidence = %evidence.describe(), zone = %f.zone.label(), "fencing started");
                self.node_event(
                    node,
                    &uid,
                    true,
                    "FencingStarted",
                    &format!(
                        "node found dead ({}); fencing before its workload is released",
                        evidence.describe()
                    ),
                )
                .await;
            }
            Err(StoreError::Conflict { .. }) => {
                // An operation exists that this replica has not loaded: read them all again.
                self.loaded = false;
            }
            Err(e) => warn!(%node, error = %chain(&e), "could not record the fencing operation"),
        }
    }

    fn cancel(&mut self, node: &str) {
        if let Some(r) = self.running.remove(node) {
            r.handle.abort();
            self.metrics
                .fence_steps
                .get_or_create(&StepOutcomeLabels {
                    step: r.step.as_str().to_owned(),
                    outcome: "cancelled".to_owned(),
                })
                .inc();
            info!(%node, step = r.step.as_str(), "fence step cancelled");
        }
    }

    /// Resolves the step's methods now (from the watched ConfigMaps) and runs them in the
    /// background; the outcome comes back through the channel. A configuration error is the
    /// step's failure: an unusable configuration never confirms anything.
    fn spawn_step(
        &mut self,
        node: &str,
        step: Step,
        attempt: u32,
        plan: &Result<Option<NodeFencePlan>, FenceConfigError>,
    ) {
        let specs: Result<Vec<MethodSpec>, StepError> = match plan {
            Ok(Some(p)) => {
                // Method and template ConfigMaps as watched now (templates may have any name).
                let all = self.ports.configmaps();
                p.methods(step)
                    .iter()
                    .map(|m| {
                        methods::resolve_method(m, node, self.cfg.fencing.method_timeout, |n| {
                            all.get(n)
                        })
                        .map_err(|e| StepError::Config(e.to_string()))
                    })
                    .collect()
            }
            Ok(None) => Err(StepError::Config(SkipReason::NoFenceConfig.message())),
            Err(e) => Err(StepError::Config(e.to_string())),
        };
        let tx = self.tx.clone();
        info!(node, step = step.as_str(), attempt, "fence step starting");
        // Resolved before the run: a configuration error is the step's failure, reported as the
        // run's outcome.
        let run = specs.map(|specs| self.ports.run_step(node.to_owned(), step, specs));
        let node_name = node.to_owned();
        let handle = tokio::spawn(async move {
            let result = match run {
                Err(e) => Err(e),
                Ok(run) => run.await,
            };
            let _ = tx.send(StepResult {
                node: node_name,
                step,
                attempt,
                result,
            });
        });
        self.running.insert(
            node.to_owned(),
            Running {
                step,
                attempt,
                handle,
            },
        );
    }

    async fn set_taint(&self, node: &str, present: bool) -> Result<(), String> {
        match self.ports.set_out_of_service(node, present).await {
            Ok(()) => {
                self.api_health.ok();
                Ok(())
            }
            Err(e) => {
                self.port_error(Port::taints, e.metric_label());
                Err(format!("the out-of-service taint: {e}"))
            }
        }
    }

    /// Counts a failed port call by port and kind.
    fn port_error(&self, port: Port, reason: &'static str) {
        self.metrics
            .port_errors
            .get_or_create(&PortErrorLabels { port, reason })
            .inc();
    }

    /// What allowed a release, re-checked before each of its steps from the caches as they are
    /// now: the same Node, still silent since it was found dead, and storm protection admitting
    /// its zone.
    fn release_check(&mut self, node: &str, stored: &StoredOp) -> Result<(), String> {
        if self.cfg.dry_run {
            return Err("dry run".to_owned());
        }
        let view = self.observe();
        let Some(f) = view.facts.get(node) else {
            return Err("the node is gone".to_owned());
        };
        if view.uids.get(node) != Some(&stored.op.node_uid) {
            return Err("the node was replaced by another of the same name".to_owned());
        }
        if node_is_back(stored.op.lease_renew_time, f.lease.as_ref()) {
            return Err("the node renewed its Lease again; release stopped".to_owned());
        }
        view.assessment
            .admits(&f.zone)
            .map_err(|r| format!("release stopped: {}", r.message()))
    }
}
