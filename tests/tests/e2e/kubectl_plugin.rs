//! End to end: `kubectl node-monitor` (the real `kubectl-node_monitor` binary, run as a process with
//! a kubeconfig) reads the real agent of a stand-in node through a real kube-apiserver's pod
//! proxy, and the agent authorizes each caller with TokenReview and SubjectAccessReview.
//!
//! The agent runs as a host process, not in a pod; the stand-in kubelet runs a pod object for it
//! in `node-monitor` (labelled like the DaemonSet's pods, its port named `metrics` being the
//! agent's). The API server proxies to no loopback address, so the stand-in gives its pods the
//! host's own IPv4 address and the agent listens on every address: `pods/<pod>:<port>/proxy/`
//! reaches the agent. Root only; fails loudly when it cannot run.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    core::v1::ContainerPort,
    rbac::v1::{ClusterRoleBinding, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    client::Body,
};
use node_monitor::http::{STATUS_PATH, auth::TOKEN_HEADER};
use node_monitor_tests::{
    e2e::{self, Agent, Cluster},
    manifests,
    pod::PodBuilder,
};
use serde_json::Value;

const MI: u64 = 1 << 20;
const NODE: &str = "e2e-plugin";
const AGENT_NS: &str = "node-monitor";
const AGENT_POD: &str = "node-monitor-agent";

/// The plugin binary with `kubeconfig`.
fn plugin(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(e2e::binary("kubectl-node_monitor"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("NODE_MONITOR_TOKEN")
        .output()
        .expect("running kubectl-node_monitor")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs the plugin until `done` accepts its output (up to 60 s); the last output otherwise.
async fn plugin_until(
    kubeconfig: &Path,
    args: &[&str],
    done: impl Fn(&Output) -> bool,
) -> Result<Output, Output> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = plugin(kubeconfig, args);
        if done(&out) {
            return Ok(out);
        }
        if Instant::now() > deadline {
            return Err(out);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A `trace --follow` process, its output lines read on a thread; killed when dropped.
struct Follow {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Follow {
    fn start(kubeconfig: &Path, args: &[&str]) -> Follow {
        let mut child = Command::new(e2e::binary("kubectl-node_monitor"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .env_remove("NODE_MONITOR_TOKEN")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("starting kubectl-node_monitor trace --follow");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Follow { child, lines }
    }

    fn line_within(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bearer token of a kubeconfig written by the control-plane harness.
fn kubeconfig_token(path: &Path) -> String {
    let yaml = std::fs::read_to_string(path).expect("kubeconfig");
    let v: Value = serde_norway::from_str(&yaml).expect("kubeconfig YAML");
    v["users"][0]["user"]["token"]
        .as_str()
        .expect("a token user")
        .to_owned()
}

/// GET through the pod proxy to the agent, with `token` in the node API's header when given:
/// (status, body).
async fn proxied(client: &Client, port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let uri = format!("/api/v1/namespaces/{AGENT_NS}/pods/{AGENT_POD}:{port}/proxy{path}");
    let mut request = http::Request::get(&uri);
    if let Some(t) = token {
        request = request.header(TOKEN_HEADER, format!("Bearer {t}"));
    }
    let request = request.body(Body::empty()).expect("request");
    let response = client.send(request).await.expect("the API server answers");
    let status = response.status().as_u16();
    let body = response.into_body().collect_bytes().await.expect("body");
    (status, text(&body))
}

/// The shipped viewer objects (the ServiceAccount node-monitor-viewer, its ClusterRole and
/// binding, the Role), and who is bound to what: `viewer` (a ServiceAccount, a token kubeconfig)
/// and `alice` (a user with a client certificate) to the Role, which lets them mint the viewer's
/// token, and `viewer` to the ClusterRole too (the fleet summary lists nodes); `stranger` only
/// to a Role of its own that reaches the pods' proxy and mints nothing.
async fn grant_roles(client: &Client) {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
    let viewer = manifests::read_objects(&manifests::kustomize_dir("base").join("viewer.yaml"))
        .expect("deploy/kustomize/base/viewer.yaml");
    manifests::apply(client, &viewer)
        .await
        .expect("applying the viewer roles");
    let account = |name: &str| Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some("default".into()),
        ..Subject::default()
    };
    let user = |name: &str| Subject {
        kind: "User".into(),
        name: name.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Subject::default()
    };
    let role_ref = |kind: &str, name: &str| RoleRef {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: kind.into(),
        name: name.into(),
    };
    let meta = |name: &str, ns: Option<&str>| ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(Into::into),
        ..ObjectMeta::default()
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: meta("viewer-node-monitor-viewer", None),
                role_ref: role_ref("ClusterRole", "node-monitor-viewer"),
                subjects: Some(vec![account("viewer")]),
            },
        )
        .await
        .expect("ClusterRoleBinding");
    let rbs: Api<RoleBinding> = Api::namespaced(client.clone(), AGENT_NS);
    rbs.create(
        &PostParams::default(),
        &RoleBinding {
            metadata: meta("node-monitor-viewer", Some(AGENT_NS)),
            role_ref: role_ref("Role", "node-monitor-viewer"),
            subjects: Some(vec![account("viewer"), user("alice")]),
        },
    )
    .await
    .expect("RoleBinding");
    let rule = |resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec![resource.into()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    Api::<Role>::namespaced(client.clone(), AGENT_NS)
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta("proxy-only", Some(AGENT_NS)),
                rules: Some(vec![
                    rule("pods", &["get", "list"]),
                    rule("pods/proxy", &["get"]),
                ]),
            },
        )
        .await
        .expect("Role proxy-only");
    rbs.create(
        &PostParams::default(),
        &RoleBinding {
            metadata: meta("stranger-proxy-only", Some(AGENT_NS)),
            role_ref: role_ref("Role", "proxy-only"),
            subjects: Some(vec![account("stranger")]),
        },
    )
    .await
    .expect("RoleBinding proxy-only");
}

/// The stand-in node (its pods on the host's address), the agent (dry run, a hard threshold the
/// node is below, so it decides to evict on every cycle and evicts nothing), its pod object, and
/// a BestEffort pod holding 300 MiB.
async fn setup() -> (Cluster, Agent, u16) {
    let ip = e2e::host_ipv4().expect("a host address for the pod proxy");
    let cluster = Cluster::start_with(NODE, 1024 * MI, |mut cfg| {
        cfg.node_ip = ip.to_string();
        cfg
    })
    .await
    .expect("cluster");
    let mut agent = Agent::spawn_on(
        &cluster,
        "evictionHard:\n  memory.available: 900Mi\n",
        &["--no-mlock", "--dry-run"],
        "0.0.0.0",
    )
    .expect("agent");
    agent
        .wait_log("deciding", Duration::from_secs(30))
        .await
        .expect("agent up");
    let port = agent.metrics_port;
    cluster
        .cp
        .create_namespace(AGENT_NS)
        .await
        .expect("namespace");
    let mut pod = PodBuilder::workload(AGENT_POD, NODE, &["--hold", "1Mi"])
        .namespace(AGENT_NS)
        .label("app.kubernetes.io/name", "node-monitor")
        .memory("64Mi", Some("64Mi"))
        .build();
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers[0].ports = Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: i32::from(port),
            ..ContainerPort::default()
        }]);
    }
    cluster.create_pod(pod).await.expect("agent pod");
    let running = cluster
        .wait_running(AGENT_NS, AGENT_POD, Duration::from_secs(30))
        .await
        .expect("agent pod running");
    assert_eq!(
        running.status.and_then(|s| s.pod_ip),
        Some(ip.to_string()),
        "the stand-in gives its pods the host's address"
    );
    cluster
        .run_pod(PodBuilder::workload("hog", NODE, &["--hold", "300Mi"]))
        .await
        .expect("hog running");
    grant_roles(&cluster.client()).await;
    (cluster, agent, port)
}

/// (a) a token of an identity without the viewer ClusterRole, for the agents' audience, gets 403
/// from the agent, and the plugin of an identity that may not mint the viewer's token says so;
/// (b) the viewer's token for the agents' audience gets the status and the live explain, which
/// names the pod the agent would evict; (c) a request without a token gets 401, including one
/// whose bearer token went in `Authorization` (the API server drops it), and so does a caller's
/// own API token (not valid for the agents' audience); (d) the plugin mints the viewer's token
/// with a token, a client-certificate and an exec-plugin kubeconfig alike, and prints status,
/// explain and trace through the pod proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_plugin_reads_the_agent_through_the_pod_proxy_for_viewers_only() {
    let (cluster, agent, port) = setup().await;
    let cp = &cluster.cp;
    let viewer_kc: PathBuf = cp
        .service_account_kubeconfig("default", "viewer")
        .await
        .expect("viewer kubeconfig");
    let stranger_kc: PathBuf = cp
        .service_account_kubeconfig("default", "stranger")
        .await
        .expect("stranger kubeconfig");

    let viewer_token = kubeconfig_token(&viewer_kc);
    unauthenticated_callers_are_refused(&cluster, port, &viewer_token).await;
    the_stranger_is_forbidden(&cluster, port, &stranger_kc).await;
    viewers_read_the_status(&cluster, &agent, port, &viewer_kc).await;
    any_kubeconfig_mints_the_token(cp, &viewer_kc, &viewer_token).await;
    explain_names_the_hog_and_evicts_nobody(&cluster, &agent, &viewer_kc).await;
    trace_attributes_the_oom_kill(&cluster, &agent, &viewer_kc, &stranger_kc).await;
    flight_shows_the_kill_and_the_dry_run(&viewer_kc, &stranger_kc, &agent).await;
    drop(agent);
    cluster.stop().await.expect("stop");
}

/// (c) Unauthenticated: no token at all, the caller's own token in Authorization only (the API
/// server drops it), a token that is none, and the caller's own API token sent as is.
async fn unauthenticated_callers_are_refused(cluster: &Cluster, port: u16, viewer_token: &str) {
    let cp = &cluster.cp;
    // (c) Unauthenticated: no token at all, and the viewer's own token in Authorization only.
    let (code, body) = proxied(&cluster.client(), port, STATUS_PATH, None).await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains(TOKEN_HEADER), "{body}");
    let viewer_client = cp
        .service_account_client("default", "viewer")
        .await
        .expect("viewer client");
    let (code, body) = proxied(&viewer_client, port, STATUS_PATH, None).await;
    assert_eq!(
        code, 401,
        "the API server does not pass Authorization through its proxy: {body}"
    );
    let (code, body) = proxied(&cluster.client(), port, STATUS_PATH, Some("not-a-token")).await;
    assert_eq!(code, 401, "{body}");
    // The caller's own API token, sent as is, is refused: the agents accept only tokens bound to
    // their audience, which the API server accepts for nothing else (a replay gets nothing).
    let (code, body) = proxied(&cluster.client(), port, STATUS_PATH, Some(viewer_token)).await;
    assert_eq!(code, 401, "an API token is refused by the agent: {body}");
}

/// (a) Forbidden: a token of the stranger for the agents' audience is authenticated, and
/// refused, by the agent and through the plugin.
async fn the_stranger_is_forbidden(cluster: &Cluster, port: u16, stranger_kc: &Path) {
    // (a) Forbidden: a token of the stranger for the agents' audience is authenticated, and
    // refused; the stranger's plugin cannot mint the viewer's token, and with its own token the
    // agent refuses it.
    let stranger_token = cluster
        .cp
        .audience_token("default", "stranger", "node-monitor")
        .await
        .expect("stranger token");
    let (code, body) = proxied(&cluster.client(), port, STATUS_PATH, Some(&stranger_token)).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("system:serviceaccount:default:stranger")
            && body.contains("nodes/node-monitor"),
        "{body}"
    );
    let out = plugin(stranger_kc, &["status", NODE]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("serviceaccounts/token"),
        "the plugin names the permission it lacks: {}",
        text(&out.stderr)
    );
    let out = plugin(stranger_kc, &["--token", &stranger_token, "status", NODE]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("403 Forbidden by the agent"),
        "{}",
        text(&out.stderr)
    );
}

/// (b) and (d): the viewer's token for the agents' audience is authorized; the viewer's plugin
/// mints it and prints the node's status, every agent's, and the fleet's guarantees.
async fn viewers_read_the_status(cluster: &Cluster, agent: &Agent, port: u16, viewer_kc: &Path) {
    // (b) and (d): the viewer's token for the agents' audience is authorized; the viewer's
    // plugin mints it by itself.
    let minted = cluster
        .cp
        .audience_token(AGENT_NS, "node-monitor-viewer", "node-monitor")
        .await
        .expect("viewer token");
    let (code, body) = proxied(&cluster.client(), port, STATUS_PATH, Some(&minted)).await;
    assert_eq!(code, 200, "{body}");
    let status = plugin_until(viewer_kc, &["status", NODE], |o| {
        o.status.success() && text(&o.stdout).contains("memory.available")
    })
    .await
    .unwrap_or_else(|o| {
        panic!(
            "status: {}\n{}\n{}",
            text(&o.stdout),
            text(&o.stderr),
            agent.log()
        )
    });
    let shown = text(&status.stdout);
    assert!(shown.contains(&format!("node {NODE} (dry run)")), "{shown}");
    assert!(shown.contains("900Mi"), "{shown}");
    let all = plugin(viewer_kc, &["status", "-o", "json"]);
    assert!(all.status.success(), "{}", text(&all.stderr));
    let all: Value = serde_json::from_slice(&all.stdout).expect("status JSON");
    assert_eq!(all[0]["node"], NODE, "{all}");
    // The same answer as YAML, and the agent's version in it.
    let yaml = plugin(viewer_kc, &["status", "-o", "yaml"]);
    assert!(yaml.status.success(), "{}", text(&yaml.stderr));
    let as_yaml: Value = serde_norway::from_slice(&yaml.stdout).expect("status YAML");
    assert_eq!(as_yaml[0]["node"], all[0]["node"], "{as_yaml}");
    let agent_version = all[0]["agent_version"].as_str().unwrap_or_default();
    assert!(
        agent_version.starts_with(&format!("{} (commit ", env!("CARGO_PKG_VERSION"))),
        "{all}"
    );
    // `version`: the plugin's and the agent's, the same release: no skew.
    let versions = plugin(viewer_kc, &["version"]);
    let shown = text(&versions.stdout);
    assert!(
        versions.status.success(),
        "{shown}{}",
        text(&versions.stderr)
    );
    assert!(
        shown.contains(&format!("node {NODE}: agent {agent_version}")) && !shown.contains("skew"),
        "{shown}"
    );
    assert_eq!(all[0]["thresholds"][0]["met"], true, "{all}");
    // What holds on the node: in the agent's answer, and published on the Node (the agent's
    // first publication is 15 s after its start), which the fleet summary reads.
    let holds = &all[0]["guarantees"];
    for g in node_monitor_core::guarantees::Guarantee::ALL {
        let v = holds[g.as_str()].as_str().unwrap_or_default();
        assert!(
            v == "yes" || v.starts_with("no: ") || v.starts_with("n/a: "),
            "{g:?} in {holds}"
        );
    }
    let fleet = plugin_until(viewer_kc, &["status", "--fleet", "-o", "json"], |o| {
        serde_json::from_slice::<Value>(&o.stdout).is_ok_and(|v| v["guarantees"][NODE].is_object())
    })
    .await
    .unwrap_or_else(|o| {
        panic!(
            "the node's guarantees were never published: {}\n{}\n{}",
            text(&o.stdout),
            text(&o.stderr),
            agent.log()
        )
    });
    let fleet: Value = serde_json::from_slice(&fleet.stdout).expect("fleet JSON");
    assert_eq!(fleet["nodes"], 1, "{fleet}");
    assert_eq!(
        fleet["guarantees"][NODE]["kubelet-config"], holds["kubelet-config"],
        "the annotation says what the agent says: {fleet}"
    );
    let summary = fleet["summary"].as_array().expect("summary lines");
    assert!(!summary.is_empty(), "{fleet}");
}

/// A client-certificate and an exec-plugin kubeconfig mint the same token as a token one.
async fn any_kubeconfig_mints_the_token(
    cp: &node_monitor_tests::control_plane::ControlPlane,
    viewer_kc: &Path,
    viewer_token: &str,
) {
    // Any kubeconfig: a user with a client certificate (kubeadm's and kind's admin
    // kubeconfigs), and an exec credential plugin (EKS's, GKE's, AKS's), mint the same token.
    let alice_kc = cp
        .user_kubeconfig("alice", None)
        .expect("client-certificate kubeconfig");
    let exec_kc = cp
        .exec_kubeconfig("viewer-exec", viewer_token)
        .expect("exec-plugin kubeconfig");
    for (what, kc) in [("client certificate", &alice_kc), ("exec plugin", &exec_kc)] {
        let out = plugin(kc, &["status", NODE]);
        assert!(
            out.status.success() && text(&out.stdout).contains("memory.available"),
            "{what}: {}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let with_fleet = text(&plugin(viewer_kc, &["status"]).stdout);
    assert!(
        with_fleet.starts_with("fleet: ") && with_fleet.contains(&format!("node {NODE}")),
        "{with_fleet}"
    );
}

/// The live explain names the hog, as JSON and text, and a dry run evicts nobody.
async fn explain_names_the_hog_and_evicts_nobody(
    cluster: &Cluster,
    agent: &Agent,
    viewer_kc: &Path,
) {
    let explained = plugin_until(viewer_kc, &["explain", NODE], |o| {
        serde_json::from_slice::<Value>(&o.stdout).is_ok_and(|v| v["evict"][0]["name"] == "hog")
    })
    .await
    .unwrap_or_else(|o| {
        panic!(
            "the live explain never named the hog: {}\n{}\n{}",
            text(&o.stdout),
            text(&o.stderr),
            agent.log()
        )
    });
    let v: Value = serde_json::from_slice(&explained.stdout).expect("explain JSON");
    assert_eq!(v["reclaim"], "memory.available", "{v}");
    assert_eq!(v["evict"][0]["namespace"], "default", "{v}");
    assert_eq!(v["ranked"][0]["name"], "hog", "{v}");
    assert_eq!(v["node"], NODE, "{v}");
    let as_text = plugin(viewer_kc, &["explain", NODE, "-o", "text"]);
    assert!(
        text(&as_text.stdout).contains("would evict #1: default/hog (memory.available hard)"),
        "{}",
        text(&as_text.stdout)
    );
    assert!(
        cluster.is_live("default", "hog").await.expect("get"),
        "a dry run evicts nobody"
    );
}

/// `trace`: the oomer's kill in the agent's buffer, to `--follow` and to each filter; nothing
/// for another pod or node; the stranger refused.
async fn trace_attributes_the_oom_kill(
    cluster: &Cluster,
    agent: &Agent,
    viewer_kc: &Path,
    stranger_kc: &Path,
) {
    // Trace: a container OOM-killed by its limit shows up in the agent's buffer, and to a
    // `trace --follow` started before it (its OOM kills only: the capped pod's memcg reclaim
    // stalls may come first).
    let follow = Follow::start(
        viewer_kc,
        &[
            "trace", "--follow", "-o", "json", "--pod", "oomer", "--kind", "oom_kill",
        ],
    );
    cluster
        .create_pod(
            PodBuilder::workload("oomer", NODE, &["--hold", "64Mi"])
                .memory("16Mi", Some("16Mi"))
                .restart_policy("Never")
                .build(),
        )
        .await
        .expect("oomer");
    let traced = plugin_until(viewer_kc, &["trace", "--node", NODE, "-o", "json"], |o| {
        text(&o.stdout)
            .lines()
            .any(|l| l.contains(r#""kind":"oom_kill""#))
    })
    .await
    .unwrap_or_else(|o| {
        panic!(
            "no oom_kill in the agent's trace: {}\n{}\n{}",
            text(&o.stdout),
            text(&o.stderr),
            agent.log()
        )
    });
    let followed = follow
        .line_within(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("trace --follow printed nothing:\n{}", agent.log()));
    assert!(followed.contains(r#""kind":"oom_kill""#), "{followed}");
    assert!(followed.contains(r#""pod_name":"oomer""#), "{followed}");
    drop(follow);
    let line = text(&traced.stdout)
        .lines()
        .find(|l| l.contains(r#""kind":"oom_kill""#))
        .map(str::to_owned)
        .expect("an oom_kill line");
    let event: Value = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(event["node"], NODE, "{event}");
    assert_eq!(event["pod_namespace"], "default", "{event}");
    assert_eq!(event["pod_name"], "oomer", "{event}");
    assert_eq!(event["container_name"], "main", "{event}");
    assert_eq!(event["comm"], "nm-workload", "{event}");
    // The filters: namespace, pod, container and kind all match; another pod matches nothing.
    let columns = plugin(
        viewer_kc,
        &[
            "trace",
            "-n",
            "default",
            "--pod",
            "oomer",
            "--container",
            "main",
            "--kind",
            "oom_kill",
            "-o",
            "columns",
        ],
    );
    let shown = text(&columns.stdout);
    assert!(shown.starts_with("TIME"), "{shown}");
    assert!(
        shown
            .lines()
            .skip(1)
            .any(|l| l.contains("oom_kill") && l.contains(NODE) && l.contains("default/oomer")),
        "{shown}"
    );
    let text_out = text(&plugin(viewer_kc, &["trace", "--pod", "oomer"]).stdout);
    assert!(
        text_out.contains("oom_kill")
            && text_out.contains("pod=default/oomer container=main oom=memcg"),
        "{text_out}"
    );
    let none = plugin(viewer_kc, &["trace", "-n", "default", "--pod", "hog"]);
    assert!(none.status.success(), "{}", text(&none.stderr));
    assert_eq!(text(&none.stdout), "", "no event of the hog");
    let elsewhere = plugin(viewer_kc, &["trace", "--node", "no-such-node"]);
    assert!(
        text(&elsewhere.stderr).contains("no running agent pod on node \"no-such-node\""),
        "{}",
        text(&elsewhere.stderr)
    );
    let stranger_trace = plugin(stranger_kc, &["trace"]);
    assert!(!stranger_trace.status.success());
    assert!(
        text(&stranger_trace.stderr).contains("403"),
        "{}",
        text(&stranger_trace.stderr)
    );
}

/// `kubectl node-monitor flight NODE --svg`: the agent's flight records of the oomer's kill (in
/// its own limit) and of the dry-run eviction of the hog, with their verdicts, and the newest
/// drawn; the stranger is refused.
async fn flight_shows_the_kill_and_the_dry_run(
    viewer_kc: &Path,
    stranger_kc: &Path,
    agent: &Agent,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let svg = dir.path().join("flight.svg");
    let svg_arg = svg.display().to_string();
    let out = plugin_until(viewer_kc, &["flight", NODE, "--svg", &svg_arg], |o| {
        o.status.success() && text(&o.stdout).contains("OOM kill of nm-workload")
    })
    .await
    .unwrap_or_else(|o| {
        panic!(
            "flight never showed the kill: {}\n{}\n{}",
            text(&o.stdout),
            text(&o.stderr),
            agent.log()
        )
    });
    let shown = text(&out.stdout);
    assert!(shown.contains(&format!("{NODE} record ")), "{shown}");
    assert!(
        shown.contains("OOM kill of nm-workload") && shown.contains("of default/oomer"),
        "{shown}"
    );
    assert!(
        shown.contains("verdict: dry run: node-monitor would have evicted default/hog"),
        "{shown}"
    );
    let drawn = std::fs::read_to_string(&svg).expect("the SVG written");
    assert!(
        drawn.starts_with("<svg") && drawn.contains("memory.available available"),
        "{drawn}"
    );
    let json = plugin(viewer_kc, &["flight", NODE, "-o", "json"]);
    let v: Value = serde_json::from_slice(&json.stdout).expect("flight JSON");
    assert_eq!(v["node"], NODE, "{v}");
    assert!(
        v["records"][0]["samples"]
            .as_array()
            .is_some_and(|s| !s.is_empty()),
        "{v}"
    );
    let refused = plugin(stranger_kc, &["flight", NODE]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("403"),
        "{}",
        text(&refused.stderr)
    );
}

/// `kubectl node-monitor flight` on the agent's own answer (its live view's records): the
/// records as text (newest first) or the agent's JSON, and
/// with `--svg` the picture of the newest record or of `--record ID`; an unknown id or a node
/// without records is an error naming it.
#[test]
fn flight_prints_the_records_and_draws_the_chosen_one() {
    use kubectl_node_monitor::format::Output;
    let live = node_monitor::live::LiveView::new("n1");
    for (at, name) in [(1_000u64, "first"), (60_000, "second")] {
        live.record_eviction(node_monitor::live::EvictionRecord {
            at_ms: at,
            namespace: "default".into(),
            name: name.into(),
            signal: "memory.available".into(),
            hard: true,
            outcome: "pdb_blocked".into(),
            message: String::new(),
        });
    }
    let answer = live.flight();
    let args = |output: Output, svg: bool, record: Option<u64>| kubectl_node_monitor::FlightArgs {
        node: "n1".into(),
        output,
        svg: svg.then(|| "out.svg".into()),
        record,
    };
    let (text, svg) =
        kubectl_node_monitor::flight_output(&answer, "n1", &args(Output::Text, false, None))
            .expect("text");
    assert!(svg.is_none());
    let second = text.find("n1 record 1").expect("record 1");
    let first = text.find("n1 record 0").expect("record 0");
    assert!(second < first, "newest first:\n{text}");
    assert!(text.contains("a PodDisruptionBudget refused it"), "{text}");
    let (_, svg) =
        kubectl_node_monitor::flight_output(&answer, "n1", &args(Output::Text, true, None))
            .expect("svg");
    let svg = svg.expect("an svg");
    assert!(
        svg.contains("default/second") && !svg.contains("default/first"),
        "{svg}"
    );
    let (_, svg) =
        kubectl_node_monitor::flight_output(&answer, "n1", &args(Output::Text, true, Some(0)))
            .expect("svg");
    assert!(svg.expect("an svg").contains("default/first"));
    let e = kubectl_node_monitor::flight_output(&answer, "n1", &args(Output::Text, true, Some(7)))
        .expect_err("no 7");
    assert!(e.to_string().contains("--record 7"), "{e}");
    let (json, _) =
        kubectl_node_monitor::flight_output(&answer, "n1", &args(Output::Json, false, None))
            .expect("json");
    assert!(json.contains("\"records\""), "{json}");
    let empty = node_monitor::live::LiveView::new("n2").flight();
    let (text, _) =
        kubectl_node_monitor::flight_output(&empty, "n2", &args(Output::Text, false, None))
            .expect("empty");
    assert_eq!(text, "n2: no OOM kill or eviction recorded");
    let e = kubectl_node_monitor::flight_output(&empty, "n2", &args(Output::Text, true, None))
        .expect_err("nothing");
    assert!(e.to_string().contains("no record to draw"), "{e}");
}
