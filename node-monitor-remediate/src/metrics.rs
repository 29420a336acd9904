//! The metrics of `node-monitor remediate` (`node_monitor_remediation_*`): its own registry,
//! served on remediate's `/metrics`, with none of the agent's families.
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use node_monitor_service::metrics::{Exposition, Family_, ReasonLabels, Reg, encode_registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZoneLabels {
    pub zone: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZoneStateLabels {
    pub zone: String,
    /// `Normal`, `PartialDisruption`, `FullDisruption`.
    pub state: String,
}

/// The port whose call failed (`node_monitor_remediation_port_errors_total`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[expect(
    non_camel_case_types,
    reason = "the derive writes a variant's name as the label value, which is snake_case"
)]
pub enum Port {
    /// The out-of-service taint.
    taints,
    /// The pods and VolumeAttachments of a node, and their deletion.
    node_pods,
    /// A fence step's methods.
    fence_runner,
}

/// A failed port call: its port and its kind (the error's `metric_label`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortErrorLabels {
    pub port: Port,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepOutcomeLabels {
    /// `isolation`, `power_management`, `recovery`.
    pub step: String,
    /// `success`, `failure`, `cancelled`.
    pub outcome: String,
}

/// Every metric `node-monitor remediate` exports.
pub struct RemediateMetrics {
    registry: Registry,
    families: Vec<Family_>,
    pub leader: Gauge,
    pub nodes: Family<StateLabels, Gauge>,
    pub operations: Family<StateLabels, Gauge>,
    pub zone_state: Family<ZoneStateLabels, Gauge>,
    pub zone_unhealthy_nodes: Family<ZoneLabels, Gauge>,
    pub skips: Family<ReasonLabels, Counter>,
    pub fence_steps: Family<StepOutcomeLabels, Counter>,
    pub port_errors: Family<PortErrorLabels, Counter>,
    pub releases: Counter,
    pub pods_deleted: Counter,
    pub recoveries: Counter,
    pub detection_to_release_seconds: Histogram,
    /// `node_monitor_remediation_admission_policy`: the NodeFence status policy's state.
    pub admission_policy: Family<StateLabels, Gauge>,
}

impl Default for RemediateMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RemediateMetrics {
    pub fn new() -> Self {
        let mut reg = Reg::new();
        let m = Self {
            leader: Gauge::default(),
            nodes: Family::default(),
            operations: Family::default(),
            zone_state: Family::default(),
            zone_unhealthy_nodes: Family::default(),
            skips: Family::default(),
            fence_steps: Family::default(),
            port_errors: Family::default(),
            releases: Counter::default(),
            pods_deleted: Counter::default(),
            recoveries: Counter::default(),
            // 0.5 s … ~17 min.
            detection_to_release_seconds: Histogram::new(exponential_buckets(0.5, 2.0, 12)),
            admission_policy: Family::default(),
            registry: Registry::default(),
            families: Vec::new(),
        };
        reg.add_build_info("Build information of the running remediate controller");
        reg.add(
            "remediation_admission_policy",
            "1 for the current state of the NodeFence status admission policy for this controller: enforced, policy_missing, binding_missing, not_denying, other_user (installed for another namespace or account), unknown (not readable)",
            m.admission_policy.clone(),
        );
        reg.add(
            "remediation_leader",
            "1 while this remediate replica holds the leader Lease",
            m.leader.clone(),
        );
        reg.add(
            "remediation_nodes",
            "Nodes by liveness as remediate judges it (alive, suspect, dead)",
            m.nodes.clone(),
        );
        reg.add(
            "remediation_operations",
            "Fencing operations by phase",
            m.operations.clone(),
        );
        reg.add(
            "remediation_zone_state",
            "1 for each zone's current state (Normal, PartialDisruption, FullDisruption)",
            m.zone_state.clone(),
        );
        reg.add(
            "remediation_zone_unhealthy_nodes",
            "Unhealthy (suspect, dead or not Ready) nodes per zone",
            m.zone_unhealthy_nodes.clone(),
        );
        reg.add(
            "remediation_skips",
            "Dead nodes not fenced, by reason (counted once per node and reason)",
            m.skips.clone(),
        );
        reg.add(
            "remediation_fence_steps",
            "Fencing step runs by step and outcome",
            m.fence_steps.clone(),
        );
        reg.add(
            "remediation_port_errors",
            "Failed calls of the controller's ports (the taint, the node's pods, fence steps), by port and kind",
            m.port_errors.clone(),
        );
        reg.add(
            "remediation_releases",
            "Nodes whose workload was released after confirmed fencing",
            m.releases.clone(),
        );
        reg.add(
            "remediation_pods_deleted",
            "Pods deleted from fenced nodes",
            m.pods_deleted.clone(),
        );
        reg.add(
            "remediation_recoveries",
            "Fenced nodes that came back and were recovered",
            m.recoveries.clone(),
        );
        reg.add(
            "remediation_detection_to_release_seconds",
            "Time from a node found dead to its workload released",
            m.detection_to_release_seconds.clone(),
        );
        Self {
            registry: reg.registry,
            families: reg.families,
            ..m
        }
    }

    /// The text exposition format.
    /// Sets `node_monitor_remediation_admission_policy`: `state` is 1, the other states 0.
    pub fn set_admission_policy(&self, state: &str) {
        node_monitor_service::metrics::set_one_hot(
            &self.admission_policy,
            &node_monitor_core::remediation::admission::AdmissionState::LABELS,
            state,
            |s| StateLabels {
                state: s.to_owned(),
            },
        );
    }

    pub fn encode(&self) -> String {
        encode_registry(&self.registry)
    }

    /// Every registered family as Prometheus scrapes it, with its type; for the docs check.
    pub fn families(&self) -> &[Family_] {
        &self.families
    }
}

impl Exposition for RemediateMetrics {
    fn encode(&self) -> String {
        RemediateMetrics::encode(self)
    }
}
