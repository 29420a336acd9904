//! The kubelet's local-storage limit evictions (`localStorageEviction` in
//! `pkg/kubelet/eviction/eviction_manager.go`, on while the LocalStorageCapacityIsolation feature
//! is, its default): a pod is evicted, whatever the node's pressure and without ranking, when
//! 1. one of its emptyDir volumes uses more than its `sizeLimit` (`emptyDirLimitEviction`);
//! 2. its ephemeral-storage usage (writable layers, logs, local volumes) exceeds the pod's
//!    ephemeral-storage limit, the sum of its containers' (`podEphemeralStorageLimitEviction`);
//! 3. one of its containers' logs (plus its writable layer, without a dedicated imagefs) exceed
//!    that container's limit (`containerEphemeralStorageLimitEviction`).
//!
//! The checks run in that order and the first that holds decides the pod's message. Every pod
//! over a limit is evicted in the same pass, with the kubelet's immediate grace period; critical
//! pods are refused, as `evictPod` refuses them. A pod without figures is not judged.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{
    api::core::v1::{Container, Pod},
    apimachinery::pkg::api::resource::Quantity as ApiQuantity,
};
use serde::Serialize;

use crate::{
    eviction::{EVICTION_REASON, HARD_EVICTION_GRACE_PERIOD_SECONDS},
    kubelet::pod::{PodError, PodInfo},
    units::quantity::{Format, Quantity},
};

/// Which limit a pod went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitKind {
    /// An emptyDir volume over its `sizeLimit`.
    EmptyDir,
    /// The pod over the sum of its containers' ephemeral-storage limits.
    Pod,
    /// A container over its own ephemeral-storage limit.
    Container,
}

impl LimitKind {
    /// Every kind, in the order the kubelet checks them.
    pub const ALL: [LimitKind; 3] = [LimitKind::EmptyDir, LimitKind::Pod, LimitKind::Container];

    /// The metric label: `emptydir`, `pod`, `container`.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::EmptyDir => "emptydir",
            LimitKind::Pod => "pod",
            LimitKind::Container => "container",
        }
    }

    /// The kubelet's name for it in its eviction metric (`signalEmptyDirFsLimit`, …).
    pub fn signal(self) -> &'static str {
        match self {
            LimitKind::EmptyDir => "emptydirfs.limit",
            LimitKind::Pod => "ephemeralpodfs.limit",
            LimitKind::Container => "ephemeralcontainerfs.limit",
        }
    }
}

impl std::fmt::Display for LimitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pod's local-storage limits, from its spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StorageLimits {
    /// Every emptyDir volume, in spec order, with its `sizeLimit` if any.
    pub empty_dirs: Vec<(String, Option<Quantity>)>,
    /// `PodLimits(pod)[ephemeral-storage]`: containers summed, restartable init containers
    /// included, at least the largest init container's need, plus overhead when non-zero;
    /// `None` when no container sets the limit.
    pub pod: Option<Quantity>,
    /// The regular containers with a non-zero ephemeral-storage limit, in spec order.
    pub containers: Vec<(String, Quantity)>,
}

/// What a pod uses of local storage, as the kubelet's summary reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StorageUsage {
    /// The pod's ephemeral-storage usage (writable layers, logs, local volumes, its other files
    /// under the kubelet's pod directory); `None`: not measured.
    pub pod: Option<u64>,
    /// Bytes used per measured volume, by volume name.
    pub volumes: BTreeMap<String, u64>,
    /// The containers measured.
    pub containers: Vec<ContainerStorage>,
}

/// One container's measured local storage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ContainerStorage {
    /// The container's name in the pod spec.
    pub name: String,
    /// Its log files, bytes.
    pub logs: Option<u64>,
    /// Its writable layer, bytes.
    pub rootfs: Option<u64>,
}

/// A pod to evict for going over a local-storage limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitEviction {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The limit it went over.
    pub kind: LimitKind,
    /// The kubelet's immediate grace period (`immediateEvictionGracePeriodSeconds`).
    pub grace_period_seconds: i64,
    /// `Evicted`.
    pub reason: &'static str,
    /// The kubelet's message.
    pub message: String,
}

impl StorageLimits {
    /// The limits of an API pod. Fails on a malformed quantity, naming the field.
    pub fn from_pod(pod: &Pod) -> Result<StorageLimits, PodError> {
        let meta = &pod.metadata;
        let id = format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or("default"),
            meta.name.as_deref().unwrap_or("<unnamed>")
        );
        let parse = |field: String, q: &ApiQuantity| {
            Quantity::parse(&q.0).map_err(|e| PodError::Quantity {
                pod: id.clone(),
                field,
                source: e,
            })
        };
        let mut out = StorageLimits::default();
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(out);
        };
        for v in spec.volumes.as_deref().unwrap_or(&[]) {
            let Some(ed) = &v.empty_dir else { continue };
            let size = ed
                .size_limit
                .as_ref()
                .map(|q| parse(format!("spec.volumes[{}].emptyDir.sizeLimit", v.name), q))
                .transpose()?;
            out.empty_dirs.push((v.name.clone(), size));
        }
        let limit = |c: &Container, kind: &str| {
            c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get(EPHEMERAL_STORAGE))
                .map(|q| {
                    parse(
                        format!(
                            "spec.{kind}[{}].resources.limits.{EPHEMERAL_STORAGE}",
                            c.name
                        ),
                        q,
                    )
                })
                .transpose()
        };
        // AggregateContainerLimits, for one resource: present once any container sets it.
        let mut sum: Option<Quantity> = None;
        for c in &spec.containers {
            if let Some(q) = limit(c, "containers")? {
                add(&mut sum, &q);
                if q.value() != 0 {
                    out.containers.push((c.name.clone(), q));
                }
            }
        }
        let mut sidecars: Option<Quantity> = None;
        let mut init_max: Option<Quantity> = None;
        for c in spec.init_containers.as_deref().unwrap_or(&[]) {
            let own = limit(c, "initContainers")?;
            let need = if c.restart_policy.as_deref() == Some("Always") {
                if let Some(q) = &own {
                    add(&mut sum, q);
                    add(&mut sidecars, q);
                }
                sidecars.clone()
            } else {
                let mut combined = own;
                if let Some(s) = &sidecars {
                    add(&mut combined, s);
                }
                combined
            };
            if let Some(n) = need
                && init_max.as_ref().is_none_or(|m| n > *m)
            {
                init_max = Some(n);
            }
        }
        if let Some(m) = init_max
            && sum.as_ref().is_none_or(|s| m > *s)
        {
            sum = Some(m);
        }
        // Overhead is added to non-zero limits only.
        if let Some(s) = &mut sum
            && !s.is_zero()
            && let Some(q) = spec
                .overhead
                .as_ref()
                .and_then(|o| o.get(EPHEMERAL_STORAGE))
        {
            s.add(&parse(format!("spec.overhead.{EPHEMERAL_STORAGE}"), q)?);
        }
        out.pod = sum;
        Ok(out)
    }

    /// Whether any check can hold for this pod: an emptyDir with a positive `sizeLimit`, or an
    /// ephemeral-storage limit.
    pub fn any(&self) -> bool {
        self.pod.is_some()
            || !self.containers.is_empty()
            || self
                .empty_dirs
                .iter()
                .any(|(_, s)| s.as_ref().is_some_and(|s| s.signum() == 1))
    }
}

const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// `addResourceList` for one resource: the first value is copied (keeping its form), later ones
/// added.
fn add(sum: &mut Option<Quantity>, q: &Quantity) {
    match sum {
        Some(s) => s.add(q),
        None => *sum = Some(q.clone()),
    }
}

/// `localStorageEviction`: the pods over a local-storage limit, in the order given, each with
/// the first limit it went over. `dedicated_image_fs`: writable layers are on their own
/// filesystem, and a container's limit then counts its logs alone.
pub fn limit_evictions(
    pods: &[(PodInfo, StorageLimits)],
    usage: &HashMap<String, StorageUsage>,
    dedicated_image_fs: bool,
) -> Vec<LimitEviction> {
    let mut out = Vec::new();
    for (pod, limits) in pods {
        let Some(used) = usage.get(&pod.uid) else {
            continue;
        };
        let Some((kind, message)) = empty_dir_over(limits, used)
            .or_else(|| pod_over(limits, used))
            .or_else(|| container_over(limits, used, dedicated_image_fs))
        else {
            continue;
        };
        // evictPod refuses critical pods.
        if pod.critical {
            continue;
        }
        out.push(LimitEviction {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            kind,
            grace_period_seconds: HARD_EVICTION_GRACE_PERIOD_SECONDS,
            reason: EVICTION_REASON,
            message,
        });
    }
    out
}

fn bytes(v: u64) -> Quantity {
    Quantity::new(i64::try_from(v).unwrap_or(i64::MAX), Format::BinarySI)
}

/// `emptyDirLimitEviction`: the first emptyDir (in spec order) over a positive `sizeLimit`.
fn empty_dir_over(limits: &StorageLimits, used: &StorageUsage) -> Option<(LimitKind, String)> {
    limits.empty_dirs.iter().find_map(|(name, size)| {
        let size = size.as_ref()?;
        let u = used.volumes.get(name)?;
        (size.signum() == 1 && bytes(*u) > *size).then(|| {
            (
                LimitKind::EmptyDir,
                format!(
                    "Usage of EmptyDir volume {} exceeds the limit {}. ",
                    go_quote(name),
                    go_quote(&size.to_string())
                ),
            )
        })
    })
}

/// `podEphemeralStorageLimitEviction`: the pod's usage over its ephemeral-storage limit (an
/// unmeasured pod counts as using nothing, as a summary without the figure does).
fn pod_over(limits: &StorageLimits, used: &StorageUsage) -> Option<(LimitKind, String)> {
    let limit = limits.pod.as_ref()?;
    (bytes(used.pod.unwrap_or(0)) > *limit).then(|| {
        (
            LimitKind::Pod,
            format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {limit}. "
            ),
        )
    })
}

/// `containerEphemeralStorageLimitEviction`: the first measured container whose logs (and
/// writable layer, without a dedicated imagefs) exceed its limit.
fn container_over(
    limits: &StorageLimits,
    used: &StorageUsage,
    dedicated_image_fs: bool,
) -> Option<(LimitKind, String)> {
    used.containers.iter().find_map(|c| {
        let mut total = c.logs.unwrap_or(0);
        if !dedicated_image_fs {
            total = total.saturating_add(c.rootfs.unwrap_or(0));
        }
        let (_, limit) = limits.containers.iter().find(|(n, _)| *n == c.name)?;
        (*limit < bytes(total)).then(|| {
            (
                LimitKind::Container,
                format!(
                    "Container {} exceeded its local ephemeral storage limit {}. ",
                    c.name,
                    go_quote(&limit.to_string())
                ),
            )
        })
    })
}

/// Go's `%q` for the strings met here (names and quantities): double quotes, with `"` and `\`
/// escaped and control characters written as escapes.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
