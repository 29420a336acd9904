//! Two real nodes for failover: two guests, each a real kubelet and containerd joined to one
//! control plane on the host, with node-monitor installed by `helm install` with remediate
//! enabled, as shipped. Each guest's power is a QMP socket on the host's loopback, which
//! remediate's fence methods drive with `fence_qmp` from its own image, as they would drive a
//! hypervisor or a BMC.
//!
//! The fence configuration is the documented one (docs/remediate.md, "Fence configuration"):
//! `fence-config-default` power-cycles a dead node (`power_management=qmp-off qmp-on`), through a
//! shared template and per-node methods that name their node and its QMP port. The guests reach
//! the host at 10.0.2.2 (qemu user networking), the remediate pods too, through their node.
use std::time::{Duration, Instant};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Node},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use node_monitor_remediate::fence_qmp;

use super::{
    RealNode, RealNodeOptions,
    scenario::{AGENT_NS, agent_pod_on, helm_install, node_ready, until},
};
use crate::control_plane::{ControlPlane, ControlPlaneOptions};

/// The two nodes' names.
pub const NODES: [&str; 2] = ["nm-a", "nm-b"];
/// remediate's image archive, which each node imports besides the tier's own.
pub const REMEDIATE_IMAGE: &str = super::REMEDIATE_IMAGE_ARCHIVE.0;
/// Where a pod on a guest reaches the host's loopback.
const HOST_FROM_GUEST: &str = "10.0.2.2";

/// The pair, joined, with node-monitor and remediate Ready.
pub struct Pair {
    pub cp: ControlPlane,
    pub client: Client,
    pub nodes: Vec<RealNode>,
    /// Each node's QMP port on the host's loopback, in [`NODES`]' order.
    pub qmp_ports: Vec<u16>,
    pub started: Instant,
}

impl Pair {
    /// The node named `name`, to step.
    pub fn node_mut(&mut self, name: &str) -> &mut RealNode {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name} in the pair"))
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> &RealNode {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name} in the pair"))
    }

    /// The QMP port of the node named `name`.
    pub fn qmp_port(&self, name: &str) -> u16 {
        let i = NODES
            .iter()
            .position(|n| *n == name)
            .unwrap_or_else(|| panic!("no node {name} in the pair"));
        self.qmp_ports[i]
    }

    /// Runs a QMP `command` on the node's machine, as the host's power would act on it.
    pub fn qmp(&self, name: &str, command: &str) -> Result<serde_json::Value, String> {
        let stream = std::net::TcpStream::connect(("127.0.0.1", self.qmp_port(name)))
            .map_err(|e| format!("QMP of {name}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .map_err(|e| e.to_string())?;
        fence_qmp::Session::open(stream)?.execute(command)
    }

    /// The node whose guest is running, to report from when a wait fails.
    pub fn witness(&self) -> &RealNode {
        self.nodes
            .iter()
            .find(|n| n.running())
            .unwrap_or(&self.nodes[0])
    }
}

/// The fence configuration: power-cycle a dead node through its QMP socket.
fn fence_config(ports: &[u16]) -> Vec<ConfigMap> {
    let cm = |name: &str, key: &str, text: String| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(AGENT_NS.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([(key.to_owned(), text)].into()),
        ..ConfigMap::default()
    };
    let mut out = vec![
        cm(
            "fence-config-default",
            "config.properties",
            "power_management=qmp-off qmp-on\n".to_owned(),
        ),
        cm(
            "fence-method-template-qmp",
            "template.properties",
            format!("agent_name=fence_qmp\nip={HOST_FROM_GUEST}\npower_timeout=30\n"),
        ),
    ];
    for (node, port) in NODES.iter().zip(ports) {
        for action in ["off", "on"] {
            out.push(cm(
                &format!("fence-method-qmp-{action}-{node}"),
                "method.properties",
                format!(
                    "template=fence-method-template-qmp\nnode_name={node}\nmethod_name=qmp-{action}\n\
                     ipport={port}\naction={action}\n"
                ),
            ));
        }
    }
    out
}

/// Boots both nodes as `options` say (their names, QMP sockets and remediate's image are the
/// pair's), starts the control plane (NodeRestriction, kube-scheduler), joins them and runs
/// `helm install` of the chart with remediate, `helm_set` and the agent's configuration
/// `agent_config` (the chart's `config` value); returns once both nodes are Ready, the release
/// installed ([`Pair::installed`] waits for its pods).
pub async fn boot_pair(
    options: [RealNodeOptions; 2],
    helm_set: &[&str],
    agent_config: Option<&str>,
) -> Pair {
    let started = Instant::now();
    let qmp_ports: Vec<u16> = NODES
        .iter()
        .map(|_| crate::e2e::free_port().expect("a free port"))
        .collect();
    let nodes: Vec<RealNode> = options
        .into_iter()
        .zip(NODES.iter().zip(&qmp_ports))
        .map(|(opts, (name, port))| {
            RealNode::boot(&RealNodeOptions {
                name,
                qmp_port: Some(*port),
                extra_images: &[REMEDIATE_IMAGE],
                timeout: Duration::from_secs(1800),
                ..opts
            })
            .expect("real node payload and boot")
        })
        .collect();
    let release = super::Release::Current;
    let cp = ControlPlane::start(ControlPlaneOptions {
        scheduler: Some(
            release
                .node_binaries()
                .expect("node binaries")
                .join("kube-scheduler"),
        ),
        ..ControlPlaneOptions::default().apiserver_arg("--enable-admission-plugins=NodeRestriction")
    })
    .await
    .expect("control plane");
    let client = cp.client();
    // `node-monitor trace` in the guests names pods through the API.
    let admin = std::fs::read(cp.guest_kubeconfig_path()).expect("guest kubeconfig");
    for n in &nodes {
        n.join(&cp).expect("node credentials");
        n.put("admin.kubeconfig", &admin).expect("admin kubeconfig");
        n.put_file("node-monitor", &crate::e2e::binary("node-monitor"))
            .expect("node-monitor binary");
    }
    let pair = Pair {
        cp,
        client,
        nodes,
        qmp_ports,
        started,
    };
    let api: Api<Node> = Api::all(pair.client.clone());
    for name in NODES {
        until(
            pair.node(name),
            &format!("node {name} Ready"),
            Duration::from_secs(900),
            || {
                let api = api.clone();
                async move { api.get_opt(name).await.ok().flatten().filter(node_ready) }
            },
        )
        .await;
        eprintln!(
            "failover pair: {name} Ready {:.1} s after boot",
            started.elapsed().as_secs_f64()
        );
    }
    let mut set = vec!["remediate.enabled=true"];
    set.extend_from_slice(helm_set);
    helm_install(&pair.cp, &set, agent_config);
    let cms: Api<ConfigMap> = Api::namespaced(pair.client.clone(), AGENT_NS);
    for cm in fence_config(&pair.qmp_ports) {
        cms.create(&PostParams::default(), &cm)
            .await
            .unwrap_or_else(|e| panic!("create {:?}: {e}", cm.metadata.name));
    }
    pair
}

impl Pair {
    /// Tells both guests to collect their logs and power off, and waits for both.
    pub async fn finish(self) {
        let Pair { nodes, .. } = self;
        for n in &nodes {
            n.put("finish", b"").expect("finish flag");
        }
        for n in nodes {
            let name = n.name;
            let run = n.finish().await.expect("guest run");
            eprintln!(
                "failover pair: {name} ran {:.1} s",
                run.elapsed.as_secs_f64()
            );
        }
    }

    /// Waits until both agents and both remediate replicas are Ready.
    pub async fn installed(&self) {
        for name in NODES {
            let client = self.client.clone();
            until(
                self.node(name),
                &format!("node-monitor's pod Ready on {name}"),
                Duration::from_secs(600),
                || agent_pod_on(&client, name),
            )
            .await;
        }
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), AGENT_NS);
        until(
            self.witness(),
            "both remediate replicas Ready",
            Duration::from_secs(600),
            || {
                let deployments = deployments.clone();
                async move {
                    let d = deployments.get("node-monitor-remediate").await.ok()?;
                    (d.status?.ready_replicas? == 2).then_some(())
                }
            },
        )
        .await;
        eprintln!(
            "failover pair: node-monitor and remediate Ready {:.1} s after boot",
            self.started.elapsed().as_secs_f64()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_has_its_own_off_and_on_methods_naming_it_and_its_port() {
        let cms = fence_config(&[4001, 4002]);
        let text = |name: &str| {
            let cm = cms
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("{name}"));
            cm.data.as_ref().unwrap().values().next().unwrap().clone()
        };
        assert_eq!(
            text("fence-config-default"),
            "power_management=qmp-off qmp-on\n"
        );
        let off_b = text("fence-method-qmp-off-nm-b");
        for line in [
            "node_name=nm-b",
            "ipport=4002",
            "action=off",
            "method_name=qmp-off",
        ] {
            assert!(off_b.lines().any(|l| l == line), "{line} in {off_b}");
        }
        assert!(text("fence-method-qmp-on-nm-a").contains("ipport=4001\naction=on"));
        assert!(text("fence-method-template-qmp").contains("agent_name=fence_qmp"));
    }
}
