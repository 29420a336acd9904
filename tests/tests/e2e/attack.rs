//! A hostile tenant against the agent, end to end: for 60 s one peer holds its share of the
//! endpoint's connections with idle, never-finished requests (reopened as they close), and another
//! sprays the node API with junk and forged tokens, while a pod climbs towards the memory
//! threshold. The agent must stay live for the kubelet's probe (answered every second from a third
//! address), evict the climber as it would without the flood, and cost the API server no more
//! TokenReviews than its documented budget (docs/security.md, "What a caller costs the API
//! server"). Root only; fails loudly when it cannot run.
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use base64::Engine as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use node_monitor_tests::{
    e2e::{Agent, Cluster},
    pod::PodBuilder,
};

const MI: u64 = 1 << 20;
const FLOOD: Duration = Duration::from_secs(60);
/// The agent's review budget (node-monitor/src/http/review_budget.rs): a burst, then a rate.
const REVIEW_BURST: u64 = 20;
const REVIEWS_PER_SECOND: u64 = 5;

/// A connection to the agent from the loopback address `ip`.
async fn connect_from(ip: &str, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(ip.parse().expect("ip"), 0))?;
    socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
}

/// One GET from `ip` with `headers`; the status line, or the error.
async fn get_from(ip: &str, port: u16, path: &str, headers: &str) -> Result<String, String> {
    let mut c = connect_from(ip, port).await.map_err(|e| e.to_string())?;
    c.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    c.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(out.lines().next().unwrap_or_default().to_owned())
}

/// TokenReviews the API server has served, from its own metrics.
async fn token_reviews(cluster: &Cluster) -> u64 {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = cluster
        .client()
        .request_text(req)
        .await
        .expect("the API server's /metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"tokenreviews\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A JWT-shaped token whose unverified claims name the agents' audience: it passes the agent's
/// precheck, and only a TokenReview refuses it.
fn forged(i: u64) -> String {
    let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    let claims = serde_json::json!({
        "aud": [node_monitor_core::contract::names::NODE_API_AUDIENCE],
        "exp": 4_000_000_000_i64,
        "jti": i,
    });
    format!(
        "{}.{}.{}",
        b64(br#"{"alg":"RS256"}"#),
        b64(claims.to_string().as_bytes()),
        b64(b"forged")
    )
}

/// Holds `n` idle connections from `ip`, each a request whose headers never end, reopening any
/// that closes, until `stop`.
async fn hold_slots(ip: &'static str, port: u16, n: usize, stop: Arc<AtomicBool>) {
    let mut held = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        held.retain(|c: &tokio::net::TcpStream| {
            let mut probe = [0u8; 1];
            matches!(c.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        });
        while held.len() < n {
            match connect_from(ip, port).await {
                Ok(mut c) => {
                    let _ = c.write_all(b"GET /metrics HTTP/1.1\r\n").await;
                    held.push(c);
                }
                Err(_) => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sprays the node API from `ip` with junk and forged tokens until `stop`; counts the answers.
async fn spray(ip: &'static str, port: u16, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let header = node_monitor_core::contract::TOKEN_HEADER;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let token = if i.is_multiple_of(2) {
            forged(i)
        } else {
            format!("junk-{i}")
        };
        let _ = get_from(
            ip,
            port,
            node_monitor_core::contract::STATUS_PATH,
            &format!("{header}: Bearer {token}\r\n"),
        )
        .await;
        sent.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_neither_silences_the_agent_nor_throttles_its_evictions() {
    let cluster = Cluster::start("e2e-attack", 1024 * MI)
        .await
        .expect("cluster");
    let agent = Agent::start(
        &cluster,
        "evictionHard:\n  memory.available: 300Mi\nevictionPressureTransitionPeriod: 30s\n",
        &["--no-mlock"],
    )
    .await
    .expect("agent up");
    let port = agent.metrics_port;
    let reviews_before = token_reviews(&cluster).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let holder = tokio::spawn(hold_slots("127.0.0.2", port, 16, stop.clone()));
    let sprayer = tokio::spawn(spray("127.0.0.3", port, stop.clone(), sent.clone()));

    // Under the flood: a climbing pod, and the kubelet's liveness probe every second.
    let node = cluster.node.clone();
    cluster
        .run_pod(PodBuilder::ramping(
            "climber", &node, "900Mi", "16Mi", "100ms",
        ))
        .await
        .expect("climber running");
    let started = Instant::now();
    let mut probes = 0;
    let mut failed_probes = Vec::new();
    let mut evicted_after = None;
    while started.elapsed() < FLOOD {
        match get_from("127.0.0.1", port, "/healthz", "").await {
            Ok(status) if status.contains(" 200 ") => {}
            other => failed_probes.push(format!("{:?}: {other:?}", started.elapsed())),
        }
        probes += 1;
        if evicted_after.is_none() && !cluster.is_live("default", "climber").await.expect("get") {
            evicted_after = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = holder.await;
    let _ = sprayer.await;
    let reviews = token_reviews(&cluster).await.saturating_sub(reviews_before);
    let sprayed = sent.load(Ordering::Relaxed);

    assert!(
        failed_probes.is_empty(),
        "{} of {probes} liveness probes failed under the flood: {failed_probes:?}\n{}",
        failed_probes.len(),
        agent.log()
    );
    let evicted_after = evicted_after.unwrap_or_else(|| {
        panic!(
            "the climber was not evicted during the flood:\n{}",
            agent.log()
        )
    });
    let evicted = agent
        .metric_sum(
            "node_monitor_evictions_total",
            &[
                ("eviction_signal", "memory.available"),
                ("outcome", "evicted"),
            ],
        )
        .await
        .expect("metrics");
    assert!(
        evicted >= 1.0,
        "evictions_total{{outcome=evicted}}={evicted}"
    );
    let throttled = agent
        .metric_sum("node_monitor_evictions_total", &[("outcome", "throttled")])
        .await
        .unwrap_or(0.0);
    assert_eq!(
        throttled, 0.0,
        "an eviction was answered 429 under the flood"
    );
    let budget = REVIEW_BURST + REVIEWS_PER_SECOND * (FLOOD.as_secs() + 5);
    assert!(
        sprayed > budget,
        "the flood sent {sprayed} requests, not enough to test the budget of {budget}"
    );
    assert!(
        reviews <= budget,
        "{sprayed} sprayed requests cost {reviews} TokenReviews, over the budget of {budget}"
    );
    println!(
        "flood: {sprayed} node-API requests, {reviews} TokenReviews (budget {budget}); {probes} probes, none failed; the climber evicted after {evicted_after:?}"
    );
    assert_eq!(
        cluster.oom_kills().expect("oom_kill counter"),
        0,
        "the kernel OOM killer acted first:\n{}",
        agent.log()
    );
}
