use std::net::SocketAddr;

use tokio::{net::TcpListener, sync::watch};

use super::*;
use crate::metrics::Metrics;

/// Allows the token `viewer` only; any other token is not authenticated.
struct AllowViewer;

impl auth::Reviews for AllowViewer {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<auth::Authentication, auth::ReviewError>> {
        Box::pin(async move {
            Ok(match token {
                "viewer" | "stranger" => auth::Authentication::Accepted(auth::UserInfo {
                    username: token.to_owned(),
                    ..auth::UserInfo::default()
                }),
                _ => auth::Authentication::Rejected {
                    why: "invalid".to_owned(),
                },
            })
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a auth::UserInfo,
        _node: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<auth::Access, auth::ReviewError>> {
        Box::pin(async move {
            Ok(auth::Access {
                allowed: user.username == "viewer",
                reason: String::new(),
            })
        })
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
        let health = Arc::new(Health::default());
        serve_with(
            listener,
            Arc::new(Metrics::new()),
            health.clone(),
            router(api, health),
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
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let stopped = async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        };
        serve_on(
            listener,
            Arc::new(Metrics::new()),
            Arc::new(Health::default()),
            ServeLimits::default(),
            stopped,
        )
        .await
        .expect("serve");
    });
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
