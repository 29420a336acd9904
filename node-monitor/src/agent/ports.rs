//! The agent cycle's ports: the node it observes, the pods the API lists, the writes it makes, and
//! the memcg thresholds it re-arms. Production plugs in the sampler, the reflector's store, the
//! actuator and the wake-ups; the cycle's unit tests plug in fakes, as the kubelet's eviction
//! manager tests inject `killPodFunc` and a fake summary provider. The clock is tokio's
//! (`tokio::time::Instant`), which the tests pause and advance.
use std::{collections::HashMap, future::Future, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use node_monitor_core::{signals::Observations, signals::threshold::Threshold};

use crate::{
    cluster::actuator::{
        Actuator, ActuatorError, EvictOutcome, EvictionRequest, NodeConditionUpdate, Release,
        ReleasePlan,
    },
    sampler::{MemoryReading, PodDiskDetail, SampleKind, Sampler, SamplerError, TimedObservations},
    wakeup::{Wakeup, Wakeups},
};

/// The node's signals as the agent observes them (the sampler). Calls may block on cgroup and
/// proc reads: the production implementation runs them with `block_in_place`.
pub trait NodeSignals {
    /// A pass of `kind` for `wakeup`, timed from the wake-up.
    fn observe(&mut self, wakeup: Wakeup, kind: SampleKind) -> TimedObservations<Wakeup>;
    /// A fresh pass of `kind`.
    fn sample(&mut self, kind: SampleKind) -> Observations;
    /// The node cgroup's memory at the last pass.
    fn last_node_memory(&self) -> Option<MemoryReading>;
    /// The kubepods cgroup's memory at the last pass.
    fn last_kubepods_memory(&self) -> Option<MemoryReading>;
}

/// The pods' usage as the agent reads it (the sampler): their cgroups, their figures for a
/// ranking, their disk. Calls may block, as [`NodeSignals`]' do.
pub trait PodView {
    /// Completes `out` with a pass of `kind` (per-pod usage for ranking).
    fn sample_into(&mut self, kind: SampleKind, out: &mut Observations);
    /// Reads every pod's usage into `out.pods` (no signal), asking `give_up` between pods and
    /// stopping at its first yes; true when every pod was read. A read given up leaves `out`
    /// part old, part new: the caller keeps it only when complete.
    fn read_pods_unless(
        &mut self,
        out: &mut Observations,
        give_up: &mut dyn FnMut() -> bool,
    ) -> bool;
    /// Measures the pods' disk usage now, instead of the background meter's last walk.
    fn measure_pod_disk_now(&mut self);
    /// Lists the pod cgroups again.
    fn refresh_pod_cgroups(&mut self) -> Result<(), SamplerError>;
    /// Whether the pod with this UID has a cgroup on the node.
    fn has_pod_cgroup(&self, uid: &str) -> bool;
    /// Where the pods are read from.
    fn kubepods(&self) -> KubepodsSight;
    /// Asks for a per-pod disk measurement if none was asked for within the full-sample
    /// interval (the walk runs apart).
    fn request_pod_disk(&mut self) {}
    /// The per-pod disk figures in parts of the last disk measurement, once per measurement.
    fn take_pod_disk_detail(&mut self) -> Option<HashMap<String, PodDiskDetail>> {
        None
    }
}

/// The node as the cycle observes it: its signals and its pods' usage. A stage that needs only
/// one of them takes only that port.
pub trait NodeView: NodeSignals + PodView {}

impl<T: NodeSignals + PodView> NodeView for T {}

impl NodeSignals for Sampler {
    fn observe(&mut self, wakeup: Wakeup, kind: SampleKind) -> TimedObservations<Wakeup> {
        tokio::task::block_in_place(|| self.observe_as(wakeup, kind))
    }
    fn sample(&mut self, kind: SampleKind) -> Observations {
        tokio::task::block_in_place(|| Sampler::sample(self, kind))
    }
    fn last_node_memory(&self) -> Option<MemoryReading> {
        Sampler::last_node_memory(self)
    }
    fn last_kubepods_memory(&self) -> Option<MemoryReading> {
        Sampler::last_kubepods_memory(self)
    }
}

impl PodView for Sampler {
    fn sample_into(&mut self, kind: SampleKind, out: &mut Observations) {
        tokio::task::block_in_place(|| {
            Sampler::sample_into(self, kind, out);
        });
    }
    fn read_pods_unless(
        &mut self,
        out: &mut Observations,
        give_up: &mut dyn FnMut() -> bool,
    ) -> bool {
        tokio::task::block_in_place(|| Sampler::read_pods_unless(self, out, give_up))
    }
    fn measure_pod_disk_now(&mut self) {
        tokio::task::block_in_place(|| Sampler::measure_pod_disk_now(self));
    }
    fn refresh_pod_cgroups(&mut self) -> Result<(), SamplerError> {
        tokio::task::block_in_place(|| Sampler::refresh_pod_cgroups(self))
    }
    fn has_pod_cgroup(&self, uid: &str) -> bool {
        Sampler::has_pod_cgroup(self, uid)
    }
    fn kubepods(&self) -> KubepodsSight {
        let layout = self.layout();
        KubepodsSight {
            driver: layout
                .kubepods_detection
                .driver_label(&layout.kubepods_name)
                .to_owned(),
            path: layout.kubepods_memory.display().to_string(),
            detection: format!("{:?}", layout.kubepods_detection),
        }
    }
    fn request_pod_disk(&mut self) {
        tokio::task::block_in_place(|| Sampler::request_pod_disk(self));
    }
    fn take_pod_disk_detail(&mut self) -> Option<HashMap<String, PodDiskDetail>> {
        Sampler::take_pod_disk_detail(self)
    }
}

/// Where the pods' cgroups are read from, for the log line and the `node_monitor_kubepods_layout`
/// metric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubepodsSight {
    /// The cgroup driver (`systemd`, `cgroupfs`) as the metric labels it.
    pub driver: String,
    /// The kubepods cgroup in the memory hierarchy.
    pub path: String,
    /// How the kubepods cgroup was chosen (configured, detected and from what, pending).
    pub detection: String,
}

/// This node's pods as the API lists them (the reflector's store).
pub trait PodSource {
    /// Every pod bound to this node that the API lists now.
    fn pods(&self) -> Vec<Arc<Pod>>;
}

impl PodSource for Store<Pod> {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.state()
    }
}

/// What the cycle writes to the cluster (the actuator).
pub trait ClusterWrites {
    /// Asks for one eviction through the Eviction API.
    fn evict(&self, req: &EvictionRequest) -> impl Future<Output = EvictOutcome>;
    /// The Events of an answered eviction.
    fn record_eviction_events(
        &self,
        req: &EvictionRequest,
        outcome: &EvictOutcome,
    ) -> impl Future<Output = ()>;
    /// Writes the agent-owned node conditions.
    fn set_conditions(
        &self,
        updates: &[NodeConditionUpdate],
    ) -> impl Future<Output = Result<(), ActuatorError>>;
    /// Puts a taint on the node (`present`) or takes it off.
    fn set_taint(
        &self,
        key: &str,
        value: &str,
        effect: &str,
        present: bool,
    ) -> impl Future<Output = Result<bool, ActuatorError>>;
    /// Whether the pod with this UID is still in the API.
    fn pod_present(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<bool, kube::Error>>;
    /// Takes the agent's marks back from the node, as `release` plans them on the node the API
    /// holds now (not on what the loop believes it published). Returns what was written.
    fn release(&self, release: Release)
    -> impl Future<Output = Result<ReleasePlan, ActuatorError>>;
}

impl ClusterWrites for Actuator {
    fn evict(&self, req: &EvictionRequest) -> impl Future<Output = EvictOutcome> {
        Actuator::evict(self, req)
    }
    fn record_eviction_events(
        &self,
        req: &EvictionRequest,
        outcome: &EvictOutcome,
    ) -> impl Future<Output = ()> {
        Actuator::record_eviction_events(self, req, outcome)
    }
    fn set_conditions(
        &self,
        updates: &[NodeConditionUpdate],
    ) -> impl Future<Output = Result<(), ActuatorError>> {
        Actuator::set_conditions(self, updates)
    }
    fn set_taint(
        &self,
        key: &str,
        value: &str,
        effect: &str,
        present: bool,
    ) -> impl Future<Output = Result<bool, ActuatorError>> {
        Actuator::set_taint(self, key, value, effect, present)
    }
    fn pod_present(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<bool, kube::Error>> {
        Actuator::pod_present(self, namespace, name, uid)
    }
    fn release(
        &self,
        release: Release,
    ) -> impl Future<Output = Result<ReleasePlan, ActuatorError>> {
        Actuator::release(self, release, false)
    }
}

/// What wakes the loop: the memcg thresholds, PSI triggers, the kernel probes, the housekeeping
/// tick (the wake-ups).
pub trait WakeupStream {
    /// The next wake-up; `None` when every source has ended.
    fn next(&mut self) -> impl Future<Output = Option<Wakeup>>;
    /// Whether a wake-up is waiting to be taken, without taking it.
    fn pending(&self) -> bool;
}

impl WakeupStream for Wakeups {
    fn next(&mut self) -> impl Future<Output = Option<Wakeup>> {
        Wakeups::next(self)
    }
    fn pending(&self) -> bool {
        Wakeups::pending(self)
    }
}

/// What stops the agent: SIGTERM or SIGINT in production; the tests send their own, at an
/// instant of tokio's paused clock.
pub trait StopSignal {
    /// Resolves when the agent is asked to stop, with what asked (`SIGTERM`, `SIGINT`). Cancel
    /// safe: the loop selects on it beside each wait and each cycle.
    fn stopped(&mut self) -> impl Future<Output = &'static str>;
}

/// SIGTERM and SIGINT, registered once for the agent's lifetime.
pub struct UnixSignals {
    sigterm: tokio::signal::unix::Signal,
    sigint: tokio::signal::unix::Signal,
}

impl UnixSignals {
    /// Registers the handlers: from now on the signals stop the loop instead of the process.
    pub fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            sigterm: signal(SignalKind::terminate())?,
            sigint: signal(SignalKind::interrupt())?,
        })
    }
}

impl StopSignal for UnixSignals {
    async fn stopped(&mut self) -> &'static str {
        tokio::select! {
            _ = self.sigterm.recv() => "SIGTERM",
            _ = self.sigint.recv() => "SIGINT",
        }
    }
}

/// The memcg thresholds the cycle re-arms after every pass (the wake-ups).
pub trait Arming {
    /// Arms (or re-arms at the fresh `inactive_file`) the thresholds of the configured memory
    /// signals on the node and kubepods cgroups.
    fn rearm(
        &mut self,
        thresholds: &[Threshold],
        node: Option<MemoryReading>,
        kubepods: Option<MemoryReading>,
    );
}

impl Arming for Wakeups {
    fn rearm(
        &mut self,
        thresholds: &[Threshold],
        node: Option<MemoryReading>,
        kubepods: Option<MemoryReading>,
    ) {
        super::memcg::rearm(self, thresholds, node, kubepods);
    }
}
