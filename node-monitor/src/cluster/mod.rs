//! The Kubernetes adapter: client construction, the reflector of this node's pods, and the
//! [`actuator::Actuator`] that carries out decisions.
pub mod actuator;
pub mod events;
pub mod liveness_lease;
pub mod oom_events;

use std::{path::Path, time::Duration};

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
    #[error(transparent)]
    Input(#[from] crate::io::InputError),
    #[error("no in-cluster config and no kubeconfig")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building the API client")]
    Build(#[source] kube::Error),
}

/// The default bound on one API call (`nodeMonitor.apiTimeout`).
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(30);
/// Watches ask the server to end them after this long (`timeoutSeconds`); a healthy server then
/// closes the stream, so a longer silence means a stalled one. The agent's pod watch lengthens it
/// by a per-process draw of up to [`WATCH_TIMEOUT_JITTER`] ([`pod_watch_timeout_secs`]).
pub const WATCH_TIMEOUT_SECS: u32 = 60;
/// The share by which the pod watch's timeout is lengthened, drawn once per process: agents
/// started together (a rollout, a reconnect after an API server restart) renew their watches at
/// different moments instead of all in the same second.
pub const WATCH_TIMEOUT_JITTER: f64 = 0.25;

/// The pod watch's `timeoutSeconds` in this process: [`WATCH_TIMEOUT_SECS`] lengthened by a draw
/// of up to [`WATCH_TIMEOUT_JITTER`], the same for every watch of the process.
pub fn pod_watch_timeout_secs() -> u32 {
    static SECS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SECS.get_or_init(|| {
        let base = Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS));
        u32::try_from(crate::jitter::jittered(base, WATCH_TIMEOUT_JITTER).as_secs())
            .unwrap_or(WATCH_TIMEOUT_SECS)
    })
}
/// Silence on a watch connection beyond the watch timeout before it counts as stalled and the
/// watcher reconnects.
pub const WATCH_STALL_MARGIN: Duration = Duration::from_secs(15);

/// The client configuration from `--kubeconfig` when given, else the in-cluster config or
/// `$KUBECONFIG`, with kube's built-in retry off.
pub async fn load_config(kubeconfig: Option<&Path>) -> Result<Config, ClientError> {
    let mut config = match kubeconfig {
        Some(path) => {
            // A FIFO or a runaway file is refused before kube opens it.
            crate::io::check_regular_file(path, "the kubeconfig", crate::io::MAX_INPUT_BYTES)?;
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
    config.default_retry = false;
    Ok(config)
}

/// A client from `--kubeconfig` when given, else the in-cluster config or `$KUBECONFIG`, with
/// kube's default transport timeouts.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    Client::try_from(load_config(kubeconfig).await?).map_err(ClientError::Build)
}

/// The agent's clients: one for plain API calls, every one of them bounded by `api_timeout`, and
/// one for watches, whose connections may stay silent up to the watch timeout.
#[derive(Clone)]
pub struct Clients {
    pub api: Client,
    pub watch: Client,
}

/// Builds [`Clients`] from a configuration.
pub fn clients(config: Config, api_timeout: Duration) -> Result<Clients, ClientError> {
    Ok(Clients {
        api: api_client(config.clone(), api_timeout)?,
        watch: watch_client(config, api_timeout)?,
    })
}

/// A client whose every call is bounded: connecting, sending and each read wait at most
/// `timeout` (the read timeout counts from the request's last write, not from when a pooled
/// connection went idle). Callers bound each call as a whole too ([`actuator::Actuator`]).
pub fn api_client(mut config: Config, timeout: Duration) -> Result<Client, ClientError> {
    config.connect_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.reset_reader_on_write = true;
    Client::try_from(config).map_err(ClientError::Build)
}

/// A client for watches and the lists that start them: a read may wait for the watch timeout
/// plus [`WATCH_STALL_MARGIN`], never longer, so a black-holed connection is dropped and retried.
pub fn watch_client(mut config: Config, connect_timeout: Duration) -> Result<Client, ClientError> {
    config.connect_timeout = Some(connect_timeout);
    config.write_timeout = Some(connect_timeout);
    config.read_timeout =
        Some(Duration::from_secs(u64::from(pod_watch_timeout_secs())) + WATCH_STALL_MARGIN);
    config.reset_reader_on_write = true;
    Client::try_from(config).map_err(ClientError::Build)
}

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
