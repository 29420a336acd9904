//! A real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-controller-manager,
//! started from the binaries `cargo xtask build control-plane` builds, with certificates made fresh
//! for every start.
//!
//! ```no_run
//! # async fn demo() -> Result<(), node_monitor_tests::control_plane::Error> {
//! use node_monitor_tests::control_plane::{ControlPlane, ControlPlaneOptions};
//! let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
//! let client = cp.client();
//! // ... talk to the API; `cp.kubeconfig_path()` for other programs ...
//! cp.stop()?; // or drop it: every process is killed and the directory removed either way
//! # Ok(()) }
//! ```
//!
//! What runs, and why each flag:
//! - etcd on two free loopback ports, data in the work directory, fsync off (tests never need
//!   durability across a crash).
//! - kube-apiserver on `127.0.0.1:<free port>` with `--authorization-mode=Node,RBAC` (the
//!   authorizers a production cluster runs, so RBAC tests mean something), client-certificate
//!   authentication against the test CA, service-account tokens signed with a fresh key, and a
//!   serving certificate valid for 127.0.0.1, localhost, 10.0.2.2 (a qemu guest with user
//!   networking reaches the host's loopback there) and the `kubernetes` service IP.
//! - kube-controller-manager (started once the apiserver is ready: it gives up if the apiserver
//!   does not answer within 10 s of its own start) with its own identity
//!   (`system:kube-controller-manager`), per-controller service-account credentials as kubeadm
//!   configures it, `--leader-elect=false`, and the controllers in [`DEFAULT_CONTROLLERS`].
//!
//! Every process runs in its own process group, with `PR_SET_PDEATHSIG` tied to a thread owned by
//! the [`ControlPlane`] (see [`process`]), and has its output in `<dir>/logs/<name>.log`; the tails
//! of those logs are part of every startup error.
pub mod kubeconfig;
pub mod pki;
pub mod process;

use std::{
    env, fs,
    net::{IpAddr, Ipv4Addr, TcpListener},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::{Namespace, ServiceAccount},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use tracing::{debug, info, warn};

use self::{
    kubeconfig::Credentials,
    pki::Pki,
    process::{ManagedProcess, Spawner, describe_exit},
};

/// The Kubernetes release the harness is built and tested against.
pub const K8S_VERSION: &str = "v1.36.3";
/// The etcd release paired with it.
pub const ETCD_VERSION: &str = "v3.6.16";
/// What to run when the binaries are missing.
pub const SETUP_COMMAND: &str = "scripts/setup.sh --with-control-plane";
/// The binaries the harness needs, all in one directory.
pub const BINARIES: [&str; 3] = ["etcd", "kube-apiserver", "kube-controller-manager"];

/// Controllers kube-controller-manager runs by default: the ones node-monitor's behaviour depends on
/// (PDBs, node lifecycle and taint-based eviction, workload controllers, garbage collection, pod GC)
/// and the ones that make namespaces usable (service accounts and their tokens, the root CA
/// ConfigMap, namespace deletion, the aggregated `admin`/`edit`/`view` roles).
pub const DEFAULT_CONTROLLERS: &[&str] = &[
    "disruption-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "replicaset-controller",
    "deployment-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "garbage-collector-controller",
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "namespace-controller",
    "pod-garbage-collector-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "endpointslice-controller",
];

/// Errors of the control-plane harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no control-plane binaries: KUBEBUILDER_ASSETS is unset and {path} does not exist; \
         run `{SETUP_COMMAND}` (or point KUBEBUILDER_ASSETS at a directory holding {BINARIES:?})"
    )]
    NoAssets { path: PathBuf },
    #[error(
        "control-plane binary {name} is missing or not executable in {dir} (from {origin}); \
         run `{SETUP_COMMAND}`"
    )]
    MissingBinary {
        name: &'static str,
        dir: PathBuf,
        origin: &'static str,
    },
    #[error("generate the {what}")]
    Certificate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reserve a free loopback port")]
    Port(#[source] std::io::Error),
    #[error("spawn {name}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} exited during startup with {status}; logs:\n{logs}")]
    Exited {
        name: String,
        status: String,
        /// The process could not bind a port another process took after it was reserved.
        port_conflict: bool,
        logs: String,
    },
    #[error("the control plane is not ready after {timeout:?}: {waiting_for}; logs:\n{logs}")]
    Timeout {
        timeout: Duration,
        waiting_for: String,
        logs: String,
    },
    #[error("load kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("invalid URL {url}")]
    InvalidUrl {
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("build a client for {server}")]
    Client {
        server: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("the token request for {namespace}/{name} returned no token")]
    NoToken { namespace: String, name: String },
    #[error("stop {name}")]
    Stop {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error and its causes, one per line: what tests print when they fail.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str("\n  caused by: ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// How to start the control plane. Extra arguments are appended after the harness's own, so a
/// repeated flag overrides the default (pflag keeps the last value of a scalar flag).
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// Where the binaries are; `None`: `KUBEBUILDER_ASSETS`, then the setup script's cache.
    pub assets_dir: Option<PathBuf>,
    /// Work directory (certificates, kubeconfigs, etcd data, logs). `None`: a temporary directory
    /// removed on stop. A given directory is kept.
    pub work_dir: Option<PathBuf>,
    /// Bound on the whole startup, readiness checks included.
    pub startup_timeout: Duration,
    /// Start kube-controller-manager.
    pub controller_manager: bool,
    /// kube-controller-manager `--controllers`.
    pub controllers: Vec<String>,
    /// `--service-cluster-ip-range` (the `kubernetes` service gets its first address).
    pub service_cluster_ip_range: String,
    pub etcd_args: Vec<String>,
    pub apiserver_args: Vec<String>,
    pub controller_manager_args: Vec<String>,
    /// A kube-scheduler binary to start once the apiserver is ready (the real-node tier, whose
    /// DaemonSet and test pods are scheduled as on any cluster; `cargo xtask build node` builds it).
    /// `None`: no scheduler (the stand-in binds its own pods).
    pub scheduler: Option<PathBuf>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            assets_dir: None,
            work_dir: None,
            startup_timeout: Duration::from_secs(120),
            controller_manager: true,
            controllers: DEFAULT_CONTROLLERS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            service_cluster_ip_range: "10.0.0.0/24".to_owned(),
            etcd_args: Vec::new(),
            apiserver_args: Vec::new(),
            controller_manager_args: Vec::new(),
            scheduler: None,
        }
    }
}

impl ControlPlaneOptions {
    /// Adds a kube-apiserver flag (`--name=value`).
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// Adds a kube-controller-manager flag (`--name=value`).
    pub fn controller_manager_arg(mut self, arg: impl Into<String>) -> Self {
        self.controller_manager_args.push(arg.into());
        self
    }

    /// Scales node-failure handling down for failover tests: the node lifecycle controller checks
    /// every second and declares a node whose lease stopped `grace` ago unreachable
    /// (`--node-monitor-period`, `--node-monitor-grace-period`, `--node-startup-grace-period`);
    /// pods get `not-ready`/`unreachable` tolerations of `toleration` instead of 300 s from the
    /// DefaultTolerationSeconds admission plugin, so taint-based eviction follows after that.
    pub fn fast_node_failover(self, grace: Duration, toleration: Duration) -> Self {
        let g = grace.as_secs().max(1);
        let t = toleration.as_secs();
        self.controller_manager_arg("--node-monitor-period=1s")
            .controller_manager_arg(format!("--node-monitor-grace-period={g}s"))
            .controller_manager_arg(format!("--node-startup-grace-period={g}s"))
            .apiserver_arg(format!("--default-not-ready-toleration-seconds={t}"))
            .apiserver_arg(format!("--default-unreachable-toleration-seconds={t}"))
    }
}

/// Creates `object`; one that already exists (409) is left as it is.
async fn create_if_absent<K>(api: &Api<K>, object: &K, action: String) -> Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(source) => Err(Error::Api { action, source }),
    }
}

/// Finds the directory holding [`BINARIES`]: `override_dir`, else `KUBEBUILDER_ASSETS`, else
/// `$NODE_MONITOR_CACHE` / `$XDG_CACHE_HOME/node-monitor` / `~/.cache/node-monitor` +
/// `control-plane/current` (the symlink the setup script makes).
pub fn assets_dir(override_dir: Option<&Path>) -> Result<PathBuf> {
    let (dir, origin) = if let Some(d) = override_dir {
        (d.to_owned(), "ControlPlaneOptions::assets_dir")
    } else if let Some(d) = env::var_os("KUBEBUILDER_ASSETS").filter(|v| !v.is_empty()) {
        (PathBuf::from(d), "KUBEBUILDER_ASSETS")
    } else {
        let cache = env::var_os("NODE_MONITOR_CACHE")
            .map(PathBuf::from)
            .or_else(|| {
                env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("node-monitor"))
            })
            .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/node-monitor")))
            .unwrap_or_else(|| PathBuf::from("/root/.cache/node-monitor"));
        let path = cache.join("control-plane/current");
        if !path.exists() {
            return Err(Error::NoAssets { path });
        }
        (path, "the setup script's cache")
    };
    for name in BINARIES {
        if !is_executable(&dir.join(name)) {
            return Err(Error::MissingBinary { name, dir, origin });
        }
    }
    Ok(dir)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first host address of an IPv4 CIDR: the address the apiserver gives the `kubernetes`
/// service (`pkg/controlplane/services.go`, `ServiceIPRange`).
pub fn first_service_ip(cidr: &str) -> Option<Ipv4Addr> {
    let (addr, len) = cidr.split_once('/')?;
    let addr: Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    if len > 30 {
        return None;
    }
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Some(Ipv4Addr::from((u32::from(addr) & mask) + 1))
}

enum WorkDir {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl WorkDir {
    fn path(&self) -> &Path {
        match self {
            Self::Temp(t) => t.path(),
            Self::Kept(p) => p,
        }
    }
}

/// A running control plane. Dropping it (also while a test panics) or [`ControlPlane::stop`]
/// terminates every process it started, waits for them and removes the temporary directory.
pub struct ControlPlane {
    processes: Vec<ManagedProcess>,
    /// kube-apiserver's program and flags, to start it again after [`ControlPlane::stop_apiserver`].
    apiserver_command: Option<(PathBuf, Vec<std::ffi::OsString>)>,
    spawner: Option<Spawner>,
    pki: Pki,
    server: String,
    port: u16,
    controller_manager_port: Option<u16>,
    service_ip: Ipv4Addr,
    admin_kubeconfig: PathBuf,
    guest_kubeconfig: PathBuf,
    config: kube::Config,
    client: Client,
    // Last: removed after the processes that use it are gone.
    dir: Option<WorkDir>,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and (unless disabled) kube-controller-manager and waits until
    /// the apiserver's `/readyz` is `ok`, the `default` namespace exists, the controller manager's
    /// `/healthz` is `ok` and its service-account controller has made `default/default`.
    pub async fn start(opts: ControlPlaneOptions) -> Result<ControlPlane> {
        let assets = assets_dir(opts.assets_dir.as_deref())?;
        let mut attempt = 1;
        loop {
            match Self::start_once(&opts, &assets).await {
                Err(Error::Exited {
                    port_conflict: true,
                    name,
                    ..
                }) if attempt < 3 => {
                    warn!(%name, attempt, "a reserved port was taken meanwhile; starting again");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(opts: &ControlPlaneOptions, assets: &Path) -> Result<ControlPlane> {
        let started = Instant::now();
        let deadline = started + opts.startup_timeout;
        let dir = match &opts.work_dir {
            Some(p) => {
                fs::create_dir_all(p).map_err(io_err("create", p))?;
                WorkDir::Kept(p.clone())
            }
            None => WorkDir::Temp(
                tempfile::Builder::new()
                    .prefix("nm-control-plane-")
                    .tempdir()
                    .map_err(io_err("create a temporary directory in", &env::temp_dir()))?,
            ),
        };
        let d = dir.path().to_owned();
        for sub in ["logs", "pki", "etcd"] {
            fs::create_dir_all(d.join(sub)).map_err(io_err("create", &d.join(sub)))?;
        }

        let service_ip = first_service_ip(&opts.service_cluster_ip_range).unwrap_or_else(|| {
            warn!(range = %opts.service_cluster_ip_range, "not an IPv4 CIDR; assuming 10.0.0.1");
            Ipv4Addr::new(10, 0, 0, 1)
        });
        let [etcd_client, etcd_peer, port, kcm_port] = free_ports::<4>()?;
        let server = format!("https://127.0.0.1:{port}");

        let pki = Pki::new().map_err(cert_err("CA"))?;
        let files = PkiFiles::write(&pki, &d.join("pki"), service_ip)?;
        let admin = pki
            .client("node-monitor-admin", Some("system:masters"))
            .map_err(cert_err("admin client certificate"))?;
        let admin_creds = Credentials::ClientCert {
            cert_pem: &admin.cert_pem,
            key_pem: &admin.key_pem,
        };
        let admin_kubeconfig = d.join("admin.kubeconfig");
        let admin_text = kubeconfig::render(&server, pki.ca_pem(), "admin", &admin_creds);
        write(&admin_kubeconfig, &admin_text)?;
        let guest_kubeconfig = d.join("admin-guest.kubeconfig");
        write(
            &guest_kubeconfig,
            &kubeconfig::render(
                &format!("https://10.0.2.2:{port}"),
                pki.ca_pem(),
                "admin",
                &admin_creds,
            ),
        )?;
        let kcm_client = pki
            .client("system:kube-controller-manager", None)
            .map_err(cert_err("controller-manager client certificate"))?;
        let kcm_kubeconfig = d.join("controller-manager.kubeconfig");
        write(
            &kcm_kubeconfig,
            &kubeconfig::render(
                &server,
                pki.ca_pem(),
                "system:kube-controller-manager",
                &Credentials::ClientCert {
                    cert_pem: &kcm_client.cert_pem,
                    key_pem: &kcm_client.key_pem,
                },
            ),
        )?;

        let config = config_from_text(&admin_text, &admin_kubeconfig).await?;
        let client = Client::try_from(config.clone()).map_err(|source| Error::Client {
            server: server.clone(),
            source,
        })?;
        let spawner = Spawner::new("nm-control-plane").map_err(|source| Error::Spawn {
            name: "the spawner thread".to_owned(),
            source,
        })?;
        let mut cp = ControlPlane {
            processes: Vec::new(),
            apiserver_command: None,
            spawner: Some(spawner),
            pki,
            server,
            port,
            controller_manager_port: opts.controller_manager.then_some(kcm_port),
            service_ip,
            admin_kubeconfig,
            guest_kubeconfig,
            config,
            client,
            dir: Some(dir),
        };

        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd = etcd_command(assets, &d, &etcd_url, &peer_url, opts);
        cp.spawn("etcd", etcd)?;

        let apiserver = apiserver_command(assets, &d, &files, port, &etcd_url, opts);
        cp.apiserver_command = Some((
            PathBuf::from(apiserver.get_program()),
            apiserver.get_args().map(ToOwned::to_owned).collect(),
        ));
        cp.spawn("kube-apiserver", apiserver)?;

        cp.wait_apiserver_ready(deadline, started).await?;
        cp.wait_for("the default namespace", deadline, started, |cp| {
            let api: Api<Namespace> = Api::all(cp.client.clone());
            async move { matches!(api.get_opt("default").await, Ok(Some(_))) }
        })
        .await?;

        if opts.controller_manager {
            let kcm =
                controller_manager_command(assets, &d, &files, &kcm_kubeconfig, kcm_port, opts);
            cp.spawn("kube-controller-manager", kcm)?;

            cp.wait_controller_manager(kcm_port, deadline, started)
                .await?;
        }
        if let Some(bin) = &opts.scheduler {
            // Serving on a port of its own, which nothing scrapes; the admin identity spares
            // the scheduler's own certificate.
            let [sched_port] = free_ports::<1>()?;
            let kc = cp.admin_kubeconfig.display().to_string();
            let mut sched = Command::new(bin);
            sched.args([
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={sched_port}"),
                format!("--cert-dir={}", d.join("pki/scheduler").display()),
                "--leader-elect=false".to_owned(),
                "--v=1".to_owned(),
            ]);
            cp.spawn("kube-scheduler", sched)?;
        }
        info!(
            server = %cp.server,
            kubeconfig = %cp.admin_kubeconfig.display(),
            elapsed_ms = started.elapsed().as_millis(),
            "control plane ready"
        );
        Ok(cp)
    }

    /// Waits until kube-controller-manager answers its `/healthz` and its serviceaccount
    /// controller created `default/default`.
    async fn wait_controller_manager(
        &mut self,
        kcm_port: u16,
        deadline: Instant,
        started: Instant,
    ) -> Result<()> {
        let mut kcm_config = self.config.clone();
        let kcm_url = format!("https://127.0.0.1:{kcm_port}");
        kcm_config.cluster_url = kcm_url.parse().map_err(|source| Error::InvalidUrl {
            url: kcm_url.clone(),
            source,
        })?;
        let kcm_client = Client::try_from(kcm_config).map_err(|source| Error::Client {
            server: format!("https://127.0.0.1:{kcm_port}"),
            source,
        })?;
        self.wait_for(
            "kube-controller-manager /healthz",
            deadline,
            started,
            |_| {
                let client = kcm_client.clone();
                async move {
                    get_text(&client, "/healthz")
                        .await
                        .is_some_and(|t| t == "ok")
                }
            },
        )
        .await?;
        self.wait_for(
            "the ServiceAccount default/default (serviceaccount controller)",
            deadline,
            started,
            |cp| {
                let api: Api<ServiceAccount> = Api::namespaced(cp.client.clone(), "default");
                async move { matches!(api.get_opt("default").await, Ok(Some(_))) }
            },
        )
        .await?;
        Ok(())
    }

    fn spawn(&mut self, name: &str, cmd: Command) -> Result<()> {
        let dir = self.dir().to_owned();
        let log = dir.join("logs").join(format!("{name}.log"));
        let spawner = self.spawner.as_ref().ok_or_else(|| Error::Spawn {
            name: name.to_owned(),
            source: std::io::Error::other("the control plane is stopped"),
        })?;
        let p = ManagedProcess::spawn(spawner, name, cmd, &log).map_err(|source| Error::Spawn {
            name: name.to_owned(),
            source,
        })?;
        debug!(name, pid = p.pid(), log = %log.display(), "started");
        self.processes.push(p);
        Ok(())
    }

    /// Waits until kube-apiserver answers `/readyz` with `ok`.
    async fn wait_apiserver_ready(&mut self, deadline: Instant, started: Instant) -> Result<()> {
        self.wait_for("kube-apiserver /readyz", deadline, started, |cp| {
            let client = cp.client.clone();
            async move {
                get_text(&client, "/readyz")
                    .await
                    .is_some_and(|t| t == "ok")
            }
        })
        .await
    }

    /// Polls `check` until it holds, failing early when a process exits and at `deadline`.
    async fn wait_for<F, Fut>(
        &mut self,
        what: &str,
        deadline: Instant,
        started: Instant,
        check: F,
    ) -> Result<()>
    where
        F: Fn(&ControlPlane) -> Fut,
        Fut: Future<Output = bool>,
    {
        loop {
            self.check_alive()?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let attempt = tokio::time::timeout(remaining.min(Duration::from_secs(5)), check(self));
            if attempt.await.unwrap_or(false) {
                debug!(what, elapsed_ms = started.elapsed().as_millis(), "ready");
                return Ok(());
            }
            if Instant::now() >= deadline {
                let logs = self.logs_tail(40);
                eprintln!("control plane not ready: {what}\n{logs}");
                return Err(Error::Timeout {
                    timeout: deadline - started,
                    waiting_for: what.to_owned(),
                    logs,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails with the process's log when one of the processes has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for i in 0..self.processes.len() {
            let status = self.processes[i].exited().map_err(|source| Error::Stop {
                name: self.processes[i].name().to_owned(),
                source,
            })?;
            if let Some(status) = status {
                let p = &self.processes[i];
                let own = p.log_tail(60);
                let port_conflict = own.contains("address already in use");
                let logs = self.logs_tail(40);
                eprintln!("{} exited with {}\n{logs}", p.name(), describe_exit(status));
                return Err(Error::Exited {
                    name: p.name().to_owned(),
                    status: describe_exit(status),
                    port_conflict,
                    logs,
                });
            }
        }
        Ok(())
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The apiserver's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The apiserver as a qemu guest with user networking reaches it: `https://10.0.2.2:<port>`.
    pub fn guest_server(&self) -> String {
        format!("https://10.0.2.2:{}", self.port)
    }

    /// kube-controller-manager's secure port on 127.0.0.1, when it runs.
    pub fn controller_manager_port(&self) -> Option<u16> {
        self.controller_manager_port
    }

    /// The `kubernetes` service's cluster IP (one of the serving certificate's SANs).
    pub fn service_ip(&self) -> Ipv4Addr {
        self.service_ip
    }

    /// A kubeconfig for a cluster admin (`system:masters`), credentials embedded.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The same admin kubeconfig with the server at [`ControlPlane::guest_server`].
    pub fn guest_kubeconfig_path(&self) -> &Path {
        &self.guest_kubeconfig
    }

    /// The cluster CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        self.pki.ca_pem()
    }

    /// The cluster CA certificate file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir().join("pki/ca.crt")
    }

    /// The work directory (certificates, kubeconfigs, etcd data, `logs/`).
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), WorkDir::path)
    }

    /// The admin client configuration, with kube's automatic retries of 429/503/504 turned off:
    /// a test must see a PDB's 429 at once, not after minutes of hidden retries.
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// An admin client (see [`ControlPlane::config`]), bound to the tokio runtime that started the
    /// control plane.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The API server's own `/metrics` (request counts, sizes, latencies, watchers), or `None`
    /// when it does not answer.
    pub async fn apiserver_metrics(&self) -> Option<String> {
        get_text(&self.client, "/metrics").await
    }

    /// The processes' names and pids, in start order.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.processes
            .iter()
            .map(|p| (p.name().to_owned(), p.pid()))
            .collect()
    }

    /// The processes' log files.
    pub fn log_paths(&self) -> Vec<(String, PathBuf)> {
        self.processes
            .iter()
            .map(|p| (p.name().to_owned(), p.log_path().to_owned()))
            .collect()
    }

    /// The last `lines` lines of every process's log, each under a header.
    pub fn logs_tail(&self, lines: usize) -> String {
        self.processes
            .iter()
            .map(|p| {
                format!(
                    "----- {} ({}) -----\n{}",
                    p.name(),
                    p.log_path().display(),
                    p.log_tail(lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Writes a kubeconfig for a client certificate of `user` in `group` (e.g.
    /// `system:node:<name>` in `system:nodes`, which the Node authorizer recognises) and returns
    /// its path.
    pub fn user_kubeconfig(&self, user: &str, group: Option<&str>) -> Result<PathBuf> {
        let cert = self
            .pki
            .client(user, group)
            .map_err(cert_err("user client certificate"))?;
        let path = self
            .dir()
            .join(format!("user-{}.kubeconfig", sanitize(user)));
        write(
            &path,
            &kubeconfig::render(
                &self.server,
                self.pki.ca_pem(),
                user,
                &Credentials::ClientCert {
                    cert_pem: &cert.cert_pem,
                    key_pem: &cert.key_pem,
                },
            ),
        )?;
        Ok(path)
    }

    /// A kubeconfig named `name` whose user authenticates through an exec credential plugin
    /// (`/bin/cat` of an `ExecCredential` holding `token`), as managed clouds' kubeconfigs do;
    /// returns its path.
    pub fn exec_kubeconfig(&self, name: &str, token: &str) -> Result<PathBuf> {
        let credential = self.dir().join(format!("exec-{}.json", sanitize(name)));
        write(
            &credential,
            &serde_json::json!({
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": {"token": token},
            })
            .to_string(),
        )?;
        let credential = credential.to_string_lossy().into_owned();
        let path = self
            .dir()
            .join(format!("exec-{}.kubeconfig", sanitize(name)));
        write(
            &path,
            &kubeconfig::render(
                &self.server,
                self.pki.ca_pem(),
                name,
                &Credentials::Exec {
                    command: "/bin/cat",
                    args: &[&credential],
                },
            ),
        )?;
        Ok(path)
    }

    /// A 10-minute token of the existing ServiceAccount `namespace/name` for `audience`
    /// (TokenRequest, as the admin): what `kubectl node-monitor` mints for the agents.
    pub async fn audience_token(
        &self,
        namespace: &str,
        name: &str,
        audience: &str,
    ) -> Result<String> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec![audience.to_owned()]),
                expiration_seconds: Some(600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        api.create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(|source| Error::Api {
                action: format!("request a {audience} token for ServiceAccount {namespace}/{name}"),
                source,
            })?
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Error::NoToken {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
    }

    /// Creates the ServiceAccount `namespace/name` if it does not exist, requests a one-hour token
    /// for it (TokenRequest API) and writes a kubeconfig using that token; returns its path.
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        let action = |what: &str| format!("{what} ServiceAccount {namespace}/{name}");
        let exists = api.get_opt(name).await.map_err(|source| Error::Api {
            action: action("get"),
            source,
        })?;
        if exists.is_none() {
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            };
            create_if_absent(&api, &sa, action("create")).await?;
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let answer = api
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(|source| Error::Api {
                action: action("request a token for"),
                source,
            })?;
        let token = answer
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Error::NoToken {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })?;
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let path = self.dir().join(format!(
            "sa-{}-{}.kubeconfig",
            sanitize(namespace),
            sanitize(name)
        ));
        write(
            &path,
            &kubeconfig::render(
                &self.server,
                self.pki.ca_pem(),
                &user,
                &Credentials::Token(&token),
            ),
        )?;
        Ok(path)
    }

    /// A client authenticated as the ServiceAccount `namespace/name` (made if missing).
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> Result<Client> {
        let path = self.service_account_kubeconfig(namespace, name).await?;
        client_from_kubeconfig(&path).await
    }

    /// Creates namespace `name` and waits (up to 60 s) until its `default` ServiceAccount exists:
    /// until then the ServiceAccount admission plugin rejects pods in it.
    pub async fn create_namespace(&self, name: &str) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        create_if_absent(&api, &ns, format!("create namespace {name}")).await?;
        let sas: Api<ServiceAccount> = Api::namespaced(self.client(), name);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match sas.get_opt("default").await {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(None) => {
                    return Err(Error::Timeout {
                        timeout: Duration::from_secs(60),
                        waiting_for: format!("the ServiceAccount {name}/default"),
                        logs: self.logs_tail(20),
                    });
                }
                Err(source) => {
                    return Err(Error::Api {
                        action: format!("get ServiceAccount {name}/default"),
                        source,
                    });
                }
            }
        }
    }

    /// Stops kube-apiserver alone (SIGTERM, SIGKILL after 5 s); etcd and the controller manager
    /// keep running. For clients that must survive an unreachable API server.
    pub fn stop_apiserver(&mut self) -> Result<()> {
        let idx = self
            .processes
            .iter()
            .position(|p| p.name() == "kube-apiserver")
            .ok_or_else(|| Error::Spawn {
                name: "kube-apiserver".to_owned(),
                source: std::io::Error::other("kube-apiserver is not running"),
            })?;
        let mut p = self.processes.remove(idx);
        p.terminate(Duration::from_secs(5))
            .map_err(|source| Error::Spawn {
                name: "kube-apiserver".to_owned(),
                source,
            })?;
        info!("kube-apiserver stopped");
        Ok(())
    }

    /// Starts kube-apiserver again with the same flags (port, certificates, etcd) and waits for
    /// its `/readyz`.
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        let (program, args) = self.apiserver_command.clone().ok_or_else(|| Error::Spawn {
            name: "kube-apiserver".to_owned(),
            source: std::io::Error::other("the control plane never started kube-apiserver"),
        })?;
        let mut cmd = Command::new(program);
        cmd.args(args);
        self.spawn("kube-apiserver", cmd)?;
        let started = Instant::now();
        self.wait_apiserver_ready(started + Duration::from_secs(60), started)
            .await?;
        info!(
            elapsed_ms = started.elapsed().as_millis(),
            "kube-apiserver restarted"
        );
        Ok(())
    }

    /// Terminates every process (SIGTERM to its process group, SIGKILL after 5 s), newest first,
    /// waits for them and removes the temporary work directory.
    pub fn stop(mut self) -> Result<()> {
        let mut first_err = self.shutdown();
        if let Some(WorkDir::Temp(t)) = self.dir.take() {
            let path = t.path().to_owned();
            if let Err(source) = t.close()
                && first_err.is_none()
            {
                first_err = Some(Error::Io {
                    action: "remove",
                    path,
                    source,
                });
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn shutdown(&mut self) -> Option<Error> {
        let mut first_err = None;
        while let Some(mut p) = self.processes.pop() {
            match p.terminate(Duration::from_secs(5)) {
                Ok(status) => debug!(name = p.name(), status = %describe_exit(status), "stopped"),
                Err(source) => {
                    warn!(name = p.name(), error = %source, "stop failed");
                    first_err.get_or_insert(Error::Stop {
                        name: p.name().to_owned(),
                        source,
                    });
                }
            }
        }
        // Joins the spawner thread; nothing it spawned is alive any more.
        self.spawner.take();
        first_err
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(e) = self.shutdown() {
            eprintln!("stopping the control plane: {}", error_chain(&e));
        }
    }
}

/// A client for a kubeconfig file, with kube's automatic retries off (see
/// [`ControlPlane::config`]).
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client> {
    let text = fs::read_to_string(path).map_err(io_err("read", path))?;
    let config = config_from_text(&text, path).await?;
    let server = config.cluster_url.to_string();
    Client::try_from(config).map_err(|source| Error::Client { server, source })
}

async fn config_from_text(text: &str, path: &Path) -> Result<kube::Config> {
    let kc_err = |source| Error::Kubeconfig {
        path: path.to_owned(),
        source,
    };
    let kc = Kubeconfig::from_yaml(text).map_err(kc_err)?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(kc_err)?;
    config.default_retry = false;
    Ok(config)
}

async fn get_text(client: &Client, path: &str) -> Option<String> {
    let req = http::Request::get(path).body(Vec::new()).ok()?;
    client.request_text(req).await.ok()
}

/// Certificates and keys on disk, as the processes' flags name them.
struct PkiFiles {
    ca: PathBuf,
    apiserver_cert: PathBuf,
    apiserver_key: PathBuf,
    kcm_cert: PathBuf,
    kcm_key: PathBuf,
    sa_key: PathBuf,
    sa_pub: PathBuf,
}

impl PkiFiles {
    fn write(pki: &Pki, dir: &Path, service_ip: Ipv4Addr) -> Result<Self> {
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        // A qemu guest with user networking reaches the host's loopback at 10.0.2.2.
        let guest_gateway = IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2));
        let apiserver = pki
            .serving(
                "kube-apiserver",
                &[
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
                &[loopback, guest_gateway, IpAddr::V4(service_ip)],
            )
            .map_err(cert_err("apiserver serving certificate"))?;
        let kcm = pki
            .serving("kube-controller-manager", &["localhost"], &[loopback])
            .map_err(cert_err("controller-manager serving certificate"))?;
        let sa = pki::service_account_key().map_err(cert_err("service-account signing key"))?;
        let files = Self {
            ca: dir.join("ca.crt"),
            apiserver_cert: dir.join("apiserver.crt"),
            apiserver_key: dir.join("apiserver.key"),
            kcm_cert: dir.join("controller-manager.crt"),
            kcm_key: dir.join("controller-manager.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
        };
        write(&files.ca, pki.ca_pem())?;
        write(&files.apiserver_cert, &apiserver.cert_pem)?;
        write(&files.apiserver_key, &apiserver.key_pem)?;
        write(&files.kcm_cert, &kcm.cert_pem)?;
        write(&files.kcm_key, &kcm.key_pem)?;
        write(&files.sa_key, &sa.key_pem)?;
        write(&files.sa_pub, &sa.cert_pem)?;
        Ok(files)
    }
}

/// `N` distinct free loopback ports (etcd client and peer, apiserver, controller manager; the
/// scheduler). They are released before the processes bind them, so another process may take one
/// meanwhile; the caller retries the start when a process then fails with `address already in use`.
fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(Error::Port)?;
    let mut ports = [0u16; N];
    for (slot, l) in ports.iter_mut().zip(&listeners) {
        *slot = l.local_addr().map_err(Error::Port)?.port();
    }
    Ok(ports)
}

fn write(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    // Keys and tokens: owner-only.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))?;
    f.write_all(text.as_bytes()).map_err(io_err("write", path))
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}

fn cert_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Certificate { what, source }
}

/// etcd for the control plane: its data in `d/etcd`, no fsync.
fn etcd_command(
    assets: &Path,
    d: &Path,
    etcd_url: &str,
    peer_url: &str,
    opts: &ControlPlaneOptions,
) -> Command {
    let mut etcd = Command::new(assets.join("etcd"));
    etcd.args([
        "--name=default".to_owned(),
        format!("--data-dir={}", d.join("etcd").display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=default={peer_url}"),
        "--initial-cluster-state=new".to_owned(),
        "--unsafe-no-fsync=true".to_owned(),
        "--log-level=warn".to_owned(),
    ])
    .args(&opts.etcd_args);
    etcd
}

/// kube-apiserver on `port`, with RBAC and the Node authorizer, the test PKI and etcd at
/// `etcd_url`.
fn apiserver_command(
    assets: &Path,
    d: &Path,
    files: &PkiFiles,
    port: u16,
    etcd_url: &str,
    opts: &ControlPlaneOptions,
) -> Command {
    let mut apiserver = Command::new(assets.join("kube-apiserver"));
    apiserver
        .args([
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            "--advertise-address=127.0.0.1".to_owned(),
            // The `kubernetes` Endpoints would name a loopback address, which validation
            // rejects; nothing in the tests reaches the apiserver through the service.
            "--endpoint-reconciler-type=none".to_owned(),
            format!("--cert-dir={}", d.join("pki").display()),
            format!("--tls-cert-file={}", files.apiserver_cert.display()),
            format!("--tls-private-key-file={}", files.apiserver_key.display()),
            format!("--client-ca-file={}", files.ca.display()),
            // Published in kube-system/extension-apiserver-authentication, where the controller
            // manager's delegated authentication expects a request-header CA. No front proxy
            // certificate is ever issued, so the headers are never trusted.
            format!("--requestheader-client-ca-file={}", files.ca.display()),
            "--requestheader-allowed-names=front-proxy-client".to_owned(),
            "--requestheader-username-headers=X-Remote-User".to_owned(),
            "--requestheader-group-headers=X-Remote-Group".to_owned(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", files.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                files.sa_key.display()
            ),
            format!(
                "--service-cluster-ip-range={}",
                opts.service_cluster_ip_range
            ),
            "--allow-privileged=true".to_owned(),
            "--profiling=false".to_owned(),
            "--v=1".to_owned(),
        ])
        .args(&opts.apiserver_args);
    apiserver
}

/// kube-controller-manager on `kcm_port`, with the controllers of `opts`.
fn controller_manager_command(
    assets: &Path,
    d: &Path,
    files: &PkiFiles,
    kcm_kubeconfig: &Path,
    kcm_port: u16,
    opts: &ControlPlaneOptions,
) -> Command {
    let mut kcm = Command::new(assets.join("kube-controller-manager"));
    kcm.args([
        format!("--kubeconfig={}", kcm_kubeconfig.display()),
        format!("--authentication-kubeconfig={}", kcm_kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kcm_kubeconfig.display()),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={kcm_port}"),
        format!("--cert-dir={}", d.join("pki").display()),
        format!("--tls-cert-file={}", files.kcm_cert.display()),
        format!("--tls-private-key-file={}", files.kcm_key.display()),
        format!("--client-ca-file={}", files.ca.display()),
        "--leader-elect=false".to_owned(),
        format!("--controllers={}", opts.controllers.join(",")),
        "--use-service-account-credentials=true".to_owned(),
        format!(
            "--service-account-private-key-file={}",
            files.sa_key.display()
        ),
        format!("--root-ca-file={}", files.ca.display()),
        format!(
            "--service-cluster-ip-range={}",
            opts.service_cluster_ip_range
        ),
        "--cluster-name=node-monitor-test".to_owned(),
        "--v=1".to_owned(),
    ])
    .args(&opts.controller_manager_args);
    kcm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_service_ip_is_the_network_plus_one() {
        let cases = [
            ("10.0.0.0/24", Some(Ipv4Addr::new(10, 0, 0, 1))),
            ("10.96.0.0/12", Some(Ipv4Addr::new(10, 96, 0, 1))),
            ("10.96.7.9/16", Some(Ipv4Addr::new(10, 96, 0, 1))),
            ("10.0.0.0/31", None),
            ("fd00::/108", None),
            ("10.0.0.0", None),
        ];
        for (cidr, want) in cases {
            assert_eq!(first_service_ip(cidr), want, "{cidr}");
        }
    }

    #[test]
    fn missing_assets_name_the_setup_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = assets_dir(Some(dir.path())).expect_err("an empty directory has no binaries");
        let msg = err.to_string();
        assert!(msg.contains("etcd"), "{msg}");
        assert!(msg.contains(SETUP_COMMAND), "{msg}");
    }

    #[test]
    fn fast_node_failover_sets_both_sides() {
        let o = ControlPlaneOptions::default()
            .fast_node_failover(Duration::from_secs(6), Duration::from_secs(4));
        assert!(
            o.controller_manager_args
                .contains(&"--node-monitor-grace-period=6s".to_owned())
        );
        assert!(
            o.apiserver_args
                .contains(&"--default-unreachable-toleration-seconds=4".to_owned())
        );
    }

    #[test]
    fn sanitize_keeps_file_names_flat() {
        assert_eq!(sanitize("system:node:a/b"), "system_node_a_b");
    }
}
