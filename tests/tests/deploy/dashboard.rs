//! The shipped Grafana dashboard against a real Prometheus (the Debian package) scraping a running
//! agent: after real pressure (an eviction, a container OOM kill), every panel query, with its
//! template variables substituted as Grafana does (`$cluster` as one cluster and as All, `$node`),
//! evaluated through Prometheus's HTTP API, returns data; the variables' own queries list the
//! cluster and the node; and no query names a metric the agent does not export, but for the
//! kubelet's `kubelet_evictions` and `up`. Root only (the agent runs against real cgroups and a
//! real control plane).
use std::{
    collections::BTreeSet,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use node_monitor::metrics::Metrics;
use node_monitor_tests::{
    e2e::{Agent, Cluster, free_port, http_get},
    pod::PodBuilder,
};

/// Series the dashboard reads from other jobs than the agent's.
const EXTERNAL: [&str; 2] = ["up", "kubelet_evictions"];
/// The `cluster` label the test's Prometheus gives its targets.
const CLUSTER: &str = "test-cluster";
/// The target labels a ServiceMonitor gives the agent's series: its own pod's.
const AGENT_NS: &str = "node-monitor";
const AGENT_POD: &str = "node-monitor-x7k2p";

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn dashboard() -> serde_json::Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/node-monitor-dashboard.json"
    ))
    .expect("dashboard JSON");
    serde_json::from_str(&text).expect("dashboard is JSON")
}

/// (panel title, expression) for every target of every panel.
fn panel_queries(d: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            out.push((
                p["title"].as_str().unwrap_or("?").to_owned(),
                t["expr"].as_str().expect("expr").to_owned(),
            ));
        }
    }
    out
}

/// Every metric name in `expr` with the label matchers that follow it (empty when none).
fn selectors(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if c == '"' {
            // Skip a string literal (a label value).
            i += 1 + expr[i + 1..].find('"').unwrap_or(expr.len() - i - 1) + 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < bytes.len()
                && ((bytes[i] as char).is_ascii_alphanumeric() || bytes[i] == b'_')
            {
                i += 1;
            }
            let word = &expr[start..i];
            if bytes.get(i) == Some(&b'{') {
                // The closing brace outside the label values' quotes.
                let mut end = i + 1;
                let mut quoted = false;
                while end < bytes.len() && (quoted || bytes[end] != b'}') {
                    if bytes[end] == b'"' {
                        quoted = !quoted;
                    }
                    end += 1;
                }
                assert!(end < bytes.len(), "unclosed selector in {expr}");
                out.push((word.to_owned(), expr[i + 1..end].to_owned()));
                i = end + 1;
            } else if word.starts_with("node_monitor_") || EXTERNAL.contains(&word) {
                out.push((word.to_owned(), String::new()));
            }
            continue;
        }
        i += 1;
    }
    out
}

/// `expr` with the dashboard's variables replaced as Grafana does for the given values.
fn substitute(expr: &str, cluster: &str, node: &str) -> String {
    expr.replace("$cluster", cluster)
        .replace("$node", node)
        .replace("$__rate_interval", "1m")
}

#[test]
fn selectors_are_found_with_their_matchers() {
    assert_eq!(
        selectors(r#"sum by (le) (rate(a_b{x="{y}", z=~"$z"}[1m])) / node_monitor_q"#),
        [
            ("a_b".to_owned(), r#"x="{y}", z=~"$z""#.to_owned()),
            ("node_monitor_q".to_owned(), String::new())
        ]
    );
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn dashboard_uses_template_variables_and_only_exported_metrics() {
    let d = dashboard();
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "cluster", "node"]);
    for v in d["templating"]["list"].as_array().expect("templating") {
        if v["type"] == "query" {
            assert_eq!(v["datasource"]["uid"], "${datasource}", "{v}");
            // All matches series without the label too (a single cluster has no `cluster`).
            assert_eq!(v["allValue"], ".*", "{v}");
        }
    }
    let exported: BTreeSet<String> = Metrics::new()
        .families()
        .iter()
        .map(|f| f.name.clone())
        .collect();
    let queries = panel_queries(&d);
    assert!(queries.len() >= 30, "{} queries", queries.len());
    for (title, expr) in &queries {
        let found = selectors(expr);
        assert!(!found.is_empty(), "{title}: no metric in {expr}");
        for (name, matchers) in found {
            assert!(
                matchers.contains(r#"cluster=~"$cluster""#)
                    && matchers.contains(r#"node=~"$node""#),
                "{title}: {name} ignores $cluster or $node: {expr}"
            );
            if EXTERNAL.contains(&name.as_str()) {
                continue;
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .fold(name.as_str(), |n, s| n.strip_suffix(s).unwrap_or(n));
            assert!(
                exported.contains(family),
                "{title}: {name} is not exported by the agent ({exported:?})"
            );
        }
    }
    assert!(
        queries.iter().any(|(_, e)| e.contains("kubelet_evictions")),
        "no panel beside the kubelet's own evictions"
    );
}

/// Every panel: the data source variable, a description, and the unit of what it shows.
#[test]
fn every_panel_has_a_description_the_datasource_and_its_unit() {
    let d = dashboard();
    for p in d["panels"].as_array().expect("panels") {
        let title = p["title"].as_str().expect("title");
        assert!(
            p["description"].as_str().is_some_and(|s| s.len() > 20),
            "{title} has no description"
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let unit = p["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .unwrap_or_else(|| panic!("{title} has no unit"));
        let exprs: Vec<&str> = p["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .map(|t| {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
                t["expr"].as_str().expect("expr")
            })
            .collect();
        let names: Vec<String> = exprs
            .iter()
            .flat_map(|e| selectors(e))
            .map(|(n, _)| n)
            .collect();
        let all = |f: &dyn Fn(&str) -> bool| names.iter().all(|n| f(n));
        let want = if all(&|n| n.ends_with("_bytes")) {
            Some("bytes")
        } else if names
            .iter()
            .any(|n| n.ends_with("_inodes") || n.ends_with("_pids"))
        {
            Some("short")
        } else if exprs.iter().all(|e| e.starts_with("histogram_quantile(")) {
            Some("s")
        } else if exprs.iter().all(|e| e.contains("(rate(")) {
            Some("ops")
        } else if all(&|n| n.ends_with("_time_seconds")) {
            Some("dateTimeAsIso")
        } else if all(&|n| n.ends_with("_seconds")) {
            Some("s")
        } else {
            None
        };
        if let Some(want) = want {
            assert_eq!(unit, want, "{title}: {exprs:?}");
        }
        assert!(
            !(unit == "bytes" && names.iter().any(|n| !n.ends_with("_bytes"))),
            "{title} shows a family that is not in bytes with the unit bytes"
        );
    }
}

/// Serves what a kubelet's /metrics shows of its eviction counter, for the panel beside it: the
/// stand-in node has no /metrics of its own.
async fn serve_kubelet_evictions(listener: tokio::net::TcpListener) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const BODY: &str = "# HELP kubelet_evictions [ALPHA] Cumulative number of pod evictions by eviction signal\n# TYPE kubelet_evictions counter\nkubelet_evictions{eviction_signal=\"memory.available\"} 0\n";
    while let Ok((mut conn, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
                        BODY.len()
                    )
                    .as_bytes(),
                )
                .await;
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_returns_data_from_a_real_prometheus() {
    let cluster = Cluster::start("dash-node", 1 << 30).await.expect("cluster");
    // A threshold of each unit, so that each signal panel has a threshold to show, and a kubelet
    // root (nodefs) that exists on this host.
    let kubelet_root = tempfile::tempdir().expect("tempdir");
    let kubelet_root_arg = kubelet_root.path().display().to_string();
    let mut agent = Agent::start(
        &cluster,
        "evictionHard:\n  memory.available: 300Mi\n  nodefs.inodesFree: \"1%\"\n  pid.available: \"100\"\n",
        &["--no-mlock", "--kubelet-root", &kubelet_root_arg],
    )
    .await
    .expect("agent up");

    let kubelet = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let kubelet_port = kubelet.local_addr().expect("addr").port();
    let kubelet_task = tokio::spawn(serve_kubelet_evictions(kubelet));

    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port().expect("port");
    let config = dir.path().join("prometheus.yml");
    // The labels a ServiceMonitor gives its targets (the agent pod's `namespace` and `pod`, the
    // shipped relabeling's `node`) and a multi-cluster setup adds (`cluster`); the kubelet's job
    // as the prometheus-operator scrapes it.
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n\
             - job_name: node-monitor\n  static_configs:\n  - targets: ['127.0.0.1:{}']\n    labels:\n      node: {node}\n      cluster: {CLUSTER}\n      namespace: {AGENT_NS}\n      pod: {AGENT_POD}\n\
             - job_name: kubelet\n  static_configs:\n  - targets: ['127.0.0.1:{kubelet_port}']\n    labels:\n      node: {node}\n      cluster: {CLUSTER}\n",
            agent.metrics_port,
            node = cluster.node
        ),
    )
    .expect("config");
    let _prom = Prometheus(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is installed by scripts/setup.sh (Debian package prometheus)"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(port, "/-/ready").await.is_err() {
        assert!(Instant::now() < deadline, "prometheus did not become ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Real events for the panels: a container OOM kill and a memory-pressure eviction.
    let node = cluster.node.clone();
    cluster
        .create_pod(
            PodBuilder::workload("capped", &node, &["--hold", "64Mi"])
                .memory("32Mi", Some("32Mi"))
                .build(),
        )
        .await
        .expect("capped pod");
    agent
        .wait_log("kernel event: OOM kill", Duration::from_secs(30))
        .await
        .expect("OOM kill seen");
    cluster
        .create_pod(PodBuilder::ramping("leaky", &node, "900Mi", "32Mi", "100ms").build())
        .await
        .expect("leaky pod");
    assert!(
        cluster
            .wait_gone("default", "leaky", Duration::from_secs(60))
            .await
            .expect("watch")
            .is_some(),
        "{}",
        agent.log()
    );
    // A few scrapes after the events.
    tokio::time::sleep(Duration::from_secs(5)).await;

    // The variables' own queries, as Grafana runs `label_values(...)`.
    for (label, matcher, want) in [
        ("cluster", "node_monitor_build_info".to_owned(), CLUSTER),
        (
            "node",
            format!("node_monitor_build_info{{cluster=~\"{CLUSTER}\"}}"),
            node.as_str(),
        ),
    ] {
        let body = http_get(
            port,
            &format!("/api/v1/label/{label}/values?match[]={}", encode(&matcher)),
        )
        .await
        .unwrap_or_else(|e| panic!("label values of {label}: {e:#}"));
        let v: serde_json::Value = serde_json::from_str(&body).expect("prometheus JSON");
        assert_eq!(v["data"], serde_json::json!([want]), "{label}: {body}");
    }

    let mut empty = Vec::new();
    let mut queried = 0;
    // `$cluster` as one cluster, then as All (its allValue).
    for cluster_value in [CLUSTER, ".*"] {
        for (title, expr) in panel_queries(&dashboard()) {
            let q = substitute(&expr, cluster_value, &node);
            assert!(!q.contains('$'), "{title}: a variable left in {q}");
            let body = http_get(port, &format!("/api/v1/query?query={}", encode(&q)))
                .await
                .unwrap_or_else(|e| panic!("{title}: {q}: {e:#}"));
            let v: serde_json::Value = serde_json::from_str(&body).expect("prometheus JSON");
            assert_eq!(v["status"], "success", "{title}: {q}: {body}");
            queried += 1;
            if v["data"]["result"].as_array().is_none_or(Vec::is_empty) {
                empty.push(format!("{title}: {q}"));
            }
        }
    }
    assert!(queried >= 60, "{queried} queries");
    assert!(
        empty.is_empty(),
        "panel queries without data:\n{}",
        empty.join("\n")
    );
    // The OOM kills table names the killed pod, not the agent's own pod that the target labels
    // name.
    let (_, oom_expr) = panel_queries(&dashboard())
        .into_iter()
        .find(|(title, _)| title.starts_with("OOM kills by pod"))
        .expect("the OOM kills panel");
    let q = substitute(&oom_expr, CLUSTER, &node);
    let body = http_get(port, &format!("/api/v1/query?query={}", encode(&q)))
        .await
        .expect("query");
    let v: serde_json::Value = serde_json::from_str(&body).expect("prometheus JSON");
    let rows = v["data"]["result"].as_array().cloned().unwrap_or_default();
    assert!(
        rows.iter()
            .any(|r| r["metric"]["pod_namespace"] == "default"
                && r["metric"]["pod_name"] == "capped"
                && r["metric"]["scope"] == "pod"),
        "the killed pod default/capped: {body}"
    );
    assert!(
        rows.iter().all(|r| r["metric"]["pod_name"] != AGENT_POD),
        "{body}"
    );
    // Another cluster's selection shows nothing of this one.
    let other = substitute(&panel_queries(&dashboard())[4].1, "another-cluster", &node);
    let body = http_get(port, &format!("/api/v1/query?query={}", encode(&other)))
        .await
        .expect("query");
    let v: serde_json::Value = serde_json::from_str(&body).expect("prometheus JSON");
    assert_eq!(
        v["data"]["result"],
        serde_json::json!([]),
        "{other}: {body}"
    );
    kubelet_task.abort();
    cluster.stop().await.expect("stop");
}
