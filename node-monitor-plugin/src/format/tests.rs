use super::*;

fn ev(node: &str, ns: &str, pod: &str, container: &str, kind: &str, at: u64) -> Value {
    json!({"node": node, "pod_namespace": ns, "pod_name": pod, "container_name": container,
           "container_id": format!("{container}0123456789abcdef"), "kind": kind,
           "received_at_ms": at, "pid": 7, "comm": "hog", "scope": "memcg", "rss_bytes": 3 << 20})
}

#[test]
fn trace_filters_all_must_match() {
    let events = vec![
        ev("n1", "a", "p1", "app", "oom_kill", 3),
        ev("n2", "a", "p2", "side", "reclaim_stall", 1),
        ev("n1", "b", "p1", "app", "oom_kill", 2),
    ];
    let names = |f: TraceFilter| -> Vec<(String, String)> {
        f.apply(events.clone())
            .iter()
            .map(|e| (s(e, "node").to_owned(), s(e, "pod_namespace").to_owned()))
            .collect()
    };
    let pair = |n: &str, ns: &str| (n.to_owned(), ns.to_owned());
    assert_eq!(
        names(TraceFilter::default()),
        vec![pair("n2", "a"), pair("n1", "b"), pair("n1", "a")],
        "every event, oldest first"
    );
    let f = |namespace: Option<&str>,
             pod: Option<&str>,
             container: Option<&str>,
             node: Option<&str>| TraceFilter {
        namespace: namespace.map(str::to_owned),
        pod: pod.map(str::to_owned),
        container: container.map(str::to_owned),
        node: node.map(str::to_owned),
        kind: Vec::new(),
    };
    assert_eq!(
        names(f(Some("a"), None, None, None)),
        vec![pair("n2", "a"), pair("n1", "a")]
    );
    assert_eq!(
        names(f(Some("a"), Some("p1"), None, None)),
        vec![pair("n1", "a")]
    );
    assert_eq!(
        names(f(None, None, Some("side"), None)),
        vec![pair("n2", "a")]
    );
    assert_eq!(
        names(f(None, None, Some("app0123"), None)).len(),
        2,
        "an id prefix"
    );
    assert_eq!(
        names(f(None, None, None, Some("n1"))),
        vec![pair("n1", "b"), pair("n1", "a")]
    );
    assert!(names(f(Some("b"), Some("p2"), None, None)).is_empty());
    let kinds = TraceFilter {
        kind: vec!["reclaim_stall".into()],
        ..TraceFilter::default()
    };
    assert_eq!(names(kinds), vec![pair("n2", "a")]);
    // An unattributed event passes no pod filter.
    let bare = json!({"node": "n1", "kind": "kswapd_wake", "pod_namespace": null});
    assert!(!f(Some("a"), None, None, None).matches(&bare));
    assert!(f(None, None, None, Some("n1")).matches(&bare));
}

#[test]
fn trace_outputs() {
    let events = vec![ev("n1", "a", "p1", "app", "oom_kill", 1_764_188_103_123)];
    let text = trace_output(&events, Output::Text);
    assert_eq!(
        text,
        "2025-11-26T20:15:03.123Z n1 oom_kill      pid=7 comm=hog pod=a/p1 container=app oom=memcg rss=3.0Mi"
    );
    let json_lines = trace_output(&events, Output::Json);
    let back: Value = serde_json::from_str(&json_lines).expect("a JSON line");
    assert_eq!(back["pod_name"], "p1");
    let cols = trace_output(&events, Output::Columns);
    let lines: Vec<&str> = cols.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].starts_with(
            "TIME                      NODE  KIND      POD   CONTAINER  PID  COMM  DETAIL"
        ),
        "{cols}"
    );
    assert!(lines[1].contains("a/p1  app"), "{cols}");
    assert_eq!(trace_output(&[], Output::Text), "");
}

#[test]
fn utc_dates() {
    assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(utc(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
}

#[test]
fn amounts_in_binary_units_or_counts() {
    assert_eq!(amount("memory.available", Some(300 << 20)), "300.0Mi");
    assert_eq!(amount("memory.available", Some(-(2 << 30))), "-2.0Gi");
    assert_eq!(amount("pid.available", Some(4000)), "4000");
    assert_eq!(amount("nodefs.inodesFree", Some(1 << 20)), "1048576");
    assert_eq!(amount("memory.available", None), "-");
}

#[test]
fn agent_answers_say_who_refused() {
    assert_eq!(
        agent_answer(200, br#"{"node":"n"}"#).expect("ok")["node"],
        "n"
    );
    let e = |code, body: &[u8]| format!("{:#}", agent_answer(code, body).expect_err("refused"));
    assert!(
        e(401, br#"{"error":"no bearer token","code":401}"#)
            .contains("401 Unauthorized: no bearer token")
    );
    assert!(e(403, br#"{"error":"user \"x\" cannot get","code":403}"#).contains("by the agent"));
    assert!(
        e(
            403,
            br#"{"kind":"Status","message":"pods \"a\" is forbidden"}"#
        )
        .contains("pods/proxy")
    );
    assert!(e(503, b"upstream down").contains("HTTP 503: upstream down"));
    assert!(e(200, b"<html>").contains("not JSON"));
}

fn agent(phase: &str, ip: Option<&str>, ports: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "nm-x", "namespace": "node-monitor"},
        "spec": {"nodeName": "n1", "containers": [{"name": "agent", "ports": ports}]},
        "status": {"phase": phase, "podIP": ip}
    }))
    .expect("pod")
}

#[test]
fn agent_pods_are_running_with_an_ip_and_a_port() {
    let named = json!([{"name": "metrics", "containerPort": 9555}]);
    let p = agent_pod(&agent("Running", Some("10.0.0.5"), named.clone()), None).expect("agent");
    assert_eq!(
        (p.name.as_str(), p.node.as_str(), p.port),
        ("nm-x", "n1", 9555)
    );
    assert_eq!(
        agent_pod(
            &agent("Running", Some("10.0.0.5"), named.clone()),
            Some(1234)
        )
        .map(|p| p.port),
        Some(1234)
    );
    assert_eq!(
        agent_pod(&agent("Running", Some("10.0.0.5"), json!([])), None).map(|p| p.port),
        Some(DEFAULT_PORT)
    );
    assert!(agent_pod(&agent("Pending", Some("10.0.0.5"), named.clone()), None).is_none());
    assert!(agent_pod(&agent("Running", None, named), None).is_none());
}

#[test]
fn status_text_shows_headroom_conditions_and_evictions() {
    let v = json!({
        "node": "n1", "ready": true, "readiness": "ok", "dry_run": false,
        "observed_at_ms": 0, "degraded": ["eBPF program x failed"],
        "thresholds": [{"signal": "memory.available", "kind": "hard", "value": "300Mi",
                         "available": 400 << 20, "threshold": 300 << 20, "headroom": 100 << 20, "met": false}],
        "conditions": [{"type": "MemoryPressure", "status": true}],
        "recent_evictions": [{"at_ms": 0, "namespace": "d", "name": "hog", "signal": "memory.available",
                              "kind": "hard", "outcome": "evicted", "message": "low"}]
    });
    let t = status_text(&read_status(&v));
    assert!(t.contains("node n1: ready (ok)"), "{t}");
    assert!(t.contains("memory.available"), "{t}");
    assert!(t.contains("400.0Mi") && t.contains("100.0Mi"), "{t}");
    assert!(t.contains("conditions: MemoryPressure=True"), "{t}");
    assert!(t.contains("degraded: eBPF program x failed"), "{t}");
    assert!(
        t.contains("d/hog memory.available hard evicted: low"),
        "{t}"
    );
    assert_eq!(
        status_text(&read_status(&json!({"node": "n2", "error": "403"}))),
        "node n2: error: 403\n"
    );
    // Not the node API's answer: said so, not shown as an empty status.
    let odd = status_text(&read_status(&json!({"node": "n3", "ready": "yes"})));
    assert!(
        odd.starts_with("node n3: error: the agent's status answer does not read"),
        "{odd}"
    );
}

#[test]
fn explain_text_names_the_pods_in_order() {
    let v = json!({
        "node": "n1", "observed_at_ms": 0, "reclaim": "memory.available",
        "thresholds_met": [{"signal": "memory.available", "value": "500Mi", "available": 400 << 20, "grace_period_elapsed": true}],
        "evict": [{"namespace": "d", "name": "hog", "signal": "memory.available", "hard": true, "message": "low"}],
        "ranked": [{"namespace": "d", "name": "hog", "qos": "BestEffort", "priority": 0, "usage": 5, "exceeds_request": true, "critical": false},
                   {"namespace": "d", "name": "g", "qos": "Guaranteed", "priority": 0, "usage": 1, "exceeds_request": false, "critical": false}]
    });
    let t = explain_text(&v);
    assert!(t.contains("reclaiming for: memory.available"), "{t}");
    assert!(
        t.contains("would evict #1: d/hog (memory.available hard): low"),
        "{t}"
    );
    assert!(t.contains("1. d/hog qos=BestEffort"), "{t}");
    assert!(t.contains("2. d/g qos=Guaranteed"), "{t}");
}

#[test]
fn outputs_parse() {
    assert_eq!("columns".parse::<Output>(), Ok(Output::Columns));
    assert_eq!("wide".parse::<Output>(), Ok(Output::Columns));
    assert_eq!(
        "xml".parse::<Output>(),
        Err("output \"xml\": expected text, json, yaml or columns".to_owned())
    );
}

#[test]
fn trace_kinds_are_checked_and_named_in_the_error() {
    for k in TRACE_KINDS {
        assert_eq!(parse_kind(k).as_deref(), Ok(k));
    }
    for bad in ["", "oom", "OOM_KILL", "oom_kill "] {
        let e = parse_kind(bad).expect_err(bad);
        assert!(
            e.contains(&format!("{bad:?}")) && e.contains("reclaim_stall"),
            "{e}"
        );
    }
    use clap::Parser as _;
    let e =
        crate::Cli::try_parse_from(["kubectl-node_monitor", "trace", "--kind", "oom_kill,oops"])
            .expect_err("refused");
    assert!(e.to_string().contains("\"oops\""), "{e}");
}

#[tokio::test]
async fn an_empty_token_is_refused_naming_the_flag() {
    use clap::Parser as _;
    // The command line refuses it first, naming the flag.
    let e = crate::Cli::try_parse_from(["kubectl-node_monitor", "--token", " ", "status"])
        .expect_err("refused at parse");
    assert!(e.to_string().contains("--token"), "{e}");
    // And the credential, whatever gave it the token.
    let client = {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("uri"));
        kube::Client::try_from(config).expect("client")
    };
    let e = crate::credential::Credential::new(
        &crate::credential::Choice {
            token: Some(" "),
            token_file: None,
            namespace: "node-monitor",
            account: "node-monitor-viewer",
            audience: "node-monitor",
        },
        &client,
    )
    .err()
    .expect("an empty token is refused");
    assert!(e.to_string().contains("--token: the token is empty"), "{e}");
}

/// `-o yaml`: the same values as `-o json`, as YAML; trace events one document each.
#[test]
fn yaml_output_carries_what_json_carries() {
    assert_eq!("yaml".parse::<Output>(), Ok(Output::Yaml));
    let err = "xml".parse::<Output>().expect_err("xml");
    assert!(err.contains("\"xml\"") && err.contains("yaml"), "{err}");
    let v = json!({"node": "n1", "thresholds": [{"signal": "memory.available", "met": true}]});
    let yaml = structured(Output::Yaml, &v)
        .expect("yaml")
        .expect("structured");
    let back: Value = serde_norway::from_str(&yaml).expect("reads back");
    assert_eq!(back, v);
    assert!(structured(Output::Text, &v).expect("text").is_none());
    let events = [
        json!({"kind": "oom_kill", "pid": 7}),
        json!({"kind": "reboot", "pid": 1}),
    ];
    let out = trace_output(&events, Output::Yaml);
    let docs: Vec<Value> = out
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_norway::from_str(d).expect("a YAML document"))
        .collect();
    assert_eq!(docs, events);
}
