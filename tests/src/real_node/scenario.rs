//! What the real-node scenarios share: installing node-monitor on the joined node from a
//! kustomization, and waiting on the API and the guest with the guest's logs on failure.
use std::time::{Duration, Instant};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Event, Node, Pod},
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde_json::Value;

use super::{NODE, RealNode, RealNodeOptions, WORKLOAD_IMAGE};
use crate::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    e2e::binary,
    manifests,
    pod::PodBuilder,
};

/// The namespace of the scenarios' pods.
pub const NS: &str = "default";
/// The agent's namespace, as the base installs it.
pub const AGENT_NS: &str = "node-monitor";

/// Fails the test with `what` and the guest's logs.
pub fn fail(node: &RealNode, what: &str) -> ! {
    panic!("{what}\n{}", node.report());
}

/// Polls `check` every 500 ms until it returns `Some`, failing with the guest's logs at `limit`
/// or when the guest ends. A liveness bound, not a speed assertion.
pub async fn until<T, F, Fut>(node: &RealNode, what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll(node, limit, check).await {
        Ok(v) => v,
        Err(Gone::Ended) => fail(node, &format!("the guest ended while waiting for {what}")),
        Err(Gone::Late) => fail(node, &format!("{what}: not within {limit:?}")),
    }
}

/// Why [`poll`] gave up.
enum Gone {
    /// The guest ended (powered off, or its runner ended a locked-up kernel).
    Ended,
    /// The limit passed.
    Late,
}

/// [`until`], returning why it gave up instead of failing.
async fn poll<T, F, Fut>(node: &RealNode, limit: Duration, mut check: F) -> Result<T, Gone>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if !node.running() {
            return Err(Gone::Ended);
        }
        if Instant::now() > deadline {
            return Err(Gone::Late);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A pod on the node running the workload image with `command`, never restarted.
pub fn workload(name: &str, command: &[&str]) -> PodBuilder {
    PodBuilder::new(name)
        .namespace(NS)
        .termination_grace(5)
        .restart_policy("Never")
        .image(WORKLOAD_IMAGE)
        .command(command)
}

/// Creates `p` (in its namespace, [`NS`] when it has none) and waits until it runs.
pub async fn create_running(client: &Client, node: &RealNode, p: Pod) -> Pod {
    let ns = p
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| NS.to_owned());
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let name = p.metadata.name.clone().expect("pod name");
    api.create(&PostParams::default(), &p)
        .await
        .unwrap_or_else(|e| panic!("create pod {ns}/{name}: {e}"));
    until(
        node,
        &format!("pod {ns}/{name} Running"),
        Duration::from_secs(300),
        || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let p = api.get(&name).await.ok()?;
                (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
            }
        },
    )
    .await
}

/// Whether the node's Ready condition is True.
pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The status of the node's condition `type_`.
pub fn condition(n: &Node, type_: &str) -> Option<String> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

/// The agent container's log, from the guest's mirror of /var/log/pods.
pub fn agent_log(node: &RealNode) -> String {
    let pods = node.out_dir().join("pods");
    let mut out = String::new();
    for d in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
        if d.file_name().to_string_lossy().starts_with("node-monitor_")
            && let Ok(t) = std::fs::read_to_string(d.path().join("node-monitor/0.log"))
        {
            out.push_str(&t);
        }
    }
    out
}

/// [`RealNode::step`], failing the test with the guest's logs on error.
pub async fn guest_step(node: &mut RealNode, what: &str, script: &str, limit: Duration) -> String {
    match node.step(what, script, limit).await {
        Ok(out) => out,
        Err(e) => fail(node, &format!("{e:#}")),
    }
}

/// The agent's Ready pod on the node.
pub async fn agent_pod(client: &Client) -> Option<Pod> {
    agent_pod_on(client, NODE).await
}

/// The agent's Ready pod on the node `node`.
pub async fn agent_pod_on(client: &Client, node: &str) -> Option<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), AGENT_NS);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=node-monitor"))
        .await
        .ok()?;
    list.items.into_iter().find(|p| {
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
            && p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
}

/// What a test starts from: the node joined, node-monitor's DaemonSet pod Ready on it.
pub struct Installed {
    pub cp: ControlPlane,
    pub client: Client,
    pub node: RealNode,
    pub agent: Pod,
    pub agent_ip: String,
}

/// Where node-monitor's objects come from.
#[derive(Debug, Clone, Copy)]
pub enum Manifests<'a> {
    /// `deploy/kustomize/<dir>` (`base`, `overlays/shutdown`), rendered.
    Kustomize(&'a str),
    /// `helm template` of deploy/helm/node-monitor with these `--set` values, without the hooks
    /// and test pods (`helm install` creates them only on uninstall and for `helm test`).
    Helm(&'a [&'a str]),
}

/// Boots the node as `options` say, starts the control plane
/// (NodeRestriction, kube-scheduler), joins the node, and installs the kustomization
/// `deploy/kustomize/<kustomization>` (`base`, `overlays/shutdown`), with `agent_config` as the
/// ConfigMap's configuration, or the kustomization's own when `None`.
pub async fn install(
    kustomization: &str,
    agent_config: Option<&str>,
    options: &RealNodeOptions,
) -> Installed {
    install_from(Manifests::Kustomize(kustomization), agent_config, options).await
}

/// How many times [`install_from`] boots a node whose kernel locked up before the agent was Ready.
const BOOTS: u32 = 2;

/// As [`install`], from the Kustomize manifests or the Helm chart. A guest whose kernel locked up
/// or panicked under emulation before the agent was Ready ([`RealNode::stalled`]) is ended with
/// its control plane and the node booted again, once, saying so on stderr.
pub async fn install_from(
    manifests_source: Manifests<'_>,
    agent_config: Option<&str>,
    options: &RealNodeOptions,
) -> Installed {
    let mut boot = 1;
    loop {
        match install_once(manifests_source, agent_config, options).await {
            Ok(installed) => return installed,
            Err(node) if boot < BOOTS => {
                eprintln!(
                    "real node: boot {boot}: the guest's kernel locked up or panicked before \
                     node-monitor was Ready ({}); its files: {}; booting again",
                    node.stalled().unwrap_or_default(),
                    node.out_dir().display()
                );
                boot += 1;
            }
            Err(node) => fail(
                &node,
                &format!("the guest's kernel locked up at each of {BOOTS} boots"),
            ),
        }
    }
}

/// Waits as [`until`] does, giving the node back when its kernel locked up.
async fn until_or_stall<T, F, Fut>(
    node: RealNode,
    what: &str,
    limit: Duration,
    check: F,
) -> Result<(RealNode, T), Box<RealNode>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll(&node, limit, check).await {
        Ok(v) => Ok((node, v)),
        Err(_) if node.stalled().is_some() => Err(Box::new(node)),
        Err(Gone::Ended) => fail(&node, &format!("the guest ended while waiting for {what}")),
        Err(Gone::Late) => fail(&node, &format!("{what}: not within {limit:?}")),
    }
}

/// One boot of [`install_from`]: the node back when its kernel locked up.
async fn install_once(
    manifests_source: Manifests<'_>,
    agent_config: Option<&str>,
    options: &RealNodeOptions,
) -> Result<Installed, Box<RealNode>> {
    let t0 = Instant::now();
    let node = RealNode::boot(options).expect("real node payload and boot");
    let scheduler = options
        .release
        .node_binaries()
        .expect("node binaries")
        .join("kube-scheduler");
    let kubelet_version = options.release.kubelet_version().expect("kubelet release");
    let cp = ControlPlane::start(ControlPlaneOptions {
        scheduler: Some(scheduler),
        assets_dir: options
            .release
            .control_plane_assets()
            .expect("control plane binaries"),
        ..ControlPlaneOptions::default().apiserver_arg("--enable-admission-plugins=NodeRestriction")
    })
    .await
    .expect("control plane");
    let client = cp.client();
    node.join(&cp).expect("node credentials");
    // `node-monitor trace` in the guest names pods through the API.
    let admin = std::fs::read(cp.guest_kubeconfig_path()).expect("guest kubeconfig");
    node.put("admin.kubeconfig", &admin)
        .expect("admin kubeconfig");
    node.put_file("node-monitor", &binary("node-monitor"))
        .expect("node-monitor binary");

    // --- 1. the node joins; node-monitor from the shipped manifests ------------------------------
    let nodes: Api<Node> = Api::all(client.clone());
    let (node, _) = until_or_stall(node, "the node Ready", Duration::from_secs(600), || {
        let nodes = nodes.clone();
        async move { nodes.get_opt(NODE).await.ok().flatten().filter(node_ready) }
    })
    .await?;
    let info = nodes
        .get(NODE)
        .await
        .ok()
        .and_then(|n| n.status?.node_info)
        .unwrap_or_default();
    assert!(
        info.kernel_version
            .starts_with(options.kernel.release_prefix()),
        "the node booted {:?}'s kernel: its kubelet reports {:?}",
        options.kernel,
        info.kernel_version
    );
    assert_eq!(
        info.kubelet_version, kubelet_version,
        "the node runs the {:?} release's kubelet",
        options.release
    );
    eprintln!(
        "real node: Ready {:.1} s after boot, kernel {}, kubelet {}",
        t0.elapsed().as_secs_f64(),
        info.kernel_version,
        info.kubelet_version
    );

    // Rendered and applied here.
    let mut objects = match manifests_source {
        Manifests::Kustomize(kustomization) => {
            manifests::render(&manifests::kustomize_dir(kustomization))
                .unwrap_or_else(|e| panic!("render {kustomization}: {e:#}"))
        }
        Manifests::Helm(set) => crate::helm::template(set)
            .unwrap_or_else(|e| panic!("helm template {set:?}: {e:#}"))
            .into_iter()
            .filter(|m| {
                m.object["metadata"]["annotations"]
                    .get("helm.sh/hook")
                    .is_none()
            })
            .collect(),
    };
    if let Some(config) = agent_config {
        let cm = objects
            .iter_mut()
            .find(|m: &&mut manifests::Manifest| {
                m.kind() == "ConfigMap" && m.name() == "node-monitor-config"
            })
            .expect("the kustomization has the agent's ConfigMap");
        cm.object["data"]["config.yaml"] = Value::String(config.to_owned());
    }
    manifests::apply(&client, &objects)
        .await
        .unwrap_or_else(|e| panic!("apply {manifests_source:?}: {e:#}"));

    let (node, agent) = until_or_stall(
        node,
        "node-monitor's DaemonSet pod Ready on the node",
        Duration::from_secs(420),
        || agent_pod(&client),
    )
    .await?;
    let agent_ip = agent
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("agent pod IP");
    eprintln!(
        "real node: node-monitor Ready {:.1} s after boot, pod IP {agent_ip}",
        t0.elapsed().as_secs_f64()
    );
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), AGENT_NS);
    let ds = ds.get("node-monitor").await.expect("DaemonSet");
    assert_eq!(
        ds.status.as_ref().map(|s| s.number_ready),
        Some(1),
        "the DaemonSet reports its pod ready"
    );
    Ok(Installed {
        cp,
        client,
        node,
        agent,
        agent_ip,
    })
}

/// `helm install` of the chart with `set` and the agent's configuration `agent_config` (the
/// chart's `config` value), into a namespace helm creates.
pub fn helm_install(cp: &ControlPlane, set: &[&str], agent_config: Option<&str>) {
    let chart = crate::helm::chart_dir().to_string_lossy().into_owned();
    let values = agent_config.map(|c| crate::helm::config_values(c).expect("values file"));
    let values_path = values
        .as_ref()
        .map(|v| v.path().to_string_lossy().into_owned());
    let mut args = vec![
        "install",
        crate::helm::RELEASE,
        chart.as_str(),
        "--create-namespace",
        "--timeout",
        "120s",
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    if let Some(path) = &values_path {
        args.extend(["-f", path.as_str()]);
    }
    crate::helm::release(cp.kubeconfig_path(), &args)
        .unwrap_or_else(|e| panic!("helm install {set:?}: {e:#}"));
}

/// `Evicted` Events on pod `name`, by the component that reported them.
pub async fn evictions_of(client: &Client, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .expect("list events");
    list.items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Evicted"))
        .map(|e| {
            e.reporting_component
                .clone()
                .filter(|c| !c.is_empty())
                .or_else(|| e.source.as_ref().and_then(|s| s.component.clone()))
                .unwrap_or_default()
        })
        .collect()
}

/// The kernel's OOM kill count in the guest (`oom_kill` in /proc/vmstat).
pub async fn guest_oom_kills(node: &mut RealNode) -> u64 {
    let out = guest_step(
        node,
        "oom_kill count",
        "awk '$1 == \"oom_kill\" { print $2 }' /proc/vmstat",
        Duration::from_secs(30),
    )
    .await;
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("oom_kill in /proc/vmstat: {out:?}: {e}"))
}
