//! End-to-end harness: a real control plane, a stand-in kubelet whose pods are real processes in
//! kubelet-layout cgroups under a memory-limited node cgroup, and the real `node-monitor` binary
//! running as that node's agent. Shared by the end-to-end tests, the demo and the benchmarks.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::{
    api::{
        core::v1::{Event, Pod},
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec},
        scheduling::v1::PriorityClass,
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta},
        util::intstr::IntOrString,
    },
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};

use crate::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    pod::PodBuilder,
    standin::{StandIn, StandInConfig},
};

/// A directory of this workspace's target (debug) binaries: `node-monitor`, `nm-workload`, ….
/// `CARGO_TARGET_DIR` is honoured. The test command builds every binary before running tests.
pub fn target_dir() -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    // Benchmarks run the release build with `NODE_MONITOR_PROFILE=release`; tests use the debug one.
    base.join(std::env::var("NODE_MONITOR_PROFILE").unwrap_or_else(|_| "debug".to_owned()))
}

/// Path of a workspace binary, or a failure that says how to build it. The agent alone can come
/// from another profile (`NODE_MONITOR_AGENT_PROFILE=release`): the footprint benchmarks measure
/// the release agent with the debug harness.
pub fn binary(name: &str) -> PathBuf {
    let agent_profile = std::env::var("NODE_MONITOR_AGENT_PROFILE").ok();
    let p = match agent_profile {
        Some(profile) if name == "node-monitor" => target_dir()
            .parent()
            .map_or_else(|| PathBuf::from(&profile), |t| t.join(&profile))
            .join(name),
        _ => target_dir().join(name),
    };
    assert!(
        p.is_file(),
        "{} is missing: build the binaries first (`cargo bins`, as scripts/test.sh does)",
        p.display()
    );
    p
}

/// A control plane plus one stand-in node.
pub struct Cluster {
    pub cp: ControlPlane,
    pub standin: Option<StandIn>,
    pub node: String,
    /// The node cgroup relative to the hierarchy roots (`node-monitor-test/<node>-<pid>`).
    pub node_cgroup: PathBuf,
}

impl Cluster {
    /// Starts the control plane and a stand-in node with `memory` bytes (the node cgroup's limit).
    pub async fn start(node: &str, memory: u64) -> Result<Cluster> {
        Self::start_with(node, memory, |cfg| cfg).await
    }

    /// [`Cluster::start`], with the stand-in's configuration adjusted by `adjust` (its node IP,
    /// which is also every pod's IP, for instance).
    pub async fn start_with(
        node: &str,
        memory: u64,
        adjust: impl FnOnce(StandInConfig) -> StandInConfig,
    ) -> Result<Cluster> {
        crate::cgroup::require_root("the end-to-end tier");
        let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
        let node_cgroup = PathBuf::from(format!("node-monitor-test/{node}-{}", std::process::id()));
        let cfg = adjust(StandInConfig::new(node, &node_cgroup).memory(memory));
        let standin = StandIn::start(cp.client(), cfg).await?;
        standin.wait_ready(Duration::from_secs(60)).await?;
        Ok(Cluster {
            cp,
            standin: Some(standin),
            node: node.to_owned(),
            node_cgroup,
        })
    }

    pub fn client(&self) -> Client {
        self.cp.client()
    }

    pub fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client(), ns)
    }

    /// The node cgroup's directory in the memory hierarchy.
    pub fn node_memory_dir(&self) -> PathBuf {
        Path::new(crate::cgroup::MEMORY_V1).join(&self.node_cgroup)
    }

    /// memory.available of the node cgroup as the kubelet computes it (capacity − working set),
    /// read directly from the cgroup files: the ground truth the agent is measured against.
    pub fn memory_available(&self) -> Result<i64> {
        let dir = self.node_memory_dir();
        let read = |f: &str| -> Result<String> {
            fs::read_to_string(dir.join(f)).with_context(|| format!("{}/{f}", dir.display()))
        };
        let limit: i64 = read("memory.limit_in_bytes")?.trim().parse()?;
        let usage: i64 = read("memory.usage_in_bytes")?.trim().parse()?;
        let stat = read("memory.stat")?;
        let inactive: i64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("total_inactive_file "))
            .context("total_inactive_file")?
            .trim()
            .parse()?;
        Ok(limit - (usage - inactive).max(0))
    }

    /// memory.available once the pods have finished allocating: two reads 500 ms apart within
    /// 4 MiB of each other (a pod reports Running before its process has touched its memory).
    pub async fn settled_memory_available(&self) -> Result<i64> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = self.memory_available()?;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.memory_available()?;
            if (now - last).abs() < 4 << 20 {
                return Ok(now);
            }
            if Instant::now() > deadline {
                bail!("node memory did not settle: {last} then {now} bytes available");
            }
            last = now;
        }
    }

    /// The node cgroup's kernel OOM kills (`oom_kill` in memory.oom_control): a scenario whose
    /// agent reacts in time has none.
    pub fn oom_kills(&self) -> Result<u64> {
        let path = self.node_memory_dir().join("memory.oom_control");
        let text = fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .with_context(|| format!("no oom_kill counter in {}", path.display()))?
            .trim()
            .parse()
            .with_context(|| format!("oom_kill in {}", path.display()))
    }

    pub async fn create_pod(&self, pod: Pod) -> Result<Pod> {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        Ok(self.pods(&ns).create(&PostParams::default(), &pod).await?)
    }

    /// Waits until the pod reports Running (its processes started).
    pub async fn wait_running(&self, ns: &str, name: &str, timeout: Duration) -> Result<Pod> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(p) = self.pods(ns).get_opt(name).await?
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            {
                return Ok(p);
            }
            if Instant::now() > deadline {
                bail!("pod {ns}/{name} not Running after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates the pod and waits (up to 30 s) until it reports Running; returns its name.
    pub async fn run_pod(&self, pod: PodBuilder) -> Result<String> {
        let p = self.create_pod(pod.build()).await?;
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let name = p
            .metadata
            .name
            .clone()
            .context("the created pod has no name")?;
        self.wait_running(ns, &name, Duration::from_secs(30))
            .await?;
        Ok(name)
    }

    /// Waits until the pod is gone from the API; returns when it went, or `None` on timeout.
    pub async fn wait_gone(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<Instant>> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.pods(ns).get_opt(name).await?.is_none() {
                return Ok(Some(Instant::now()));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Is the pod still in the API and not terminating?
    pub async fn is_live(&self, ns: &str, name: &str) -> Result<bool> {
        Ok(self
            .pods(ns)
            .get_opt(name)
            .await?
            .is_some_and(|p| p.metadata.deletion_timestamp.is_none()))
    }

    /// Events whose reason is `reason`, about the object named `name`, in `ns`.
    pub async fn events(&self, ns: &str, name: &str, reason: &str) -> Result<Vec<Event>> {
        let events: Api<Event> = Api::namespaced(self.client(), ns);
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect())
    }

    pub async fn create_priority_class(&self, name: &str, value: i32) -> Result<()> {
        let api: Api<PriorityClass> = Api::all(self.client());
        let pc = PriorityClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            value: Some(value),
            ..Default::default()
        };
        api.create(&PostParams::default(), &pc).await?;
        Ok(())
    }

    /// A PDB over `app=<app>` with `minAvailable`.
    pub async fn create_pdb(&self, ns: &str, app: &str, min_available: i32) -> Result<()> {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client(), ns);
        let pdb = PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(format!("{app}-pdb")),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(min_available)),
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        api.create(&PostParams::default(), &pdb).await?;
        // The disruption controller must have computed the budget before evictions consult it.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let p = api.get(&format!("{app}-pdb")).await?;
            if p.status.as_ref().is_some_and(|s| {
                s.observed_generation.is_some() && s.expected_pods.unwrap_or(0) > 0
            }) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("PDB {app}-pdb was not observed by the disruption controller");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn stop(mut self) -> Result<()> {
        if let Some(s) = self.standin.take() {
            s.stop().await?;
        }
        self.cp.stop()?;
        Ok(())
    }
}

/// The agent binary running as the stand-in node's agent.
pub struct Agent {
    child: Option<Child>,
    pub log_path: PathBuf,
    pub metrics_port: u16,
    /// Its `nodeMonitor.stateDir`: a directory of its own (under its temporary directory unless
    /// given), so that agents share no flight records and none writes the host's
    /// /var/lib/node-monitor.
    pub state_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Agent {
    /// Starts `node-monitor run` for the cluster's node with `config_yaml` and `extra` arguments.
    /// The agent's node cgroup is the stand-in's, so memory.available is the simulated node's.
    pub fn spawn(cluster: &Cluster, config_yaml: &str, extra: &[&str]) -> Result<Agent> {
        Self::spawn_on(cluster, config_yaml, extra, "127.0.0.1")
    }

    /// [`Agent::spawn`], its endpoint listening on `listen` (an IP address) rather than loopback.
    pub fn spawn_on(
        cluster: &Cluster,
        config_yaml: &str,
        extra: &[&str],
        listen: &str,
    ) -> Result<Agent> {
        Self::spawn_in(cluster, config_yaml, extra, listen, None)
    }

    /// [`Agent::spawn_on`] with `state_dir` as its `nodeMonitor.stateDir` (`None`: one of its
    /// own), as a restarted agent finds the previous one's.
    pub fn spawn_in(
        cluster: &Cluster,
        config_yaml: &str,
        extra: &[&str],
        listen: &str,
        state_dir: Option<&Path>,
    ) -> Result<Agent> {
        let dir = tempfile::Builder::new().prefix("nm-agent").tempdir()?;
        let state_dir = state_dir.map_or_else(|| dir.path().join("state"), Path::to_path_buf);
        // First, so that a scenario's own configuration may set it.
        let state = dir.path().join("state.yaml");
        fs::write(
            &state,
            format!("nodeMonitor:\n  stateDir: {}\n", state_dir.display()),
        )?;
        let config = dir.path().join("config.yaml");
        fs::write(&config, config_yaml)?;
        let log_path = dir.path().join("agent.log");
        let log = fs::File::create(&log_path)?;
        let metrics_port = free_port()?;
        let child = Command::new(binary("node-monitor"))
            .arg("run")
            .arg("--config")
            .arg(&state)
            .arg("--config")
            .arg(&config)
            .arg("--kubeconfig")
            .arg(cluster.cp.kubeconfig_path())
            .args(["--node-name", &cluster.node])
            .arg("--node-cgroup")
            .arg(&cluster.node_cgroup)
            .args(["--metrics-addr", &format!("{listen}:{metrics_port}")])
            .args(extra)
            .env("RUST_LOG", "info,node_monitor=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting node-monitor")?;
        Ok(Agent {
            child: Some(child),
            log_path,
            metrics_port,
            state_dir,
            _dir: dir,
        })
    }

    /// [`Agent::spawn`], then waits (up to 30 s) until the agent logs `deciding`: its sources are
    /// up and its decision loop starts.
    pub async fn start(cluster: &Cluster, config_yaml: &str, extra: &[&str]) -> Result<Agent> {
        let mut agent = Agent::spawn(cluster, config_yaml, extra)?;
        agent.wait_log("deciding", Duration::from_secs(30)).await?;
        Ok(agent)
    }

    /// The agent's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_log(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().contains(needle) {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!(
                    "agent exited ({status}) before logging {needle:?}:\n{}",
                    self.log()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "agent did not log {needle:?} within {timeout:?}:\n{}",
                    crate::vm::tail(&self.log(), 60)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The agent's /metrics text.
    pub async fn metrics(&self) -> Result<String> {
        http_get(self.metrics_port, "/metrics").await
    }

    /// Sum of the samples of `family` whose label set contains every `labels` pair.
    pub async fn metric_sum(&self, family: &str, labels: &[(&str, &str)]) -> Result<f64> {
        crate::metrics::try_sum(&self.metrics().await?, family, labels)
    }

    /// GET `path` of the agent's node API (`/node-monitor/v1/...`) as a ServiceAccount bound to
    /// `cluster-admin` (created on first use): the agent authorizes its token as it would a
    /// `kubectl node-monitor` caller's.
    pub async fn node_api_get(&self, cluster: &Cluster, path: &str) -> Result<String> {
        let client = cluster.client();
        let crbs: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client);
        let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "node-api-reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "node-api-reader",
                              "namespace": "default"}],
            }))?;
        match crbs.create(&PostParams::default(), &binding).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e).context("binding node-api-reader to cluster-admin"),
        }
        // Creates the ServiceAccount; the token sent is one for the agents' audience, the only
        // kind they accept.
        cluster
            .cp
            .service_account_kubeconfig("default", "node-api-reader")
            .await?;
        let token = cluster
            .cp
            .audience_token(
                "default",
                "node-api-reader",
                node_monitor_core::contract::names::NODE_API_AUDIENCE,
            )
            .await
            .context("minting node-api-reader's token for the agents' audience")?;
        http_get_with(
            self.metrics_port,
            path,
            &format!(
                "{}: Bearer {token}\r\n",
                node_monitor::http::auth::TOKEN_HEADER
            ),
        )
        .await
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("agent already stopped")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(child.id())?),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!(
                    "agent did not exit within 20 s of SIGTERM:\n{}",
                    crate::vm::tail(&self.log(), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A minimal HTTP/1.0 GET on loopback (no client dependency for one line of protocol).
pub async fn http_get(port: u16, path: &str) -> Result<String> {
    http_get_with(port, path, "").await
}

/// [`http_get`] with extra header lines (each ending in CRLF).
pub async fn http_get_with(port: u16, path: &str, headers: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{headers}\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_owned())
}

/// The host's first IPv4 address outside loopback (from /proc/net/fib_trie's local addresses):
/// the API server proxies to no loopback address, so a pod it must reach has this one.
pub fn host_ipv4() -> Result<std::net::Ipv4Addr> {
    let trie = fs::read_to_string("/proc/net/fib_trie").context("/proc/net/fib_trie")?;
    let lines: Vec<&str> = trie.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[1].trim() == "/32 host LOCAL")
        .filter_map(|w| {
            w[0].trim()
                .trim_start_matches(['|', '+', '-', ' '])
                .parse()
                .ok()
        })
        .find(|ip: &std::net::Ipv4Addr| !ip.is_loopback() && !ip.is_link_local())
        .context("this host has no IPv4 address outside loopback for the API server to proxy to")
}

/// A free loopback TCP port.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
