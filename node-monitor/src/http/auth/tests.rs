use super::*;

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::HeaderValue;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_str(v).expect("header value"));
    }
    h
}

#[test]
fn the_token_comes_from_its_header_then_authorization() {
    let t = |pairs: &[(&'static str, &str)]| bearer_token(&headers(pairs));
    assert_eq!(t(&[(TOKEN_HEADER, "Bearer abc")]), Ok("abc".to_owned()));
    assert_eq!(t(&[(TOKEN_HEADER, "abc")]), Ok("abc".to_owned()));
    assert_eq!(t(&[("authorization", "Bearer xyz")]), Ok("xyz".to_owned()));
    assert_eq!(
        t(&[
            (TOKEN_HEADER, "Bearer abc"),
            ("authorization", "Bearer xyz")
        ]),
        Ok("abc".to_owned()),
        "the node API's header first"
    );
    assert!(matches!(t(&[]), Err(Denied::Unauthenticated(m)) if m.contains(TOKEN_HEADER)));
}

#[test]
fn malformed_tokens_are_refused_naming_the_header() {
    let t = |pairs: &[(&'static str, &str)]| bearer_token(&headers(pairs));
    let cases: [(&[(&'static str, &str)], &str); 4] = [
        (&[("authorization", "Basic dXNlcjpwdw==")], "Basic"),
        (&[(TOKEN_HEADER, "Bearer ")], "empty"),
        (&[(TOKEN_HEADER, "Bearer a b")], "spaces"),
        (&[("authorization", "Bearer")], "Bearer"),
    ];
    for (pairs, needle) in cases {
        match t(pairs) {
            Err(Denied::Malformed(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("{pairs:?}: {other:?}"),
        }
    }
    let long = "a".repeat(MAX_TOKEN_BYTES + 100);
    assert!(
        matches!(t(&[(TOKEN_HEADER, &long)]), Err(Denied::Malformed(m)) if m.contains("longer"))
    );
    let mut h = HeaderMap::new();
    h.insert(
        TOKEN_HEADER,
        HeaderValue::from_bytes(b"Bearer \xff").expect("bytes"),
    );
    assert!(matches!(bearer_token(&h), Err(Denied::Malformed(m)) if m.contains("ASCII")));
}

#[test]
fn the_cache_expires_and_stays_bounded() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut c = AuthCache::new(2, s(30));
    let (a, b, d) = (
        AuthCache::<String>::key("a"),
        AuthCache::<String>::key("b"),
        AuthCache::<String>::key("d"),
    );
    assert_ne!(a, b);
    c.insert(a, "alice".to_owned(), t0);
    assert_eq!(c.get(&a, t0 + s(29)), Some("alice".to_owned()));
    assert_eq!(c.get(&a, t0 + s(30)), None, "expired at the TTL");
    assert!(c.is_empty(), "an expired entry is dropped when seen");
    c.insert(a, "alice".to_owned(), t0);
    c.insert(b, "bob".to_owned(), t0 + s(1));
    c.insert(d, "dave".to_owned(), t0 + s(2));
    assert_eq!(c.len(), 2, "bounded");
    assert_eq!(c.get(&a, t0 + s(3)), None, "the one expiring first went");
    assert_eq!(c.get(&b, t0 + s(3)), Some("bob".to_owned()));
    assert_eq!(c.get(&d, t0 + s(3)), Some("dave".to_owned()));
    // Expired entries go before a live one: at 31.5 s, bob's has expired, dave's has not.
    let later = t0 + Duration::from_millis(31_500);
    c.insert(a, "alice".to_owned(), later);
    assert_eq!(c.get(&d, later), Some("dave".to_owned()));
    assert_eq!(c.get(&a, later), Some("alice".to_owned()));
}

/// Reviews that know one token per user and allow only `viewer`; counted.
#[derive(Default)]
struct FakeReviews {
    tokens: AtomicUsize,
    accesses: AtomicUsize,
    down: bool,
}

impl Reviews for FakeReviews {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Authentication, ReviewError>> {
        self.tokens.fetch_add(1, Ordering::SeqCst);
        let down = self.down;
        Box::pin(async move {
            if down {
                return Err(ReviewError::Api {
                    review: Review::TokenReview,
                    source: kube::Error::Service(Box::new(std::io::Error::other(
                        "connection refused",
                    ))),
                });
            }
            Ok(match token {
                "t-viewer" | "t-stranger" => Authentication::Accepted(UserInfo {
                    username: token.trim_start_matches("t-").to_owned(),
                    ..UserInfo::default()
                }),
                _ => Authentication::Rejected {
                    why: "invalid bearer token".to_owned(),
                },
            })
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Access, ReviewError>> {
        self.accesses.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            Ok(Access {
                allowed: user.username == "viewer" && node == "n1",
                reason: String::new(),
            })
        })
    }
}

#[tokio::test]
async fn reviews_decide_and_answers_are_reused() {
    let reviews = Arc::new(FakeReviews::default());
    let authorizer = Authorizer::new(reviews.clone(), "n1");
    let h = |t: &str| headers(&[(TOKEN_HEADER, t)]);
    assert_eq!(
        authorizer.check(&h("t-viewer")).await,
        Ok("viewer".to_owned())
    );
    assert_eq!(
        authorizer.check(&h("t-viewer")).await,
        Ok("viewer".to_owned())
    );
    assert_eq!(
        reviews.tokens.load(Ordering::SeqCst),
        1,
        "the second answer came from the cache"
    );
    match authorizer.check(&h("t-stranger")).await {
        Err(Denied::Forbidden(m)) => assert!(
            m.contains("\"stranger\"") && m.contains("nodes/node-monitor") && m.contains("\"n1\""),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        authorizer.check(&h("t-stranger")).await,
        Err(Denied::Forbidden(_))
    ));
    assert_eq!(
        reviews.accesses.load(Ordering::SeqCst),
        2,
        "a refusal is reused for the same token (REFUSAL_TTL), not asked again"
    );
    assert!(matches!(
        authorizer.check(&h("t-bogus")).await,
        Err(Denied::Unauthenticated(m)) if m.contains("invalid bearer token")
    ));
    assert!(matches!(
        authorizer.check(&HeaderMap::new()).await,
        Err(Denied::Unauthenticated(_))
    ));
}

#[tokio::test]
async fn an_unreachable_api_server_fails_closed() {
    let reviews = Arc::new(FakeReviews {
        down: true,
        ..FakeReviews::default()
    });
    let authorizer = Authorizer::new(reviews, "n1");
    let d = authorizer
        .check(&headers(&[(TOKEN_HEADER, "t-viewer")]))
        .await
        .expect_err("refused");
    assert_eq!(d.status(), 503);
    assert!(d.message().contains("TokenReview failed"), "{d:?}");
    assert!(
        !d.message().contains("connection refused"),
        "the details go to the log, not to an unauthenticated caller: {d:?}"
    );
}

/// A pod spraying junk at the node API: tokens that cannot be for the agent's audience cost no
/// review; JWT-shaped forgeries cost at most the budget's burst, then are answered 429 with a
/// retry time, without a review; a repeated token costs one review.
#[tokio::test]
async fn a_token_flood_costs_at_most_the_review_budget() {
    use base64::Engine as _;
    let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    let forged = |i: usize| {
        let claims = serde_json::json!({"aud": ["node-monitor"], "exp": 4_000_000_000_i64, "i": i});
        format!(
            "{}.{}.{}",
            b64(b"{}"),
            b64(claims.to_string().as_bytes()),
            b64(b"sig")
        )
    };
    let reviews = Arc::new(FakeReviews::default());
    let authorizer = Authorizer::new(reviews.clone(), "n1")
        .expecting(vec!["node-monitor".to_owned()])
        .with_budget(ReviewBudget::new(5, 1));
    let h = |t: &str| headers(&[(TOKEN_HEADER, t)]);
    for i in 0..200 {
        let d = authorizer
            .check(&h(&format!("junk-{i}")))
            .await
            .expect_err("junk is refused");
        assert_eq!(d.status(), 401, "{d:?}");
    }
    assert_eq!(
        reviews.tokens.load(Ordering::SeqCst),
        0,
        "junk costs no review"
    );
    let mut throttled = 0;
    for i in 0..50 {
        let d = authorizer.check(&h(&forged(i))).await.expect_err("forged");
        match d.status() {
            401 => {}
            429 => {
                throttled += 1;
                assert!(d.retry_after_secs().is_some_and(|s| s >= 1), "{d:?}");
            }
            other => panic!("{other}: {d:?}"),
        }
    }
    assert_eq!(
        reviews.tokens.load(Ordering::SeqCst),
        5,
        "50 forgeries in a burst cost the budget's 5 reviews"
    );
    assert_eq!(throttled, 45);
    // The first forgery again: its refusal is remembered, no review and no budget spent.
    let again = authorizer.check(&h(&forged(0))).await.expect_err("refused");
    assert_eq!(again.status(), 401);
    assert_eq!(reviews.tokens.load(Ordering::SeqCst), 5);
}
