//! The agent's node API under `/node-monitor/v1/` (status, the live explain, recent kernel events,
//! the flight record), every request of which is authorized ([`auth`], docs/security.md). It is
//! served beside `/metrics`, `/healthz` and `/readyz` by the shared endpoint
//! ([`node_monitor_service::http`], re-exported here), as the routes of [`router`].
//!
//! Ready means the pod cache is synced and the probes are loaded, or the agent runs in an
//! explicitly reported degraded state (some probes or wake-up sources unavailable): a degraded
//! agent still protects the node by polling, so it stays in service and says why.
use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::{Value, json};
use tracing::debug;

use crate::live::LiveView;

pub mod answers;
pub mod auth;
pub mod review_budget;

pub use node_monitor_service::http::{
    Health, POD_WATCH_UNREADY_AFTER, ServeLimits, serve, serve_on, serve_with, spawn,
};

/// The node API's paths (the contract, in the core).
pub use node_monitor_core::contract::{EXPLAIN_PATH, FLIGHT_PATH, STATUS_PATH, TRACE_PATH};

/// The agent's node API: what it shows, and who may see it.
#[derive(Clone)]
pub struct NodeApi {
    pub live: Arc<LiveView>,
    pub auth: Arc<auth::AuthSlot>,
}

#[derive(Clone)]
struct AppState {
    health: Arc<Health>,
    node_api: NodeApi,
    /// The large answers, one at a time ([`answers`]).
    answers: answers::AnswerGate,
}

/// The node API's routes, to serve beside the shared endpoint's ([`serve_with`], [`spawn`]).
pub fn router(api: NodeApi, health: Arc<Health>) -> Router {
    Router::new()
        .route(STATUS_PATH, get(status_handler))
        .route(EXPLAIN_PATH, get(explain_handler))
        .route(TRACE_PATH, get(trace_handler))
        .route(FLIGHT_PATH, get(flight_handler))
        .with_state(AppState {
            health,
            node_api: api,
            answers: answers::AnswerGate::default(),
        })
}

/// A JSON answer.
fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The node API's refusal: a JSON error, and the scheme to use on a 401.
fn denied_response(d: &auth::Denied) -> Response {
    let code = StatusCode::from_u16(d.status()).unwrap_or(StatusCode::FORBIDDEN);
    let mut r = json_response(code, &json!({"error": d.message(), "code": d.status()}));
    if let Some(secs) = d.retry_after_secs() {
        r.headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from(secs));
    }
    if code == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            "www-authenticate",
            axum::http::HeaderValue::from_static("Bearer realm=\"node-monitor\""),
        );
    }
    r
}

/// The node API and the caller's identity, or the answer that refuses it.
async fn authorized(
    s: &AppState,
    headers: &HeaderMap,
    path: &str,
) -> Result<Arc<LiveView>, Box<Response>> {
    let api = &s.node_api;
    let Some(authorizer) = api.auth.get() else {
        return Err(Box::new(denied_response(&auth::Denied::Unavailable(
            "the agent is starting: no API client to authorize requests yet".to_owned(),
        ))));
    };
    match authorizer.check(headers).await {
        Ok(user) => {
            debug!(%user, path, "node API request authorized");
            Ok(api.live.clone())
        }
        Err(d) => {
            debug!(
                path,
                code = d.status(),
                reason = d.message(),
                "node API request refused"
            );
            Err(Box::new(denied_response(&d)))
        }
    }
}

async fn status_handler(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let live = match authorized(&s, &headers, STATUS_PATH).await {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let (ready, why) = s.health.readiness();
    json_response(
        StatusCode::OK,
        &live.status(ready, &why, &s.health.degraded()),
    )
}

async fn explain_handler(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let live = match authorized(&s, &headers, EXPLAIN_PATH).await {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let permit = s.answers.enter().await;
    match live.explain() {
        Some(v) => answers::json_answer(StatusCode::OK, &v, permit),
        None => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": "the agent has not decided yet", "code": 503}),
        ),
    }
}

async fn trace_handler(State(s): State<AppState>, headers: HeaderMap, uri: Uri) -> Response {
    let live = match authorized(&s, &headers, TRACE_PATH).await {
        Ok(l) => l,
        Err(r) => return *r,
    };
    match parse_trace_query(uri.query().unwrap_or_default()) {
        Ok((since, limit)) => {
            let permit = s.answers.enter().await;
            answers::json_answer(StatusCode::OK, &live.trace(since, limit), permit)
        }
        Err(e) => json_response(StatusCode::BAD_REQUEST, &json!({"error": e, "code": 400})),
    }
}

async fn flight_handler(State(s): State<AppState>, headers: HeaderMap) -> Response {
    match authorized(&s, &headers, FLIGHT_PATH).await {
        Ok(live) => {
            let permit = s.answers.enter().await;
            answers::json_answer(StatusCode::OK, &live.flight(), permit)
        }
        Err(r) => *r,
    }
}

/// `since=<number>&limit=<number>` of a trace request, both optional. Pure.
pub fn parse_trace_query(query: &str) -> Result<(u64, usize), String> {
    let mut since = 0u64;
    let mut limit = node_monitor_core::contract::TRACE_PAGE_MAX;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "since" => {
                since = value.parse().map_err(|_| {
                    format!("query parameter since: {value:?} is not a non-negative integer")
                })?;
            }
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|l: &usize| *l > 0)
                    .ok_or_else(|| {
                        format!("query parameter limit: {value:?} is not a positive integer")
                    })?;
            }
            other => {
                return Err(format!(
                    "unknown query parameter {other:?} (expected since, limit)"
                ));
            }
        }
    }
    Ok((since, limit))
}

#[cfg(test)]
mod tests;
