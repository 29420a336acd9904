use super::*;

/// The eviction registry's PDB refusal, as k8s.io/kubernetes
/// pkg/registry/core/pod/storage/eviction.go (`checkAndDecrement`) writes it.
const PDB_429: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
        "message":"Cannot evict pod as it would violate the pod's disruption budget.",
        "reason":"TooManyRequests","details":{"causes":[{"reason":"DisruptionBudget",
        "message":"The disruption budget guarded needs 2 healthy pods and has 2 currently"}]},
        "code":429}"#;
/// The same refusal while the budget's status lags its spec (`createTooManyRequestsError`):
/// the server suggests 10 s, and it is still a PDB.
const PDB_429_PROCESSING: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},
        "status":"Failure","message":"Cannot evict pod as it would violate the pod's disruption budget.",
        "reason":"TooManyRequests","details":{"causes":[{"reason":"DisruptionBudget",
        "message":"The disruption budget guarded is still being processed by the server."}],
        "retryAfterSeconds":10},"code":429}"#;
/// API Priority and Fairness (and max-in-flight) rejecting a request: plain text and a
/// Retry-After header (k8s.io/apiserver pkg/server/filters, `tooManyRequests`).
const APF_429: &str = "Too many requests, please try again later.\n";
/// A throttling Status without a cause (what a proxy or an older filter may send).
const THROTTLE_STATUS: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},
        "status":"Failure","message":"Too many requests, please try again later.",
        "reason":"TooManyRequests","details":{"retryAfterSeconds":4},"code":429}"#;
const TWO_PDBS_500: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},
        "status":"Failure","message":"This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        "code":500}"#;

#[test]
fn a_pdb_refusal_is_told_apart_from_throttling() {
    let secs = Duration::from_secs;
    let pdb = |r: &Refusal| matches!(r, Refusal::DisruptionBudget { .. });
    // (code, Retry-After, body, throttled for, PDB)
    type Case = (
        u16,
        Option<&'static str>,
        &'static str,
        Option<Duration>,
        bool,
    );
    let cases: &[Case] = &[
        (429, None, PDB_429, None, true),
        (429, Some("10"), PDB_429_PROCESSING, None, true),
        (429, Some("3"), APF_429, Some(secs(3)), false),
        (429, None, APF_429, Some(RETRY_AFTER_MIN), false),
        (429, Some("0"), APF_429, Some(RETRY_AFTER_MIN), false),
        (429, Some("3600"), APF_429, Some(RETRY_AFTER_MAX), false),
        (429, Some("soon"), APF_429, Some(RETRY_AFTER_MIN), false),
        (429, None, THROTTLE_STATUS, Some(secs(4)), false),
        (429, Some("2"), THROTTLE_STATUS, Some(secs(2)), false),
    ];
    for (code, retry_after, body, throttled, is_pdb) in cases {
        let r = classify_refusal(*code, *retry_after, body.as_bytes());
        assert_eq!(pdb(&r), *is_pdb, "{retry_after:?} {body}: {r:?}");
        let got = match r {
            Refusal::Throttled { retry_after } => Some(retry_after),
            _ => None,
        };
        assert_eq!(got, *throttled, "{retry_after:?} {body}");
    }
}

/// One recorded request of the fake API server: method and path.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A fake API server on loopback answering every request with `response`; records what it
/// was asked.
async fn fake_api(response: String) -> (Client, Seen) {
    let (client, seen, _bodies) = fake_api_with_bodies(response).await;
    (client, seen)
}

/// [`fake_api`], also recording each request's body.
async fn fake_api_with_bodies(response: String) -> (Client, Seen, Seen) {
    let response: std::sync::Arc<str> = response.into();
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Seen = Seen::default();
    let bodies: Seen = Seen::default();
    let log = seen.clone();
    let body_log = bodies.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let log = log.clone();
            let body_log = body_log.clone();
            let response = response.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = conn.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some(head_end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let length = text[..head_end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if buf.len() < head_end + 4 + length {
                        continue;
                    }
                    let line = text.lines().next().unwrap_or_default().to_owned();
                    log.lock().expect("log").push(line);
                    let body = &buf[head_end + 4..head_end + 4 + length];
                    body_log
                        .lock()
                        .expect("log")
                        .push(String::from_utf8_lossy(body).into_owned());
                    buf.drain(..head_end + 4 + length);
                    if conn.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
    config.default_retry = false;
    (Client::try_from(config).expect("client"), seen, bodies)
}

/// An HTTP/1.1 response with `status`, extra header lines and `body`.
fn answer(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn hard_request() -> EvictionRequest {
    EvictionRequest {
        namespace: "default".into(),
        name: "guarded".into(),
        uid: "uid-1".into(),
        grace_period_seconds: 1,
        hard: true,
        signal: "memory.available".into(),
        message: "test".into(),
        annotations: BTreeMap::new(),
    }
}

/// API Priority and Fairness answers 429 with Retry-After and no DisruptionBudget cause: under
/// `pdbPolicy: escalate` and a hard threshold the agent still never deletes the pod.
#[tokio::test]
async fn throttling_is_never_escalated_to_a_delete() {
    let (client, seen) = fake_api(answer(
        "429 Too Many Requests",
        "Retry-After: 2\r\nContent-Type: text/plain; charset=utf-8\r\n",
        APF_429,
    ))
    .await;
    let actuator = Actuator::new(
        client,
        ActuatorConfig {
            node_name: "n".into(),
            pdb_policy: PdbPolicy::Escalate,
            dry_run: false,
        },
    );
    assert_eq!(
        actuator.evict(&hard_request()).await,
        EvictOutcome::Throttled {
            retry_after: Duration::from_secs(2)
        }
    );
    let seen = seen.lock().expect("log").clone();
    assert_eq!(
        seen,
        ["POST /api/v1/namespaces/default/pods/guarded/eviction? HTTP/1.1"],
        "one eviction request, no delete"
    );
}

/// The same policy with a real PDB refusal does escalate: the discrimination is by cause.
#[tokio::test]
async fn a_pdb_refusal_is_escalated_under_a_hard_threshold() {
    let (client, seen) = fake_api(answer(
        "429 Too Many Requests",
        "Content-Type: application/json\r\n",
        PDB_429,
    ))
    .await;
    let actuator = Actuator::new(
        client,
        ActuatorConfig {
            node_name: "n".into(),
            pdb_policy: PdbPolicy::Escalate,
            dry_run: false,
        },
    );
    // The fake answers the delete with the same 429: what matters is that it was sent.
    let _ = actuator.evict(&hard_request()).await;
    let seen = seen.lock().expect("log").clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[1].starts_with("DELETE /api/v1/namespaces/default/pods/guarded"),
        "{seen:?}"
    );
}

/// The pod's eviction Event carries the kubelet's annotations (`AnnotatedEventf` in the
/// kubelet's `evictPod`); the node's Event, which the kubelet does not write, carries none.
#[tokio::test]
async fn the_pod_eviction_event_carries_the_kubelet_annotations() {
    use node_monitor_core::eviction::{
        OFFENDING_CONTAINERS_KEY, OFFENDING_CONTAINERS_USAGE_KEY, STARVED_RESOURCE_KEY,
    };
    let (client, seen, bodies) = fake_api_with_bodies(answer(
        "201 Created",
        "Content-Type: application/json\r\n",
        r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"e"},"involvedObject":{}}"#,
    ))
    .await;
    let actuator = Actuator::new(
        client,
        ActuatorConfig {
            node_name: "n".into(),
            pdb_policy: PdbPolicy::Respect,
            dry_run: false,
        },
    );
    let annotations: BTreeMap<String, String> = [
        (OFFENDING_CONTAINERS_KEY, "app,sidecar"),
        (OFFENDING_CONTAINERS_USAGE_KEY, "300Mi,20Mi"),
        (STARVED_RESOURCE_KEY, "memory"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let req = EvictionRequest {
        annotations: annotations.clone(),
        ..hard_request()
    };
    actuator
        .record_eviction_events(&req, &EvictOutcome::Evicted)
        .await;
    let seen = seen.lock().expect("log").clone();
    assert_eq!(
        seen,
        [
            "POST /api/v1/namespaces/default/events? HTTP/1.1",
            "POST /api/v1/namespaces/default/events? HTTP/1.1"
        ]
    );
    let bodies = bodies.lock().expect("log").clone();
    let events: Vec<k8s_openapi::api::core::v1::Event> = bodies
        .iter()
        .map(|b| serde_json::from_str(b).expect("an Event"))
        .collect();
    assert_eq!(events[0].involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(events[0].reason.as_deref(), Some("Evicted"));
    assert_eq!(events[0].metadata.annotations.as_ref(), Some(&annotations));
    assert_eq!(events[1].involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(events[1].metadata.annotations, None);
}

/// Every actuator call ends on its own timeout against an API server that accepts
/// connections and never answers, even over a client with no transport timeouts.
#[tokio::test]
async fn calls_to_a_black_hole_fail_on_the_api_timeout() {
    let (config, server) = crate::cluster::tests::black_hole().await;
    let actuator = Actuator::new(
        Client::try_from(config).expect("client"),
        ActuatorConfig {
            node_name: "n".into(),
            pdb_policy: PdbPolicy::Escalate,
            dry_run: false,
        },
    )
    .with_timeout(Duration::from_secs(1));
    let hung = Duration::from_secs(120);
    let outcome = tokio::time::timeout(hung, actuator.evict(&hard_request()))
        .await
        .expect("evict must end on its own timeout");
    assert!(
        matches!(
            outcome,
            EvictOutcome::Failed {
                code: None,
                kind: FailureKind::Timeout,
                ..
            }
        ),
        "{outcome:?}"
    );
    let update = NodeConditionUpdate {
        type_: "NodeMonitorMemoryPressure".into(),
        status: false,
        reason: "r".into(),
        message: "m".into(),
    };
    let conditions = tokio::time::timeout(hung, actuator.set_conditions(&[update]))
        .await
        .expect("set_conditions must end on its own timeout");
    assert!(conditions.is_err());
    let present = tokio::time::timeout(hung, actuator.pod_present("ns", "p", "u"))
        .await
        .expect("pod_present must end on its own timeout");
    assert!(present.is_err());
    server.abort();
}

#[test]
fn other_refusals() {
    assert_eq!(classify_refusal(404, None, b"{}"), Refusal::Gone);
    assert_eq!(classify_refusal(409, None, b"{}"), Refusal::Gone);
    match classify_refusal(500, None, TWO_PDBS_500.as_bytes()) {
        Refusal::Failed {
            code: 500,
            kind: FailureKind::MultiplePdbs,
            message,
        } => assert!(message.contains("more than one"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        classify_refusal(403, None, b"forbidden by webhook"),
        Refusal::Failed {
            kind: FailureKind::Forbidden,
            ..
        }
    ));
}

/// lastTransitionTime moves only with the status; the heartbeat always moves.
#[test]
fn condition_transition_time_is_kept_while_the_status_holds() {
    let t = |secs: i64| Timestamp::from_second(secs).expect("time");
    let existing = |status: &str, since: i64| NodeCondition {
        type_: "NodeMonitorMemoryPressure".into(),
        status: status.into(),
        last_transition_time: Some(Time(t(since))),
        last_heartbeat_time: Some(Time(t(since))),
        ..NodeCondition::default()
    };
    let update = |status: bool| NodeConditionUpdate {
        type_: "NodeMonitorMemoryPressure".into(),
        status,
        reason: "r".into(),
        message: "m".into(),
    };
    let other = NodeCondition {
        type_: "NodeMonitorDiskPressure".into(),
        status: "False".into(),
        last_transition_time: Some(Time(t(5))),
        ..NodeCondition::default()
    };
    // (current condition, new status, want lastTransitionTime)
    let cases = [
        (None, false, 1000),
        (Some(existing("False", 100)), false, 100),
        (Some(existing("True", 100)), true, 100),
        (Some(existing("False", 100)), true, 1000),
        (Some(existing("True", 100)), false, 1000),
        (Some(existing("Unknown", 100)), false, 1000),
    ];
    for (current, status, want) in cases {
        let mut conditions = vec![other.clone()];
        conditions.extend(current.clone());
        let patch = condition_patch(&conditions, &[update(status)], t(1000));
        assert_eq!(patch.len(), 1);
        assert_eq!(
            patch[0]["lastTransitionTime"],
            serde_json::to_value(Time(t(want))).expect("json"),
            "{current:?} -> {status}"
        );
        assert_eq!(
            patch[0]["lastHeartbeatTime"],
            serde_json::to_value(Time(t(1000))).expect("json")
        );
        assert_eq!(patch[0]["status"], if status { "True" } else { "False" });
    }
}

/// A release writes Unknown without a heartbeat, deletes removed conditions, and replaces the
/// taint list without the released taints under the node's resourceVersion.
#[test]
fn release_patches() {
    use node_monitor_core::release::TaintRef;
    let plan = ReleasePlan {
        remove_taints: vec![TaintRef {
            key: "node-monitor.io/memory-pressure".into(),
            effect: "NoSchedule".into(),
        }],
        unknown_conditions: vec!["NodeMonitorMemoryPressure".into()],
        remove_conditions: vec!["NodeMonitorDiskPressure".into()],
        remove_annotations: vec!["node-monitor.io/cordoned-for-shutdown".into()],
        uncordon: true,
    };
    let now = Timestamp::from_second(1000).expect("time");
    let conditions = release_conditions_patch(&plan, now);
    assert_eq!(
        conditions,
        [
            json!({"type": "NodeMonitorMemoryPressure", "status": "Unknown",
                       "reason": "NodeMonitorStopped", "message": STOPPED_MESSAGE,
                       "lastTransitionTime": Time(now)}),
            json!({"type": "NodeMonitorDiskPressure", "$patch": "delete"}),
        ]
    );
    let taint = |key: &str, effect: &str| Taint {
        key: key.into(),
        effect: effect.into(),
        ..Taint::default()
    };
    let node = Node {
        metadata: ObjectMeta {
            resource_version: Some("42".into()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![
                taint("node-monitor.io/memory-pressure", "NoSchedule"),
                taint("dedicated", "NoSchedule"),
                // Same key, another effect: not node-monitor's write, kept.
                taint("node-monitor.io/memory-pressure", "NoExecute"),
            ]),
            ..Default::default()
        }),
        ..Node::default()
    };
    assert_eq!(
        release_spec_patch(&node, &plan),
        json!({
            "metadata": {"resourceVersion": "42",
                         "annotations": {"node-monitor.io/cordoned-for-shutdown": null}},
            "spec": {"taints": [{"key": "dedicated", "effect": "NoSchedule"},
                                {"key": "node-monitor.io/memory-pressure", "effect": "NoExecute"}],
                     "unschedulable": false},
        })
    );
}

#[test]
fn eviction_body_carries_grace_and_uid_under_delete_options() {
    let body = eviction_body(Some("ns".into()), "p", "uid-1", 7);
    let json = serde_json::to_value(&body).expect("serialize");
    assert_eq!(json["apiVersion"], "policy/v1");
    assert_eq!(json["kind"], "Eviction");
    assert_eq!(json["metadata"]["name"], "p");
    assert_eq!(json["metadata"]["namespace"], "ns");
    assert_eq!(json["deleteOptions"]["gracePeriodSeconds"], 7);
    assert_eq!(json["deleteOptions"]["preconditions"]["uid"], "uid-1");
    assert!(json.get("delete_options").is_none(), "{json}");
}
