//! Control-plane tier: the harness (a real etcd + kube-apiserver + kube-controller-manager) and the
//! kubelet stand-in (pods as real processes in kubelet-layout cgroups).
//!
//! Needs the binaries from `scripts/setup.sh --with-control-plane` and, for the stand-in, root:
//! without them every test fails with a message naming what is missing.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        apps::v1::{ReplicaSet, ReplicaSetSpec},
        coordination::v1::Lease,
        core::v1::{
            Container, Node, NodeCondition, Pod, PodSpec, PodTemplateSpec, ResourceRequirements,
        },
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec},
        rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta, Time},
        util::intstr::IntOrString,
    },
    jiff::Timestamp,
};
use kube::{
    Api,
    api::{EvictParams, ListParams, Patch, PatchParams, PostParams},
};
use node_monitor_core::kubelet::layout::{QosClass, parse_cgroup_path};
use node_monitor_tests::{
    cgroup::{MEMORY_V1, PIDS_V1, TestCgroups, UNIFIED, require_root},
    control_plane::{ControlPlane, ControlPlaneOptions},
    pod::PodBuilder,
    standin::{StandIn, StandInConfig, decide::parse_bytes},
    wait::{self, must},
};
use serde_json::json;

/// Bound on every wait for the cluster to converge (a liveness bound, not a speed assertion).
const WAIT: Duration = Duration::from_secs(90);
const WORKLOAD: &str = env!("CARGO_BIN_EXE_nm-workload");

async fn eventually<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    wait::eventually(what, WAIT, check).await
}

async fn start_control_plane() -> ControlPlane {
    must(
        ControlPlane::start(ControlPlaneOptions::default()).await,
        "start the control plane",
    )
}

/// Whether `pid` is a live, non-zombie process.
fn running(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

fn procs(dir: &Path) -> Vec<i32> {
    let text = fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_else(|e| panic!("read {}/cgroup.procs: {e}", dir.display()));
    let mut pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    pids.sort_unstable();
    pids
}

/// The processes in `dir` once there are `n` of them (a workload forks its helpers after it
/// starts, so the count grows for a moment after the pod is Running).
async fn wait_procs(dir: &Path, n: usize) -> Vec<i32> {
    let what = format!("{n} processes in {}", dir.display());
    eventually(&what, async || {
        let pids = procs(dir);
        (pids.len() == n).then_some(pids)
    })
    .await
}

fn workload_pod(
    name: &str,
    labels: &[(&str, &str)],
    args: &[&str],
    memory_limit: Option<&str>,
) -> Pod {
    let pod = PodBuilder::new(name)
        .labels(labels)
        .image("nm-workload")
        .command(std::iter::once(WORKLOAD).chain(args.iter().copied()))
        .termination_grace(10);
    match memory_limit {
        Some(limit) => pod.memory("16Mi", Some(limit)),
        None => pod.resources(ResourceRequirements::default()),
    }
    .build()
}

/// Waits until the pod runs: phase Running, its container running. Returns the pod.
async fn wait_running(api: &Api<Pod>, name: &str) -> Pod {
    let deadline = Instant::now() + WAIT;
    loop {
        let p = api.get_opt(name).await.ok().flatten();
        let running = p
            .as_ref()
            .and_then(|p| p.status.as_ref())
            .is_some_and(|st| {
                st.phase.as_deref() == Some("Running")
                    && st.container_statuses.as_ref().is_some_and(|cs| {
                        cs.iter().all(|c| {
                            c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some())
                        })
                    })
            });
        if running && let Some(p) = p {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {WAIT:?} waiting for pod {name} to run; last seen: {:?}",
            p.map(|p| (p.spec.and_then(|s| s.node_name), p.status))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The container ID from `containerd://<id>`.
fn container_id(pod: &Pod) -> String {
    let cs = &pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .expect("container statuses")[0];
    let id = cs
        .container_id
        .as_deref()
        .and_then(|c| c.strip_prefix("containerd://"))
        .unwrap_or_else(|| panic!("containerID {:?} is not containerd://<id>", cs.container_id));
    assert_eq!(id.len(), 64, "{id}");
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    id.to_owned()
}

struct NodeCgroup {
    /// Kept alive until the test ends: dropping it removes the subtree.
    _cgroups: TestCgroups,
    node_rel: PathBuf,
}

/// A node cgroup under the test subtree (removed when dropped, after the stand-in).
fn node_cgroup(test: &str) -> NodeCgroup {
    require_root("the kubelet stand-in (it creates cgroups and runs pods as processes)");
    let mut cgroups = TestCgroups::new(test);
    cgroups
        .create("node-a")
        .unwrap_or_else(|e| panic!("create the node cgroup: {e:#}"));
    let node_rel = cgroups.rel_root().join("node-a");
    NodeCgroup {
        _cgroups: cgroups,
        node_rel,
    }
}

/// A control plane and the stand-in `node-a` (512 MiB) in a test cgroup. Fields drop in order:
/// the stand-in, the control plane, the node cgroup.
struct NodeA {
    standin: StandIn,
    cp: ControlPlane,
    node: NodeCgroup,
}

impl NodeA {
    async fn start(test: &str, opts: ControlPlaneOptions) -> NodeA {
        let node = node_cgroup(test);
        let cp = must(ControlPlane::start(opts).await, "start the control plane");
        let standin = start_named_standin(&cp, "node-a", &node.node_rel, 512 << 20).await;
        NodeA { standin, cp, node }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cp.client(), "default")
    }

    /// Stops the stand-in (its processes and cgroups go), then the control plane, then removes
    /// the node cgroup.
    async fn stop(self) {
        must(self.standin.stop().await, "stop the stand-in");
        drop(self.cp);
        drop(self.node);
    }
}

async fn create_pod(pods: &Api<Pod>, pod: &Pod) -> Pod {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    must(
        pods.create(&PostParams::default(), pod).await,
        &format!("create pod {name}"),
    )
}

/// Waits until the pod `name` is gone from the API.
async fn wait_gone(pods: &Api<Pod>, name: &str) {
    eventually(&format!("{name} to leave the API"), async || {
        matches!(pods.get_opt(name).await, Ok(None)).then_some(())
    })
    .await;
}

async fn start_named_standin(
    cp: &ControlPlane,
    name: &str,
    node_rel: &Path,
    memory: u64,
) -> StandIn {
    let cfg = StandInConfig::new(name, node_rel)
        .memory(memory)
        .label("topology.kubernetes.io/zone", "zone-a")
        .lease_interval(Duration::from_secs(1))
        .status_interval(Duration::from_secs(2))
        .restart_backoff(Duration::from_secs(1), Duration::from_secs(5));
    let standin = must(
        StandIn::start(cp.client(), cfg).await,
        "start the kubelet stand-in",
    );
    must(standin.wait_ready(WAIT).await, "the stand-in's node Ready");
    standin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_serves_enforces_rbac_and_runs_controllers() {
    let cp = start_control_plane().await;
    let client = cp.client();

    let readyz = must(
        client
            .request_text(
                http::Request::get("/readyz")
                    .body(Vec::new())
                    .expect("request"),
            )
            .await,
        "GET /readyz",
    );
    assert_eq!(readyz, "ok");

    // A ServiceAccount token without any binding authenticates (not 401) but may not list pods.
    let sa = must(
        cp.service_account_client("default", "no-rights").await,
        "mint a ServiceAccount client",
    );
    let pods_as_sa: Api<Pod> = Api::namespaced(sa, "default");
    match pods_as_sa.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("an unbound ServiceAccount listed pods: {other:?}"),
    }
    // With a RoleBinding the same token may: the 403 above was RBAC's decision.
    let roles: Api<Role> = Api::namespaced(client.clone(), "default");
    must(
        roles
            .create(
                &PostParams::default(),
                &Role {
                    metadata: ObjectMeta {
                        name: Some("pod-reader".to_owned()),
                        ..ObjectMeta::default()
                    },
                    rules: Some(vec![PolicyRule {
                        api_groups: Some(vec![String::new()]),
                        resources: Some(vec!["pods".to_owned()]),
                        verbs: vec!["list".to_owned()],
                        ..PolicyRule::default()
                    }]),
                },
            )
            .await,
        "create a Role",
    );
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), "default");
    must(
        bindings
            .create(
                &PostParams::default(),
                &RoleBinding {
                    metadata: ObjectMeta {
                        name: Some("pod-reader".to_owned()),
                        ..ObjectMeta::default()
                    },
                    role_ref: RoleRef {
                        api_group: Some("rbac.authorization.k8s.io".to_owned()),
                        kind: "Role".to_owned(),
                        name: "pod-reader".to_owned(),
                    },
                    subjects: Some(vec![Subject {
                        kind: "ServiceAccount".to_owned(),
                        name: "no-rights".to_owned(),
                        namespace: Some("default".to_owned()),
                        ..Subject::default()
                    }]),
                },
            )
            .await,
        "create a RoleBinding",
    );
    eventually("the bound ServiceAccount to list pods", async || {
        pods_as_sa.list(&ListParams::default()).await.ok()
    })
    .await;

    // The replicaset controller runs: a ReplicaSet gets its pods (Pending: no node exists).
    let labels = BTreeMap::from([("app".to_owned(), "rs-check".to_owned())]);
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let rs = must(
        rss.create(
            &PostParams::default(),
            &ReplicaSet {
                metadata: ObjectMeta {
                    name: Some("rs-check".to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(ReplicaSetSpec {
                    replicas: Some(2),
                    selector: LabelSelector {
                        match_labels: Some(labels.clone()),
                        ..LabelSelector::default()
                    },
                    template: Some(PodTemplateSpec {
                        metadata: Some(ObjectMeta {
                            labels: Some(labels),
                            ..ObjectMeta::default()
                        }),
                        spec: Some(PodSpec {
                            containers: vec![Container {
                                name: "main".to_owned(),
                                image: Some("nm-workload".to_owned()),
                                ..Container::default()
                            }],
                            ..PodSpec::default()
                        }),
                    }),
                    ..ReplicaSetSpec::default()
                }),
                ..ReplicaSet::default()
            },
        )
        .await,
        "create a ReplicaSet",
    );
    let rs_uid = rs.metadata.uid.expect("uid");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let owned = eventually("the ReplicaSet's two pods", async || {
        let list = pods
            .list(&ListParams::default().labels("app=rs-check"))
            .await
            .ok()?;
        (list.items.len() == 2).then_some(list.items)
    })
    .await;
    for p in &owned {
        let owner = &p.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(owner.uid, rs_uid);
        assert_eq!(owner.kind, "ReplicaSet");
    }

    // Everything started is stopped and the work directory removed.
    let pids = cp.pids();
    let names: Vec<&str> = pids.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["etcd", "kube-apiserver", "kube-controller-manager"]);
    let dir = cp.dir().to_owned();
    must(cp.stop(), "stop the control plane");
    for (name, pid) in pids {
        let pid = i32::try_from(pid).expect("pid");
        assert!(!running(pid), "{name} (pid {pid}) outlived stop()");
    }
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

#[test]
fn a_panicking_test_leaves_no_control_plane_process() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let cp = start_control_plane().await;
            tx.send((cp.pids(), cp.dir().to_owned())).expect("send");
            panic!("deliberate panic with a running control plane");
        })
    })
    .join();
    assert!(result.is_err(), "the thread was meant to panic");
    let (pids, dir) = rx
        .recv()
        .expect("the control plane started before the panic");
    assert_eq!(pids.len(), 3);
    for (name, pid) in pids {
        let pid = i32::try_from(pid).expect("pid");
        assert!(!running(pid), "{name} (pid {pid}) outlived the panic");
    }
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

#[test]
fn control_plane_binary_takes_its_processes_down_when_killed() {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nm-control-plane"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn nm-control-plane");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let mut fields = BTreeMap::new();
    for line in lines.by_ref() {
        let line = line.expect("read stdout");
        if let Some((k, v)) = line.split_once('=') {
            fields.insert(k.to_owned(), v.to_owned());
        }
        if line == "NM_READY=1" {
            break;
        }
    }
    assert_eq!(
        fields.get("NM_READY").map(String::as_str),
        Some("1"),
        "nm-control-plane did not become ready (exit: {:?})",
        child.try_wait()
    );
    let kubeconfig = PathBuf::from(&fields["NM_KUBECONFIG"]);
    assert!(kubeconfig.is_file(), "{}", kubeconfig.display());
    let guest = fs::read_to_string(&fields["NM_GUEST_KUBECONFIG"]).expect("guest kubeconfig");
    assert!(guest.contains("server: https://10.0.2.2:"), "{guest}");

    // Its children: etcd, kube-apiserver, kube-controller-manager.
    let parent = i32::try_from(child.id()).expect("pid");
    let children: Vec<i32> = fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.split_whitespace().nth(1)?.to_owned();
                    rest.parse::<i32>().ok()
                })
                == Some(parent)
        })
        .collect();
    assert_eq!(
        children.len(),
        3,
        "children of nm-control-plane: {children:?}"
    );

    // SIGKILL: no handler runs, only PR_SET_PDEATHSIG can take the children down.
    child.kill().expect("kill nm-control-plane");
    child.wait().expect("reap nm-control-plane");
    let deadline = Instant::now() + Duration::from_secs(10);
    while children.iter().any(|p| running(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let alive: Vec<i32> = children.iter().copied().filter(|p| running(*p)).collect();
    assert!(alive.is_empty(), "orphans after SIGKILL: {alive:?}");
    // The work directory of a killed process cannot be cleaned by it; remove it here.
    if let Some(dir) = fields.get("NM_CONTROL_PLANE_DIR") {
        let _ = fs::remove_dir_all(dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standin_registers_a_ready_node_and_runs_pods_in_kubelet_cgroups() {
    let fx = NodeA::start("cp-standin", ControlPlaneOptions::default()).await;
    let (standin, node) = (&fx.standin, &fx.node);
    let client = fx.cp.client();

    // The Node: Ready, capacity = the node cgroup's limit, labels.
    let nodes: Api<Node> = Api::all(client.clone());
    let n = must(nodes.get("node-a").await, "get node-a");
    let st = n.status.as_ref().expect("node status");
    // Compared as numbers: the apiserver canonicalises quantities (524288Ki reads back 512Mi).
    let capacity = &st.capacity.as_ref().expect("capacity")["memory"];
    assert_eq!(parse_bytes(&capacity.0), Some(512 << 20), "{capacity:?}");
    let allocatable = &st.allocatable.as_ref().expect("allocatable")["memory"];
    assert_eq!(
        parse_bytes(&allocatable.0),
        Some(512 << 20),
        "{allocatable:?}"
    );
    let limit = fs::read_to_string(
        Path::new(MEMORY_V1)
            .join(&node.node_rel)
            .join("memory.limit_in_bytes"),
    )
    .expect("node cgroup limit");
    assert_eq!(limit.trim(), (512u64 << 20).to_string());
    assert_eq!(
        n.metadata.labels.as_ref().expect("labels")["topology.kubernetes.io/zone"],
        "zone-a"
    );

    // The Lease is renewed.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renew_time = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let first = renew_time(&must(leases.get("node-a").await, "get the lease")).expect("renewTime");
    eventually("the lease to be renewed", async || {
        let l = leases.get("node-a").await.ok()?;
        renew_time(&l).filter(|t| *t > first)
    })
    .await;

    // A pod without a node is bound to node-a and runs as processes in its kubelet cgroup.
    let pods = fx.pods();
    create_pod(
        &pods,
        &workload_pod("w1", &[], &["--hold", "8Mi", "--procs", "2"], Some("64Mi")),
    )
    .await;
    let pod = wait_running(&pods, "w1").await;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("node-a")
    );
    let uid = pod.metadata.uid.clone().expect("uid");
    let id = container_id(&pod);
    let rel = node
        .node_rel
        .join("kubepods/burstable")
        .join(format!("pod{uid}"))
        .join(&id);
    let mem_dir = Path::new(MEMORY_V1).join(&rel);
    // main + 2 sleepers
    let pids = wait_procs(&mem_dir, 3).await;
    assert_eq!(procs(&Path::new(PIDS_V1).join(&rel)), pids);
    assert_eq!(procs(&Path::new(UNIFIED).join(&rel)), pids);
    let limit = fs::read_to_string(mem_dir.join("memory.limit_in_bytes")).expect("limit");
    assert_eq!(limit.trim(), (64u64 << 20).to_string());
    let info = standin.pod(&uid).expect("the stand-in runs w1");
    assert_eq!(info.qos, QosClass::Burstable);
    let main_pid = i32::try_from(info.containers[0].pid).expect("pid");
    assert!(pids.contains(&main_pid));
    let cmdline = fs::read(format!("/proc/{main_pid}/cmdline")).expect("cmdline");
    assert!(
        String::from_utf8_lossy(&cmdline).contains("nm-workload"),
        "{cmdline:?}"
    );
    // The agent's own parser attributes the process to the pod and container.
    let own_cgroup = fs::read_to_string(format!("/proc/{main_pid}/cgroup")).expect("cgroup");
    let memory_line = own_cgroup
        .lines()
        .find(|l| l.split(':').nth(1) == Some("memory"))
        .expect("memory line");
    let parsed = parse_cgroup_path(memory_line.rsplit(':').next().expect("path"))
        .expect("a kubelet-layout path");
    assert_eq!(parsed.pod_uid, uid);
    assert_eq!(parsed.container_id.as_deref(), Some(id.as_str()));

    a_finished_pod_succeeds_and_its_cgroup_goes(&pods, node).await;

    // node-monitor's own conditions survive the stand-in's status updates. (MemoryPressure=True
    // taints the node NoSchedule, so this comes after the pod is placed.)
    let now = Timestamp::now();
    let nm_condition = NodeCondition {
        type_: "NodeMonitorMemoryPressure".to_owned(),
        status: "False".to_owned(),
        reason: Some("NoPressure".to_owned()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
        ..NodeCondition::default()
    };
    must(
        nodes
            .patch_status(
                "node-a",
                &PatchParams::default(),
                &Patch::Strategic(json!({ "status": { "conditions": [nm_condition] } })),
            )
            .await,
        "add a NodeMonitor condition",
    );
    standin.set_node_condition(
        "MemoryPressure",
        true,
        "KubeletHasInsufficientMemory",
        "simulated",
    );
    let conds = eventually("the stand-in's next status update", async || {
        let n = nodes.get("node-a").await.ok()?;
        let conds = n.status?.conditions?;
        conds
            .iter()
            .any(|c| c.type_ == "MemoryPressure" && c.status == "True")
            .then_some(conds)
    })
    .await;
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "NodeMonitorMemoryPressure" && c.status == "False"),
        "the stand-in clobbered node-monitor's condition: {conds:?}"
    );

    // Stopping the stand-in kills the processes and removes its cgroups.
    let node_rel = node.node_rel.clone();
    fx.stop().await;
    for pid in &pids {
        assert!(!running(*pid), "pid {pid} outlived the stand-in");
    }
    for root in [MEMORY_V1, PIDS_V1, UNIFIED] {
        let kubepods = Path::new(root).join(&node_rel).join("kubepods");
        assert!(!kubepods.exists(), "{} remains", kubepods.display());
    }
}

/// A pod that runs to completion: Succeeded, its exit code reported, its cgroup removed.
async fn a_finished_pod_succeeds_and_its_cgroup_goes(pods: &Api<Pod>, node: &NodeCgroup) {
    let mut once = workload_pod("once", &[], &["--sleep", "1s", "--exit-code", "0"], None);
    if let Some(spec) = once.spec.as_mut() {
        spec.restart_policy = Some("Never".to_owned());
    }
    let once = create_pod(pods, &once).await;
    let once_uid = once.metadata.uid.expect("uid");
    let done = eventually("once to succeed", async || {
        let p = pods.get_opt("once").await.ok().flatten()?;
        let st = p.status?;
        (st.phase.as_deref() == Some("Succeeded")).then_some(st)
    })
    .await;
    let term = done.container_statuses.expect("statuses")[0]
        .state
        .clone()
        .and_then(|s| s.terminated)
        .expect("terminated state");
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (0, Some("Completed"))
    );
    let once_dir = Path::new(MEMORY_V1)
        .join(&node.node_rel)
        .join("kubepods/besteffort")
        .join(format!("pod{once_uid}"));
    eventually("the finished pod's cgroup to go", async || {
        (!once_dir.exists()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_kills_the_processes_and_the_standin_finalizes_the_pod() {
    let fx = NodeA::start("cp-evict", ControlPlaneOptions::default()).await;
    let (standin, node) = (&fx.standin, &fx.node);
    let pods = fx.pods();
    create_pod(
        &pods,
        &workload_pod("victim", &[], &["--hold", "8Mi", "--procs", "1"], None),
    )
    .await;
    let pod = wait_running(&pods, "victim").await;
    let uid = pod.metadata.uid.clone().expect("uid");
    let info = standin.pod(&uid).expect("the stand-in runs victim");
    assert_eq!(info.qos, QosClass::BestEffort);
    let container_dir = Path::new(MEMORY_V1).join(&info.containers[0].cgroup);
    assert!(
        container_dir.starts_with(
            Path::new(MEMORY_V1)
                .join(&node.node_rel)
                .join("kubepods/besteffort")
        ),
        "{}",
        container_dir.display()
    );
    // main + 1 sleeper
    let pids = wait_procs(&container_dir, 2).await;
    let log = info.containers[0].log.clone();

    must(
        pods.evict("victim", &EvictParams::default()).await,
        "evict victim",
    );
    eventually("victim to leave the API", async || {
        match pods.get_opt("victim").await {
            Ok(None) => Some(()),
            Ok(Some(p)) if p.metadata.uid.as_deref() != Some(uid.as_str()) => Some(()),
            _ => None,
        }
    })
    .await;
    // The stand-in completes the deletion only once the processes are gone.
    for pid in &pids {
        assert!(!running(*pid), "pid {pid} survived the eviction");
    }
    assert!(
        !container_dir.exists(),
        "{} remains",
        container_dir.display()
    );
    assert!(standin.pod(&uid).is_none());
    // The workload saw SIGTERM (a graceful stop), not only a SIGKILL.
    let out = fs::read_to_string(&log).expect("container log");
    assert!(out.contains("signalled; exiting"), "{out}");
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_at_its_minimum_makes_eviction_return_429() {
    let fx = NodeA::start("cp-pdb", ControlPlaneOptions::default()).await;
    let client = fx.cp.client();
    let pods = fx.pods();
    for name in ["guarded-0", "guarded-1"] {
        create_pod(
            &pods,
            &workload_pod(name, &[("app", "guarded")], &["--sleep"], None),
        )
        .await;
    }
    for name in ["guarded-0", "guarded-1"] {
        wait_running(&pods, name).await;
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    must(
        pdbs.create(
            &PostParams::default(),
            &PodDisruptionBudget {
                metadata: ObjectMeta {
                    name: Some("guarded".to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(PodDisruptionBudgetSpec {
                    min_available: Some(IntOrString::Int(2)),
                    selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            "app".to_owned(),
                            "guarded".to_owned(),
                        )])),
                        ..LabelSelector::default()
                    }),
                    ..PodDisruptionBudgetSpec::default()
                }),
                ..PodDisruptionBudget::default()
            },
        )
        .await,
        "create the PDB",
    );
    let observed = async |allowed: i32| {
        eventually(
            &format!("the disruption controller to allow {allowed}"),
            async || {
                let p = pdbs.get("guarded").await.ok()?;
                let st = p.status?;
                (st.observed_generation == p.metadata.generation
                    && st.current_healthy == Some(2)
                    && st.disruptions_allowed == Some(allowed))
                .then_some(())
            },
        )
        .await;
    };
    observed(0).await;

    let victim = must(pods.get("guarded-0").await, "get guarded-0");
    let victim_pids = fx
        .standin
        .running_pod_pids(victim.metadata.uid.as_deref().expect("uid"))
        .await;
    assert!(!victim_pids.is_empty());
    match pods.evict("guarded-0", &EvictParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "{s:?}"),
        other => panic!("eviction despite the PDB: {other:?}"),
    }
    let still = must(pods.get("guarded-0").await, "get guarded-0");
    assert!(still.metadata.deletion_timestamp.is_none());
    assert!(victim_pids.iter().all(|p| running(*p)));

    // With room in the budget the same eviction goes through: the 429 was the PDB's.
    must(
        pdbs.patch(
            "guarded",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "minAvailable": 1 } })),
        )
        .await,
        "relax the PDB",
    );
    observed(1).await;
    must(
        pods.evict("guarded-0", &EvictParams::default()).await,
        "evict within the budget",
    );
    wait_gone(&pods, "guarded-0").await;
    assert!(victim_pids.iter().all(|p| !running(*p)));
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_killed_container_is_reported_and_restarted() {
    let fx = NodeA::start("cp-oom", ControlPlaneOptions::default()).await;
    let pods = fx.pods();
    create_pod(
        &pods,
        &workload_pod(
            "hog",
            &[],
            &["--ramp-to", "128Mi", "--step", "8Mi", "--interval", "10ms"],
            Some("48Mi"),
        ),
    )
    .await;
    let last = eventually("hog's OOMKilled termination and restart", async || {
        let p = pods.get_opt("hog").await.ok().flatten()?;
        let cs = p.status?.container_statuses?.into_iter().next()?;
        let t = cs.last_state?.terminated?;
        (cs.restart_count >= 1).then_some(t)
    })
    .await;
    assert_eq!(last.reason.as_deref(), Some("OOMKilled"), "{last:?}");
    assert_eq!(last.exit_code, 137);
    must(
        pods.delete("hog", &kube::api::DeleteParams::default())
            .await,
        "delete hog",
    );
    wait_gone(&pods, "hog").await;

    // Without a limit of its own, the pod runs into the node's (the kubepods cgroup's) limit: the
    // kernel's OOM killer picks it in an ancestor cgroup, and it is still reported OOMKilled.
    create_pod(
        &pods,
        &workload_pod(
            "node-hog",
            &[],
            &["--ramp-to", "1Gi", "--step", "16Mi", "--interval", "10ms"],
            None,
        ),
    )
    .await;
    let last = eventually("node-hog's OOMKilled termination", async || {
        let p = pods.get_opt("node-hog").await.ok().flatten()?;
        let cs = p.status?.container_statuses?.into_iter().next()?;
        cs.last_state?.terminated
    })
    .await;
    assert_eq!(last.reason.as_deref(), Some("OOMKilled"), "{last:?}");
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_standin_goes_unknown_and_its_deleted_pods_wait_for_it() {
    // Node failure handling scaled down: unreachable after 4 s, pods evicted 2 s later.
    let opts = ControlPlaneOptions::default()
        .fast_node_failover(Duration::from_secs(4), Duration::from_secs(2));
    let fx = NodeA::start("cp-pause", opts).await;
    let (standin, cp) = (&fx.standin, &fx.cp);
    // A healthy second node: with every node down the node lifecycle controller enters
    // "full disruption" and evicts nothing.
    let mut other_cgroups = TestCgroups::new("cp-pause-b");
    other_cgroups
        .create("node-b")
        .unwrap_or_else(|e| panic!("create the node-b cgroup: {e:#}"));
    let other = start_named_standin(
        cp,
        "node-b",
        &other_cgroups.rel_root().join("node-b"),
        256 << 20,
    )
    .await;
    // node-b takes no pods: the one under test must land on node-a.
    let nodes: Api<Node> = Api::all(cp.client());
    must(nodes.cordon("node-b").await, "cordon node-b");
    let pods = fx.pods();
    create_pod(&pods, &workload_pod("stranded", &[], &["--sleep"], None)).await;
    let pod = wait_running(&pods, "stranded").await;
    let uid = pod.metadata.uid.clone().expect("uid");
    let pids = standin.running_pod_pids(&uid).await;
    assert!(
        !pids.is_empty(),
        "the running pod's processes in its cgroup"
    );

    // A dead kubelet: the node lifecycle controller marks the node Unknown, the taint eviction
    // controller deletes the pod, and nobody completes the deletion.
    standin.pause();
    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone())
    };
    eventually("node-a Ready=Unknown", async || {
        let n = nodes.get("node-a").await.ok()?;
        (ready(&n).as_deref() == Some("Unknown")).then_some(())
    })
    .await;
    eventually(
        "the taint eviction controller to delete stranded",
        async || {
            let p = pods.get_opt("stranded").await.ok().flatten()?;
            p.metadata.deletion_timestamp.map(|_| ())
        },
    )
    .await;
    let p = must(pods.get("stranded").await, "stranded is still in the API");
    assert_eq!(p.metadata.uid.as_deref(), Some(uid.as_str()));
    assert!(
        pids.iter().all(|p| running(*p)),
        "a paused stand-in must not kill processes"
    );

    // The kubelet comes back: it completes the deletion and the node turns Ready again.
    standin.resume();
    wait_gone(&pods, "stranded").await;
    assert!(pids.iter().all(|p| !running(*p)));
    eventually("node-a Ready=True again", async || {
        let n = nodes.get("node-a").await.ok()?;
        (ready(&n).as_deref() == Some("True")).then_some(())
    })
    .await;
    must(other.stop().await, "stop the node-b stand-in");
    drop(other_cgroups);
    fx.stop().await;
}

/// The agent's eviction reaches the API server with its grace period and UID precondition (the
/// Eviction's `deleteOptions`): the pod's deletionGracePeriodSeconds is the planned one, not its
/// terminationGracePeriodSeconds, and an eviction meant for an older pod of the same name is
/// refused. No kubelet runs for `ghost`, so an evicted pod stays Terminating and can be read.
#[tokio::test]
async fn agent_evictions_carry_their_grace_period_and_uid_precondition() {
    use node_monitor::cluster::actuator::{
        Actuator, ActuatorConfig, EvictOutcome, EvictionRequest,
    };

    use node_monitor_core::config::PdbPolicy;
    let cp = start_control_plane().await;
    let client = cp.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str| {
        PodBuilder::new(name)
            .node("ghost")
            .termination_grace(30)
            .container_name("c")
            .image("none")
            .build()
    };
    let actuator = Actuator::new(
        client.clone(),
        ActuatorConfig {
            node_name: "ghost".into(),
            pdb_policy: PdbPolicy::Respect,
            dry_run: false,
        },
    );
    let request = |name: &str, uid: &str| EvictionRequest {
        namespace: "default".into(),
        name: name.into(),
        uid: uid.into(),
        grace_period_seconds: 7,
        hard: true,
        signal: "memory.available".into(),
        message: "test".into(),
        annotations: Default::default(),
    };
    let a = create_pod(&pods, &pod("a")).await;
    let uid = a.metadata.uid.clone().expect("uid");
    assert_eq!(
        actuator.evict(&request("a", &uid)).await,
        EvictOutcome::Evicted
    );
    let a = must(pods.get("a").await, "get a");
    assert!(a.metadata.deletion_timestamp.is_some(), "a is terminating");
    assert_eq!(
        a.metadata.deletion_grace_period_seconds,
        Some(7),
        "the planned grace period, not the pod's 30 s"
    );
    let b = create_pod(&pods, &pod("b")).await;
    assert_eq!(
        actuator.evict(&request("b", "an-older-pods-uid")).await,
        EvictOutcome::Gone,
        "the UID precondition refuses an eviction meant for another pod"
    );
    let b_now = must(pods.get("b").await, "get b");
    assert!(b_now.metadata.deletion_timestamp.is_none(), "b untouched");
    assert_eq!(b_now.metadata.uid, b.metadata.uid);
    must(cp.stop(), "stop the control plane");
}
