use super::*;
use crate::metrics::{Reg, encode_registry};

/// A product's exposition, for the endpoint's tests: a registry with the build information.
struct TestMetrics(Reg);

impl TestMetrics {
    fn new() -> Self {
        let mut reg = Reg::new();
        reg.add_build_info("Build information.");
        Self(reg)
    }
}

impl Exposition for TestMetrics {
    fn encode(&self) -> String {
        encode_registry(&self.0.registry)
    }
}

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
    let last: Gauge<f64, AtomicU64> = Gauge::default();
    let bound: Gauge<f64, AtomicU64> = Gauge::default();
    let h = Health::default();
    h.export_progress(last.clone(), bound.clone());
    h.progress();
    assert_eq!(
        last.get(),
        0.0,
        "untracked (remediate, start-up): nothing exported"
    );
    h.track_progress(Duration::from_secs(90));
    assert_eq!(bound.get(), 90.0);
    let unix_now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64()
    };
    // Within a few seconds of the wall clock: conversion slack, not a speed goal.
    assert!((unix_now() - last.get()).abs() < 5.0);
    let stale = Instant::now()
        .checked_sub(Duration::from_secs(600))
        .expect("the clock runs for 10 minutes");
    h.progress_at(stale);
    let age = unix_now() - last.get();
    assert!((595.0..605.0).contains(&age), "{age}");
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
        Arc::new(TestMetrics::new()),
        health.clone(),
        Router::new(),
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
        serve_on(
            listener,
            Arc::new(TestMetrics::new()),
            health,
            limits,
            stopped,
        )
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

/// A connection from `ip` (a loopback address other than 127.0.0.1 stands for another pod).
async fn connect_from(ip: &str, addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(ip.parse().expect("ip"), 0))
        .expect("bind the client address");
    socket.connect(addr).await.expect("connect")
}

/// One peer (a pod) that holds its share of slots with idle connections cannot take the rest:
/// its next connection is refused, and another peer (the kubelet's probe) is still served.
#[tokio::test]
async fn one_peer_cannot_take_every_slot() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let limits = ServeLimits {
        max_connections: 8,
        max_per_peer: 3,
        header_read_timeout: Duration::from_secs(600),
        ..ServeLimits::default()
    };
    let (addr, stop, task) = start(limits).await;
    let mut holders = Vec::new();
    for _ in 0..3 {
        let mut c = connect_from("127.0.0.2", addr).await;
        c.write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .expect("write");
        holders.push(c);
    }
    // The accept loop takes connections in order: once this one is answered, the three before
    // it hold their slots.
    let mut fourth = connect_from("127.0.0.2", addr).await;
    let answer = tokio::time::timeout(HUNG, read_until_closed(&mut fourth))
        .await
        .expect("refused at once, never queued");
    assert!(
        answer
            .as_deref()
            .is_none_or(|t| t.is_empty() || t.starts_with("HTTP/1.1 503")),
        "a peer over its share was served: {answer:?}"
    );
    // Another peer is served, while the first still holds its three.
    let mut probe = connect_from("127.0.0.3", addr).await;
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut text = String::new();
    tokio::time::timeout(HUNG, probe.read_to_string(&mut text))
        .await
        .expect("answered")
        .expect("read");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    // A slot given back is the peer's again.
    drop(holders.pop());
    let again = async {
        loop {
            let mut c = connect_from("127.0.0.2", addr).await;
            let _ = c
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await;
            let mut t = String::new();
            let _ = c.read_to_string(&mut t).await;
            if t.starts_with("HTTP/1.1 200") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(HUNG, again)
        .await
        .expect("the freed slot serves its peer again");
    let _ = stop.send(true);
    task.await.expect("server");
}
