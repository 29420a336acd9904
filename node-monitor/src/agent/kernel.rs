//! Kernel events in the run loop: each event wakes the sampler at once, is counted by kind,
//! attributed to its pod (OOM kills keep their namespace/pod in a bounded metric), logged, and
//! reboot requests are handed to the shutdown manager. Malformed records are counted and skipped.
use std::{sync::Arc, time::Duration};

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::{
    attribution::{Attribution, Attributor, CgroupPaths, PodDirectory, PodRef},
    cluster::oom_events::{NodeKill, OomEvents, OomKill, OomNotice, tells_the_node},
    ebpf::{KernelEvent, ProbeConfig, Probes},
    http::Health,
    live::LiveView,
    metrics::{KindLabels, Metrics},
    wakeup::{KernelSender, KernelWakeKind},
};

/// A reboot, power-off, halt or kexec request the kernel probe saw (the shutdown manager's type).
pub use crate::shutdown::RebootSeen;

/// How often the in-kernel drop counters are mirrored into the metrics.
const COUNTER_PERIOD: Duration = Duration::from_secs(5);

/// Loads the probes (never fatal: failures degrade the agent with a warning and a metric) and
/// spawns the task that consumes their events. Returns the probes so they stay attached.
#[expect(
    clippy::too_many_arguments,
    reason = "the start-up wiring: each argument is one of the agent's shared parts"
)]
pub async fn start(
    config: ProbeConfig,
    pods: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    wake: KernelSender,
    live: Arc<LiveView>,
    reboots: mpsc::Sender<RebootSeen>,
    oom_events: Option<OomEvents>,
    fast_gasp: Option<crate::shutdown::gasp::FastStart>,
    stop: watch::Receiver<bool>,
) -> Option<Probes> {
    let mut probes = match tokio::task::spawn_blocking(move || Probes::load(&config)).await {
        Ok(p) => p,
        Err(e) => {
            warn!(error = %e, "loading the eBPF programs panicked; running without them");
            health.report_degraded("eBPF programs not loaded");
            metrics.degraded.set(1);
            return None;
        }
    };
    for s in probes.program_states() {
        metrics.kernel.set_program_state(s.name, s.state.label());
        if s.state.label() == "failed" && probes.fallback_attached(s.name).is_none() {
            warn!(program = s.name, state = ?s.state, "eBPF program unavailable; the agent continues without it");
            health.report_degraded(format!("eBPF program {} failed", s.name));
            metrics.degraded.set(1);
        }
    }
    info!(attached = probes.attached(), "eBPF programs ready");
    let events = match probes.events() {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %e, "no kernel event stream; running on cgroup notifications and the tick");
            health.report_degraded("kernel event stream unavailable");
            metrics.degraded.set(1);
            return Some(probes);
        }
    };
    // The memory push's wake records have a ring buffer of their own: a wake-up is all they mean.
    if probes.mem_push().is_some() {
        match probes.mem_push_wakes() {
            Ok(wakes) => {
                tokio::spawn(memory_growth_wakes(wakes, wake.clone(), stop.clone()));
            }
            Err(e) => {
                warn!(error = %e, "no memory push wake-ups; the agent samples near thresholds instead");
            }
        }
    }
    // The last gasp's fast path reads its own ring buffer on a thread of its own.
    if let Some(fast) = fast_gasp {
        match probes.gasp_ring() {
            Ok(ring) => {
                if let Err(e) = fast.start(ring, stop.clone()) {
                    warn!(error = %e, "no last gasp fast path thread; the shutdown manager sends it alone");
                }
            }
            Err(e) => {
                warn!(error = %e, "no last gasp ring buffer; the shutdown manager sends it alone");
            }
        }
    }
    let attributor = match CgroupPaths::detect() {
        Ok(mut paths) => {
            if let Err(e) = paths.watch() {
                warn!(error = %e, "not watching cgroup creation: short-lived containers may go unattributed");
            }
            Some(Attributor::new(paths, Box::new(StorePods(pods.clone()))))
        }
        Err(e) => {
            warn!(error = %e, "no cgroup2 hierarchy for attributing kernel events to pods");
            None
        }
    };
    let sinks = Sinks {
        pods: pods.clone(),
        metrics,
        live,
        wake,
        reboots,
        oom_events,
    };
    tokio::spawn(consume(events, attributor, sinks, stop));
    Some(probes)
}

/// Wakes the sampler for each batch of memory push records (the same path as a memcg threshold
/// event on cgroup v1: a fresh read of memory, and the decision on it).
async fn memory_growth_wakes(
    mut wakes: crate::ebpf::MemPushWakes,
    wake: KernelSender,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let records = tokio::select! {
            r = wakes.next() => r,
            _ = stop.changed() => return,
        };
        match records {
            Ok(records) => {
                wake.wake(KernelWakeKind::MemoryGrowth);
                if let Some(last) = records.last() {
                    tracing::debug!(
                        records = records.len(),
                        net_pages = last.net_pages,
                        batch_pages = last.batch_pages,
                        cpu = last.cpu,
                        suppressed = last.suppressed,
                        "memory push"
                    );
                }
            }
            Err(e) => {
                warn!(error = %e, "memory push ring buffer unreadable; the agent samples near thresholds instead");
                return;
            }
        }
    }
}

/// Where the kernel events go.
struct Sinks {
    /// This node's pods, for the container names of the trace buffer's events.
    pods: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    metrics: Arc<Metrics>,
    /// The node API's trace buffer.
    live: Arc<LiveView>,
    wake: KernelSender,
    reboots: mpsc::Sender<RebootSeen>,
    /// The `OOMKilling` Event writer ([`crate::cluster::oom_events`]).
    oom_events: Option<OomEvents>,
}

async fn consume(
    mut events: crate::ebpf::EventStream,
    mut attributor: Option<Attributor>,
    sinks: Sinks,
    mut stop: watch::Receiver<bool>,
) {
    let Sinks {
        pods,
        metrics,
        live,
        wake,
        reboots,
        oom_events,
    } = sinks;
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev,
            _ = stop.changed() => return,
        };
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) if e.is_fatal() => {
                warn!(error = %e, "kernel event stream ended");
                return;
            }
            Err(e) => {
                metrics.kernel.event_errors.inc();
                warn!(error = %e, "malformed kernel event skipped");
                continue;
            }
        };
        let kind = match &ev {
            KernelEvent::OomKill(_) => KernelWakeKind::OomKill,
            KernelEvent::ReclaimStall(_) => KernelWakeKind::ReclaimStall,
            KernelEvent::KswapdWake(_) => KernelWakeKind::KswapdWake,
            KernelEvent::Reboot(_) => KernelWakeKind::Reboot,
            KernelEvent::Synthetic(_) => continue,
        };
        // Wake first: everything below is bookkeeping. A reboot goes to the shutdown manager
        // just as early: its last gasp races the kernel's restart path.
        wake.wake(kind);
        if let KernelEvent::Reboot(r) = &ev
            && reboots.try_send(RebootSeen::from(r)).is_err()
        {
            warn!("shutdown manager not listening for reboot events");
        }
        metrics
            .kernel
            .events
            .get_or_create(&KindLabels {
                kind: ev.kind().to_owned(),
            })
            .inc();
        let attribution = match attributor.as_mut() {
            Some(a) => Some(a.attribute(ev.cgroup_id()).await),
            None => None,
        };
        record_trace_event(&live, &pods, &ev, attribution.as_ref());
        if let Some(e) =
            crate::flight::kernel_event(&ev, attribution.as_ref(), crate::live::unix_ms())
        {
            live.flight_event(e);
        }
        let pod_uid = attribution
            .as_ref()
            .and_then(|a| a.pod.as_ref())
            .map(|p| p.pod_uid.clone());
        let path = attribution.as_ref().and_then(|a| a.cgroup_path.clone());
        match &ev {
            KernelEvent::OomKill(o) => {
                let global = o.global().unwrap_or(false);
                let pod_ref = attribution.as_ref().and_then(|a| a.pod_ref.clone());
                let labels = match (&pod_ref, &pod_uid) {
                    (Some(r), _) => Some((r.namespace.clone(), r.name.clone())),
                    (None, Some(uid)) => Some((String::new(), uid.clone())),
                    (None, None) => None,
                };
                metrics.kernel.record_oom_kill(
                    global,
                    labels.as_ref().map(|(n, p)| (n.as_str(), p.as_str())),
                );
                warn!(
                    kind = "oom_kill",
                    global,
                    pid = o.victim_pid,
                    comm = o.victim_comm.as_deref().unwrap_or(""),
                    pod_uid = pod_uid.as_deref().unwrap_or(""),
                    cgroup = path.as_deref().unwrap_or(""),
                    rss_bytes = o.memory.as_ref().map(|m| m.rss_bytes()),
                    "kernel event: OOM kill"
                );
                if let Some(tx) = &oom_events {
                    notify_oom(tx, o, attribution.as_ref(), &pods, &metrics);
                }
            }
            KernelEvent::Reboot(r) => {
                warn!(kind = "reboot", cmd = r.cmd.as_str(), pid = r.task.pid, comm = %r.task.comm, "kernel event: reboot requested");
            }
            other => info!(
                kind = other.kind(),
                pod_uid = pod_uid.as_deref().unwrap_or(""),
                cgroup = path.as_deref().unwrap_or(""),
                "kernel event"
            ),
        }
    }
}

/// Hands an OOM kill to the Event writer: to its pod (from this node's own cache) when it is
/// attributed to one of this node's pods, and to the Node when it is node-level or its victim is
/// in no pod ([`tells_the_node`]). A kill attributed to a pod this node does not list gets no pod
/// Event.
fn notify_oom(
    sink: &OomEvents,
    o: &crate::ebpf::OomKillEvent,
    attribution: Option<&Attribution>,
    pods: &kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    metrics: &Metrics,
) {
    let send = |notice| {
        if sink.tx.try_send(notice).is_err() {
            metrics.record_event_dropped(crate::cluster::oom_events::REASON);
        }
    };
    let in_pod = attribution.and_then(|a| a.pod.as_ref());
    if tells_the_node(o.global(), in_pod.is_some()) {
        send(OomNotice::Node {
            kill: NodeKill {
                victim_pid: o.victim_pid,
                victim_comm: o.victim_comm.clone(),
                global: o.global(),
                memory: o.memory,
                uid: o.uid,
                oom_score_adj: o.oom_score_adj,
                cgroup: attribution.and_then(|a| a.cgroup_path.clone()),
            },
            node: sink.node.clone(),
        });
    }
    let Some(cg) = in_pod else {
        return;
    };
    let Some(pod) = pods
        .state()
        .iter()
        .find(|p| p.metadata.uid.as_deref() == Some(cg.pod_uid.as_str()))
        .map(|p| (**p).clone())
    else {
        return;
    };
    send(OomNotice::Pod {
        kill: OomKill {
            victim_pid: o.victim_pid,
            victim_comm: o.victim_comm.clone(),
            global: o.global(),
            memory: o.memory,
            pod_uid: cg.pod_uid.clone(),
            container_id: cg.container_id.clone(),
        },
        pod: Box::new(pod),
    });
}

/// An event as the node API's trace buffer keeps it: `node-monitor trace`'s JSON object, with the
/// container's name when this node's pods know its id.
fn buffered_event(
    ev: &KernelEvent,
    attribution: Option<&Attribution>,
    pods: &kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
) -> serde_json::Value {
    let unknown = Attribution {
        cgroup_id: ev.cgroup_id(),
        cgroup_path: None,
        pod: None,
        pod_ref: None,
    };
    let mut event = crate::trace::event_json(ev, attribution.unwrap_or(&unknown), None);
    let name = attribution
        .and_then(|a| a.pod.as_ref())
        .and_then(|p| container_name_in(pods, &p.pod_uid, p.container_id.as_deref()?));
    if let serde_json::Value::Object(m) = &mut event {
        m.insert("container_name".into(), serde_json::json!(name));
    }
    event
}

/// The name of container `id` of pod `uid`, as this node's pods know it.
fn container_name_in(
    pods: &kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    uid: &str,
    id: &str,
) -> Option<String> {
    pods.state()
        .iter()
        .find(|pod| pod.metadata.uid.as_deref() == Some(uid))
        .and_then(|pod| node_monitor_core::kubelet::pod::container_name(pod, id))
}

/// How long an event in a known pod's container that the pods do not name yet waits for the
/// pod's status: a container killed as it starts is in the kernel's event before its ID is in
/// the pod's status, as the agent's watch receives it.
const NAME_WAIT: Duration = Duration::from_secs(2);

/// Records the event in the trace buffer ([`buffered_event`]); one in a known container the pods do not name yet is
/// recorded by a task of its own once they do, or at [`NAME_WAIT`] without the name, so the
/// kernel events behind it wait for nothing.
fn record_trace_event(
    live: &Arc<LiveView>,
    pods: &kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    ev: &KernelEvent,
    attribution: Option<&Attribution>,
) {
    let event = buffered_event(ev, attribution, pods);
    let unnamed = event
        .get("container_name")
        .is_some_and(serde_json::Value::is_null);
    let ids = (event["pod_uid"].as_str(), event["container_id"].as_str());
    let (true, (Some(uid), Some(id))) = (unnamed, ids) else {
        live.record_event(event);
        return;
    };
    let (uid, id) = (uid.to_owned(), id.to_owned());
    let (live, pods) = (live.clone(), pods.clone());
    tokio::spawn(async move {
        let mut event = event;
        let deadline = tokio::time::Instant::now() + NAME_WAIT;
        loop {
            if let Some(name) = container_name_in(&pods, &uid, &id) {
                event["container_name"] = serde_json::json!(name);
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        live.record_event(event);
    });
}

/// Namespace and name from the agent's own reflector of this node's pods: no extra API calls.
struct StorePods(kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>);

impl PodDirectory for StorePods {
    fn lookup<'a>(
        &'a mut self,
        pod_uid: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<PodRef>> {
        let found = self
            .0
            .state()
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(pod_uid))
            .map(|p| PodRef {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
            });
        Box::pin(async move { found })
    }
}

/// Mirrors the kernel's drop counters into the metrics until `stop`.
pub async fn mirror_counters(
    probes: Arc<Probes>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(COUNTER_PERIOD);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        match probes.counters() {
            Ok(c) => {
                metrics.kernel.observe_ringbuf_drops(c.total_drops());
                if let Some(push) = probes.mem_push() {
                    observe_memory_push(&metrics, &c, &push.switch().state());
                }
            }
            Err(e) => warn!(error = %e, "reading the in-kernel counters failed"),
        }
    }
}

/// The memory push's records and attachment into the metrics; its programs' state follows the
/// attachment (`attached` near a memory threshold, `loaded` otherwise).
fn observe_memory_push(
    metrics: &Metrics,
    c: &crate::ebpf::Counters,
    s: &crate::ebpf::PushAttachment,
) {
    metrics.kernel.observe_memory_push(
        [
            ("sent", c.mem_push_wakes),
            ("withheld", c.mem_push_suppressed),
            ("dropped", c.mem_push_drops),
        ],
        [
            ("attached", s.attaches),
            ("detached", s.detaches),
            ("failed", s.failures),
        ],
        s.attached,
    );
    let state = if s.attached { "attached" } else { "loaded" };
    for program in [
        node_monitor_common::names::prog::MEM_PUSH_ALLOC,
        node_monitor_common::names::prog::MEM_PUSH_FREE,
    ] {
        metrics.kernel.set_program_state(program, state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oom(cgroup_id: u64) -> crate::ebpf::OomKillEvent {
        crate::ebpf::OomKillEvent {
            ts_ns: 0,
            trigger: crate::ebpf::TaskInfo {
                pid: 7,
                tid: 7,
                comm: "hog".to_owned(),
                cgroup_id,
            },
            victim_pid: 7,
            victim_tid: 7,
            victim_comm: Some("hog".to_owned()),
            victim_cgroup_id: Some(cgroup_id),
            memory: None,
            uid: None,
            oom_score_adj: None,
            scope: node_monitor_common::logic::OomScope::Memcg,
            trigger_reclaim: None,
        }
    }

    fn attributed(pod_uid: &str) -> Attribution {
        let path = format!("/kubepods/burstable/pod{pod_uid}/abc");
        Attribution {
            cgroup_id: 1,
            pod: node_monitor_core::kubelet::layout::parse_cgroup_path(&path),
            cgroup_path: Some(path),
            pod_ref: None,
        }
    }

    /// A kill in a container the pods do not name yet (killed as it starts) is recorded once
    /// the pod's status names it; one never named is recorded at the wait's end, unnamed.
    #[tokio::test(start_paused = true)]
    async fn a_trace_event_waits_for_its_containers_name() {
        let uid = "0f8e1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b";
        let pod = |statuses: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web-0", "namespace": "apps", "uid": uid},
                "spec": {"nodeName": "n1", "containers": [{"name": "app"}]},
                "status": {"containerStatuses": statuses},
            }))
            .expect("pod")
        };
        let (reader, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod(
            serde_json::json!([]),
        )));
        let live = Arc::new(LiveView::new("n1"));
        let ev = KernelEvent::OomKill(oom(1));
        let first = attributed(uid);
        assert_eq!(
            buffered_event(&ev, Some(&first), &reader)["container_name"],
            serde_json::Value::Null
        );
        record_trace_event(&live, &reader, &ev, Some(&first));
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(
            live.trace_answer(0, 10).events.is_empty(),
            "held until the pod names its container"
        );
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod(
            serde_json::json!([{
                "name": "app", "containerID": "containerd://abc", "image": "i", "imageID": "",
                "ready": true, "restartCount": 0,
            }]),
        )));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let events = live.trace_answer(0, 10).events;
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0]["container_name"], "app");

        // A container the pods never name: recorded at the wait's end, unnamed.
        let never = attributed("11111111-2222-3333-4444-555555555555");
        record_trace_event(&live, &reader, &ev, Some(&never));
        tokio::time::sleep(NAME_WAIT + Duration::from_millis(100)).await;
        let events = live.trace_answer(0, 10).events;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[1]["container_name"], serde_json::Value::Null);
    }

    /// A memcg kill gets a pod `OOMKilling` notice only when its pod is in the agent's own cache
    /// (this node's pods), with that cached pod; a victim in no pod, or with no cgroup known,
    /// gets a Node notice; a node-level kill gets a Node notice, and the pod's too.
    #[test]
    fn pods_of_this_nodes_cache_and_the_node_get_oom_events() {
        let uid = "0f8e1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b";
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "apps", "uid": uid},
            "spec": {"nodeName": "n1", "containers": [{"name": "app"}]},
        }))
        .expect("pod");
        let (reader, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod));
        let metrics = Metrics::new();
        let (tx, mut rx) = mpsc::channel(8);
        let sink = OomEvents {
            tx,
            node: "n1".to_owned(),
        };
        let mut next = || rx.try_recv().ok();

        let elsewhere = attributed("11111111-2222-3333-4444-555555555555");
        assert!(elsewhere.pod.is_some(), "a pod cgroup path");
        notify_oom(&sink, &oom(1), Some(&elsewhere), &reader, &metrics);
        assert!(next().is_none(), "no notice for a pod not in the cache");

        for attribution in [
            None,
            Some(Attribution {
                cgroup_id: 1,
                cgroup_path: Some("/system.slice/sshd.service".to_owned()),
                pod: None,
                pod_ref: None,
            }),
        ] {
            notify_oom(&sink, &oom(1), attribution.as_ref(), &reader, &metrics);
            match next() {
                Some(OomNotice::Node { kill, node }) => {
                    assert_eq!(node, "n1");
                    assert_eq!(kill.victim_comm.as_deref(), Some("hog"));
                    assert_eq!(
                        kill.cgroup,
                        attribution.as_ref().and_then(|a| a.cgroup_path.clone())
                    );
                }
                other => panic!("a Node notice for a victim in no pod: {other:?}"),
            }
            assert!(next().is_none());
        }

        notify_oom(&sink, &oom(1), Some(&attributed(uid)), &reader, &metrics);
        let Some(OomNotice::Pod { kill, pod }) = next() else {
            panic!("a pod notice for this node's pod")
        };
        assert_eq!(kill.pod_uid, uid);
        assert_eq!(kill.container_id.as_deref(), Some("abc"));
        assert_eq!(kill.global, Some(false));
        assert_eq!(pod.metadata.name.as_deref(), Some("web-0"));
        assert!(next().is_none(), "a memcg kill in a pod: no Node notice");

        let mut global = oom(1);
        global.scope = node_monitor_common::logic::OomScope::Global;
        notify_oom(&sink, &global, Some(&attributed(uid)), &reader, &metrics);
        assert!(
            matches!(next(), Some(OomNotice::Node { .. })),
            "node-level: the Node's"
        );
        assert!(
            matches!(next(), Some(OomNotice::Pod { .. })),
            "and the pod's"
        );
    }
}
