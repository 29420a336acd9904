//! The Kubernetes adapter: client construction, the reflector of this node's pods, and the
//! [`actuator::Actuator`] that carries out decisions.
pub mod actuator;

use std::path::Path;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt as _, reflector, watcher},
};
use tracing::{info, warn};

/// Errors building a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no in-cluster config and no kubeconfig")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building the API client")]
    Build(#[source] kube::Error),
}

/// A client from `--kubeconfig` when given, else the in-cluster config or `$KUBECONFIG`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?
        }
        None => Config::infer().await.map_err(ClientError::Infer)?,
    };
    // The client's built-in retry resends a 429 up to 15 times, honouring Retry-After: minutes in
    // which a PDB-blocked eviction would hold the loop. The agent handles 429s itself (backoff and
    // the next candidate) and retries other failures on its next cycle.
    let mut config = config;
    config.default_retry = false;
    Client::try_from(config).map_err(ClientError::Build)
}

/// Starts a reflector of the pods bound to `node_name` (field selector `spec.nodeName`). The
/// returned task runs until dropped; watch errors are retried with backoff and never end it, so an
/// unreachable API server degrades to a stale cache that catches up on reconnect.
pub fn pod_reflector(
    client: Client,
    node_name: &str,
) -> (
    reflector::Store<Pod>,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let pods: Api<Pod> = Api::all(client);
    let (store, writer) = reflector::store();
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let stream = reflector(writer, watcher(pods, cfg)).default_backoff();
    let task = async move {
        let mut stream = std::pin::pin!(stream);
        let mut healthy = true;
        while let Some(item) = stream.next().await {
            match item {
                Ok(_) if !healthy => {
                    info!("pod watch recovered");
                    healthy = true;
                }
                Ok(_) => {}
                Err(e) => {
                    if healthy {
                        warn!(error = %e, "pod watch failed; retrying with backoff");
                    }
                    healthy = false;
                }
            }
        }
    };
    (store, task)
}
