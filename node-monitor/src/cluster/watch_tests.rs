//! The pod reflector against a fake API server whose watch goes silent: the connection stays
//! open and sends nothing, from the start or after an event (black-holed mid-stream). The
//! watcher's idle bound (the watch timeout plus 5 s, kube's) or the watch client's read bound
//! (the watch timeout plus [`WATCH_STALL_MARGIN`]), whichever comes first, drops it, and the
//! reflector catches up with the pods the API lists since. On tokio's paused clock: the bounds
//! are the production ones, and the test waits nothing.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    http::Uri,
    routing::get,
};
use futures::StreamExt as _;
use serde_json::json;

use super::{
    PodWatchEvent, WATCH_STALL_MARGIN, WATCH_TIMEOUT_SECS, pod_reflector, pod_watch_timeout_secs,
    watch_client,
};

/// How the first watch connection goes silent.
#[derive(Debug, Clone, Copy)]
enum Stall {
    /// Headers, then nothing.
    Silent,
    /// One event, then nothing.
    AfterOneEvent,
}

/// The fake API server's pods (name → resourceVersion) and the watch requests it got.
#[derive(Default)]
struct Api {
    pods: BTreeMap<String, u64>,
    version: u64,
    watches: usize,
    lists: usize,
    /// Requests still to be answered 503 before any other answer.
    refuse: usize,
}

impl Api {
    fn add(&mut self, name: &str) -> u64 {
        self.version += 1;
        self.pods.insert(name.to_owned(), self.version);
        self.version
    }
}

fn pod(name: &str, version: u64) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": version.to_string()},
        "spec": {"nodeName": "node-a", "containers": []},
    })
}

fn event(name: &str, version: u64) -> Result<Bytes, std::convert::Infallible> {
    let line = json!({"type": "ADDED", "object": pod(name, version)}).to_string() + "\n";
    Ok(Bytes::from(line))
}

/// Serves `GET /api/v1/pods`: lists answer the pods of now; the first watch stalls as `stall`
/// says, later ones send every pod of now as `ADDED` and then stay open.
async fn serve(api: Arc<Mutex<Api>>, stall: Stall) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = Router::new().route(
        "/api/v1/pods",
        get(move |uri: Uri| {
            let api = api.clone();
            async move {
                let mut a = api.lock().expect("api");
                if a.refuse > 0 {
                    a.refuse -= 1;
                    return axum::response::Response::builder()
                        .status(503)
                        .body(Body::from("unavailable"))
                        .expect("response");
                }
                if !uri.query().unwrap_or_default().contains("watch=true") {
                    a.lists += 1;
                    let items: Vec<_> = a.pods.iter().map(|(n, v)| pod(n, *v)).collect();
                    let list = json!({"apiVersion": "v1", "kind": "PodList",
                        "metadata": {"resourceVersion": a.version.to_string()}, "items": items});
                    return axum::response::Response::new(Body::from(list.to_string()));
                }
                a.watches += 1;
                let events: Vec<_> = match (a.watches, stall) {
                    (1, Stall::Silent) => vec![],
                    (1, Stall::AfterOneEvent) => {
                        let v = a.add("early");
                        vec![event("early", v)]
                    }
                    _ => a.pods.iter().map(|(n, v)| event(n, *v)).collect(),
                };
                axum::response::Response::new(Body::from_stream(
                    futures::stream::iter(events).chain(futures::stream::pending()),
                ))
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// The pods the store holds, by name.
fn names(store: &kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>) -> Vec<String> {
    let mut n: Vec<String> = store
        .state()
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    n.sort();
    n
}

#[tokio::test(start_paused = true)]
async fn a_silent_pod_watch_is_dropped_at_its_bound_and_the_store_catches_up() {
    let stall_bound = Duration::from_secs(u64::from(pod_watch_timeout_secs())) + WATCH_STALL_MARGIN;
    // kube's default backoff starts well under this; a reconnect must fit.
    let reconnect = Duration::from_secs(30);
    for stall in [Stall::Silent, Stall::AfterOneEvent] {
        let api = Arc::new(Mutex::new(Api::default()));
        api.lock().expect("api").add("first");
        let url = serve(api.clone(), stall).await;
        let mut config = kube::Config::new(url.parse().expect("url"));
        config.default_retry = false;
        let client = watch_client(config, Duration::from_secs(30)).expect("client");
        let seen_events = Arc::new(Mutex::new(Vec::new()));
        let log = seen_events.clone();
        let (store, reflector) = pod_reflector(client, "node-a", move |e| {
            log.lock().expect("events").push(e);
        });
        let task = tokio::spawn(reflector);
        let start = tokio::time::Instant::now();
        store.wait_until_ready().await.expect("synced");
        let early = match stall {
            Stall::Silent => vec!["first"],
            Stall::AfterOneEvent => vec!["early", "first"],
        };
        // The first watch is open; the event it delivers (if any) arrives at once.
        while api.lock().expect("api").watches == 0 || names(&store) != early {
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{stall:?}: {:?}",
                names(&store)
            );
        }
        // A pod arrives on the node; the silent watch does not deliver it.
        api.lock().expect("api").add("late");
        let seen = tokio::time::timeout(stall_bound + reconnect, async {
            while !names(&store).contains(&"late".to_owned()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        let took = start.elapsed();
        assert!(
            seen.is_ok(),
            "{stall:?}: the store never caught up: {:?}",
            names(&store)
        );
        // A quiet but healthy watch lasts its server-side timeout: not dropped before it.
        assert!(
            took >= Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS)),
            "{stall:?}: seen after {took:?}: was the watch silent?"
        );
        assert!(
            api.lock().expect("api").watches >= 2,
            "{stall:?}: reconnected"
        );
        // kube ends a silent stream at its idle bound as it ends one the server closed: the
        // reconnect is not an error, so nothing is told.
        let events = seen_events.lock().expect("events").clone();
        assert_eq!(events, [], "{stall:?}");
        task.abort();
    }
}

/// An API server that refuses (503) before it answers: each failure is told, then the first
/// delivery as the recovery, and the store syncs.
#[tokio::test(start_paused = true)]
async fn a_failing_pod_watch_is_told_and_so_is_its_recovery() {
    let api = Arc::new(Mutex::new(Api {
        refuse: 3,
        ..Api::default()
    }));
    api.lock().expect("api").add("first");
    let url = serve(api.clone(), Stall::Silent).await;
    let mut config = kube::Config::new(url.parse().expect("url"));
    config.default_retry = false;
    let client = watch_client(config, Duration::from_secs(30)).expect("client");
    let seen_events = Arc::new(Mutex::new(Vec::new()));
    let log = seen_events.clone();
    let (store, reflector) = pod_reflector(client, "node-a", move |e| {
        log.lock().expect("events").push(e);
    });
    let task = tokio::spawn(reflector);
    tokio::time::timeout(Duration::from_secs(120), store.wait_until_ready())
        .await
        .expect("synced after the refusals")
        .expect("store");
    let events = seen_events.lock().expect("events").clone();
    let failures = events
        .iter()
        .filter(|e| matches!(e, PodWatchEvent::Failed(_)))
        .count();
    assert_eq!(failures, 3, "{events:?}");
    assert_eq!(events.last(), Some(&PodWatchEvent::Recovered), "{events:?}");
    assert_eq!(names(&store), ["first"]);
    task.abort();
}
