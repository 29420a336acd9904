//! The shipped Grafana dashboard against a real Prometheus (the Debian package) scraping a running
//! agent: after real pressure (an eviction, a container OOM kill), every panel query, evaluated
//! through Prometheus's HTTP API, returns data, and no query names a metric the agent does not
//! export. Root only (the agent runs against real cgroups and a real control plane).
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
    assert_eq!(vars, ["datasource", "node"]);
    let exported: BTreeSet<String> = Metrics::new()
        .families()
        .iter()
        .map(|f| f.name.clone())
        .collect();
    let queries = panel_queries(&d);
    assert!(queries.len() >= 15, "{} queries", queries.len());
    for (title, expr) in &queries {
        assert!(
            expr.contains("node=~\"$node\""),
            "{title}: query ignores $node: {expr}"
        );
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("node_monitor_"))
        {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
            assert!(
                exported.contains(family),
                "{title}: {name} is not exported by the agent ({exported:?})"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_returns_data_from_a_real_prometheus() {
    let cluster = Cluster::start("dash-node", 1 << 30).await.expect("cluster");
    let mut agent = Agent::start(
        &cluster,
        "evictionHard:\n  memory.available: 300Mi\n",
        &["--no-mlock"],
    )
    .await
    .expect("agent up");

    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port().expect("port");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: node-monitor\n  static_configs:\n  - targets: ['127.0.0.1:{}']\n    labels:\n      node: {}\n",
            agent.metrics_port, cluster.node
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

    let mut empty = Vec::new();
    for (title, expr) in panel_queries(&dashboard()) {
        let q = expr
            .replace("$node", &node)
            .replace("$__rate_interval", "1m");
        let body = http_get(port, &format!("/api/v1/query?query={}", encode(&q)))
            .await
            .unwrap_or_else(|e| panic!("{title}: {q}: {e:#}"));
        let v: serde_json::Value = serde_json::from_str(&body).expect("prometheus JSON");
        assert_eq!(v["status"], "success", "{title}: {q}: {body}");
        if v["data"]["result"].as_array().is_none_or(Vec::is_empty) {
            empty.push(format!("{title}: {q}"));
        }
    }
    assert!(
        empty.is_empty(),
        "panel queries without data:\n{}",
        empty.join("\n")
    );
    cluster.stop().await.expect("stop");
}
