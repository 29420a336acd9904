use super::*;
use crate::metrics::Metrics;

#[test]
fn readiness_table() {
    let cases = [
        (false, false, false, false),
        (false, true, false, false),
        (true, false, false, false),
        (true, true, false, true),
        (true, false, true, true),
        (true, true, true, true),
    ];
    for (synced, probes, degraded, want) in cases {
        let h = Health::default();
        h.pods_synced.store(synced, Ordering::Relaxed);
        h.probes_loaded.store(probes, Ordering::Relaxed);
        if degraded {
            h.report_degraded("oom_mark_victim: attach failed");
        }
        assert_eq!(
            h.readiness().0,
            want,
            "synced={synced} probes={probes} degraded={degraded}"
        );
    }
}

/// Liveness follows the heartbeat once tracked: untracked (remediate, start-up) is live; a
/// heartbeat older than the bound is not.
#[test]
fn liveness_follows_the_loop_heartbeat() {
    let bound = Duration::from_secs(60);
    let s = Duration::from_secs;
    let t0 = Instant::now();
    // (tracked, heartbeat age at the check, live)
    let cases = [
        (false, s(3600), true),
        (true, s(0), true),
        (true, s(59), true),
        (true, s(60), true),
        (true, s(61), false),
        (true, s(3600), false),
    ];
    for (tracked, age, want) in cases {
        let h = Health::default();
        if tracked {
            h.track_progress(bound);
            h.progress_at(t0);
        }
        let (live, why) = h.liveness_at(t0 + age);
        assert_eq!(live, want, "tracked={tracked} age={age:?}: {why}");
        if !want {
            assert!(why.contains("no progress"), "{why}");
        }
    }
    // A heartbeat revives it.
    let h = Health::default();
    h.track_progress(bound);
    h.progress_at(t0);
    assert!(!h.liveness_at(t0 + s(120)).0);
    h.progress_at(t0 + s(120));
    assert!(h.liveness_at(t0 + s(120)).0);
}

/// The heartbeat is exported for the stalled-loop alert: the bound, and the Unix time of the last
/// progress, which stays where a wedged loop left it.
#[test]
fn the_heartbeat_is_exported_as_gauges() {
    let m = Metrics::new();
    let h = Health::default();
    h.export_progress(
        m.loop_last_progress_timestamp_seconds.clone(),
        m.loop_liveness_bound_seconds.clone(),
    );
    h.progress();
    assert_eq!(
        m.loop_last_progress_timestamp_seconds.get(),
        0.0,
        "untracked (remediate, start-up): nothing exported"
    );
    h.track_progress(Duration::from_secs(90));
    assert_eq!(m.loop_liveness_bound_seconds.get(), 90.0);
    let unix_now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64()
    };
    // Within a few seconds of the wall clock: conversion slack, not a speed goal.
    assert!((unix_now() - m.loop_last_progress_timestamp_seconds.get()).abs() < 5.0);
    let stale = Instant::now()
        .checked_sub(Duration::from_secs(600))
        .expect("the clock runs for 10 minutes");
    h.progress_at(stale);
    let age = unix_now() - m.loop_last_progress_timestamp_seconds.get();
    assert!((595.0..605.0).contains(&age), "{age}");
    let text = m.encode();
    assert!(
        text.contains("node_monitor_loop_liveness_bound_seconds 90.0"),
        "{text}"
    );
}

/// Waits until the server accepts connections (a liveness bound, not a speed goal).
async fn wait_listening(addr: SocketAddr) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{addr} never listened");
}

async fn get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = String::new();
    conn.read_to_string(&mut out).await.expect("read");
    out
}

/// A wedged loop turns `/healthz` unhealthy over HTTP, and its next heartbeat heals it.
#[tokio::test]
async fn healthz_fails_while_the_loop_makes_no_progress() {
    let health = Arc::new(Health::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = spawn(
        addr,
        Arc::new(Metrics::new()),
        health.clone(),
        None,
        stop_rx,
    );
    wait_listening(addr).await;
    let first = get(addr, "/healthz").await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    health.track_progress(Duration::from_secs(60));
    let stale = Instant::now()
        .checked_sub(Duration::from_secs(120))
        .expect("the clock runs for 2 minutes");
    health.progress_at(stale);
    let wedged = get(addr, "/healthz").await;
    assert!(wedged.starts_with("HTTP/1.1 503"), "{wedged}");
    assert!(wedged.contains("no progress"), "{wedged}");
    health.progress();
    let healed = get(addr, "/healthz").await;
    assert!(healed.starts_with("HTTP/1.1 200"), "{healed}");
    let _ = stop_tx.send(true);
    task.await.expect("server task");
}

/// Serves on a fresh loopback port with `limits`; the address and a stop switch.
async fn start(limits: ServeLimits) -> (SocketAddr, watch::Sender<bool>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let stopped = async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        };
        let health = Arc::new(Health::default());
        serve_on(listener, Arc::new(Metrics::new()), health, limits, stopped)
            .await
            .expect("serve");
    });
    (addr, stop_tx, task)
}

/// Liveness bound of the tests below: far above the limits they configure.
const HUNG: Duration = Duration::from_secs(60);

/// Reads until the peer closes; what it sent, or `None` when it reset the connection.
async fn read_until_closed(conn: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt as _;
    let mut out = Vec::new();
    match conn.read_to_end(&mut out).await {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

/// A client that trickles header lines and never ends them loses its connection.
#[tokio::test]
async fn a_slowloris_connection_is_closed() {
    use tokio::io::AsyncWriteExt as _;
    let limits = ServeLimits {
        header_read_timeout: Duration::from_secs(1),
        ..ServeLimits::default()
    };
    let (addr, stop, task) = start(limits).await;
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let trickle = async {
        // One header line every 200 ms, for ever, until the server hangs up.
        for i in 0u64.. {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if conn
                .write_all(format!("X-Slow-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
            let mut probe = [0u8; 1];
            match conn.try_read(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // Closed, reset, or an error answer: the server gave up on the headers.
                _ => break,
            }
        }
    };
    tokio::time::timeout(HUNG, trickle)
        .await
        .expect("the server must give up on headers that never end");
    tokio::time::timeout(HUNG, read_until_closed(&mut conn))
        .await
        .expect("and close the connection");
    // The endpoint still serves a well-behaved client.
    let ok = get(addr, "/healthz").await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let _ = stop.send(true);
    task.await.expect("server");
}

/// Connections over the cap are refused at once, not queued, and a freed slot is reused.
#[tokio::test]
async fn connections_over_the_cap_are_refused() {
    use tokio::io::AsyncWriteExt as _;
    let limits = ServeLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(600),
        ..ServeLimits::default()
    };
    let (addr, stop, task) = start(limits).await;
    // Two clients hold both slots with headers that never end.
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .expect("write");
        holders.push(c);
    }
    // Served in order: once a request on a third connection is answered, both slots are
    // taken (the accept loop handles connections one at a time).
    let mut refused = 0;
    for _ in 0..20 {
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let answer = tokio::time::timeout(HUNG, read_until_closed(&mut c))
            .await
            .expect("refused at once, never queued");
        match answer {
            Some(text) if text.starts_with("HTTP/1.1 503") || text.is_empty() => refused += 1,
            None => refused += 1,
            Some(text) => panic!("a connection over the cap was served: {text}"),
        }
    }
    assert_eq!(refused, 20);
    // A slot freed is a slot for the next client.
    drop(holders.pop());
    let served = async {
        loop {
            let text = get(addr, "/healthz").await;
            if text.starts_with("HTTP/1.1 200") {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(HUNG, served)
        .await
        .expect("the freed slot serves again");
    let _ = stop.send(true);
    tokio::time::timeout(HUNG, task)
        .await
        .expect("stopping is bounded even with a client holding a slot")
        .expect("server");
}

#[test]
fn blindness_fails_readiness_until_cleared() {
    let h = Health::default();
    h.pods_synced.store(true, Ordering::Relaxed);
    h.probes_loaded.store(true, Ordering::Relaxed);
    h.set_blind(Some(
        "no cgroup found for the 3 pods running on this node".into(),
    ));
    let (ready, why) = h.readiness();
    assert!(!ready);
    assert!(why.contains("3 pods"), "{why}");
    h.set_blind(None);
    assert_eq!(h.readiness(), (true, "ok".to_owned()));
}

/// A pod watch that keeps failing makes the agent not ready once it has failed for
/// [`POD_WATCH_UNREADY_AFTER`]; later failures do not restart the clock, and the first delivery
/// after them makes it ready again.
#[test]
fn a_pod_watch_failing_past_its_bound_makes_the_agent_not_ready() {
    let health = Health::default();
    health.pods_synced.store(true, Ordering::Relaxed);
    health.probes_loaded.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    assert_eq!(health.readiness_at(t0), (true, "ok".to_owned()));
    health.pod_watch_failed("connection refused".into(), t0);
    let just_before = t0 + POD_WATCH_UNREADY_AFTER - Duration::from_secs(1);
    assert!(
        health.readiness_at(just_before).0,
        "one stall or restart does not flap readiness"
    );
    health.pod_watch_failed("read timed out".into(), t0 + Duration::from_secs(60));
    let (ready, why) = health.readiness_at(t0 + POD_WATCH_UNREADY_AFTER);
    assert!(!ready, "{why}");
    assert!(
        why.contains("pod watch has failed for 120s") && why.contains("read timed out"),
        "{why}"
    );
    health.pod_watch_recovered();
    assert_eq!(
        health.readiness_at(t0 + POD_WATCH_UNREADY_AFTER * 2),
        (true, "ok".to_owned())
    );
}

/// Allows the token `viewer` only; any other token is not authenticated.
struct AllowViewer;

impl auth::Reviews for AllowViewer {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Result<auth::UserInfo, String>, String>> {
        Box::pin(async move {
            Ok(match token {
                "viewer" | "stranger" => Ok(auth::UserInfo {
                    username: token.to_owned(),
                    ..auth::UserInfo::default()
                }),
                _ => Err("invalid".to_owned()),
            })
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a auth::UserInfo,
        _node: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(bool, String), String>> {
        Box::pin(async move { Ok((user.username == "viewer", String::new())) })
    }
}

/// GET with extra header lines.
async fn get_with(addr: SocketAddr, path: &str, extra: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = String::new();
    conn.read_to_string(&mut out).await.expect("read");
    out
}

/// Every node API path refuses a request without a token (401), with a token the API server
/// does not accept (401), a malformed one (400) and an identity without the role (403); the
/// viewer gets the answer. Before the authorizer is set, it answers 503.
#[tokio::test]
async fn the_node_api_authorizes_every_request() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let live = Arc::new(LiveView::new("n1"));
    let slot = Arc::new(auth::AuthSlot::default());
    let api = NodeApi {
        live: live.clone(),
        auth: slot.clone(),
    };
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let stopped = async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        };
        serve_with(
            listener,
            Arc::new(Metrics::new()),
            Arc::new(Health::default()),
            Some(api),
            ServeLimits::default(),
            stopped,
        )
        .await
        .expect("serve");
    });
    let token = |t: &str| format!("{}: Bearer {t}\r\n", auth::TOKEN_HEADER);
    let starting = get_with(addr, STATUS_PATH, &token("viewer")).await;
    assert!(starting.starts_with("HTTP/1.1 503"), "{starting}");
    slot.set(Arc::new(auth::Authorizer::new(Arc::new(AllowViewer), "n1")));
    for path in [STATUS_PATH, EXPLAIN_PATH, TRACE_PATH, FLIGHT_PATH] {
        let none = get_with(addr, path, "").await;
        assert!(none.starts_with("HTTP/1.1 401"), "{path}: {none}");
        assert!(none.contains("www-authenticate: Bearer"), "{none}");
        let bogus = get_with(addr, path, &token("bogus")).await;
        assert!(bogus.starts_with("HTTP/1.1 401"), "{path}: {bogus}");
        let malformed = get_with(addr, path, "authorization: Basic eDp5\r\n").await;
        assert!(malformed.starts_with("HTTP/1.1 400"), "{path}: {malformed}");
        let stranger = get_with(addr, path, &token("stranger")).await;
        assert!(stranger.starts_with("HTTP/1.1 403"), "{path}: {stranger}");
        assert!(stranger.contains("nodes/node-monitor"), "{stranger}");
    }
    let status = get_with(addr, STATUS_PATH, &token("viewer")).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(status.contains(r#""node":"n1""#), "{status}");
    let undecided = get_with(addr, EXPLAIN_PATH, &token("viewer")).await;
    assert!(undecided.starts_with("HTTP/1.1 503"), "{undecided}");
    live.record_event(serde_json::json!({"kind": "oom_kill"}));
    let trace = get_with(
        addr,
        &format!("{TRACE_PATH}?since=0&limit=5"),
        &token("viewer"),
    )
    .await;
    assert!(trace.starts_with("HTTP/1.1 200"), "{trace}");
    assert!(trace.contains(r#""kind":"oom_kill""#), "{trace}");
    live.record_eviction(crate::live::EvictionRecord {
        at_ms: 1_000,
        namespace: "default".into(),
        name: "hog".into(),
        signal: "memory.available".into(),
        hard: true,
        outcome: "evicted".into(),
        message: String::new(),
    });
    let flight = get_with(addr, FLIGHT_PATH, &token("viewer")).await;
    assert!(flight.starts_with("HTTP/1.1 200"), "{flight}");
    assert!(
        flight.contains(r#""verdict":"node-monitor evicted default/hog""#),
        "{flight}"
    );
    let bad = get_with(addr, &format!("{TRACE_PATH}?since=-1"), &token("viewer")).await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    assert!(bad.contains("since"), "{bad}");
    let _ = stop_tx.send(true);
    task.await.expect("server task");
}

/// Without a node API (remediate), its paths do not exist.
#[tokio::test]
async fn without_a_node_api_its_paths_are_not_served() {
    let (addr, stop_tx, task) = start(ServeLimits::default()).await;
    let r = get_with(addr, STATUS_PATH, "").await;
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    let _ = stop_tx.send(true);
    task.await.expect("server task");
}

#[test]
fn trace_queries_are_checked() {
    assert_eq!(parse_trace_query(""), Ok((0, crate::live::TRACE_PAGE_MAX)));
    assert_eq!(parse_trace_query("since=7&limit=3"), Ok((7, 3)));
    for (q, needle) in [
        ("since=x", "since: \"x\""),
        ("limit=0", "limit: \"0\""),
        ("follow=1", "unknown query parameter \"follow\""),
    ] {
        let e = parse_trace_query(q).expect_err(q);
        assert!(e.contains(needle), "{q}: {e}");
    }
}
