//! Driving one fencing operation: the core's `advance` on what the controller sees, every change
//! stored before it is acted on, then the actions carried out.
use tracing::{debug, info, warn};

use super::{Controller, MAX_STEPS_PER_PASS, View, chain};
use crate::{
    methods::{FenceConfigError, NodeFencePlan},
    ports::Ports,
    store::{StoreError, StoredOp},
};
use node_monitor_core::remediation::{
    FenceOp, KubeletReturn, OpAction, OpContext, OpEvent, Phase, advance, node_is_back,
};

impl<P: Ports> Controller<P> {
    /// Moves one operation along from `first`, persisting every change before acting on it.
    pub(super) async fn drive(&mut self, node: &str, first: OpEvent, view: &View) {
        let mut event = first;
        for _ in 0..MAX_STEPS_PER_PASS {
            let Some(stored) = self.ops.get(node).cloned() else {
                return;
            };
            let plan = self.plan(node);
            let ctx = self.op_context(node, &stored, &plan, view).await;
            let t = advance(&stored.op, &event, &ctx, &self.cfg.fencing);
            let changed = t.op != stored.op;
            let forget = t.actions.contains(&OpAction::Forget);
            if changed && !forget && !self.save(node, &stored, &t.op).await {
                return;
            }
            let follow = self
                .carry_out(node, &stored, t.actions, t.op.attempts, &plan, view)
                .await;
            if forget {
                return;
            }
            match follow {
                Some(ev) => event = ev,
                None if changed => event = OpEvent::Tick,
                None => return,
            }
        }
    }

    /// What the operation on `node` needs to know to advance: the node as `view` has it, its
    /// kubelet's return, running steps, storm protection and the configured fence steps.
    async fn op_context(
        &mut self,
        node: &str,
        stored: &StoredOp,
        plan: &Result<Option<NodeFencePlan>, FenceConfigError>,
        view: &View,
    ) -> OpContext {
        let facts = view.facts.get(node);
        let present = facts.is_some()
            && view.uids.get(node).map(String::as_str) == Some(stored.op.node_uid.as_str());
        let zone = facts.map(|f| f.zone.clone()).unwrap_or_default();
        let kubelet = match facts {
            Some(f) => {
                let mut k = KubeletReturn::observe(&stored.op, f, None);
                // Counted only while a released node's recovery waits on it.
                let waiting = matches!(stored.op.phase, Phase::Recovering { recovered: false })
                    && stored.op.confirmed_by.is_some();
                if waiting && !k.rebooted && k.ready_again {
                    k.old_pods = self.old_pods(node).await;
                }
                k
            }
            None => KubeletReturn::default(),
        };
        OpContext {
            kubelet,
            now: view.now_unix,
            node_present: present,
            node_back: node_is_back(
                stored.op.lease_renew_time,
                facts.and_then(|f| f.lease.as_ref()),
            ),
            executing: self.running.contains_key(node),
            may_fence: !self.cfg.dry_run && view.assessment.admits(&zone).is_ok(),
            configured: plan
                .as_ref()
                .ok()
                .and_then(Option::as_ref)
                .map(NodeFencePlan::configured)
                .unwrap_or_default(),
        }
    }

    /// Stores `op` over `stored`; false (nothing to act on) when the write fails.
    async fn save(&mut self, node: &str, stored: &StoredOp, op: &FenceOp) -> bool {
        match self.ports.update_op(stored, op).await {
            Ok(s) => {
                self.api_health.ok();
                debug!(%node, phase = op.phase.label(), running = ?op.running, "operation saved");
                self.ops.insert(node.to_owned(), s);
                true
            }
            Err(e) => {
                // Nothing is done that the stored operation does not say.
                warn!(%node, error = %chain(&e), "could not save the fencing operation; retrying");
                if matches!(e, StoreError::Conflict { .. }) {
                    self.loaded = false;
                }
                false
            }
        }
    }

    /// Carries out the actions of one transition of the operation on `node` (`stored` as it was
    /// before it); returns the event the last of them produced, if any.
    async fn carry_out(
        &mut self,
        node: &str,
        stored: &StoredOp,
        actions: Vec<OpAction>,
        attempts: u32,
        plan: &Result<Option<NodeFencePlan>, FenceConfigError>,
        view: &View,
    ) -> Option<OpEvent> {
        let mut follow = None;
        for action in actions {
            match action {
                OpAction::Run(step) => self.spawn_step(node, step, attempts, plan),
                OpAction::Cancel => self.cancel(node),
                OpAction::Release => {
                    let current = self.ops.get(node).cloned().unwrap_or(stored.clone());
                    let result = self.release(node, &current).await;
                    if let Ok(s) = &result {
                        self.metrics.releases.inc();
                        self.metrics.pods_deleted.inc_by(u64::from(s.pods_deleted));
                        #[expect(
                            clippy::cast_precision_loss,
                            reason = "milliseconds of an operation, far below 2^52"
                        )]
                        let secs = (view.now_unix - stored.op.detected_at).max(0) as f64 / 1e3;
                        self.metrics.detection_to_release_seconds.observe(secs);
                    }
                    follow = Some(OpEvent::ReleaseDone { result });
                }
                OpAction::RemoveTaint => {
                    let result = self.set_taint(node, false).await;
                    follow = Some(OpEvent::TaintRemoved { result });
                }
                OpAction::Forget => self.forget(node, stored).await,
                OpAction::Notify(n) => {
                    if n.warning {
                        warn!(%node, reason = n.reason, message = %n.message, "fencing");
                    } else {
                        info!(%node, reason = n.reason, message = %n.message, "fencing");
                    }
                    self.node_event(node, &stored.op.node_uid, n.warning, n.reason, &n.message)
                        .await;
                }
            }
        }
        follow
    }

    /// Ends the finished operation on `node`: its step cancelled, its record deleted.
    async fn forget(&mut self, node: &str, stored: &StoredOp) {
        self.cancel(node);
        match self.ports.delete_op(node).await {
            Ok(()) => {
                if matches!(stored.op.phase, Phase::Recovering { .. }) {
                    self.metrics.recoveries.inc();
                }
                info!(%node, "fencing operation finished");
                self.ops.remove(node);
            }
            Err(e) => {
                warn!(%node, error = %chain(&e), "could not delete the finished operation; retrying");
            }
        }
    }
}
