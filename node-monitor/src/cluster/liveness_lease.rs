//! The agent's liveness Lease: `node-monitor-agent-<node>` in the agent's namespace, renewed
//! every `nodeMonitor.livenessLeaseInterval` (5 s, lengthened by a random share of up to 10 %) by
//! one merge PATCH of its `renewTime`. `node-monitor remediate` reads it to find a silent node
//! dead in seconds (docs/remediate.md, "A dead node"). The Lease is created when missing; a
//! failing renewal is logged once and retried at the next interval; it never stops the agent.
//! Each renewal is counted (`node_monitor_liveness_lease_renewals_total{result}`) and the time of
//! the last one that wrote the Lease is exported
//! (`node_monitor_liveness_lease_last_renewal_timestamp_seconds`).
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use node_monitor_core::contract::names::agent_lease_name;
use tracing::{info, warn};

use crate::jitter::jittered;
pub use crate::metrics::lease::{RenewalLabels, RenewalMetrics};

/// What one renewal did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The Lease's `renewTime` was patched.
    Renewed,
    /// The Lease was missing and has been created.
    Created,
    /// The Lease was missing, and was created by someone else between the patch and the create
    /// (HTTP 409): nothing was written this time; the next renewal patches it.
    Conflict,
}

impl Renewal {
    /// The `result` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Renewed => "renewed",
            Self::Created => "created",
            Self::Conflict => "conflict",
        }
    }

    /// Whether the Lease now carries this renewal's time.
    pub fn wrote(self) -> bool {
        !matches!(self, Self::Conflict)
    }
}

/// Counts one renewal's outcome in `metrics`; a write moves the last renewal's time to
/// `unix_secs`.
fn observe(metrics: &RenewalMetrics, outcome: &Result<Renewal, kube::Error>, unix_secs: f64) {
    let result = match outcome {
        Ok(r) => r.label(),
        Err(_) => "error",
    };
    metrics.record(result, outcome.as_ref().is_ok_and(|r| r.wrote()), unix_secs);
}

fn unix_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The share by which each pause between renewals is lengthened at random.
pub const RENEW_JITTER: f64 = 0.1;

/// One node's liveness Lease.
#[derive(Clone)]
pub struct LivenessLease {
    api: Api<Lease>,
    node: String,
    name: String,
    metrics: RenewalMetrics,
}

impl LivenessLease {
    /// The Lease of `node` in `namespace`.
    pub fn new(client: Client, namespace: &str, node: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            node: node.to_owned(),
            name: agent_lease_name(node),
            metrics: RenewalMetrics::default(),
        }
    }

    /// Counts the renewals on `metrics` (the agent's registry).
    #[must_use]
    pub fn with_metrics(mut self, metrics: RenewalMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One renewal: a merge PATCH of `renewTime` (and `holderIdentity`, the node's name); when
    /// the Lease does not exist yet, it is created. Counted on the renewer's metrics.
    pub async fn renew(&self) -> Result<Renewal, kube::Error> {
        let outcome = self.write().await;
        observe(&self.metrics, &outcome, unix_secs());
        outcome
    }

    async fn write(&self) -> Result<Renewal, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let patch = serde_json::json!({
            "spec": { "holderIdentity": self.node, "renewTime": now }
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Renewal::Renewed),
            Err(kube::Error::Api(s)) if s.code == 404 => self.create(now).await,
            Err(e) => Err(e),
        }
    }

    async fn create(&self, now: MicroTime) -> Result<Renewal, kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(
                    [(
                        "app.kubernetes.io/name".to_owned(),
                        "node-monitor".to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.node.clone()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..LeaseSpec::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Renewal::Created),
            // Created meanwhile (a previous run of the agent): the next renewal patches it.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Renewal::Conflict),
            Err(e) => Err(e),
        }
    }
}

/// Renews `lease` every `interval` (lengthened by up to [`RENEW_JITTER`]) until `stop` turns
/// true or its sender is gone. An `interval` of zero renews nothing.
pub async fn renew_until_stopped(
    lease: LivenessLease,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    if interval.is_zero() {
        info!("no liveness Lease (nodeMonitor.livenessLeaseInterval: 0s)");
        return;
    }
    info!(
        lease = lease.name(),
        ?interval,
        "renewing the liveness Lease"
    );
    let mut failing = false;
    loop {
        match lease.renew().await {
            Ok(_) if failing => {
                info!(lease = lease.name(), "liveness Lease renewed again");
                failing = false;
            }
            Ok(_) => {}
            Err(e) if !failing => {
                warn!(lease = lease.name(), error = %e,
                      "could not renew the liveness Lease; retrying every interval");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = tokio::time::sleep(jittered(interval, RENEW_JITTER)) => {}
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::VecDeque,
        sync::{Arc, Mutex},
    };

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// An API server on loopback that answers its requests with `answers` (status line and JSON
    /// body), in order; records each request's method and path.
    async fn scripted_api(answers: &[(&str, &str)]) -> (Client, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let queue: Arc<Mutex<VecDeque<String>>> = Arc::new(Mutex::new(
            answers
                .iter()
                .map(|(status, body)| {
                    format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                })
                .collect(),
        ));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (queue, log) = (queue.clone(), log.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(n) = conn.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        let Some(head_end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length = text[..head_end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if buf.len() < head_end + 4 + length {
                            continue;
                        }
                        let line = text.lines().next().unwrap_or_default();
                        log.lock()
                            .expect("log")
                            .push(line.split(' ').take(2).collect::<Vec<_>>().join(" "));
                        buf.drain(..head_end + 4 + length);
                        let answer = queue.lock().expect("queue").pop_front();
                        let Some(answer) = answer else { return };
                        if conn.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let mut config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        config.default_retry = false;
        (Client::try_from(config).expect("client"), seen)
    }

    fn status(code: u16, reason: &str) -> String {
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": reason, "reason": reason, "code": code,
        })
        .to_string()
    }

    const LEASE: &str = r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease",
        "metadata":{"name":"node-monitor-agent-n1","namespace":"node-monitor"},
        "spec":{"holderIdentity":"n1"}}"#;

    /// Each renewal is counted by what the API answered: a patch (`renewed`), a create after a
    /// 404 (`created`), a create that found the Lease made meanwhile (`conflict`, nothing
    /// written) and a refusal or failure (`error`); the last renewal's time moves only when the
    /// Lease was written.
    #[tokio::test]
    async fn renewals_are_counted_by_result() {
        let not_found = status(404, "NotFound");
        let exists = status(409, "AlreadyExists");
        let failed = status(500, "InternalError");
        let forbidden = status(403, "Forbidden");
        let (client, seen) = scripted_api(&[
            ("200 OK", LEASE),
            ("404 Not Found", &not_found),
            ("201 Created", LEASE),
            ("404 Not Found", &not_found),
            ("409 Conflict", &exists),
            ("500 Internal Server Error", &failed),
            ("403 Forbidden", &forbidden),
        ])
        .await;
        let metrics = RenewalMetrics::default();
        let lease = LivenessLease::new(client, "node-monitor", "n1").with_metrics(metrics.clone());
        let count = |result: &str| {
            metrics
                .renewals
                .get_or_create(&RenewalLabels {
                    result: result.to_owned(),
                })
                .get()
        };
        assert_eq!(metrics.last_renewal.get(), 0.0);
        assert_eq!(lease.renew().await.expect("patched"), Renewal::Renewed);
        let first = metrics.last_renewal.get();
        assert!(first > 0.0, "{first}");
        assert_eq!(lease.renew().await.expect("created"), Renewal::Created);
        let second = metrics.last_renewal.get();
        assert!(second >= first);
        assert_eq!(lease.renew().await.expect("conflict"), Renewal::Conflict);
        assert_eq!(
            metrics.last_renewal.get(),
            second,
            "a conflict writes nothing"
        );
        assert!(lease.renew().await.is_err());
        assert!(lease.renew().await.is_err());
        assert_eq!(
            metrics.last_renewal.get(),
            second,
            "an error writes nothing"
        );
        assert_eq!(
            [
                count("renewed"),
                count("created"),
                count("conflict"),
                count("error")
            ],
            [1, 1, 1, 2]
        );
        let seen = seen.lock().expect("seen").clone();
        let lease_path = "/apis/coordination.k8s.io/v1/namespaces/node-monitor/leases";
        assert_eq!(
            seen,
            [
                format!("PATCH {lease_path}/node-monitor-agent-n1?"),
                format!("PATCH {lease_path}/node-monitor-agent-n1?"),
                format!("POST {lease_path}?"),
                format!("PATCH {lease_path}/node-monitor-agent-n1?"),
                format!("POST {lease_path}?"),
                format!("PATCH {lease_path}/node-monitor-agent-n1?"),
                format!("PATCH {lease_path}/node-monitor-agent-n1?"),
            ]
        );
    }
}
