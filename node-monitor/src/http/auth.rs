//! Authorization of the agent's node API (`/node-monitor/v1/...`), as kube-rbac-proxy does it: the
//! caller's bearer token is authenticated with a TokenReview, then the identity it names is
//! authorized with a SubjectAccessReview for `get nodes/node-monitor` on this node. Positive
//! answers are cached briefly, keyed by a SHA-256 of the token, in a bounded cache, and refusals
//! for less long; what a caller may cost the API server before that is bounded
//! ([`super::review_budget`]: a precheck of the token's claims, a budget of reviews). The model
//! is in docs/security.md.
//!
//! Through the API server's pod proxy the `Authorization` header does not arrive (the API
//! server's authentication filter removes it once it has authenticated the caller), so the token
//! travels in [`TOKEN_HEADER`]; a direct request (port-forward, in-cluster) may use either.
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use axum::http::HeaderMap;
use futures::future::BoxFuture;
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, api::PostParams};
use tokio::sync::Semaphore;

use super::review_budget::{REFUSAL_TTL, ReviewBudget, precheck};

/// The longest token accepted (the contract).
pub use node_monitor_core::contract::MAX_TOKEN_BYTES;
/// The header that carries the caller's bearer token through the pod proxy (the contract).
pub use node_monitor_core::contract::TOKEN_HEADER;
/// How long a positive decision is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(30);
/// How many positive decisions are kept.
pub const CACHE_ENTRIES: usize = 256;
/// Reviews in flight at once; more callers wait (their connections are capped as well).
const REVIEWS_AT_ONCE: usize = 4;

/// The resource attribute a caller needs: `get` on the virtual subresource `nodes/node-monitor`
/// of this node (no such API object exists; RBAC grants it like any subresource).
pub const RESOURCE: &str = "nodes";
pub const SUBRESOURCE: &str = "node-monitor";
pub const VERB: &str = "get";

/// An authenticated identity (TokenReview `status.user`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a request is refused, with its status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// 400: the token header is malformed.
    Malformed(String),
    /// 401: no token, or the API server does not accept it.
    Unauthenticated(String),
    /// 403: the identity may not read this node's agent.
    Forbidden(String),
    /// 429: the budget of reviews is spent; retry after the duration.
    Throttled(Duration),
    /// 503: the agent cannot reach the API server to decide (it fails closed).
    Unavailable(String),
}

impl Denied {
    pub fn status(&self) -> u16 {
        match self {
            Self::Malformed(_) => 400,
            Self::Unauthenticated(_) => 401,
            Self::Forbidden(_) => 403,
            Self::Throttled(_) => 429,
            Self::Unavailable(_) => 503,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::Malformed(m)
            | Self::Unauthenticated(m)
            | Self::Forbidden(m)
            | Self::Unavailable(m) => m,
            Self::Throttled(_) => "too many requests to authorize: retry later",
        }
    }

    /// Whole seconds to wait before retrying, for `Retry-After` (at least 1).
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::Throttled(d) => Some(d.as_secs().max(1)),
            _ => None,
        }
    }
}

/// The token of a request: [`TOKEN_HEADER`] (`Bearer <token>` or the bare token), else
/// `Authorization: Bearer <token>`. Pure.
pub fn bearer_token(headers: &HeaderMap) -> Result<String, Denied> {
    let (name, raw) = if let Some(v) = headers.get(TOKEN_HEADER) {
        (TOKEN_HEADER, v)
    } else if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
        ("authorization", v)
    } else {
        return Err(Denied::Unauthenticated(format!(
            "no bearer token: send it in the {TOKEN_HEADER} header (the API server's proxy drops Authorization)"
        )));
    };
    if raw.len() > MAX_TOKEN_BYTES + "Bearer ".len() {
        return Err(Denied::Malformed(format!(
            "header {name}: {} bytes, longer than the {MAX_TOKEN_BYTES} bytes a token may have",
            raw.len()
        )));
    }
    let text = raw
        .to_str()
        .map_err(|_| Denied::Malformed(format!("header {name}: not visible ASCII")))?;
    let token = match text.strip_prefix("Bearer ") {
        Some(t) => t.trim(),
        None if name == TOKEN_HEADER => text.trim(),
        None => {
            return Err(Denied::Malformed(format!(
                "header {name}: expected \"Bearer <token>\", got a {} scheme",
                text.split(' ').next().unwrap_or_default()
            )));
        }
    };
    if token.is_empty() {
        return Err(Denied::Malformed(format!(
            "header {name}: the token is empty"
        )));
    }
    if token.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(Denied::Malformed(format!(
            "header {name}: the token has spaces or control characters"
        )));
    }
    Ok(token.to_owned())
}

/// A bounded cache of positive decisions with an expiry each. Pure: `now` is passed in.
#[derive(Debug)]
pub struct AuthCache<V> {
    entries: HashMap<[u8; 32], (Instant, V)>,
    capacity: usize,
    ttl: Duration,
}

impl<V: Clone> AuthCache<V> {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            ttl,
        }
    }

    /// The key of a token: its SHA-256 (the token itself is never kept).
    pub fn key(token: &str) -> [u8; 32] {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        key
    }

    /// The decision cached for `key`, unless expired at `now`.
    pub fn get(&mut self, key: &[u8; 32], now: Instant) -> Option<V> {
        match self.entries.get(key) {
            Some((expires, v)) if *expires > now => Some(v.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for the TTL; when full, the expired entries go, then the one expiring first.
    pub fn insert(&mut self, key: [u8; 32], value: V, now: Instant) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (expires, _)| *expires > now);
            if self.entries.len() >= self.capacity
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (expires, _))| *expires)
                    .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (now + self.ttl, value));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Which review an authorization makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Review {
    TokenReview,
    SubjectAccessReview,
}

impl std::fmt::Display for Review {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::TokenReview => "TokenReview",
            Self::SubjectAccessReview => "SubjectAccessReview",
        })
    }
}

/// A review the API server did not give: the caller is neither accepted nor refused.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("{review} failed: {source}")]
    Api {
        review: Review,
        #[source]
        source: kube::Error,
    },
}

impl ReviewError {
    /// The error's kind, for a log field or a metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Api { .. } => "api",
        }
    }
}

/// A TokenReview's answer about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authentication {
    /// The token's identity.
    Accepted(UserInfo),
    /// Not accepted, with the API server's reason.
    Rejected { why: String },
}

/// A SubjectAccessReview's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub allowed: bool,
    /// The authorizer's reason, often empty.
    pub reason: String,
}

/// The two API calls an authorization makes; the Kubernetes one is [`KubeReviews`].
pub trait Reviews: Send + Sync {
    /// TokenReview: the identity, or why the token is not accepted.
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Authentication, ReviewError>>;
    /// SubjectAccessReview of `get nodes/node-monitor` named `node`.
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Access, ReviewError>>;
}

/// TokenReview and SubjectAccessReview through the API server.
pub struct KubeReviews {
    client: kube::Client,
    /// The audiences a token must be valid for; empty: the API server's own.
    audiences: Vec<String>,
}

impl KubeReviews {
    pub fn new(client: kube::Client, audiences: Vec<String>) -> Self {
        Self { client, audiences }
    }
}

impl Reviews for KubeReviews {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Authentication, ReviewError>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_owned(),
                    audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
                },
                ..TokenReview::default()
            };
            let api: Api<TokenReview> = Api::all(self.client.clone());
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|source| ReviewError::Api {
                    review: Review::TokenReview,
                    source,
                })?;
            let status = answer.status.unwrap_or_default();
            if status.authenticated != Some(true) {
                let why = status
                    .error
                    .filter(|e| !e.is_empty())
                    .unwrap_or_else(|| "the token is not valid".to_owned());
                return Ok(Authentication::Rejected { why });
            }
            let user = status.user.unwrap_or_default();
            Ok(Authentication::Accepted(UserInfo {
                username: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }))
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Access, ReviewError>> {
        Box::pin(async move {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.username.clone()),
                    uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                    groups: Some(user.groups.clone()),
                    extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(String::new()),
                        resource: Some(RESOURCE.to_owned()),
                        subresource: Some(SUBRESOURCE.to_owned()),
                        verb: Some(VERB.to_owned()),
                        name: Some(node.to_owned()),
                        ..ResourceAttributes::default()
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|source| ReviewError::Api {
                    review: Review::SubjectAccessReview,
                    source,
                })?;
            let status = answer.status.unwrap_or_default();
            let reason = status
                .reason
                .or(status.evaluation_error)
                .unwrap_or_default();
            Ok(Access {
                allowed: status.allowed && status.denied != Some(true),
                reason,
            })
        })
    }
}

/// Decides whether a request may read this node's agent.
pub struct Authorizer {
    reviews: Arc<dyn Reviews>,
    node: String,
    cache: Mutex<AuthCache<String>>,
    refused: Mutex<AuthCache<Denied>>,
    budget: Mutex<ReviewBudget>,
    audiences: Vec<String>,
    gate: Semaphore,
}

impl Authorizer {
    pub fn new(reviews: Arc<dyn Reviews>, node: impl Into<String>) -> Self {
        Self {
            reviews,
            node: node.into(),
            cache: Mutex::new(AuthCache::new(CACHE_ENTRIES, CACHE_TTL)),
            refused: Mutex::new(AuthCache::new(CACHE_ENTRIES, REFUSAL_TTL)),
            budget: Mutex::new(ReviewBudget::default()),
            audiences: Vec::new(),
            gate: Semaphore::new(REVIEWS_AT_ONCE),
        }
    }

    /// Refuses, before any review, a token whose unverified claims do not name one of
    /// `audiences` or have expired ([`precheck`]); empty: no precheck.
    pub fn expecting(mut self, audiences: Vec<String>) -> Self {
        self.audiences = audiences;
        self
    }

    /// Spends [`ReviewBudget`]'s budget with `budget` instead (tests).
    pub fn with_budget(mut self, budget: ReviewBudget) -> Self {
        self.budget = Mutex::new(budget);
        self
    }

    /// The caller's username when it may read this node's agent; why not otherwise.
    pub async fn check(&self, headers: &HeaderMap) -> Result<String, Denied> {
        let token = bearer_token(headers)?;
        let key = AuthCache::<String>::key(&token);
        if let Some(user) = self
            .cache
            .lock()
            .ok()
            .and_then(|mut c| c.get(&key, Instant::now()))
        {
            return Ok(user);
        }
        if let Some(refused) = self
            .refused
            .lock()
            .ok()
            .and_then(|mut c| c.get(&key, Instant::now()))
        {
            return Err(refused);
        }
        let unix_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        if let Err(why) = precheck(&token, &self.audiences, unix_now) {
            return Err(Denied::Unauthenticated(format!("token rejected: {why}")));
        }
        let spent = self
            .budget
            .lock()
            .map_or(Ok(()), |mut b| b.take(Instant::now()));
        if let Err(wait) = spent {
            return Err(Denied::Throttled(wait));
        }
        let decided = self.review(&token).await;
        if let Err(d @ (Denied::Unauthenticated(_) | Denied::Forbidden(_))) = &decided
            && let Ok(mut c) = self.refused.lock()
        {
            c.insert(key, d.clone(), Instant::now());
        }
        let user = decided?;
        if let Ok(mut c) = self.cache.lock() {
            c.insert(key, user.clone(), Instant::now());
        }
        Ok(user)
    }

    /// The two reviews of `token`: the caller's username when it may read this node's agent.
    async fn review(&self, token: &str) -> Result<String, Denied> {
        let _permit = self
            .gate
            .acquire()
            .await
            .map_err(|_| Denied::Unavailable("the agent is stopping".to_owned()))?;
        let user = match self.reviews.authenticate(token).await {
            Ok(Authentication::Accepted(user)) => user,
            Ok(Authentication::Rejected { why }) => {
                return Err(Denied::Unauthenticated(format!("token rejected: {why}")));
            }
            Err(e) => {
                // The details (the agent's own RBAC, the API server's address) are for the log,
                // not for a caller not yet authenticated.
                tracing::warn!(error = %e, kind = e.metric_label(), "node API: cannot authenticate a caller");
                return Err(Denied::Unavailable(
                    "the agent cannot authenticate callers now (TokenReview failed; see its log)"
                        .to_owned(),
                ));
            }
        };
        let Access { allowed, reason } = self
            .reviews
            .authorize(&user, &self.node)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, user = %user.username, "node API: cannot authorize a caller");
                Denied::Unavailable(
                    "the agent cannot authorize callers now (SubjectAccessReview failed; see its log)"
                        .to_owned(),
                )
            })?;
        if !allowed {
            let why = if reason.is_empty() {
                String::new()
            } else {
                format!(" ({reason})")
            };
            return Err(Denied::Forbidden(format!(
                "user {:?} cannot {VERB} resource \"{RESOURCE}/{SUBRESOURCE}\" named {:?}{why}",
                user.username, self.node
            )));
        }
        Ok(user.username)
    }
}

/// Where the authorizer goes once the agent has its API client; until then the node API answers
/// 503 (it never answers without one).
#[derive(Default)]
pub struct AuthSlot(OnceLock<Arc<Authorizer>>);

impl AuthSlot {
    pub fn set(&self, authorizer: Arc<Authorizer>) {
        let _ = self.0.set(authorizer);
    }

    pub fn get(&self) -> Option<&Arc<Authorizer>> {
        self.0.get()
    }
}

#[cfg(test)]
mod tests;
