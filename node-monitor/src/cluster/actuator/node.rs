//! The node writes: agent-owned conditions, taints, the cordon, annotations, and taking
//! node-monitor's marks back on a clean stop.
use super::*;
use node_monitor_service::taint::{TaintSpec, conflict_status, set_taint};

impl Actuator {
    /// Sets agent-owned conditions on the node's status. A strategic merge patch keyed by `type`
    /// touches only these entries, so the kubelet's conditions are never rewritten. Reads the node
    /// first: `lastTransitionTime` moves only when a condition's status changes
    /// ([`condition_patch`]), as the kubelet's own conditions do.
    pub async fn set_conditions(
        &self,
        updates: &[NodeConditionUpdate],
    ) -> Result<(), ActuatorError> {
        if let Some(u) = updates
            .iter()
            .find(|u| KUBELET_CONDITIONS.contains(&u.type_.as_str()))
        {
            return Err(ActuatorError::KubeletOwnedCondition(u.type_.clone()));
        }
        if updates.is_empty() {
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let err = |what, source| ActuatorError::Api {
            node: self.cfg.node_name.clone(),
            what,
            source,
        };
        let node = self
            .bounded(nodes.get(&self.cfg.node_name))
            .await
            .map_err(|e| err("get node", e))?;
        let existing = node.status.and_then(|s| s.conditions).unwrap_or_default();
        let conditions = condition_patch(&existing, updates, Timestamp::now());
        self.bounded(nodes.patch_status(
            &self.cfg.node_name,
            &PatchParams::default(),
            &Patch::Strategic(json!({ "status": { "conditions": conditions } })),
        ))
        .await
        .map(|_| ())
        .map_err(|e| err("patch conditions", e))
    }

    /// Adds (`present`) or removes a taint of the agent's own, keyed by `key` and `effect`. Uses the
    /// node's resourceVersion for optimistic concurrency and retries on conflict.
    pub async fn set_taint(
        &self,
        key: &str,
        value: &str,
        effect: &str,
        present: bool,
    ) -> Result<bool, ActuatorError> {
        let taint = TaintSpec { key, value, effect };
        set_taint(
            &self.client,
            &self.cfg.node_name,
            taint,
            present,
            self.timeout,
        )
        .await
        .map_err(|e| ActuatorError::Api {
            node: e.node,
            what: e.what,
            source: e.source,
        })
    }

    /// Cordons (`true`) or uncordons the node (`spec.unschedulable`). Returns whether it was
    /// unschedulable before, so a caller can undo only what it did.
    pub async fn set_unschedulable(&self, unschedulable: bool) -> Result<bool, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let err = |what, source| ActuatorError::Api {
            node: self.cfg.node_name.clone(),
            what,
            source,
        };
        let node = self
            .bounded(nodes.get(&self.cfg.node_name))
            .await
            .map_err(|e| err("get node", e))?;
        let before = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if before != unschedulable {
            self.bounded(nodes.patch(
                &self.cfg.node_name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "unschedulable": unschedulable } })),
            ))
            .await
            .map_err(|e| err("patch unschedulable", e))?;
            info!(unschedulable, "node schedulability updated");
        }
        Ok(before)
    }

    /// Sets (`Some`) or removes (`None`) one annotation on the node, with a single merge patch.
    pub async fn annotate_node(&self, key: &str, value: Option<&str>) -> Result<(), ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.bounded(nodes.patch(
            &self.cfg.node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { key: value } } })),
        ))
        .await
        .map(|_| ())
        .map_err(|source| ActuatorError::Api {
            node: self.cfg.node_name.clone(),
            what: "patch annotation",
            source,
        })
    }

    /// The value of one annotation on the node.
    pub async fn node_annotation(&self, key: &str) -> Result<Option<String>, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = self
            .bounded(nodes.get(&self.cfg.node_name))
            .await
            .map_err(|source| ActuatorError::Api {
                node: self.cfg.node_name.clone(),
                what: "get node",
                source,
            })?;
        Ok(node.metadata.annotations.and_then(|mut a| a.remove(key)))
    }

    /// Whether the node is cordoned (`spec.unschedulable`).
    pub async fn is_unschedulable(&self) -> Result<bool, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get(&self.cfg.node_name)
            .await
            .map_err(|source| ActuatorError::Api {
                node: self.cfg.node_name.clone(),
                what: "get node",
                source,
            })?;
        Ok(node.spec.and_then(|s| s.unschedulable).unwrap_or(false))
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Takes back node-monitor's marks from the node as [`release_plan`] decides for `release`
    /// (a clean stop, or `node-monitor cleanup`), and returns what it wrote. With `dry_run`, only
    /// reads the node and returns the plan.
    ///
    /// Taints, annotations and the cordon go in one merge patch carrying the node's
    /// resourceVersion (a conflict re-reads the node and plans again); conditions in one strategic
    /// merge patch of the status keyed by `type`: `Unknown` entries keep their
    /// `lastHeartbeatTime`, removed ones are `$patch: delete`. Each call is bounded by the API
    /// timeout; callers bound the whole.
    pub async fn release(
        &self,
        release: Release,
        dry_run: bool,
    ) -> Result<ReleasePlan, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let err = |what, source| ActuatorError::Api {
            node: self.cfg.node_name.clone(),
            what,
            source,
        };
        let mut written = ReleasePlan::default();
        for attempt in 0..5u32 {
            let node = self
                .bounded(nodes.get(&self.cfg.node_name))
                .await
                .map_err(|e| err("get node", e))?;
            let plan = release_plan(&node, release);
            if dry_run {
                return Ok(plan);
            }
            if attempt == 0 && plan.has_conditions() {
                let conditions = release_conditions_patch(&plan, Timestamp::now());
                self.bounded(nodes.patch_status(
                    &self.cfg.node_name,
                    &PatchParams::default(),
                    &Patch::Strategic(json!({ "status": { "conditions": conditions } })),
                ))
                .await
                .map_err(|e| err("patch conditions", e))?;
                written.unknown_conditions = plan.unknown_conditions.clone();
                written.remove_conditions = plan.remove_conditions.clone();
            }
            if !plan.touches_spec() {
                return Ok(written);
            }
            let patch = release_spec_patch(&node, &plan);
            match self
                .bounded(nodes.patch(
                    &self.cfg.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                ))
                .await
            {
                Ok(_) => {
                    written.remove_taints = plan.remove_taints;
                    written.remove_annotations = plan.remove_annotations;
                    written.uncordon = plan.uncordon;
                    return Ok(written);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    debug!(attempt, "node changed under us; planning the release again");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
                }
                Err(e) => return Err(err("patch node", e)),
            }
        }
        Err(err(
            "patch node",
            kube::Error::Api(Box::new(conflict_status())),
        ))
    }
}

/// The `status.conditions` entries of a release: `Unknown` with [`STOPPED_REASON`] and
/// `lastTransitionTime` `now` (no `lastHeartbeatTime`: the strategic merge keeps the old one, as
/// the node lifecycle controller does for a silent kubelet), and `$patch: delete` for removals.
pub fn release_conditions_patch(plan: &ReleasePlan, now: Timestamp) -> Vec<serde_json::Value> {
    plan.unknown_conditions
        .iter()
        .map(|c| {
            json!({
                "type": c,
                "status": "Unknown",
                "reason": STOPPED_REASON,
                "message": STOPPED_MESSAGE,
                "lastTransitionTime": Time(now),
            })
        })
        .chain(
            plan.remove_conditions
                .iter()
                .map(|c| json!({ "type": c, "$patch": "delete" })),
        )
        .collect()
}

/// The merge patch of a release on the node object: the taints without the removed ones, the
/// removed annotations as `null`, `unschedulable: false` when uncordoning, and the node's
/// resourceVersion (the taint list is replaced whole).
pub fn release_spec_patch(node: &Node, plan: &ReleasePlan) -> serde_json::Value {
    let mut patch = json!({ "metadata": { "resourceVersion": node.metadata.resource_version } });
    if !plan.remove_taints.is_empty() {
        let taints: Vec<&Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
            .iter()
            .filter(|t| {
                !plan
                    .remove_taints
                    .iter()
                    .any(|r| r.key == t.key && r.effect == t.effect)
            })
            .collect();
        patch["spec"]["taints"] = json!(taints);
    }
    if plan.uncordon {
        patch["spec"]["unschedulable"] = json!(false);
    }
    if !plan.remove_annotations.is_empty() {
        let nulls: serde_json::Map<String, serde_json::Value> = plan
            .remove_annotations
            .iter()
            .map(|a| (a.clone(), serde_json::Value::Null))
            .collect();
        patch["metadata"]["annotations"] = serde_json::Value::Object(nulls);
    }
    patch
}

/// The `status.conditions` entries to patch for `updates`: `lastHeartbeatTime` is `now`;
/// `lastTransitionTime` is kept from the node's current condition of the same type when the status
/// does not change (the kubelet's `setNodeStatus` does the same), and `now` when it does or the
/// condition is new.
pub fn condition_patch(
    existing: &[NodeCondition],
    updates: &[NodeConditionUpdate],
    now: Timestamp,
) -> Vec<serde_json::Value> {
    updates
        .iter()
        .map(|u| {
            let status = if u.status { "True" } else { "False" };
            let transition = existing
                .iter()
                .find(|c| c.type_ == u.type_ && c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            json!({
                "type": u.type_,
                "status": status,
                "reason": u.reason,
                "message": u.message,
                "lastHeartbeatTime": Time(now),
                "lastTransitionTime": transition,
            })
        })
        .collect()
}
