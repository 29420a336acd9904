//! `/metrics`, `/healthz` and `/readyz`.
//!
//! Ready means the pod cache is synced and the probes are loaded, or the agent runs in an
//! explicitly reported degraded state (some probes or wake-up sources unavailable): a degraded
//! agent still protects the node by polling, so it stays in service and says why.
//!
//! Live means the process answers and, once a loop has asked for it ([`Health::track_progress`]),
//! that the loop has made progress within its bound: a loop wedged on a call that never returns
//! fails `/healthz`, and the liveness probe restarts the agent.
use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
    task::{JoinHandle, JoinSet},
};
use tracing::{debug, error, info};

use crate::metrics::Exposition;

/// What readiness depends on.
#[derive(Debug, Default)]
pub struct Health {
    pub pods_synced: AtomicBool,
    pub probes_loaded: AtomicBool,
    degraded: Mutex<Vec<String>>,
    /// Why the agent cannot act, when it cannot (it sees none of the pods' cgroups).
    blind: Mutex<Option<String>>,
    /// The main loop's heartbeat: when it last made progress, and the longest it may go without.
    progress: Mutex<Option<Progress>>,
}

#[derive(Debug, Clone, Copy)]
struct Progress {
    at: Instant,
    bound: Duration,
}

impl Health {
    /// Reports a degraded source (e.g. an eBPF program that failed to load).
    pub fn report_degraded(&self, what: impl Into<String>) {
        if let Ok(mut d) = self.degraded.lock() {
            d.push(what.into());
        }
    }

    /// Sets or clears the reason the agent cannot act; readiness fails while one is set.
    pub fn set_blind(&self, reason: Option<String>) {
        if let Ok(mut b) = self.blind.lock() {
            *b = reason;
        }
    }

    /// Makes liveness depend on the loop's progress: from now on, `/healthz` fails when
    /// [`Health::progress`] has not been called for longer than `bound`.
    pub fn track_progress(&self, bound: Duration) {
        if let Ok(mut p) = self.progress.lock() {
            *p = Some(Progress {
                at: Instant::now(),
                bound,
            });
        }
    }

    /// The loop made progress now.
    pub fn progress(&self) {
        self.progress_at(Instant::now());
    }

    /// The loop made progress at `at` (tests set a past heartbeat this way).
    pub fn progress_at(&self, at: Instant) {
        if let Ok(mut p) = self.progress.lock()
            && let Some(p) = p.as_mut()
        {
            p.at = at;
        }
    }

    /// (live, explanation) at `now`.
    pub fn liveness_at(&self, now: Instant) -> (bool, String) {
        let progress = self.progress.lock().ok().and_then(|p| *p);
        match progress {
            Some(p) if now.saturating_duration_since(p.at) > p.bound => (
                false,
                format!(
                    "the decision loop has made no progress for {:.0?} (bound {:.0?}): an API call or a read hangs",
                    now.saturating_duration_since(p.at),
                    p.bound
                ),
            ),
            _ => (true, "ok".to_owned()),
        }
    }

    /// (live, explanation).
    pub fn liveness(&self) -> (bool, String) {
        self.liveness_at(Instant::now())
    }

    pub fn degraded(&self) -> Vec<String> {
        self.degraded.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// (ready, explanation).
    pub fn readiness(&self) -> (bool, String) {
        let synced = self.pods_synced.load(Ordering::Relaxed);
        let probes = self.probes_loaded.load(Ordering::Relaxed);
        let degraded = self.degraded();
        if let Some(reason) = self.blind.lock().ok().and_then(|b| b.clone()) {
            return (false, reason);
        }
        match (synced, probes, degraded.is_empty()) {
            (false, _, _) => (false, "pod cache not synced".to_owned()),
            (true, true, true) => (true, "ok".to_owned()),
            (true, _, false) => (true, format!("ok (degraded: {})", degraded.join("; "))),
            (true, false, true) => (false, "probes not loaded".to_owned()),
        }
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
}

/// What the endpoint allows a client. It is reachable by anything that reaches the node's port,
/// tenants included: a client cannot hold more than one of `max_connections` slots, nor hold one
/// for longer than `header_read_timeout` without sending a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once; one more is answered 503 and closed at once, never queued.
    pub max_connections: usize,
    /// A request's headers must arrive within this, and an idle keep-alive connection is closed
    /// after it (hyper's `header_read_timeout`): a slowloris client loses its slot.
    pub header_read_timeout: Duration,
    /// On stop, open connections finish their request within this, then are closed.
    pub drain: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 32,
            header_read_timeout: Duration::from_secs(5),
            drain: Duration::from_secs(2),
        }
    }
}

/// What a connection over the cap gets before it is closed.
const OVERLOADED: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// Binds and serves until `shutdown` resolves, with the default [`ServeLimits`].
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    serve_on(listener, metrics, health, ServeLimits::default(), shutdown).await
}

/// Serves on a bound listener until `shutdown` resolves, within `limits`.
pub async fn serve_on(
    listener: TcpListener,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(health_handler))
        .route("/readyz", get(ready_handler))
        .with_state(AppState { metrics, health });
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            a = listener.accept() => a,
        };
        while connections.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: pause rather than spin on the error.
                debug!(error = %e, "accepting a metrics connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over the cap: nothing is read or kept for it.
            let _ = stream.try_write(OVERLOADED);
            debug!(
                max = limits.max_connections,
                "metrics connection refused: too many open"
            );
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let mut drain = drain_rx.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            let stopping = async move {
                let _ = drain.wait_for(|d| *d).await;
            };
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        debug!(error = %e, "metrics connection ended");
                    }
                }
                () = stopping => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    let _ = drain_tx.send(true);
    let drained = tokio::time::timeout(limits.drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        debug!(
            open = connections.len(),
            "metrics connections still open after the drain; closed"
        );
    }
    connections.abort_all();
    Ok(())
}

/// [`serve`] in a task of its own, until `stop` turns true. A failure to serve is logged: the
/// process goes on without its endpoint rather than stop over it.
pub fn spawn(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = serve(addr, metrics, health, stopped).await {
            error!(error = %e, %addr, "metrics endpoint failed");
        }
    })
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn health_handler(State(s): State<AppState>) -> impl IntoResponse {
    let (live, why) = s.health.liveness();
    let code = if live {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, why)
}

async fn ready_handler(State(s): State<AppState>) -> impl IntoResponse {
    let (ready, why) = s.health.readiness();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, why)
}

#[cfg(test)]
mod tests {
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
        let task = spawn(addr, Arc::new(Metrics::new()), health.clone(), stop_rx);
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
}
