//! What the eviction decision needs to know about a pod, and the pure conversion from the API's
//! `Pod`. QoS follows `pkg/apis/core/v1/helper/qos` (`GetPodQOS`), requests follow
//! `GetResourceRequestQuantity` (`pkg/api/v1/resource`) over `PodRequests`
//! (`k8s.io/component-helpers/resource`), criticality follows `IsCriticalPod`
//! (`pkg/kubelet/types/pod_update.go`).

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::{Container, Pod, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity as ApiQuantity,
};
use serde::Serialize;

use crate::{
    kubelet::layout::QosClass,
    units::quantity::{Format, Quantity, QuantityError},
};

/// `scheduling.SystemCriticalPriority`: `2 * HighestUserDefinablePriority`.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// `kubetypes.ConfigSourceAnnotationKey`.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// `kubetypes.ConfigMirrorAnnotationKey`.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A pod as the eviction core sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodInfo {
    /// `metadata.namespace` (`default` when unset).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`; the sampler keys pod usage by it.
    pub uid: String,
    /// The QoS class (`GetPodQOS`): `status.qosClass`, or computed from the spec.
    pub qos: QosClass,
    /// `spec.priority`, 0 when unset (`corev1helpers.PodPriority`).
    pub priority: i32,
    /// Static, mirror or system-critical by priority: never evicted.
    pub critical: bool,
    /// A static pod: its `kubernetes.io/config.source` annotation names a source other than `api`
    /// (`IsStaticPod`).
    pub static_pod: bool,
    /// The API's mirror of a static pod: it has the `kubernetes.io/config.mirror` annotation
    /// (`IsMirrorPod`).
    pub mirror_pod: bool,
    /// The controlling owner (`kind/name`), for reports.
    pub owner: Option<String>,
    /// `spec.terminationGracePeriodSeconds`; caps the grace period of a soft eviction.
    pub termination_grace_period_seconds: Option<i64>,
    /// The memory request the kubelet ranks by (containers, sidecars, init containers, pod-level
    /// resources, overhead).
    pub memory_request: Quantity,
    /// The ephemeral-storage request the kubelet ranks by.
    pub ephemeral_storage_request: Quantity,
    /// `spec.resources.requests.memory` when pod-level resources are set (the eviction message
    /// then names the pod).
    pub pod_memory_request: Option<Quantity>,
    /// Regular then init containers (ephemeral containers cannot request resources).
    pub containers: Vec<ContainerInfo>,
}

/// A container's requests, and optionally its usage (used only to word the eviction message).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerInfo {
    /// The container's name in the pod spec.
    pub name: String,
    /// `resources.requests.memory` as written, zero when absent.
    pub memory_request: Quantity,
    /// `resources.requests.ephemeral-storage` as written, zero when absent.
    pub ephemeral_storage_request: Quantity,
    /// Filled in by the caller when sampled; the default (nothing known) after [`PodInfo::from_pod`].
    pub usage: ContainerUsage,
}

/// Per-container usage, when the sampler has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ContainerUsage {
    /// Working set, bytes.
    pub memory: Option<u64>,
    /// Writable layer plus logs, bytes.
    pub disk: Option<u64>,
}

/// A pod the API returned that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// A required field is absent.
    #[error("pod {pod}: {field} is missing")]
    Missing {
        /// `namespace/name` (`namespace/<unnamed>` without a name).
        pod: String,
        /// The missing field's path (`metadata.name`, `metadata.uid`).
        field: &'static str,
    },
    /// A resource request or limit does not parse as a quantity.
    #[error("pod {pod}: {field} is not a valid quantity")]
    Quantity {
        /// `namespace/name`.
        pod: String,
        /// The field's path in the pod spec.
        field: String,
        /// Why the value does not parse.
        #[source]
        source: QuantityError,
    },
}

/// Pods the kubelet still counts as active: not finished, not being deleted.
pub fn pod_is_active(pod: &Pod) -> bool {
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    !finished && pod.metadata.deletion_timestamp.is_none()
}

/// One running pod of this node as the API lists it, and whether the sampler found its cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPresence {
    /// How long its longest-running container has been running (`None`: none started yet).
    pub running_for: Option<Duration>,
    /// The sampler found the pod's cgroup under kubepods.
    pub cgroup_found: bool,
}

/// Pods that must have a cgroup by now: running for at least this long (the runtime creates
/// the cgroup before the container starts; this covers a relist that has not run yet).
pub const POD_CGROUP_SETTLE: Duration = Duration::from_secs(30);

/// Whether the agent is blind to the pods' usage: the API has pods running on this node for at
/// least `settle`, and the sampler found the cgroup of none of them (a wrong kubepods path or
/// cgroup driver, a missing mount). Ranking then has no usage, and the wait for an evicted pod's
/// cleanup returns at once, so evictions would cascade: nothing is evicted while blind.
/// Returns the number of settled running pods when blind.
pub fn blind_to_pods(pods: &[PodPresence], settle: Duration) -> Option<usize> {
    let settled: Vec<&PodPresence> = pods
        .iter()
        .filter(|p| p.running_for.is_some_and(|d| d >= settle))
        .collect();
    (!settled.is_empty() && settled.iter().all(|p| !p.cgroup_found)).then_some(settled.len())
}

impl PodInfo {
    /// Converts an API pod. Fails on a pod without name or UID, or with a malformed quantity.
    pub fn from_pod(pod: &Pod) -> Result<PodInfo, PodError> {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let name = meta.name.clone().ok_or_else(|| PodError::Missing {
            pod: format!("{namespace}/<unnamed>"),
            field: "metadata.name",
        })?;
        let id = format!("{namespace}/{name}");
        let uid = meta.uid.clone().ok_or_else(|| PodError::Missing {
            pod: id.clone(),
            field: "metadata.uid",
        })?;
        let empty = Default::default();
        let spec = pod.spec.as_ref().unwrap_or(&empty);
        let init_containers = spec.init_containers.as_deref().unwrap_or(&[]);

        let annotations = meta.annotations.as_ref();
        let static_pod = annotations
            .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
            .is_some_and(|source| source != "api");
        let mirror_pod = annotations.is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION));
        let priority = spec.priority.unwrap_or(0);
        let critical = static_pod || mirror_pod || priority >= SYSTEM_CRITICAL_PRIORITY;

        let parse = |field: String, q: &ApiQuantity| {
            Quantity::parse(&q.0).map_err(|e| PodError::Quantity {
                pod: id.clone(),
                field,
                source: e,
            })
        };

        let qos = pod_qos(pod, &parse)?;
        let memory_request = request_quantity(pod, "memory", Format::BinarySI, &parse)?;
        let ephemeral_storage_request =
            request_quantity(pod, "ephemeral-storage", Format::BinarySI, &parse)?;
        let pod_memory_request = if pod_level_resources_set(spec.resources.as_ref()) {
            spec.resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("memory"))
                .map(|q| parse("spec.resources.requests.memory".into(), q))
                .transpose()?
        } else {
            None
        };

        let mut containers = Vec::new();
        let lists = [
            ("containers", spec.containers.as_slice()),
            ("initContainers", init_containers),
        ];
        for (kind, list) in lists {
            for c in list {
                containers.push(ContainerInfo {
                    name: c.name.clone(),
                    memory_request: container_request(c, kind, "memory", &parse)?
                        .unwrap_or_default(),
                    ephemeral_storage_request: container_request(
                        c,
                        kind,
                        "ephemeral-storage",
                        &parse,
                    )?
                    .unwrap_or_default(),
                    usage: ContainerUsage::default(),
                });
            }
        }

        let owner = meta.owner_references.as_ref().and_then(|refs| {
            refs.iter()
                .find(|r| r.controller == Some(true))
                .or_else(|| refs.first())
                .map(|r| format!("{}/{}", r.kind, r.name))
        });

        Ok(PodInfo {
            namespace,
            name,
            uid,
            qos,
            priority,
            critical,
            static_pod,
            mirror_pod,
            owner,
            termination_grace_period_seconds: spec.termination_grace_period_seconds,
            memory_request,
            ephemeral_storage_request,
            pod_memory_request,
            containers,
        })
    }
}

type ParseFn<'a> = dyn Fn(String, &ApiQuantity) -> Result<Quantity, PodError> + 'a;

/// `IsSupportedPodLevelResource`: cpu, memory and hugepages.
fn supported_pod_level(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// `IsPodLevelResourcesSet`.
fn pod_level_resources_set(resources: Option<&ResourceRequirements>) -> bool {
    let Some(r) = resources else { return false };
    let has = |m: &Option<BTreeMap<String, ApiQuantity>>| {
        m.as_ref()
            .is_some_and(|m| m.keys().any(|k| supported_pod_level(k)))
    };
    has(&r.requests) || has(&r.limits)
}

/// `GetPodQOS`: the status field when the API has set it, computed from the spec otherwise.
fn pod_qos(pod: &Pod, parse: &ParseFn<'_>) -> Result<QosClass, PodError> {
    match pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        Some("Guaranteed") => return Ok(QosClass::Guaranteed),
        Some("Burstable") => return Ok(QosClass::Burstable),
        Some("BestEffort") => return Ok(QosClass::BestEffort),
        _ => {}
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(QosClass::BestEffort);
    };
    // ComputePodQOS: pod-level resources decide when present (PodLevelResources is on by
    // default), otherwise every init and regular container must agree.
    if let Some(r) = spec.resources.as_ref() {
        return resource_qos(r, "spec.resources", parse);
    }
    let mut pod_qos: Option<QosClass> = None;
    let init = spec.init_containers.as_deref().unwrap_or(&[]);
    let all = init
        .iter()
        .map(|c| ("initContainers", c))
        .chain(spec.containers.iter().map(|c| ("containers", c)));
    for (kind, c) in all {
        let empty = ResourceRequirements::default();
        let r = c.resources.as_ref().unwrap_or(&empty);
        let qos = resource_qos(r, &format!("spec.{kind}[{}].resources", c.name), parse)?;
        match (qos, pod_qos) {
            (QosClass::Burstable, _) => return Ok(QosClass::Burstable),
            (q, None) => pod_qos = Some(q),
            (q, Some(p)) if q != p => return Ok(QosClass::Burstable),
            _ => {}
        }
    }
    Ok(pod_qos.unwrap_or(QosClass::BestEffort))
}

/// `resourceQOS` for one set of requirements: cpu and memory only.
fn resource_qos(
    r: &ResourceRequirements,
    field: &str,
    parse: &ParseFn<'_>,
) -> Result<QosClass, PodError> {
    let empty =
        |m: &Option<BTreeMap<String, ApiQuantity>>| m.as_ref().is_none_or(BTreeMap::is_empty);
    if empty(&r.requests) && empty(&r.limits) {
        return Ok(QosClass::BestEffort);
    }
    let get = |m: &Option<BTreeMap<String, ApiQuantity>>, kind: &str, res: &str| {
        m.as_ref()
            .and_then(|m| m.get(res))
            .map(|q| parse(format!("{field}.{kind}.{res}"), q))
            .transpose()
            .map(Option::unwrap_or_default)
    };
    let mut qos: Option<QosClass> = None;
    for res in ["cpu", "memory"] {
        let req = get(&r.requests, "requests", res)?;
        let lim = get(&r.limits, "limits", res)?;
        if req != lim {
            return Ok(QosClass::Burstable);
        }
        let best_effort = req.is_zero() && lim.is_zero();
        let this = if best_effort {
            QosClass::BestEffort
        } else {
            QosClass::Guaranteed
        };
        match qos {
            None => qos = Some(this),
            Some(q) if q != this => return Ok(QosClass::Burstable),
            Some(_) => {}
        }
    }
    Ok(qos.unwrap_or(QosClass::BestEffort))
}

fn container_request(
    c: &Container,
    kind: &str,
    resource: &str,
    parse: &ParseFn<'_>,
) -> Result<Option<Quantity>, PodError> {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource))
        .map(|q| {
            parse(
                format!("spec.{kind}[{}].resources.requests.{resource}", c.name),
                q,
            )
        })
        .transpose()
}

/// `GetResourceRequestQuantity(pod, resource)` for memory and ephemeral-storage.
fn request_quantity(
    pod: &Pod,
    resource: &str,
    format: Format,
    parse: &ParseFn<'_>,
) -> Result<Quantity, PodError> {
    let mut total = Quantity::new(0, format);
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(total);
    };
    if pod_level_resources_set(spec.resources.as_ref()) {
        // PodRequests with SkipContainerLevelResources: only the supported pod-level requests.
        if supported_pod_level(resource)
            && let Some(q) = spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource))
        {
            total.add(&parse(format!("spec.resources.requests.{resource}"), q)?);
        }
    } else {
        // AggregateContainerRequests: containers plus restartable init containers (sidecars);
        // an ordinary init container needs its own request plus the sidecars started before it.
        let mut sum = Quantity::default();
        for c in &spec.containers {
            if let Some(q) = container_request(c, "containers", resource, parse)? {
                sum.add(&q);
            }
        }
        let mut sidecars = Quantity::default();
        let mut init_max: Option<Quantity> = None;
        for c in spec.init_containers.as_deref().unwrap_or(&[]) {
            let q = container_request(c, "initContainers", resource, parse)?.unwrap_or_default();
            let needed = if c.restart_policy.as_deref() == Some("Always") {
                sum.add(&q);
                sidecars.add(&q);
                sidecars.clone()
            } else {
                let mut combined = q;
                combined.add(&sidecars);
                combined
            };
            if init_max.as_ref().is_none_or(|m| needed > *m) {
                init_max = Some(needed);
            }
        }
        if let Some(m) = init_max
            && m > sum
        {
            sum = m;
        }
        total.add(&sum);
    }
    // Overhead counts only when something was requested.
    if !total.is_zero()
        && let Some(q) = spec.overhead.as_ref().and_then(|o| o.get(resource))
    {
        total.add(&parse(format!("spec.overhead.{resource}"), q)?);
    }
    Ok(total)
}

/// A container's runtime id as the kubelet reports it (`containerd://<id>`, `cri-o://<id>`),
/// without its scheme: the id the runtime names its cgroup and state after.
pub fn bare_container_id(full: &str) -> &str {
    full.split_once("://").map_or(full, |(_, id)| id)
}

/// The name of the container whose runtime id is `container_id`, from the pod's statuses.
pub fn container_name(pod: &Pod, container_id: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .find(|c| {
        c.container_id
            .as_deref()
            .is_some_and(|full| !container_id.is_empty() && bare_container_id(full) == container_id)
    })
    .map(|c| c.name.clone())
}

#[cfg(test)]
pub(crate) mod tests;
