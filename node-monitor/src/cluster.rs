//! The Kubernetes adapter: client construction, the reflector of this node's pods, and the
//! [`actuator::Actuator`] that carries out decisions.
pub mod actuator;
pub use node_monitor_service::{client::*, events};
pub mod liveness_lease;
pub mod oom_events;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, reflector, watcher},
};
use tracing::{info, warn};

/// What the pod watch went through, for the agent's health and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodWatchEvent {
    /// The watch failed (error text); it reconnects with backoff. Sent for every error.
    Failed(String),
    /// The first item after one or more failures: the cache is current again.
    Recovered,
}

/// Starts a reflector of the pods bound to `node_name` (field selector `spec.nodeName`). The
/// returned task runs until dropped; watch errors are retried with backoff and never end it, so an
/// unreachable API server degrades to a stale cache that catches up on reconnect. Each failure
/// and the recovery are told to `observe`. Pass the watch client of [`clients`], whose reads
/// outlast the watch timeout.
pub fn pod_reflector(
    client: Client,
    node_name: &str,
    mut observe: impl FnMut(PodWatchEvent) + Send + 'static,
) -> (
    reflector::Store<Pod>,
    impl Future<Output = ()> + Send + 'static,
) {
    let pods: Api<Pod> = Api::all(client);
    let (store, writer) = reflector::store();
    // A short server-side timeout: the watcher treats a stream silent for longer (plus a margin)
    // as stalled and reconnects, instead of after kube's default 295 s.
    let cfg = watcher::Config::default()
        .fields(&format!("spec.nodeName={node_name}"))
        .timeout(pod_watch_timeout_secs());
    // The cache keeps what the agent reads: `managedFields` and kubectl's last-applied copy
    // (often larger than the rest of the pod) are dropped before they are stored.
    let stream = reflector(writer, watcher(pods, cfg).modify(slim_pod)).default_backoff();
    let task = async move {
        let mut stream = std::pin::pin!(stream);
        let mut healthy = true;
        while let Some(item) = stream.next().await {
            match item {
                Ok(_) if !healthy => {
                    info!("pod watch recovered");
                    healthy = true;
                    observe(PodWatchEvent::Recovered);
                }
                Ok(_) => {}
                Err(e) => {
                    if healthy {
                        warn!(error = %e, "pod watch failed; retrying with backoff");
                    }
                    healthy = false;
                    observe(PodWatchEvent::Failed(e.to_string()));
                }
            }
        }
    };
    (store, task)
}

/// Drops the parts of a pod the agent never reads before it is cached: the server-side apply
/// bookkeeping and kubectl's last-applied annotation.
pub fn slim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// kubectl's client-side apply record: a full copy of the object as last applied.
const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

#[cfg(test)]
mod watch_tests;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::Config;

    use super::*;

    /// `--kubeconfig` naming a FIFO is refused at once, never a start-up blocked on its open.
    #[tokio::test]
    async fn a_kubeconfig_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("kubeconfig");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let got = tokio::time::timeout(Duration::from_secs(5), load_config(Some(&fifo)))
            .await
            .expect("answers at once");
        let e = got.expect_err("a FIFO is refused");
        assert!(e.to_string().contains("a FIFO"), "{e}");
    }
    use k8s_openapi::api::core::v1::Node;

    #[test]
    fn slim_pod_drops_apply_bookkeeping_and_keeps_what_the_agent_reads() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u1",
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\":true}",
                    "kubernetes.io/config.source": "api",
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            },
            "spec": {"nodeName": "n1", "priorityClassName": "high", "containers": [{"name": "c"}]},
        }))
        .expect("pod");
        let before = pod.clone();
        slim_pod(&mut pod);
        assert_eq!(pod.metadata.managed_fields, None);
        let annotations = pod.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.len(), 1);
        assert_eq!(annotations["kubernetes.io/config.source"], "api");
        assert_eq!(pod.spec, before.spec);
        assert_eq!(pod.metadata.uid, before.metadata.uid);
    }

    /// A TCP listener that accepts connections and never answers: a black-holed API server.
    pub(crate) async fn black_hole() -> (Config, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let mut config = Config::new(format!("http://{addr}").parse().expect("url"));
        config.default_retry = false;
        (config, task)
    }

    /// Liveness bound for the tests below: far above the timeouts they configure, far below
    /// kube's default 295 s read timeout that wedged the agent.
    const HUNG: Duration = Duration::from_secs(120);

    #[tokio::test]
    async fn an_api_call_to_a_black_hole_fails_instead_of_hanging() {
        let (config, server) = black_hole().await;
        let client = api_client(config, Duration::from_secs(1)).expect("client");
        let nodes: Api<Node> = Api::all(client);
        let answer = tokio::time::timeout(HUNG, nodes.get("n"))
            .await
            .expect("the call must end on its own timeout");
        let err = answer.expect_err("no answer is an error");
        assert_eq!(
            actuator::FailureKind::of_error(&err),
            (None, actuator::FailureKind::Timeout),
            "{err}"
        );
        server.abort();
    }
}
