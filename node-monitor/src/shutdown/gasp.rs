//! The last gasp's fast path: a dedicated thread that sends the last gasp the moment the kernel
//! probe sees an `allowed` reboot(2), racing the kernel's restart path.
//!
//! After reboot(2) enters, the kernel runs the reboot notifiers, shuts the devices down and
//! restarts the machine; nothing in user space can hold it up, so the only lever is a short path:
//!
//! - the reboot program writes `allowed` requests to a ring buffer of their own
//!   (`names::GASP_MAP`) with `BPF_RB_FORCE_WAKEUP`, so this thread alone wakes, at once;
//! - the thread runs nothing else (its own single-threaded runtime, no tokio worker in between),
//!   at `SCHED_FIFO` priority when the agent may use it (`CAP_SYS_NICE`), else at the normal one;
//! - it keeps its own client, whose connection to the API server stays established (a
//!   `GET /version` every [`WARM_INTERVAL`]), so the gasp costs no TCP or TLS handshake;
//! - the request (method, path, headers, the body around the event's fields) is built at start;
//!   on the event the thread fills in the caller and writes it.
//!
//! The shutdown manager still receives the event through the agent's main event stream and
//! decides the last gasp as before; when the fast path already sent (or is sending) it, the
//! manager waits for that answer instead of writing again ([`FastGasp::claim`]). The fast path
//! follows the manager's rules: only while armed (a last gasp configured, no graceful shutdown
//! under way: [`FastGasp::set_armed`]) and at most once per [`LAST_GASP_MIN_INTERVAL`].
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::http;
use aya::maps::{MapData, RingBuf};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use node_monitor_core::{
    contract::names::{
        LAST_GASP_ANNOTATION, NON_GRACEFUL_SHUTDOWN_REASON, SHUTTING_DOWN_CONDITION,
    },
    shutdown::{LAST_GASP_MIN_INTERVAL, config::LastGasp},
};
use tokio::sync::watch;
use tracing::{info, warn};

use self::raw::{RawConn, RawTarget};
use super::RebootSeen;
use crate::{
    ebpf::{KernelEvent, RebootGate},
    telemetry::error_chain as chain,
};

/// How often the idle connection is used, so it stays established (the client's pool drops
/// connections idle for 90 s).
pub const WARM_INTERVAL: Duration = Duration::from_secs(60);

/// The most one warm-up may take (connect, handshake, `GET /version`). The warm-up runs on the
/// gasp's own thread, between two reads of the ring buffer: a reboot seen meanwhile waits for it,
/// so it is bounded far below the API timeout the gasp itself is given. A warm-up that does not
/// finish in time leaves no connection, and the gasp connects when it goes.
pub const WARM_BOUND: Duration = Duration::from_secs(2);

/// The `SCHED_FIFO` priority asked for (of 1–99; the kernel's own threads that matter here run at
/// 50 and up, so this never starves them).
const FIFO_PRIORITY: i32 = 10;

/// One last gasp of the fast path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastSent {
    pub pid: u32,
    pub cmd: &'static str,
    /// `None` while the request is in flight; then whether the API accepted it.
    pub ok: Option<bool>,
    /// The request's body as sent.
    pub body: String,
}

/// The state the fast path shares with the shutdown manager.
#[derive(Debug)]
pub struct FastGasp {
    armed: AtomicBool,
    sent: watch::Sender<Option<FastSent>>,
}

impl Default for FastGasp {
    fn default() -> Self {
        Self {
            armed: AtomicBool::new(false),
            sent: watch::Sender::new(None),
        }
    }
}

impl FastGasp {
    /// Whether the fast path may send: the manager's view (a last gasp configured and no
    /// graceful shutdown under way).
    pub fn set_armed(&self, armed: bool) {
        self.armed.store(armed, Ordering::SeqCst);
    }

    pub fn armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }

    /// The fast path's answer for `seen` when it sent (or is sending) the last gasp for that
    /// call: waits up to `timeout` for the answer. `None` when the fast path did not take it,
    /// and the manager must send the last gasp itself.
    pub async fn claim(&self, seen: &RebootSeen, timeout: Duration) -> Option<bool> {
        let mut rx = self.sent.subscribe();
        let matches = |s: &Option<FastSent>| {
            s.as_ref()
                .is_some_and(|s| s.pid == seen.pid && s.cmd == seen.cmd.as_str())
        };
        if !matches(&rx.borrow()) {
            return None;
        }
        let answered = tokio::time::timeout(
            timeout,
            rx.wait_for(|s| s.as_ref().is_some_and(|s| s.ok.is_some())),
        )
        .await;
        Some(match answered {
            Ok(Ok(s)) => s.as_ref().and_then(|s| s.ok).unwrap_or(false),
            _ => false,
        })
    }

    /// The fast path's latest last gasp.
    pub fn last(&self) -> Option<FastSent> {
        self.sent.borrow().clone()
    }
}

/// The last gasp request, built at start; [`GaspRequest::body`] fills in the call.
#[derive(Debug, Clone)]
pub struct GaspRequest {
    pub path: String,
    pub content_type: &'static str,
    mode: LastGasp,
    prefix: String,
    suffix: &'static str,
}

impl GaspRequest {
    /// `None` for `lastGasp: none`.
    pub fn new(mode: LastGasp, node: &str) -> Option<Self> {
        let node_path = format!("/api/v1/nodes/{node}");
        match mode {
            LastGasp::None => None,
            // The same merge patch as the manager's `annotate_node`.
            LastGasp::Annotation => Some(Self {
                path: node_path,
                content_type: "application/merge-patch+json",
                mode,
                prefix: format!(
                    "{{\"metadata\":{{\"annotations\":{{{}:",
                    serde_json::Value::from(LAST_GASP_ANNOTATION)
                ),
                suffix: "}}}",
            }),
            // One strategic merge patch of the one condition (merged by `type`): no read of the
            // node first, unlike the manager's `set_condition`.
            LastGasp::Condition => Some(Self {
                path: format!("{node_path}/status"),
                content_type: "application/strategic-merge-patch+json",
                mode,
                prefix: String::from("{\"status\":{\"conditions\":["),
                suffix: "]}}",
            }),
        }
    }

    /// The body for `seen` at `unix_now` (seconds), `rfc3339` the same instant.
    pub fn body(&self, seen: &RebootSeen, unix_now: f64, rfc3339: &str) -> String {
        let middle = match self.mode {
            LastGasp::Annotation => serde_json::Value::from(annotation_value(seen, unix_now)),
            _ => serde_json::json!({
                "type": SHUTTING_DOWN_CONDITION,
                "status": "True",
                "reason": NON_GRACEFUL_SHUTDOWN_REASON,
                "message": condition_message(seen),
                "lastHeartbeatTime": rfc3339,
                "lastTransitionTime": rfc3339,
            }),
        };
        format!("{}{}{}", self.prefix, middle, self.suffix)
    }
}

/// The `node-monitor.io/last-gasp` annotation's value (both paths write the same).
pub fn annotation_value(seen: &RebootSeen, unix_now: f64) -> String {
    serde_json::json!({
        "time": (unix_now * 1e3).round() / 1e3,
        "cmd": seen.cmd.as_str(),
        "comm": seen.comm,
        "pid": seen.pid,
        "verdict": seen.gate.as_str(),
    })
    .to_string()
}

/// The condition's message (both paths write the same).
pub fn condition_message(seen: &RebootSeen) -> String {
    format!(
        "reboot(2) {} by {} (pid {}) bypassed the shutdown inhibitor: pods were not terminated gracefully",
        seen.cmd.as_str(),
        seen.comm,
        seen.pid
    )
}

/// What the fast path does with one `allowed` request: whether it sends, given whether it is
/// armed and when it last sent.
pub fn should_send(armed: bool, last: Option<Instant>, now: Instant) -> bool {
    armed && last.is_none_or(|t| now.saturating_duration_since(t) >= LAST_GASP_MIN_INTERVAL)
}

/// What the fast path needs besides its ring buffer, prepared at the agent's start.
pub struct FastStart {
    pub shared: Arc<FastGasp>,
    /// The agent's API configuration: the thread builds a client of its own from it (its own
    /// connection, kept warm).
    pub config: kube::Config,
    pub request: GaspRequest,
    /// `lastGaspTimeout`.
    pub timeout: Duration,
    /// `node_monitor_last_gasp_realtime`: 1 once the thread runs at `SCHED_FIFO`, 0 otherwise.
    pub realtime: prometheus_client::metrics::gauge::Gauge,
}

impl FastStart {
    /// `None` when no last gasp is configured.
    pub fn new(
        mode: LastGasp,
        node: &str,
        config: kube::Config,
        timeout: Duration,
    ) -> Option<Self> {
        Some(Self {
            shared: Arc::new(FastGasp::default()),
            config,
            request: GaspRequest::new(mode, node)?,
            timeout,
            realtime: prometheus_client::metrics::gauge::Gauge::default(),
        })
    }

    /// Reports the thread's priority on `gauge` (`node_monitor_last_gasp_realtime`).
    #[must_use]
    pub fn with_realtime_gauge(mut self, gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        self.realtime = gauge;
        self
    }

    /// Starts the thread on `ring` (the probe's `names::GASP_MAP`).
    pub fn start(
        self,
        ring: RingBuf<MapData>,
        stop: watch::Receiver<bool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        spawn(
            self.shared,
            ring,
            self.config,
            self.request,
            self.timeout,
            stop,
            self.realtime,
        )
    }
}

/// Starts the fast path's thread. It runs until `stop` turns true.
pub fn spawn(
    shared: Arc<FastGasp>,
    ring: RingBuf<MapData>,
    config: kube::Config,
    request: GaspRequest,
    timeout: Duration,
    stop: watch::Receiver<bool>,
    realtime: prometheus_client::metrics::gauge::Gauge,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("nm-last-gasp".into())
        .spawn(move || {
            let fifo = enter_realtime(&realtime);
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    warn!(error = %e, "last gasp fast path: no runtime; the manager sends it alone");
                    return;
                }
            };
            rt.block_on(run(shared, ring, config, request, timeout, stop, fifo));
        })
}

/// `SCHED_FIFO` for the calling thread, reported on `gauge` (1 granted, 0 refused); the error
/// when refused.
fn enter_realtime(gauge: &prometheus_client::metrics::gauge::Gauge) -> Result<(), std::io::Error> {
    let fifo = raise_priority();
    gauge.set(i64::from(fifo.is_ok()));
    fifo
}

/// `SCHED_FIFO` for the calling thread; the error when refused.
fn raise_priority() -> Result<(), std::io::Error> {
    let param = libc::sched_param {
        sched_priority: FIFO_PRIORITY,
    };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

async fn run(
    shared: Arc<FastGasp>,
    ring: RingBuf<MapData>,
    config: kube::Config,
    request: GaspRequest,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
    fifo: Result<(), std::io::Error>,
) {
    let config_for_raw = config.clone();
    let client = match crate::cluster::api_client(config, timeout) {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %chain(&e), "last gasp fast path: no API client; the manager sends it alone");
            return;
        }
    };
    let mut fd = match crate::ebpf::loader::register(ring, "the last gasp ring buffer") {
        Ok(fd) => fd,
        Err(e) => {
            warn!(error = %e, "last gasp fast path: cannot wait on its ring buffer; the manager sends it alone");
            return;
        }
    };
    match &fifo {
        Ok(()) => info!(
            priority = FIFO_PRIORITY,
            "last gasp fast path ready (SCHED_FIFO)"
        ),
        Err(e) => {
            info!(error = %e, "last gasp fast path ready (SCHED_FIFO refused: normal priority)")
        }
    }
    let target = match RawTarget::new(&config_for_raw, timeout) {
        Ok(t) => t,
        Err(e) => {
            warn!(error = %e, "last gasp fast path: no connection of its own; it sends through the API client");
            None
        }
    };
    let mut sender = Sender {
        client,
        target,
        raw: None,
    };
    let mut warm = tokio::time::interval(WARM_INTERVAL);
    let mut last: Option<Instant> = None;
    loop {
        tokio::select! {
            biased;
            guard = fd.readable_mut() => {
                let Ok(mut guard) = guard else {
                    warn!("last gasp ring buffer no longer readable; the manager sends it alone");
                    return;
                };
                let mut calls = Vec::new();
                while let Some(item) = guard.get_inner_mut().next() {
                    if let Ok(KernelEvent::Reboot(r)) = KernelEvent::decode(&item, false) {
                        calls.push(RebootSeen::from(&r));
                    }
                }
                guard.clear_ready();
                for seen in calls {
                    // The agent's own check of the probe's verdict, as the manager's.
                    if seen.gate != RebootGate::Allowed {
                        continue;
                    }
                    let now = Instant::now();
                    if !should_send(shared.armed(), last, now) {
                        continue;
                    }
                    last = Some(now);
                    sender.send(&request, &seen, &shared, timeout).await;
                }
            }
            _ = warm.tick() => sender.keep_warm().await,
            _ = stop.changed() => return,
        }
    }
}

/// How the gasp goes out: its own connection when the credentials allow, else the client.
struct Sender {
    client: kube::Client,
    target: Option<RawTarget>,
    raw: Option<RawConn>,
}

impl Sender {
    async fn send(
        &mut self,
        request: &GaspRequest,
        seen: &RebootSeen,
        shared: &FastGasp,
        timeout: Duration,
    ) {
        let now = SystemTime::now();
        let unix = now
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let rfc3339 = Timestamp::try_from(now)
            .ok()
            .and_then(|t| serde_json::to_value(Time(t)).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let body = request.body(seen, unix, &rfc3339);
        shared.sent.send_replace(Some(FastSent {
            pid: seen.pid,
            cmd: seen.cmd.as_str(),
            ok: None,
            body: body.clone(),
        }));
        let mut how = "client";
        let ok = match self.send_raw(request, &body) {
            Some(ok) => {
                how = "own connection";
                ok
            }
            None => self.send_client(request, body, timeout).await,
        };
        shared.sent.send_modify(|s| {
            if let Some(s) = s {
                s.ok = Some(ok);
            }
        });
        warn!(
            cmd = seen.cmd.as_str(),
            pid = seen.pid,
            comm = %seen.comm,
            sent = ok,
            via = how,
            "last gasp sent by the fast path"
        );
    }

    /// On the gasp's own connection (established again if it was lost); `None` without one.
    fn send_raw(&mut self, request: &GaspRequest, body: &str) -> Option<bool> {
        let target = self.target.as_ref()?;
        let bytes = target.request("PATCH", &request.path, Some(request.content_type), body);
        let mut conn = match self.raw.take() {
            Some(c) => c,
            None => target.connect().ok()?,
        };
        let answer = conn.exchange(&bytes).or_else(|e| {
            // A connection the server closed meanwhile: once more on a new one.
            warn!(error = %e, "last gasp: the warm connection failed; reconnecting");
            conn = target.connect()?;
            conn.exchange(&bytes)
        });
        match answer {
            Ok((status, reusable)) => {
                if reusable {
                    self.raw = Some(conn);
                }
                if (200..300).contains(&status) {
                    return Some(true);
                }
                warn!(status, "last gasp (fast path) refused by the API server");
                // Credentials the server no longer takes: the API client's own may still work.
                if status == 401 || status == 403 {
                    return None;
                }
                Some(false)
            }
            Err(e) => {
                warn!(error = %e, "last gasp (fast path) failed");
                Some(false)
            }
        }
    }

    async fn send_client(&self, request: &GaspRequest, body: String, timeout: Duration) -> bool {
        let req = http::Request::patch(&request.path)
            .header(http::header::CONTENT_TYPE, request.content_type)
            .body(body.into_bytes());
        match req {
            Ok(req) => match tokio::time::timeout(timeout, self.client.request_text(req)).await {
                Ok(Ok(_)) => true,
                Ok(Err(e)) => {
                    warn!(error = %chain(&e), "last gasp (fast path) failed");
                    false
                }
                Err(_) => {
                    warn!(?timeout, "last gasp (fast path) timed out");
                    false
                }
            },
            Err(e) => {
                warn!(error = %e, "last gasp (fast path): bad request");
                false
            }
        }
    }

    /// One cheap request on the connection, so it is established when the gasp comes; each step
    /// bounded by [`WARM_BOUND`].
    async fn keep_warm(&mut self) {
        if let Some(target) = &mut self.target {
            target.refresh_token();
            let warmed = match self.raw.take() {
                Some(mut c) => c
                    .exchange_within(&target.request("GET", "/version", None, ""), WARM_BOUND)
                    .ok()
                    .filter(|(_, reusable)| *reusable)
                    .map(|_| c),
                None => None,
            };
            self.raw = match warmed {
                Some(c) => Some(c),
                None => match target.connect_within(WARM_BOUND) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        warn!(error = %e, "last gasp fast path: cannot reach the API server; retrying in {:?}", WARM_INTERVAL);
                        None
                    }
                },
            };
            return;
        }
        let Ok(req) = http::Request::get("/version").body(Vec::new()) else {
            return;
        };
        match tokio::time::timeout(WARM_BOUND, self.client.request_text(req)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                warn!(error = %chain(&e), "last gasp fast path: the API server did not answer; retrying in {:?}", WARM_INTERVAL);
            }
            Err(_) => {
                warn!(bound = ?WARM_BOUND, "last gasp fast path: the API server did not answer in time; retrying in {:?}", WARM_INTERVAL);
            }
        }
    }
}

mod raw;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::RebootCmd;

    /// The calling thread's scheduling policy is `SCHED_FIFO`.
    fn runs_fifo() -> bool {
        // SAFETY: pid 0 is the calling thread; no pointer is passed.
        unsafe { libc::sched_getscheduler(0) == libc::SCHED_FIFO }
    }

    /// `node_monitor_last_gasp_realtime` says what the kernel granted the thread: 1 when it now
    /// runs at `SCHED_FIFO` (a holder of CAP_SYS_NICE), 0 when refused; never the other way
    /// round. (Run as root and as a user, the two cases.)
    #[test]
    fn the_realtime_gauge_reports_the_threads_policy() {
        let gauge = prometheus_client::metrics::gauge::Gauge::<i64>::default();
        gauge.set(-1);
        let g = gauge.clone();
        let (granted, fifo) = std::thread::spawn(move || {
            let granted = enter_realtime(&g).is_ok();
            (granted, runs_fifo())
        })
        .join()
        .expect("thread");
        assert_eq!(granted, fifo);
        assert_eq!(gauge.get(), i64::from(fifo));
    }

    fn seen() -> RebootSeen {
        RebootSeen {
            cmd: RebootCmd::Restart,
            pid: 42,
            comm: "systemctl".into(),
            cgroup_id: 1,
            gate: RebootGate::Allowed,
            suppressed: 0,
        }
    }

    #[test]
    fn the_annotation_gasp_is_the_managers_merge_patch() {
        let r = GaspRequest::new(LastGasp::Annotation, "n1").expect("request");
        assert_eq!(r.path, "/api/v1/nodes/n1");
        assert_eq!(r.content_type, "application/merge-patch+json");
        let body: serde_json::Value =
            serde_json::from_str(&r.body(&seen(), 1700000000.1234, "x")).expect("json");
        let value = body["metadata"]["annotations"][LAST_GASP_ANNOTATION]
            .as_str()
            .expect("annotation");
        let v: serde_json::Value = serde_json::from_str(value).expect("value json");
        assert_eq!(
            v,
            serde_json::json!({"time": 1700000000.123, "cmd": "restart", "comm": "systemctl", "pid": 42, "verdict": "allowed"})
        );
    }

    #[test]
    fn the_condition_gasp_patches_one_condition_of_the_status() {
        let r = GaspRequest::new(LastGasp::Condition, "n1").expect("request");
        assert_eq!(r.path, "/api/v1/nodes/n1/status");
        assert_eq!(r.content_type, "application/strategic-merge-patch+json");
        let body: serde_json::Value =
            serde_json::from_str(&r.body(&seen(), 0.0, "2026-01-01T00:00:00Z")).expect("json");
        let c = &body["status"]["conditions"];
        assert_eq!(c.as_array().map(Vec::len), Some(1));
        assert_eq!(c[0]["type"], SHUTTING_DOWN_CONDITION);
        assert_eq!(c[0]["status"], "True");
        assert_eq!(c[0]["reason"], NON_GRACEFUL_SHUTDOWN_REASON);
        assert_eq!(c[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert!(
            c[0]["message"]
                .as_str()
                .is_some_and(|m| m.contains("systemctl (pid 42)")),
            "{body}"
        );
        assert!(GaspRequest::new(LastGasp::None, "n1").is_none());
    }

    #[test]
    fn the_fast_path_sends_only_armed_and_once_per_interval() {
        let t0 = Instant::now();
        assert!(!should_send(false, None, t0));
        assert!(should_send(true, None, t0));
        assert!(!should_send(true, Some(t0), t0 + Duration::from_secs(1)));
        assert!(should_send(true, Some(t0), t0 + LAST_GASP_MIN_INTERVAL));
    }

    #[test]
    fn the_own_connection_writes_one_prebuilt_request_with_the_token() {
        let mut config = kube::Config::new("https://10.0.2.2:6443".parse().expect("url"));
        config.auth_info.token = Some("t0ken".to_owned().into());
        let target = RawTarget::new(&config, Duration::from_secs(2))
            .expect("target")
            .expect("static credentials");
        assert_eq!(target.addr, "10.0.2.2:6443");
        let r = GaspRequest::new(LastGasp::Annotation, "n1").expect("request");
        let bytes = target.request("PATCH", &r.path, Some(r.content_type), "{}");
        assert_eq!(
            String::from_utf8(bytes).expect("utf-8"),
            "PATCH /api/v1/nodes/n1 HTTP/1.1\r\nHost: 10.0.2.2:6443\r\nUser-Agent: node-monitor-last-gasp\r\n\
             Accept: application/json\r\nAuthorization: Bearer t0ken\r\n\
             Content-Type: application/merge-patch+json\r\nContent-Length: 2\r\n\r\n{}"
        );
        // Credentials that change (an exec plugin) leave the gasp to the API client.
        config.auth_info.exec =
            Some(serde_json::from_value(serde_json::json!({"command": "x"})).expect("exec"));
        assert!(
            RawTarget::new(&config, Duration::from_secs(2))
                .expect("no error")
                .is_none()
        );
    }

    #[test]
    fn a_rotated_token_file_is_read_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        std::fs::write(&file, "first\n").expect("write");
        let mut config = kube::Config::new("https://api.example:443".parse().expect("url"));
        config.auth_info.token_file = Some(file.display().to_string());
        let mut target = RawTarget::new(&config, Duration::from_secs(2))
            .expect("target")
            .expect("static credentials");
        let head = |t: &RawTarget| {
            String::from_utf8(t.request("GET", "/version", None, "")).expect("utf-8")
        };
        assert!(
            head(&target).contains("Authorization: Bearer first\r\n"),
            "{}",
            head(&target)
        );
        std::fs::write(&file, "second").expect("write");
        target.refresh_token();
        assert!(
            head(&target).contains("Authorization: Bearer second\r\n"),
            "{}",
            head(&target)
        );
        assert!(head(&target).contains("Host: api.example:443\r\n"));
    }

    #[tokio::test]
    async fn the_manager_waits_for_the_fast_paths_answer_for_the_same_call() {
        let fast = FastGasp::default();
        assert_eq!(fast.claim(&seen(), Duration::from_millis(10)).await, None);
        fast.sent.send_replace(Some(FastSent {
            pid: 42,
            cmd: "restart",
            ok: None,
            body: String::new(),
        }));
        let mut other = seen();
        other.pid = 7;
        assert_eq!(fast.claim(&other, Duration::from_millis(10)).await, None);
        // In flight: the answer comes later.
        let answer = async {
            tokio::task::yield_now().await;
            fast.sent.send_modify(|s| {
                if let Some(s) = s {
                    s.ok = Some(true);
                }
            });
        };
        let call = seen();
        let (claimed, ()) = tokio::join!(fast.claim(&call, Duration::from_secs(5)), answer);
        assert_eq!(claimed, Some(true));
    }

    /// A server that accepts connections and never answers; its address.
    fn black_hole() -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                held.push(conn);
            }
        });
        addr
    }

    /// An API server that accepts and never answers holds the warm-up at most [`WARM_BOUND`]
    /// per step, not the gasp's API timeout (a minute here): a reboot seen meanwhile is read
    /// soon after. Both ways: the gasp's own connection, and the API client.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_api_server_holds_the_warm_up_only_its_bound() {
        let addr = black_hole();
        let minute = Duration::from_secs(60);
        let mut config = kube::Config::new(format!("https://{addr}").parse().expect("url"));
        config.auth_info.token = Some("t".to_owned().into());
        config.read_timeout = Some(minute);
        config.connect_timeout = Some(minute);
        let target = RawTarget::new(&config, minute)
            .expect("target")
            .expect("static credentials");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(target.connect_within(WARM_BOUND).is_err());
        });
        // Far past the bound's two steps, far short of the minute the gasp may take.
        let failed = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the warm-up's connection returned within its bound");
        assert!(failed, "a silent server gives no connection");

        let mut http = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        http.read_timeout = Some(minute);
        let mut sender = Sender {
            client: kube::Client::try_from(http).expect("client"),
            target: None,
            raw: None,
        };
        tokio::time::timeout(Duration::from_secs(20), sender.keep_warm())
            .await
            .expect("the warm-up through the API client returned within its bound");
    }
}
