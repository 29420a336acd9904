//! The agent's liveness Lease: `node-monitor-agent-<node>` in the agent's namespace, renewed
//! every `nodeMonitor.livenessLeaseInterval` (5 s, lengthened by a random share of up to 10 %) by
//! one merge PATCH of its `renewTime`. `node-monitor remediate` reads it to find a silent node
//! dead in seconds (docs/remediate.md, "A dead node"). The Lease is created when missing; a
//! failing renewal is logged once and retried at the next interval; it never stops the agent.
use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use node_monitor_core::names::agent_lease_name;
use tracing::{info, warn};

use crate::jitter::jittered;

/// The share by which each pause between renewals is lengthened at random.
pub const RENEW_JITTER: f64 = 0.1;

/// One node's liveness Lease.
#[derive(Clone)]
pub struct LivenessLease {
    api: Api<Lease>,
    node: String,
    name: String,
}

impl LivenessLease {
    /// The Lease of `node` in `namespace`.
    pub fn new(client: Client, namespace: &str, node: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            node: node.to_owned(),
            name: agent_lease_name(node),
        }
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One renewal: a merge PATCH of `renewTime` (and `holderIdentity`, the node's name); when
    /// the Lease does not exist yet, it is created.
    pub async fn renew(&self) -> Result<(), kube::Error> {
        let now = MicroTime(Timestamp::now());
        let patch = serde_json::json!({
            "spec": { "holderIdentity": self.node, "renewTime": now }
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => self.create(now).await,
            Err(e) => Err(e),
        }
    }

    async fn create(&self, now: MicroTime) -> Result<(), kube::Error> {
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
            Ok(_) => Ok(()),
            // Created meanwhile (a previous run of the agent): the next renewal patches it.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
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
            Ok(()) if failing => {
                info!(lease = lease.name(), "liveness Lease renewed again");
                failing = false;
            }
            Ok(()) => {}
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
