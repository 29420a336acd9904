//! API Priority and Fairness as the base installs it (`deploy/kustomize/base/flowcontrol.yaml`,
//! the chart's `flowControl`), against a real API server: the API server puts the agent's
//! TokenReviews and SubjectAccessReviews in `node-monitor-reviews`, every other request of the
//! agent in `node-monitor-agents`, and a tenant's requests in neither. The API server names the
//! priority level of each request it classifies in the `X-Kubernetes-PF-PriorityLevel-UID`
//! response header.
use std::time::{Duration, Instant};

use k8s_openapi::api::flowcontrol::v1::PriorityLevelConfiguration;
use kube::{Api, Client, client::Body};
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    manifests::{apply, kustomize_dir, render},
};

/// The agent's ServiceAccount, as the base installs it.
const AGENT: (&str, &str) = ("node-monitor", "node-monitor");

/// The priority level the API server gave `request` (its response header), and the status.
async fn priority_level(client: &Client, request: http::Request<Vec<u8>>) -> (String, u16) {
    let (parts, body) = request.into_parts();
    let request = http::Request::from_parts(parts, Body::from(body));
    let response = client.send(request).await.expect("the API server answers");
    let level = response
        .headers()
        .get("X-Kubernetes-PF-PriorityLevel-UID")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (level, response.status().as_u16())
}

fn token_review() -> http::Request<Vec<u8>> {
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": { "token": "not-a-token" }
    });
    http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request")
}

fn access_review() -> http::Request<Vec<u8>> {
    let body = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "someone",
            "resourceAttributes": { "resource": "nodes", "subresource": "node-monitor", "verb": "get", "name": "n1" }
        }
    });
    http::Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request")
}

fn list_pods() -> http::Request<Vec<u8>> {
    http::Request::get("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&limit=1")
        .body(Vec::new())
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_reviews_cannot_queue_ahead_of_their_evictions() {
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let admin = cp.client();
    let objects = render(&kustomize_dir("base")).expect("render base");
    apply(&admin, &objects).await.expect("apply base");
    let levels: Api<PriorityLevelConfiguration> = Api::all(admin.clone());
    let uid = |name: &'static str| {
        let levels = levels.clone();
        async move {
            levels
                .get(name)
                .await
                .unwrap_or_else(|e| panic!("priority level {name}: {e}"))
                .metadata
                .uid
                .expect("uid")
        }
    };
    let (agents, reviews) = (
        uid("node-monitor-agents").await,
        uid("node-monitor-reviews").await,
    );
    let agent = cp
        .service_account_client(AGENT.0, AGENT.1)
        .await
        .expect("the agent's client");
    cp.create_namespace("tenant").await.expect("namespace");
    let tenant = cp
        .service_account_client("tenant", "default")
        .await
        .expect("a tenant's client");

    // The API server's flow-control configuration follows the objects within moments.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (level, _) = priority_level(&agent, token_review()).await;
        if level == reviews {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent's TokenReview is still classified as {level:?}, not node-monitor-reviews ({reviews})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (level, status) = priority_level(&agent, access_review()).await;
    assert_eq!(
        level, reviews,
        "the agent's SubjectAccessReview (status {status})"
    );
    let (level, status) = priority_level(&agent, list_pods()).await;
    assert_eq!(
        (level.as_str(), status),
        (agents.as_str(), 200),
        "the agent's pod list goes to node-monitor-agents"
    );
    for (what, request) in [
        ("TokenReview", token_review()),
        ("SubjectAccessReview", access_review()),
        ("pod list", list_pods()),
    ] {
        let (level, _) = priority_level(&tenant, request).await;
        assert!(
            !level.is_empty() && level != agents && level != reviews,
            "a tenant's {what} stays out of node-monitor's levels: {level:?}"
        );
    }
    cp.stop().expect("stop control plane");
}
