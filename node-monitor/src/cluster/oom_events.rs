//! `OOMKilling` Events: one Warning Event on the pod for each kernel OOM kill the agent
//! attributes to one of this node's pods, in node-problem-detector's reason and the kernel's
//! wording. Repeats for the same pod, container and reason within [`SERIES_WINDOW`] bump the
//! first Event's `count` and `lastTimestamp` (core/v1 aggregation, as the kubelet's recorder
//! does) instead of creating new objects; a node-wide token bucket bounds the API writes.
//!
//! The decisions are pure: [`oom_event`] (an attributed kill and the pod from the agent's own
//! cache → what to write) and [`OomSeries::observe`] (a key and `now` → create, patch or drop).
//! [`run`] only carries them out.
use std::{collections::HashMap, sync::Arc, time::Duration};

use k8s_openapi::{
    api::core::v1::{Event, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::events::{EventRecord, Reporter, event_object, pod_ref};
use crate::{ebpf::OomMemory, metrics::Metrics};

pub mod node;

pub use self::node::{NodeKill, NodeOomEvent, node_oom_event, tells_the_node};

/// node-problem-detector's reason for a kernel OOM kill.
pub const REASON: &str = "OOMKilling";
/// Repeats within this window after the latest occurrence join the existing Event.
pub const SERIES_WINDOW: Duration = Duration::from_secs(600);
/// At most this many pod+container series are remembered (the least recently seen go first).
pub const SERIES_MAX: usize = 256;
/// Burst of Event writes (creates and patches) the node may make at once…
pub const RATE_BURST: u32 = 10;
/// …refilled at this many per minute.
pub const RATE_PER_MINUTE: u32 = 10;

/// A kernel OOM kill, attributed to a pod's cgroup (the parts the Event needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    pub victim_pid: u32,
    pub victim_comm: Option<String>,
    /// `Some(true)` node-level, `Some(false)` a memory cgroup's limit, `None` unknown.
    pub global: Option<bool>,
    pub memory: Option<OomMemory>,
    /// The pod UID the cgroup path names.
    pub pod_uid: String,
    /// The container id the cgroup path names, when it reaches into a container.
    pub container_id: Option<String>,
}

/// What to write about one OOM kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomEvent {
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    /// The container's name, when the kill is attributed to one.
    pub container: Option<String>,
    pub message: String,
}

impl OomEvent {
    /// The aggregation key: pod, container, reason.
    pub fn key(&self) -> SeriesKey {
        SeriesKey {
            namespace: self.namespace.clone(),
            pod_uid: self.pod_uid.clone(),
            container: self.container.clone().unwrap_or_default(),
            reason: REASON,
        }
    }

    /// The Event record: the pod (with its uid) as the involved object, `spec.containers{name}`
    /// as its field path when the container is known.
    pub fn record(&self) -> EventRecord {
        let mut involved = pod_ref(&self.namespace, &self.pod_name, &self.pod_uid);
        involved.field_path = self
            .container
            .as_ref()
            .map(|c| format!("spec.containers{{{c}}}"));
        EventRecord {
            namespace: self.namespace.clone(),
            involved,
            warning: true,
            reason: REASON.to_owned(),
            message: self.message.clone(),
            annotations: std::collections::BTreeMap::new(),
        }
    }
}

/// The Event for `kill` on `pod` (a pod of the agent's own cache: this node's), or `None` when
/// the pod is not the one the kill names.
pub fn oom_event(kill: &OomKill, pod: &Pod) -> Option<OomEvent> {
    if pod.metadata.uid.as_deref() != Some(kill.pod_uid.as_str()) {
        return None;
    }
    let namespace = pod.metadata.namespace.clone()?;
    let pod_name = pod.metadata.name.clone()?;
    let container = kill
        .container_id
        .as_deref()
        .and_then(|id| container_of(pod, id));
    let limit = match (kill.global, &container) {
        (Some(false), Some(c)) => memory_limit(pod, c),
        _ => None,
    };
    let scope = if kill.global == Some(false) {
        "Memory cgroup out of memory"
    } else {
        "Out of memory"
    };
    let rss = kill.memory.map_or_else(
        || "unknown".to_owned(),
        |m| {
            format!(
                "{} (anon {}, file {}, shmem {})",
                bytes(m.rss_bytes()),
                bytes(m.anon_rss_bytes),
                bytes(m.file_rss_bytes),
                bytes(m.shmem_rss_bytes)
            )
        },
    );
    let message = format!(
        "{scope}: Killed process {} ({}) in container {}: limit {}, RSS {rss}",
        kill.victim_pid,
        kill.victim_comm.as_deref().unwrap_or("?"),
        container.as_deref().unwrap_or("<unknown>"),
        limit.as_deref().unwrap_or("node"),
    );
    Some(OomEvent {
        namespace,
        pod_name,
        pod_uid: kill.pod_uid.clone(),
        container,
        message,
    })
}

/// The container whose runtime id is `id`; else, for a pod with a single container and no init
/// containers, that one (a container killed at start can die before its status names its id).
fn container_of(pod: &Pod, id: &str) -> Option<String> {
    if let Some(name) = node_monitor_core::kubelet::pod::container_name(pod, id) {
        return Some(name);
    }
    let spec = pod.spec.as_ref()?;
    let no_init = spec.init_containers.as_ref().is_none_or(Vec::is_empty)
        && spec.ephemeral_containers.as_ref().is_none_or(Vec::is_empty);
    match spec.containers.as_slice() {
        [only] if no_init && !id.is_empty() => Some(only.name.clone()),
        _ => None,
    }
}

/// The container's memory limit as its spec writes it.
fn memory_limit(pod: &Pod, container: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == container)?
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("memory")
        .map(|q| q.0.clone())
}

/// Bytes in binary units, one decimal above KiB.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["Ki", "Mi", "Gi", "Ti"];
    if n < 1024 {
        return format!("{n}B");
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "a figure for people, one decimal"
    )]
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1}{unit}")
}

/// What aggregates: the same pod, container and reason.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SeriesKey {
    /// The pod's namespace: the tenant whose share of the node's budget the series spends.
    pub namespace: String,
    pub pod_uid: String,
    /// Empty when the container is unknown.
    pub container: String,
    pub reason: &'static str,
}

/// What to do with one occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Create an Event with this `count` (more than 1 when earlier occurrences were dropped).
    Create { count: i32, first: Timestamp },
    /// Patch the existing Event `name` to this `count` and `lastTimestamp`.
    Patch { name: String, count: i32 },
    /// The node's rate limit is spent: nothing written (the occurrence still counts).
    Drop,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The Event written for this series, once created.
    name: Option<String>,
    count: i32,
    first: Timestamp,
    last: Timestamp,
}

/// The share of the node's Event budget one namespace may spend, so that one tenant's pods
/// killed in a loop cannot use it all and leave the other tenants' kills without an Event.
pub const TENANT_SHARE: f64 = 0.5;
/// At most this many namespaces' buckets are remembered (the least recently used go first).
const TENANTS_MAX: usize = 256;

/// A token bucket: `tokens`, refilled up to a burst at a rate per minute.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    refilled: Option<Timestamp>,
}

impl Bucket {
    fn full(burst: f64) -> Self {
        Self {
            tokens: burst,
            refilled: None,
        }
    }

    /// Refills for the time since the last refill, up to `burst`.
    fn refill(&mut self, now: Timestamp, burst: f64, per_minute: f64) {
        if let Some(then) = self.refilled {
            let elapsed_ns = (now.as_nanosecond() - then.as_nanosecond()).max(0);
            #[expect(
                clippy::cast_precision_loss,
                reason = "token arithmetic; nanoseconds of a few minutes fit"
            )]
            let add = elapsed_ns as f64 / 60e9 * per_minute;
            self.tokens = (self.tokens + add).min(burst);
        }
        self.refilled = Some(now);
    }
}

/// Recent series (bounded), the node's token bucket and each namespace's share of it. Pure:
/// `now` comes in.
#[derive(Debug, Clone)]
pub struct OomSeries {
    entries: HashMap<SeriesKey, Entry>,
    window: Duration,
    max: usize,
    burst: u32,
    per_minute: u32,
    node: Bucket,
    /// The share of the node's budget one namespace may spend (1: no share of its own).
    tenant_share: f64,
    tenants: HashMap<String, Bucket>,
}

impl Default for OomSeries {
    fn default() -> Self {
        Self::new(SERIES_WINDOW, SERIES_MAX, RATE_BURST, RATE_PER_MINUTE)
            .with_tenant_share(TENANT_SHARE)
    }
}

impl OomSeries {
    pub fn new(window: Duration, max: usize, burst: u32, per_minute: u32) -> Self {
        Self {
            entries: HashMap::new(),
            window,
            max: max.max(1),
            burst,
            per_minute,
            node: Bucket::full(f64::from(burst)),
            tenant_share: 1.0,
            tenants: HashMap::new(),
        }
    }

    /// Each namespace may spend at most `share` (0 to 1) of the node's burst and rate.
    pub fn with_tenant_share(mut self, share: f64) -> Self {
        self.tenant_share = share.clamp(0.0, 1.0);
        self
    }

    /// The series remembered now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// One occurrence of `key` at `now`: what to write.
    pub fn observe(&mut self, key: &SeriesKey, now: Timestamp) -> Write {
        let window = i128::try_from(self.window.as_nanos()).unwrap_or(i128::MAX);
        let fresh = self
            .entries
            .get(key)
            .is_none_or(|e| now.as_nanosecond() - e.last.as_nanosecond() > window);
        if fresh {
            if !self.entries.contains_key(key) && self.entries.len() >= self.max {
                self.forget_oldest();
            }
            self.entries.insert(
                key.clone(),
                Entry {
                    name: None,
                    count: 0,
                    first: now,
                    last: now,
                },
            );
        }
        let allowed = self.take_token(&key.namespace, now);
        let Some(entry) = self.entries.get_mut(key) else {
            return Write::Drop;
        };
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
        if !allowed {
            return Write::Drop;
        }
        match &entry.name {
            Some(name) => Write::Patch {
                name: name.clone(),
                count: entry.count,
            },
            None => Write::Create {
                count: entry.count,
                first: entry.first,
            },
        }
    }

    /// The Event written for `key` is `name` (after a create).
    pub fn created(&mut self, key: &SeriesKey, name: String) {
        if let Some(e) = self.entries.get_mut(key) {
            e.name = Some(name);
        }
    }

    /// The Event of `key` is gone (a patch found none): the next occurrence creates one.
    pub fn lost(&mut self, key: &SeriesKey) {
        if let Some(e) = self.entries.get_mut(key) {
            e.name = None;
        }
    }

    fn forget_oldest(&mut self) {
        if let Some(k) = self
            .entries
            .iter()
            .min_by_key(|(_, e)| e.last)
            .map(|(k, _)| k.clone())
        {
            self.entries.remove(&k);
        }
    }

    /// One write at `now` for `namespace`: from its own share, and from the node's budget.
    fn take_token(&mut self, namespace: &str, now: Timestamp) -> bool {
        let (burst, rate) = (f64::from(self.burst), f64::from(self.per_minute));
        self.node.refill(now, burst, rate);
        if self.tenant_share >= 1.0 {
            return take(&mut self.node);
        }
        let (t_burst, t_rate) = (
            (burst * self.tenant_share).max(1.0),
            rate * self.tenant_share,
        );
        if !self.tenants.contains_key(namespace)
            && self.tenants.len() >= TENANTS_MAX
            && let Some(oldest) = self
                .tenants
                .iter()
                .min_by_key(|(_, b)| b.refilled)
                .map(|(k, _)| k.clone())
        {
            self.tenants.remove(&oldest);
        }
        let tenant = self
            .tenants
            .entry(namespace.to_owned())
            .or_insert_with(|| Bucket::full(t_burst));
        tenant.refill(now, t_burst, t_rate);
        if tenant.tokens >= 1.0 && self.node.tokens >= 1.0 {
            tenant.tokens -= 1.0;
            self.node.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Takes one token from `b`, if it has one.
fn take(b: &mut Bucket) -> bool {
    if b.tokens >= 1.0 {
        b.tokens -= 1.0;
        true
    } else {
        false
    }
}

/// A kernel OOM kill to tell.
#[derive(Debug, Clone)]
pub enum OomNotice {
    /// A kill attributed to a pod, and that pod from the agent's own pod cache.
    Pod { kill: OomKill, pod: Box<Pod> },
    /// A kill the Node's Event tells ([`tells_the_node`]), on Node `node`.
    Node { kill: NodeKill, node: String },
}

impl OomNotice {
    /// The series the Event joins, and the Event; `None` when the pod is not the one the kill
    /// names.
    fn event(&self) -> Option<(SeriesKey, EventRecord)> {
        match self {
            OomNotice::Pod { kill, pod } => {
                let ev = oom_event(kill, pod)?;
                Some((ev.key(), ev.record()))
            }
            OomNotice::Node { kill, node } => {
                let ev = node_oom_event(kill, node);
                Some((ev.key(), ev.record()))
            }
        }
    }
}

/// Where the kernel side hands OOM kills: the writer's queue, and this node's name (for the
/// Node's own Events).
#[derive(Debug, Clone)]
pub struct OomEvents {
    pub tx: mpsc::Sender<OomNotice>,
    pub node: String,
}

/// Writes the `OOMKilling` Events of the notices until the channel closes.
pub async fn run(
    client: Client,
    reporter: Reporter,
    timeout: Duration,
    metrics: Arc<Metrics>,
    mut notices: mpsc::Receiver<OomNotice>,
) {
    let mut series = OomSeries::default();
    while let Some(n) = notices.recv().await {
        let Some((key, ev)) = n.event() else {
            continue;
        };
        let now = Timestamp::now();
        let api: Api<Event> = Api::namespaced(client.clone(), &ev.namespace);
        match series.observe(&key, now) {
            Write::Drop => {
                metrics.record_event_dropped(REASON);
                debug!(object = ?ev.involved.name, "OOMKilling Event dropped by the node's rate limit");
            }
            Write::Patch { name, count } => {
                let patch = serde_json::json!({
                    "count": count,
                    "lastTimestamp": Time(now),
                    "message": ev.message,
                });
                let sent = tokio::time::timeout(
                    timeout,
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
                )
                .await;
                match sent {
                    Ok(Ok(_)) => {}
                    Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                        series.lost(&key);
                        if let Some(name) =
                            create(&api, &reporter, &ev, count, now, now, timeout).await
                        {
                            series.created(&key, name);
                        }
                    }
                    Ok(Err(e)) => {
                        warn!(error = %e, event = %name, "could not update the OOMKilling Event")
                    }
                    Err(_) => {
                        warn!(event = %name, ?timeout, "updating the OOMKilling Event got no answer")
                    }
                }
            }
            Write::Create { count, first } => {
                if let Some(name) = create(&api, &reporter, &ev, count, first, now, timeout).await {
                    series.created(&key, name);
                }
            }
        }
    }
}

/// Creates the Event; its name on success.
async fn create(
    api: &Api<Event>,
    reporter: &Reporter,
    ev: &EventRecord,
    count: i32,
    first: Timestamp,
    now: Timestamp,
    timeout: Duration,
) -> Option<String> {
    let obj = series_object(reporter, ev, count, first, now);
    match tokio::time::timeout(timeout, api.create(&PostParams::default(), &obj)).await {
        Ok(Ok(created)) => created.metadata.name,
        Ok(Err(e)) => {
            warn!(error = %e, "could not record the OOMKilling Event");
            None
        }
        Err(_) => {
            warn!(?timeout, "recording the OOMKilling Event got no answer");
            None
        }
    }
}

/// The Event object for a series of `count` occurrences from `first` to `now`.
pub fn series_object(
    reporter: &Reporter,
    ev: &EventRecord,
    count: i32,
    first: Timestamp,
    now: Timestamp,
) -> Event {
    let mut obj = event_object(reporter, ev, now);
    obj.count = Some(count);
    obj.first_timestamp = Some(Time(first));
    obj
}

#[cfg(test)]
mod tests;
