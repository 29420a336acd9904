//! The Kubernetes client, as every product builds it: from `--kubeconfig` (a bounded, regular
//! file) or the in-cluster config, with kube's own retry off, and with every call bounded
//! ([`api_client`]) or, for watches, every read bounded past the watch timeout ([`watch_client`]).
use std::{path::Path, time::Duration};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

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
    Input(#[from] node_monitor_base::io::InputError),
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
            node_monitor_base::io::check_regular_file(
                path,
                "the kubeconfig",
                node_monitor_base::io::MAX_INPUT_BYTES,
            )?;
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
/// connection went idle). Callers bound each call as a whole too (the agent's actuator).
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
