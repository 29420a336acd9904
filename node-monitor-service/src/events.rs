//! The one writer of Kubernetes Events, for both products: the agent's (evictions on the pod and
//! the node, shutdown and last-gasp Events on the node, through the agent's actuator) and
//! remediate's (fencing Events on the node, `DeletedAfterFencing` on each deleted pod).
//!
//! Every Event is a core/v1 Event, one per occurrence, as the kubelet's recorder writes one
//! before it aggregates: `count: 1`, `firstTimestamp` = `lastTimestamp` = `eventTime`, the
//! component in both `source.component` and `reportingComponent`.
//! The agent's `OOMKilling` Events start from the same object and aggregate
//! their repeats into its `count`.
//!
//! Not kube-runtime's `Recorder` (`kube::runtime::events`, kube 5), because it cannot write
//! these Events as they are promised:
//! - it takes no annotations (its `Event` has type, reason, note, action and a secondary
//!   reference; the object's metadata is only a name and a namespace), so the pod's eviction
//!   Event would lose the annotations the kubelet puts on its own (`offending_containers`,
//!   `offending_containers_usage`, `starved_resource`, set by `recorder.AnnotatedEventf` in the
//!   eviction manager's `evictPod`);
//! - it writes events.k8s.io/v1 Events without `deprecatedSource`, so their core/v1 view has no
//!   `source.component` (`kubectl get events`' SOURCE column, and what the end-to-end tests read);
//! - it aggregates by (type, action, reason, reporter, object) *without the message*: a repeat
//!   within six minutes patches the first Event's `series` and keeps its note, so a second
//!   `FenceStepFailed` about the same node would still show the first method's error.
use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};
use tracing::warn;

/// Who writes the Events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reporter {
    /// `source.component` and `reportingComponent`; also the name prefix of an Event about no
    /// named object.
    pub component: &'static str,
    /// `reportingInstance`: the agent's node, remediate's replica.
    pub instance: String,
    /// `source.host`: the node the agent runs on; none for a cluster-wide controller.
    pub host: Option<String>,
}

/// One Event to record.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    /// Where the Event is written: the pod's namespace, `default` for a node (where the kubelet
    /// and the node lifecycle controller record theirs).
    pub namespace: String,
    pub involved: ObjectReference,
    /// `Warning`, else `Normal`.
    pub warning: bool,
    /// `reason`, and `action` too.
    pub reason: String,
    pub message: String,
    /// The Event's own annotations (none: no `annotations` field at all).
    pub annotations: BTreeMap<String, String>,
}

/// A reference to a pod, as both products write it.
pub fn pod_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        uid: Some(uid.to_owned()),
        ..ObjectReference::default()
    }
}

/// Builds Events and writes them, each request bounded by a timeout.
#[derive(Clone)]
pub struct EventWriter {
    client: Client,
    reporter: Reporter,
    timeout: Duration,
}

impl EventWriter {
    pub fn new(client: Client, reporter: Reporter, timeout: Duration) -> Self {
        Self {
            client,
            reporter,
            timeout,
        }
    }

    /// The Event object for `rec` at `now`.
    pub fn object(&self, rec: &EventRecord, now: Timestamp) -> Event {
        event_object(&self.reporter, rec, now)
    }

    /// Writes one Event. Failures are logged, never returned: an Event is never worth a failed
    /// action.
    pub async fn record(&self, rec: &EventRecord) {
        let ev = self.object(rec, Timestamp::now());
        let events: Api<Event> = Api::namespaced(self.client.clone(), &rec.namespace);
        let reason = rec.reason.as_str();
        match tokio::time::timeout(self.timeout, events.create(&PostParams::default(), &ev)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(error = %e, reason, "could not record event"),
            Err(_) => warn!(reason, timeout = ?self.timeout, "recording an event got no answer"),
        }
    }
}

/// The Event object `reporter` writes for `rec` at `now`.
pub fn event_object(reporter: &Reporter, rec: &EventRecord, now: Timestamp) -> Event {
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}.",
                rec.involved.name.as_deref().unwrap_or(reporter.component)
            )),
            namespace: Some(rec.namespace.clone()),
            annotations: (!rec.annotations.is_empty()).then(|| rec.annotations.clone()),
            ..ObjectMeta::default()
        },
        involved_object: rec.involved.clone(),
        reason: Some(rec.reason.clone()),
        message: Some(rec.message.clone()),
        type_: Some(if rec.warning { "Warning" } else { "Normal" }.to_owned()),
        source: Some(EventSource {
            component: Some(reporter.component.to_owned()),
            host: reporter.host.clone(),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        count: Some(1),
        reporting_component: Some(reporter.component.to_owned()),
        reporting_instance: Some(reporter.instance.clone()),
        action: Some(rec.reason.clone()),
        ..Event::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(annotations: &[(&str, &str)]) -> EventRecord {
        EventRecord {
            namespace: "apps".to_owned(),
            involved: pod_ref("apps", "web-0", "u1"),
            warning: true,
            reason: "Evicted".to_owned(),
            message: "The node was low on resource: memory.".to_owned(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// The agent's Events: its component and node in `source`, the node as the instance, the
    /// annotations kept.
    #[test]
    fn the_agents_event_names_its_component_and_node_and_keeps_annotations() {
        let agent = Reporter {
            component: "node-monitor",
            instance: "n1".to_owned(),
            host: Some("n1".to_owned()),
        };
        let now = Timestamp::from_second(1_700_000_000).expect("valid");
        let ev = event_object(&agent, &record(&[("starved_resource", "memory")]), now);
        let source = ev.source.clone().expect("source");
        assert_eq!(source.component.as_deref(), Some("node-monitor"));
        assert_eq!(source.host.as_deref(), Some("n1"));
        assert_eq!(ev.reporting_component.as_deref(), Some("node-monitor"));
        assert_eq!(ev.reporting_instance.as_deref(), Some("n1"));
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(
            (ev.reason.as_deref(), ev.action.as_deref()),
            (Some("Evicted"), Some("Evicted"))
        );
        assert_eq!(ev.count, Some(1));
        assert_eq!(ev.first_timestamp, Some(Time(now)));
        assert_eq!(ev.last_timestamp, Some(Time(now)));
        assert_eq!(ev.event_time, Some(MicroTime(now)));
        assert_eq!(ev.metadata.generate_name.as_deref(), Some("web-0."));
        assert_eq!(ev.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(
            ev.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("starved_resource"))
                .map(String::as_str),
            Some("memory")
        );
    }

    /// Remediate's Events: no host, its replica as the instance, Normal ones too, no empty
    /// annotations map.
    #[test]
    fn remediates_event_has_no_host_and_no_empty_annotations() {
        let remediate = Reporter {
            component: "node-monitor-remediate",
            instance: "replica-1".to_owned(),
            host: None,
        };
        let mut rec = record(&[]);
        rec.warning = false;
        rec.involved.name = None;
        let ev = event_object(&remediate, &rec, Timestamp::UNIX_EPOCH);
        assert_eq!(
            ev.source.and_then(|s| s.component).as_deref(),
            Some("node-monitor-remediate")
        );
        assert_eq!(ev.reporting_instance.as_deref(), Some("replica-1"));
        assert_eq!(ev.type_.as_deref(), Some("Normal"));
        assert_eq!(ev.metadata.annotations, None);
        assert_eq!(
            ev.metadata.generate_name.as_deref(),
            Some("node-monitor-remediate.")
        );
    }
}
