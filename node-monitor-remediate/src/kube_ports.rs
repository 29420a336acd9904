//! The controller's ports ([`super::ports`]) on the API server: the reflectors' caches, the
//! NodeFence operations, the node's taint through the actuator, pods listed and force-deleted,
//! fence agents run as commands with their Secrets, Events through the one writer. Every request
//! is bounded by [`REQUEST_TIMEOUT`].
use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Pod, Secret},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Preconditions},
    runtime::reflector::{ObjectRef, Store},
};

use node_monitor_core::{
    remediation::{
        FenceOp, OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE, Step,
    },
    units::clock::Timestamp,
};

use super::{
    WatchFreshness, exec,
    methods::{self, MethodSpec},
    ports::{
        ApiError, Clock, ClusterView, Events, FenceRunner, NodePods, OpRecords, PodDeletion,
        StepError, Taints,
    },
    store::{OpStore, StoreError, StoredOp},
};
use node_monitor_service::{
    client::DEFAULT_API_TIMEOUT,
    events::{EventRecord, EventWriter, Reporter},
    taint::{TaintSpec, set_taint},
    telemetry::error_chain as chain,
};

/// The component name on Events.
pub const COMPONENT: &str = "node-monitor-remediate";
/// Every API request the controller makes is bounded by this.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The watched objects.
pub struct Caches {
    pub nodes: Store<Node>,
    pub leases: Store<Lease>,
    /// The controller's namespace: the node agents' liveness Leases.
    pub agent_leases: Store<Lease>,
    /// The controller's namespace: fence configuration.
    pub configmaps: Store<ConfigMap>,
    /// How current `leases` is known to be.
    pub lease_freshness: Arc<WatchFreshness>,
}

/// The ports on a client and the reflectors' caches.
pub struct KubePorts {
    client: Client,
    namespace: String,
    caches: Caches,
    store: OpStore,
    events: EventWriter,
    start: tokio::time::Instant,
}

impl KubePorts {
    /// `identity` is the replica's, written as the Events' `reportingInstance`.
    pub fn new(client: Client, namespace: &str, identity: &str, caches: Caches) -> Self {
        Self {
            store: OpStore::new(client.clone()),
            events: EventWriter::new(
                client.clone(),
                Reporter {
                    component: COMPONENT,
                    instance: identity.to_owned(),
                    host: None,
                },
                REQUEST_TIMEOUT,
            ),
            client,
            namespace: namespace.to_owned(),
            caches,
            start: tokio::time::Instant::now(),
        }
    }
}

/// A request within [`REQUEST_TIMEOUT`]; its error as text ("no answer" when it ran out).
async fn bounded<T>(fut: impl Future<Output = Result<T, kube::Error>>) -> Result<T, ApiError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(ApiError::of(&e)),
        Err(_) => Err(ApiError::Timeout(REQUEST_TIMEOUT)),
    }
}

impl Clock for KubePorts {
    fn now(&self) -> Timestamp {
        Timestamp::from_duration(self.start.elapsed())
    }

    fn unix_millis(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

impl ClusterView for KubePorts {
    fn nodes(&self) -> Vec<Arc<Node>> {
        self.caches.nodes.state()
    }

    fn leases(&self) -> Vec<Arc<Lease>> {
        self.caches.leases.state()
    }

    fn agent_leases(&self) -> Vec<Arc<Lease>> {
        self.caches.agent_leases.state()
    }

    fn lease_view_age(&self) -> Option<Duration> {
        self.caches.lease_freshness.age()
    }

    fn configmaps(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        self.caches
            .configmaps
            .state()
            .iter()
            .filter_map(|cm| {
                Some((
                    cm.metadata.name.clone()?,
                    cm.data.clone().unwrap_or_default(),
                ))
            })
            .collect()
    }

    fn configmap(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.caches
            .configmaps
            .get(&ObjectRef::new(name).within(&self.namespace))
            .map(|cm| cm.data.clone().unwrap_or_default())
    }
}

impl OpRecords for KubePorts {
    async fn list_ops(&self) -> Result<Vec<Result<StoredOp, StoreError>>, StoreError> {
        self.store.list().await
    }

    async fn get_op(&self, node: &str) -> Result<Option<StoredOp>, StoreError> {
        self.store.get(node).await
    }

    async fn create_op(&self, op: &FenceOp) -> Result<StoredOp, StoreError> {
        self.store.create(op).await
    }

    async fn update_op(&self, stored: &StoredOp, op: &FenceOp) -> Result<StoredOp, StoreError> {
        self.store.update(stored, op).await
    }

    async fn delete_op(&self, node: &str) -> Result<(), StoreError> {
        self.store.delete(node).await
    }
}

impl Taints for KubePorts {
    async fn set_out_of_service(&self, node: &str, present: bool) -> Result<(), ApiError> {
        let taint = TaintSpec {
            key: OUT_OF_SERVICE_TAINT,
            value: OUT_OF_SERVICE_VALUE,
            effect: OUT_OF_SERVICE_EFFECT,
        };
        match tokio::time::timeout(
            REQUEST_TIMEOUT,
            set_taint(&self.client, node, taint, present, DEFAULT_API_TIMEOUT),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ApiError::of(&e.source)),
            Err(_) => Err(ApiError::Timeout(REQUEST_TIMEOUT)),
        }
    }
}

impl NodePods for KubePorts {
    async fn node_pods(&self, node: &str) -> Result<Vec<Pod>, ApiError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        bounded(pods.list(&lp)).await.map(|l| l.items)
    }

    async fn force_delete_pod(&self, pod: &Pod) -> Result<PodDeletion, ApiError> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match tokio::time::timeout(REQUEST_TIMEOUT, api.delete(&name, &dp)).await {
            Ok(Ok(_)) => Ok(PodDeletion::Deleted),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => Ok(PodDeletion::Gone),
            Ok(Err(e)) => Err(ApiError::of(&e)),
            Err(_) => Err(ApiError::Timeout(REQUEST_TIMEOUT)),
        }
    }

    async fn node_volume_attachments(&self, node: &str) -> Result<Vec<String>, ApiError> {
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let l = match tokio::time::timeout(REQUEST_TIMEOUT, vas.list(&ListParams::default())).await
        {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Err(ApiError::of(&e)),
            Err(_) => return Err(ApiError::Timeout(REQUEST_TIMEOUT)),
        };
        Ok(l.items
            .iter()
            .filter(|va| va.spec.node_name == node)
            .filter_map(|va| va.metadata.name.clone())
            .collect())
    }
}

impl FenceRunner for KubePorts {
    fn run_step(
        &self,
        node: String,
        step: Step,
        mut specs: Vec<MethodSpec>,
    ) -> impl Future<Output = Result<(), StepError>> + Send + 'static {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        async move {
            add_secrets(&secrets, &mut specs)
                .await
                .map_err(StepError::Config)?;
            exec::run_step(&node, step, &specs).await
        }
    }
}

impl Events for KubePorts {
    async fn record(&self, rec: EventRecord) {
        self.events.record(&rec).await;
    }
}

async fn add_secrets(secrets: &Api<Secret>, specs: &mut [MethodSpec]) -> Result<(), String> {
    for spec in specs.iter_mut() {
        let Some(name) = spec.secret.clone() else {
            continue;
        };
        let secret = match tokio::time::timeout(REQUEST_TIMEOUT, secrets.get_opt(&name)).await {
            Ok(Ok(Some(s))) => s,
            Ok(Ok(None)) => {
                return Err(format!(
                    "method {}: Secret {name} does not exist",
                    spec.method
                ));
            }
            Ok(Err(e)) => {
                return Err(format!(
                    "method {}: read Secret {name}: {}",
                    spec.method,
                    chain(&e)
                ));
            }
            Err(_) => {
                return Err(format!(
                    "method {}: read Secret {name}: no answer",
                    spec.method
                ));
            }
        };
        let data: BTreeMap<String, Vec<u8>> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        methods::add_secret(spec, &name, &data).map_err(|e| e.to_string())?;
    }
    Ok(())
}
