//! What a caller costs the API server before it is authorized. Every TokenReview and
//! SubjectAccessReview is a request on the agent's own account, in the same API Priority and
//! Fairness flow as its evictions, Lease renewals and condition patches: a pod that sprays junk
//! tokens at the node API must not spend that flow. So, before any review:
//! - [`precheck`]: a token the agent's audience could accept is a JWT whose unverified claims
//!   name that audience and have not expired; anything else is refused without a review (a
//!   forged claim passes this check, and is then refused by the review, within the budget);
//! - refusals are remembered for [`REFUSAL_TTL`] (keyed by the token's SHA-256), so a token
//!   repeated costs one review;
//! - [`ReviewBudget`]: at most [`REVIEW_BURST`] reviews at once, then [`REVIEWS_PER_SECOND`];
//!   a request beyond it is answered 429 with `Retry-After`, without a review.
//!
//! Pure: the clocks are passed in.
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

/// Reviews a burst may spend at once.
pub const REVIEW_BURST: u32 = 20;
/// Reviews per second after the burst.
pub const REVIEWS_PER_SECOND: u32 = 5;
/// How long a refusal (401, 403) is reused for the same token.
pub const REFUSAL_TTL: Duration = Duration::from_secs(10);
/// The clock skew allowed on a token's `exp`.
pub const EXPIRY_LEEWAY_SECS: i64 = 60;

/// A token bucket: [`REVIEW_BURST`] tokens, refilled at [`REVIEWS_PER_SECOND`].
#[derive(Debug, Clone)]
pub struct ReviewBudget {
    tokens: f64,
    burst: f64,
    per_second: f64,
    at: Option<Instant>,
}

impl Default for ReviewBudget {
    fn default() -> Self {
        Self::new(REVIEW_BURST, REVIEWS_PER_SECOND)
    }
}

impl ReviewBudget {
    pub fn new(burst: u32, per_second: u32) -> Self {
        Self {
            tokens: f64::from(burst.max(1)),
            burst: f64::from(burst.max(1)),
            per_second: f64::from(per_second.max(1)),
            at: None,
        }
    }

    /// Takes one review at `now`; when none is left, how long until one is.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        if let Some(at) = self.at {
            let refill = now.saturating_duration_since(at).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + refill).min(self.burst);
        }
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.per_second,
            ))
        }
    }
}

/// Whether `token` could be one of `audiences`' at `now_unix` (seconds), judged from its
/// unverified claims; why not otherwise. Empty `audiences` (the API server's own audience):
/// nothing is judged.
pub fn precheck(token: &str, audiences: &[String], now_unix: i64) -> Result<(), String> {
    if audiences.is_empty() {
        return Ok(());
    }
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a JWT (three dot-separated parts)".to_owned());
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|_| "its claims are not base64url".to_owned())?;
    let claims: Value =
        serde_json::from_slice(&bytes).map_err(|_| "its claims are not JSON".to_owned())?;
    let aud: Vec<&str> = match claims.get("aud") {
        Some(Value::String(a)) => vec![a.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !aud.iter().any(|a| audiences.iter().any(|want| want == a)) {
        return Err(format!(
            "not issued for the audience {:?} (it names {aud:?})",
            audiences.join(",")
        ));
    }
    match claims.get("exp").and_then(Value::as_i64) {
        Some(exp) if exp + EXPIRY_LEEWAY_SECS < now_unix => Err("expired".to_owned()),
        Some(_) => Ok(()),
        None => Err("no expiry (exp)".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &Value) -> String {
        let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.{}",
            b64(br#"{"alg":"RS256"}"#),
            b64(claims.to_string().as_bytes()),
            b64(b"signature")
        )
    }

    #[test]
    fn precheck_table() {
        let ours = vec!["node-monitor".to_owned()];
        let now = 1_800_000_000;
        let cases: [(String, &[String], Result<(), &str>); 9] = [
            (
                jwt(&serde_json::json!({"aud": ["node-monitor"], "exp": now + 600})),
                &ours,
                Ok(()),
            ),
            (
                jwt(&serde_json::json!({"aud": "node-monitor", "exp": now})),
                &ours,
                Ok(()),
            ),
            // Within the leeway, then past it.
            (
                jwt(&serde_json::json!({"aud": "node-monitor", "exp": now - 30})),
                &ours,
                Ok(()),
            ),
            (
                jwt(&serde_json::json!({"aud": "node-monitor", "exp": now - 61})),
                &ours,
                Err("expired"),
            ),
            // The API server's audience: a caller's own token, which the agent never wants.
            (
                jwt(
                    &serde_json::json!({"aud": ["https://kubernetes.default.svc"], "exp": now + 600}),
                ),
                &ours,
                Err("not issued for the audience"),
            ),
            (
                jwt(&serde_json::json!({"aud": "node-monitor"})),
                &ours,
                Err("no expiry"),
            ),
            ("junk".to_owned(), &ours, Err("not a JWT")),
            ("a.!!!.c".to_owned(), &ours, Err("not base64url")),
            // Without an audience of its own, the agent judges nothing before the review.
            ("junk".to_owned(), &[], Ok(())),
        ];
        for (token, audiences, want) in cases {
            let got = precheck(&token, audiences, now);
            match want {
                Ok(()) => assert_eq!(got, Ok(()), "{token}"),
                Err(needle) => {
                    let e = got.expect_err(&token);
                    assert!(e.contains(needle), "{token}: {e}");
                }
            }
        }
    }

    #[test]
    fn the_budget_allows_a_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = ReviewBudget::new(3, 2);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Ok(()));
        }
        // The clock is passed in: one review is back half a second later at 2/s.
        let half = Duration::from_millis(500);
        assert_eq!(b.take(t0), Err(half), "the burst is spent");
        let t1 = t0 + half;
        assert_eq!(b.take(t1), Ok(()));
        assert_eq!(b.take(t1), Err(half));
        // Ten seconds refill the burst, never more.
        let later = t0 + Duration::from_secs(10);
        for _ in 0..3 {
            assert_eq!(b.take(later), Ok(()));
        }
        assert!(b.take(later).is_err());
    }
}
