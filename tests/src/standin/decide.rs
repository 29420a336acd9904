//! The stand-in's decisions, pure: no I/O, no clock (time is passed in). Each function follows the
//! kubelet or scheduler code it names, reduced to what simulated pods need.
use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::api::core::v1::{
    Container, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};
use node_monitor_core::kubelet::layout::{CgroupDriver, QosClass};

/// A Kubernetes quantity in milli-units, rounded up (`1Ki` → 1 024 000, `100m` → 100).
///
/// Grammar from `apimachinery/pkg/api/resource/quantity.go`: a decimal number, then a binary
/// suffix (`Ki`…`Ei`), a decimal SI suffix (`n u m k M G T P E`) or an exponent (`e3`, `E-2`).
/// Negative quantities are rejected: nothing here (requests, limits, capacities) may be negative.
///
/// The stand-in parses quantities itself on purpose, rather than with the product's
/// `node_monitor_core::units::quantity::Quantity`: it models the kubelet independently of the agent it
/// tests, so that a bug in the product's parser (a misread suffix, exponent or fraction) makes the
/// agent's requests, QoS classes and ranks disagree with the cgroup limits, QoS and
/// `oom_score_adj` the stand-in applies, and a tier fails, instead of both sides sharing the bug.
pub fn parse_quantity_milli(s: &str) -> Option<i128> {
    let s = s.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(num_end);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return None;
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let digits = format!("{int_part}{frac_part}");
    let mantissa: i128 = digits.parse().ok()?;
    let frac = u32::try_from(frac_part.len()).ok()?;
    // value = mantissa / 10^frac * mul_num / mul_den
    let (mul_num, mul_den): (i128, i128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        _ => {
            let exp: i32 = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?
                .parse()
                .ok()?;
            if exp.unsigned_abs() > 30 {
                return None;
            }
            if exp >= 0 {
                (10i128.checked_pow(exp.unsigned_abs())?, 1)
            } else {
                (1, 10i128.checked_pow(exp.unsigned_abs())?)
            }
        }
    };
    let num = mantissa.checked_mul(mul_num)?.checked_mul(1000)?;
    let den = 10i128.checked_pow(frac)?.checked_mul(mul_den)?;
    Some((num + den - 1) / den)
}

/// A quantity in whole units, rounded up (bytes for memory, cores for cpu).
pub fn parse_quantity(s: &str) -> Option<i128> {
    parse_quantity_milli(s).map(|m| (m + 999) / 1000)
}

/// A quantity in bytes (`u64`), rounded up.
pub fn parse_bytes(s: &str) -> Option<u64> {
    parse_quantity(s).and_then(|v| u64::try_from(v).ok())
}

fn resource(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    name: &str,
) -> Option<i128> {
    map?.get(name).and_then(|q| parse_quantity_milli(&q.0))
}

/// A container's memory limit in bytes, if it declares one.
pub fn memory_limit(c: &Container) -> Option<u64> {
    let m = resource(c.resources.as_ref()?.limits.as_ref(), "memory")?;
    u64::try_from((m + 999) / 1000).ok()
}

/// A container's memory request in bytes; the limit when only the limit is set (API defaulting).
pub fn memory_request(c: &Container) -> u64 {
    let r = c.resources.as_ref();
    resource(r.and_then(|r| r.requests.as_ref()), "memory")
        .or_else(|| resource(r.and_then(|r| r.limits.as_ref()), "memory"))
        .and_then(|m| u64::try_from((m + 999) / 1000).ok())
        .unwrap_or(0)
}

/// Requests of a pod as the scheduler sums them: the larger of the regular containers' sum and
/// the largest init container (`pkg/api/v1/resource/helpers.go`, `PodRequests`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    pub cpu_milli: i128,
    pub memory: i128,
}

pub fn pod_requests(spec: &PodSpec) -> Requests {
    let of = |c: &Container| {
        let r = c.resources.as_ref();
        let get = |name| {
            resource(r.and_then(|r| r.requests.as_ref()), name)
                .or_else(|| resource(r.and_then(|r| r.limits.as_ref()), name))
                .unwrap_or(0)
        };
        Requests {
            cpu_milli: get("cpu"),
            memory: (get("memory") + 999) / 1000,
        }
    };
    let mut sum = Requests::default();
    for c in &spec.containers {
        let r = of(c);
        sum.cpu_milli += r.cpu_milli;
        sum.memory += r.memory;
    }
    for c in spec.init_containers.iter().flatten() {
        let r = of(c);
        sum.cpu_milli = sum.cpu_milli.max(r.cpu_milli);
        sum.memory = sum.memory.max(r.memory);
    }
    sum
}

/// The QoS class from the spec (`pkg/apis/core/v1/helper/qos/qos.go`, `ComputePodQOS`), for pods
/// whose `status.qosClass` is not set yet. Only cpu and memory count.
pub fn qos_class(spec: &PodSpec) -> QosClass {
    let all: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &all {
        let r = c.resources.as_ref();
        let req = r.and_then(|r| r.requests.as_ref());
        let lim = r.and_then(|r| r.limits.as_ref());
        for name in ["cpu", "memory"] {
            let rq = resource(req, name);
            let l = resource(lim, name);
            if rq.is_some_and(|v| v > 0) || l.is_some_and(|v| v > 0) {
                any = true;
            }
            // Requests default to limits; Guaranteed needs both resources limited and equal.
            match (rq.or(l), l) {
                (Some(a), Some(b)) if a == b => {}
                _ => guaranteed = false,
            }
        }
    }
    if !any {
        QosClass::BestEffort
    } else if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// `status.qosClass` when the apiserver has set it, else computed from the spec.
pub fn qos_from_status(status: Option<&str>, spec: &PodSpec) -> QosClass {
    match status {
        Some("Guaranteed") => QosClass::Guaranteed,
        Some("Burstable") => QosClass::Burstable,
        Some("BestEffort") => QosClass::BestEffort,
        _ => qos_class(spec),
    }
}

/// The pod's cgroup, relative to the node cgroup, as the kubelet names it
/// (`pkg/kubelet/cm/pod_container_manager_linux.go`, `cgroup_manager_linux.go`).
pub fn pod_cgroup(driver: CgroupDriver, qos: QosClass, uid: &str) -> PathBuf {
    match driver {
        CgroupDriver::Cgroupfs => {
            let mut p = PathBuf::from("kubepods");
            match qos {
                QosClass::Guaranteed => {}
                QosClass::Burstable => p.push("burstable"),
                QosClass::BestEffort => p.push("besteffort"),
            }
            p.push(format!("pod{uid}"));
            p
        }
        CgroupDriver::Systemd => {
            // systemd reserves '-' as the slice hierarchy separator: the UID's dashes become '_'.
            let uid = uid.replace('-', "_");
            let mut p = PathBuf::from("kubepods.slice");
            match qos {
                QosClass::Guaranteed => p.push(format!("kubepods-pod{uid}.slice")),
                QosClass::Burstable => {
                    p.push("kubepods-burstable.slice");
                    p.push(format!("kubepods-burstable-pod{uid}.slice"));
                }
                QosClass::BestEffort => {
                    p.push("kubepods-besteffort.slice");
                    p.push(format!("kubepods-besteffort-pod{uid}.slice"));
                }
            }
            p
        }
    }
}

/// The top `kubepods` cgroup for the driver.
pub fn kubepods_cgroup(driver: CgroupDriver) -> PathBuf {
    match driver {
        CgroupDriver::Cgroupfs => PathBuf::from("kubepods"),
        CgroupDriver::Systemd => PathBuf::from("kubepods.slice"),
    }
}

/// A container's cgroup directory name under its pod, as containerd names it.
pub fn container_cgroup(driver: CgroupDriver, id: &str) -> String {
    match driver {
        CgroupDriver::Cgroupfs => id.to_owned(),
        CgroupDriver::Systemd => format!("cri-containerd-{id}.scope"),
    }
}

/// The pod-level memory limit: the sum of the containers' limits (the largest init container's if
/// larger), only when every container declares one (`pkg/kubelet/cm/helpers_linux.go`,
/// `ResourceConfigForPod`).
pub fn pod_memory_limit(spec: &PodSpec) -> Option<u64> {
    let mut sum: u64 = 0;
    for c in &spec.containers {
        sum = sum.checked_add(memory_limit(c)?)?;
    }
    let mut init_max = 0;
    for c in spec.init_containers.iter().flatten() {
        init_max = init_max.max(memory_limit(c)?);
    }
    Some(sum.max(init_max))
}

/// `oom_score_adj` for a container (`pkg/kubelet/qos/policy.go`, `GetContainerOOMScoreAdjust`).
pub fn oom_score_adj(
    qos: QosClass,
    node_critical: bool,
    memory_request: u64,
    memory_capacity: u64,
) -> i32 {
    const GUARANTEED: i32 = -997;
    const BEST_EFFORT: i32 = 1000;
    if node_critical {
        return GUARANTEED;
    }
    match qos {
        QosClass::Guaranteed => GUARANTEED,
        QosClass::BestEffort => BEST_EFFORT,
        QosClass::Burstable => {
            let cap = i128::from(memory_capacity.max(1));
            let adj = 1000 - (1000 * i128::from(memory_request)) / cap;
            if adj < i128::from(1000 + GUARANTEED) {
                1000 + GUARANTEED
            } else if adj == i128::from(BEST_EFFORT) {
                BEST_EFFORT - 1
            } else {
                i32::try_from(adj).unwrap_or(BEST_EFFORT - 1)
            }
        }
    }
}

/// Whether `toleration` tolerates `taint` (`core/v1/toleration.go`, `ToleratesTaint`).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    fn nonempty(o: &Option<String>) -> Option<&str> {
        o.as_deref().filter(|s| !s.is_empty())
    }
    if let Some(e) = nonempty(&toleration.effect)
        && e != taint.effect
    {
        return false;
    }
    if let Some(k) = nonempty(&toleration.key)
        && k != taint.key
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// What the stand-in knows about its node when deciding whether to bind a pod to it.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub ready: bool,
    pub allocatable: Requests,
    pub max_pods: i128,
    /// Sum of the requests of the non-terminal pods already bound to the node.
    pub requested: Requests,
    pub pod_count: i128,
}

/// Why a pod does not fit the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    NotReady,
    Unschedulable,
    Taint(String),
    NodeSelector,
    NodeAffinity,
    Cpu,
    Memory,
    Pods,
}

/// The scheduler's filters the stand-in applies before binding (`pkg/scheduler/framework/plugins`:
/// NodeUnschedulable, TaintToleration, NodeAffinity with nodeSelector, NodeResourcesFit), plus the
/// node being Ready. Spreading, inter-pod affinity, ports and volumes are not considered.
pub fn fits(spec: &PodSpec, node: &NodeView) -> Result<(), Unfit> {
    if !node.ready {
        return Err(Unfit::NotReady);
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    if node.unschedulable {
        // The node.kubernetes.io/unschedulable:NoSchedule toleration lets a pod through
        // (DaemonSet pods carry it).
        let taint = Taint {
            key: "node.kubernetes.io/unschedulable".to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        };
        if !tolerations.iter().any(|t| tolerates(t, &taint)) {
            return Err(Unfit::Unschedulable);
        }
    }
    for taint in &node.taints {
        if (taint.effect == "NoSchedule" || taint.effect == "NoExecute")
            && !tolerations.iter().any(|t| tolerates(t, taint))
        {
            return Err(Unfit::Taint(taint.key.clone()));
        }
    }
    for (k, v) in spec.node_selector.iter().flatten() {
        if node.labels.get(k) != Some(v) {
            return Err(Unfit::NodeSelector);
        }
    }
    if let Some(terms) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| &r.node_selector_terms)
        && !terms.iter().any(|t| term_matches(t, node))
    {
        return Err(Unfit::NodeAffinity);
    }
    let want = pod_requests(spec);
    if node.requested.cpu_milli + want.cpu_milli > node.allocatable.cpu_milli {
        return Err(Unfit::Cpu);
    }
    if node.requested.memory + want.memory > node.allocatable.memory {
        return Err(Unfit::Memory);
    }
    if node.pod_count + 1 > node.max_pods {
        return Err(Unfit::Pods);
    }
    Ok(())
}

/// A node selector term: all its expressions (labels) and fields (`metadata.name`) must match
/// (`component-helpers/scheduling/corev1/nodeaffinity`).
fn term_matches(term: &NodeSelectorTerm, node: &NodeView) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches nothing.
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node.name.as_str())))
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (value.and_then(int), values.first().and_then(|s| int(s)))
            else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// Whether a container that exited with `exit_code` is started again (`pod.spec.restartPolicy`,
/// or the container's own for sidecars).
pub fn should_restart(restart_policy: &str, exit_code: i32) -> bool {
    match restart_policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// How long to wait before the `restart_count`-th restart (1-based): the first restart is
/// immediate, then `base`, doubling up to `max` — the kubelet's CrashLoopBackOff
/// (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`, `doBackOff`; 10 s, 5 min by default).
pub fn restart_delay(restart_count: u32, base: Duration, max: Duration) -> Duration {
    if restart_count <= 1 {
        return Duration::ZERO;
    }
    let shift = (restart_count - 2).min(20);
    base.saturating_mul(1u32 << shift).min(max)
}

/// A container as far as the pod phase is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerPhase {
    /// Never started yet (creating, or its command is missing).
    Waiting,
    Running,
    /// Exited, and will be started again after a back-off.
    Restarting,
    /// Exited for good with this code.
    Exited(i32),
}

/// The pod phase from its regular containers (`pkg/kubelet/kubelet_pods.go`, `getPhase`).
/// `init_failed`: an init container failed and will not be retried (restartPolicy Never).
pub fn pod_phase(
    restart_policy: &str,
    init_done: bool,
    init_failed: bool,
    containers: &[ContainerPhase],
) -> &'static str {
    if init_failed {
        return "Failed";
    }
    if !init_done {
        return "Pending";
    }
    let waiting = containers
        .iter()
        .filter(|c| **c == ContainerPhase::Waiting)
        .count();
    let running = containers
        .iter()
        .filter(|c| matches!(c, ContainerPhase::Running | ContainerPhase::Restarting))
        .count();
    let exited: Vec<i32> = containers
        .iter()
        .filter_map(|c| match c {
            ContainerPhase::Exited(code) => Some(*code),
            _ => None,
        })
        .collect();
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if exited.is_empty() {
        return "Pending";
    }
    if exited.iter().all(|c| *c == 0) {
        return "Succeeded";
    }
    match restart_policy {
        "Never" => "Failed",
        // The failed containers will run again.
        _ => "Running",
    }
}

/// The terminal phase of a pod whose deletion the stand-in completes: Succeeded when every
/// container exited 0, Failed otherwise (the kubelet moves deleted pods to a terminal phase since
/// Kubernetes 1.27, `kubelet_pods.go`, `generateAPIPodStatus`).
pub fn terminal_phase(exit_codes: &[i32]) -> &'static str {
    if !exit_codes.is_empty() && exit_codes.iter().all(|c| *c == 0) {
        "Succeeded"
    } else {
        "Failed"
    }
}

/// Expands `$(VAR)` references in a command or argument with the container's environment, as
/// the kubelet does (`third_party/forked/golang/expansion`): `$$` is a literal `$`, references to
/// undefined variables stay as written.
pub fn expand(input: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{Affinity, NodeAffinity, NodeSelector, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity,
    };
    use node_monitor_core::kubelet::layout::parse_cgroup_path;

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect()
            })
        };
        Container {
            name: "c".to_owned(),
            resources: Some(ResourceRequirements {
                requests: map(requests),
                limits: map(limits),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn spec(containers: Vec<Container>) -> PodSpec {
        PodSpec {
            containers,
            ..PodSpec::default()
        }
    }

    #[test]
    fn quantities() {
        let cases: &[(&str, Option<i128>)] = &[
            ("64Mi", Some(64 * 1024 * 1024 * 1000)),
            ("1Gi", Some((1 << 30) * 1000)),
            ("1.5Gi", Some((3 << 29) * 1000)),
            ("100m", Some(100)),
            ("2", Some(2000)),
            ("0.5", Some(500)),
            ("1k", Some(1_000_000)),
            ("1M", Some(1_000_000_000)),
            ("1e3", Some(1_000_000)),
            ("1E3", Some(1_000_000)),
            ("5E", Some(5_000_000_000_000_000_000_000)),
            ("1n", Some(1)), // rounded up to one milli-unit
            ("+3", Some(3000)),
            ("", None),
            ("Mi", None),
            ("-1", None),
            ("1.2.3", None),
            ("12Q", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_quantity_milli(s), *want, "{s:?}");
        }
        assert_eq!(parse_bytes("100M"), Some(100_000_000));
        assert_eq!(parse_bytes("1.5"), Some(2));
    }

    #[test]
    fn qos_classes() {
        let cases = [
            (spec(vec![container(&[], &[])]), QosClass::BestEffort),
            (
                spec(vec![container(&[], &[("cpu", "1"), ("memory", "1Gi")])]),
                QosClass::Guaranteed,
            ),
            (
                spec(vec![container(
                    &[("cpu", "1"), ("memory", "1Gi")],
                    &[("cpu", "1"), ("memory", "1Gi")],
                )]),
                QosClass::Guaranteed,
            ),
            (
                spec(vec![container(&[("memory", "64Mi")], &[])]),
                QosClass::Burstable,
            ),
            (
                spec(vec![container(&[], &[("memory", "64Mi")])]),
                QosClass::Burstable,
            ),
            (
                spec(vec![
                    container(&[], &[("cpu", "1"), ("memory", "1Gi")]),
                    container(&[], &[]),
                ]),
                QosClass::Burstable,
            ),
        ];
        for (s, want) in cases {
            assert_eq!(qos_class(&s), want, "{s:?}");
        }
        assert_eq!(
            qos_from_status(Some("Guaranteed"), &spec(vec![])),
            QosClass::Guaranteed
        );
    }

    #[test]
    fn cgroup_paths_parse_back_with_the_agents_parser() {
        let uid = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
        let id = "ab".repeat(32);
        for driver in [CgroupDriver::Cgroupfs, CgroupDriver::Systemd] {
            for qos in [
                QosClass::Guaranteed,
                QosClass::Burstable,
                QosClass::BestEffort,
            ] {
                let p = PathBuf::from("node-monitor-test/n1")
                    .join(pod_cgroup(driver, qos, uid))
                    .join(container_cgroup(driver, &id));
                let parsed = parse_cgroup_path(&p.to_string_lossy())
                    .unwrap_or_else(|| panic!("{} does not parse", p.display()));
                assert_eq!(parsed.pod_uid, uid);
                assert_eq!(parsed.qos, qos);
                assert_eq!(parsed.driver, driver);
                assert_eq!(parsed.container_id.as_deref(), Some(id.as_str()));
            }
        }
        assert_eq!(
            pod_cgroup(CgroupDriver::Cgroupfs, QosClass::Burstable, uid),
            PathBuf::from(format!("kubepods/burstable/pod{uid}"))
        );
        assert_eq!(
            pod_cgroup(CgroupDriver::Cgroupfs, QosClass::Guaranteed, uid),
            PathBuf::from(format!("kubepods/pod{uid}"))
        );
    }

    #[test]
    fn pod_memory_limit_needs_every_container_limited() {
        let limited = spec(vec![
            container(&[], &[("memory", "64Mi")]),
            container(&[], &[("memory", "32Mi")]),
        ]);
        assert_eq!(pod_memory_limit(&limited), Some(96 << 20));
        let mut with_init = limited.clone();
        with_init.init_containers = Some(vec![container(&[], &[("memory", "1Gi")])]);
        assert_eq!(pod_memory_limit(&with_init), Some(1 << 30));
        let partly = spec(vec![
            container(&[], &[("memory", "64Mi")]),
            container(&[], &[]),
        ]);
        assert_eq!(pod_memory_limit(&partly), None);
    }

    #[test]
    fn oom_score_adj_follows_the_kubelet() {
        let gi = 1u64 << 30;
        let cases = [
            (QosClass::Guaranteed, false, gi, 4 * gi, -997),
            (QosClass::BestEffort, false, 0, 4 * gi, 1000),
            (QosClass::Burstable, false, gi, 4 * gi, 750),
            (QosClass::Burstable, false, 0, 4 * gi, 999),
            (QosClass::Burstable, false, 4 * gi, 4 * gi, 3),
            (QosClass::Burstable, false, 8 * gi, 4 * gi, 3),
            (QosClass::BestEffort, true, 0, 4 * gi, -997),
        ];
        for (qos, critical, req, cap, want) in cases {
            assert_eq!(
                oom_score_adj(qos, critical, req, cap),
                want,
                "{qos} {req} {cap}"
            );
        }
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            ..Taint::default()
        }
    }

    fn toleration(
        key: Option<&str>,
        op: &str,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> Toleration {
        Toleration {
            key: key.map(str::to_owned),
            operator: Some(op.to_owned()),
            value: value.map(str::to_owned),
            effect: effect.map(str::to_owned),
            ..Toleration::default()
        }
    }

    #[test]
    fn tolerations() {
        let t = taint("k", Some("v"), "NoSchedule");
        let cases = [
            (toleration(Some("k"), "Equal", Some("v"), None), true),
            (toleration(Some("k"), "Equal", Some("w"), None), false),
            (
                toleration(Some("k"), "Exists", None, Some("NoSchedule")),
                true,
            ),
            (
                toleration(Some("k"), "Exists", None, Some("NoExecute")),
                false,
            ),
            (toleration(None, "Exists", None, None), true),
            (toleration(Some("other"), "Exists", None, None), false),
        ];
        for (tol, want) in cases {
            assert_eq!(tolerates(&tol, &t), want, "{tol:?}");
        }
    }

    fn node() -> NodeView {
        NodeView {
            name: "n1".to_owned(),
            labels: [("zone".to_owned(), "a".to_owned())].into(),
            ready: true,
            allocatable: Requests {
                cpu_milli: 2000,
                memory: 1 << 30,
            },
            max_pods: 10,
            ..NodeView::default()
        }
    }

    #[test]
    fn fit() {
        let small = spec(vec![container(
            &[("memory", "256Mi"), ("cpu", "500m")],
            &[],
        )]);
        assert_eq!(fits(&small, &node()), Ok(()));

        let mut n = node();
        n.ready = false;
        assert_eq!(fits(&small, &n), Err(Unfit::NotReady));

        let mut n = node();
        n.unschedulable = true;
        assert_eq!(fits(&small, &n), Err(Unfit::Unschedulable));
        let mut tolerant = small.clone();
        tolerant.tolerations = Some(vec![toleration(
            Some("node.kubernetes.io/unschedulable"),
            "Exists",
            None,
            Some("NoSchedule"),
        )]);
        assert_eq!(fits(&tolerant, &n), Ok(()));

        let mut n = node();
        n.taints = vec![taint("node.kubernetes.io/not-ready", None, "NoSchedule")];
        assert_eq!(
            fits(&small, &n),
            Err(Unfit::Taint("node.kubernetes.io/not-ready".to_owned()))
        );
        n.taints = vec![taint("soft", None, "PreferNoSchedule")];
        assert_eq!(fits(&small, &n), Ok(()));

        let mut sel = small.clone();
        sel.node_selector = Some([("zone".to_owned(), "b".to_owned())].into());
        assert_eq!(fits(&sel, &node()), Err(Unfit::NodeSelector));
        sel.node_selector = Some([("zone".to_owned(), "a".to_owned())].into());
        assert_eq!(fits(&sel, &node()), Ok(()));

        // DaemonSet pods pin themselves with matchFields metadata.name.
        let mut ds = small.clone();
        let pin = |name: &str| Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".to_owned(),
                            operator: "In".to_owned(),
                            values: Some(vec![name.to_owned()]),
                        }]),
                        ..NodeSelectorTerm::default()
                    }],
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        };
        ds.affinity = Some(pin("n2"));
        assert_eq!(fits(&ds, &node()), Err(Unfit::NodeAffinity));
        ds.affinity = Some(pin("n1"));
        assert_eq!(fits(&ds, &node()), Ok(()));

        let mut n = node();
        n.requested.memory = 900 << 20;
        assert_eq!(fits(&small, &n), Err(Unfit::Memory));
        let mut n = node();
        n.requested.cpu_milli = 1600;
        assert_eq!(fits(&small, &n), Err(Unfit::Cpu));
        let mut n = node();
        n.pod_count = 10;
        assert_eq!(fits(&small, &n), Err(Unfit::Pods));
    }

    #[test]
    fn requests_take_the_largest_init_container() {
        let mut s = spec(vec![
            container(&[("memory", "100Mi")], &[]),
            container(&[("memory", "50Mi"), ("cpu", "100m")], &[]),
        ]);
        assert_eq!(
            pod_requests(&s),
            Requests {
                cpu_milli: 100,
                memory: 150 << 20
            }
        );
        s.init_containers = Some(vec![container(&[("memory", "1Gi")], &[])]);
        assert_eq!(pod_requests(&s).memory, 1 << 30);
    }

    #[test]
    fn restarts() {
        assert!(should_restart("Always", 0));
        assert!(should_restart("OnFailure", 137));
        assert!(!should_restart("OnFailure", 0));
        assert!(!should_restart("Never", 1));
        let (b, m) = (Duration::from_secs(10), Duration::from_secs(300));
        let delays: Vec<u64> = (1..=8).map(|n| restart_delay(n, b, m).as_secs()).collect();
        assert_eq!(delays, [0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn phases() {
        use ContainerPhase::*;
        let cases: &[(&str, bool, bool, &[ContainerPhase], &str)] = &[
            ("Always", false, false, &[Waiting], "Pending"),
            ("Never", true, true, &[Waiting], "Failed"),
            ("Always", true, false, &[Waiting, Running], "Pending"),
            ("Always", true, false, &[Running, Running], "Running"),
            ("Always", true, false, &[Restarting], "Running"),
            ("Never", true, false, &[Exited(0), Exited(0)], "Succeeded"),
            ("Never", true, false, &[Exited(0), Exited(1)], "Failed"),
            ("OnFailure", true, false, &[Exited(0), Exited(1)], "Running"),
            ("Never", true, false, &[Running, Exited(1)], "Running"),
        ];
        for (policy, init_done, init_failed, cs, want) in cases {
            assert_eq!(
                pod_phase(policy, *init_done, *init_failed, cs),
                *want,
                "{policy} {cs:?}"
            );
        }
        assert_eq!(terminal_phase(&[0, 0]), "Succeeded");
        assert_eq!(terminal_phase(&[0, 137]), "Failed");
        assert_eq!(terminal_phase(&[]), "Failed");
    }

    #[test]
    fn expansion() {
        let env: BTreeMap<String, String> = [
            ("A".to_owned(), "1".to_owned()),
            ("B".to_owned(), "x y".to_owned()),
        ]
        .into();
        let cases = [
            ("$(A)", "1"),
            ("pre-$(A)-$(B)", "pre-1-x y"),
            ("$$(A)", "$(A)"),
            ("$(C)", "$(C)"),
            ("cost $5", "cost $5"),
            ("$(A", "$(A"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &env), want, "{input}");
        }
    }
}
