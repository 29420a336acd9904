//! Waiting for a cluster to converge, in tests: unwrap with the whole cause chain, and poll until a
//! check holds. The bounds are liveness bounds (how long before a test gives up), never speed
//! assertions; a test that gives up panics naming what it waited for.
use std::time::{Duration, Instant};

use crate::control_plane::error_chain;

/// How often [`eventually`] checks again.
pub const POLL: Duration = Duration::from_millis(100);

/// The value of `r`, or a panic naming `what` failed and the error's causes.
pub fn must<T, E: std::error::Error>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {}", error_chain(&e)))
}

/// Calls `check` every [`POLL`] until it returns `Some`, and returns that; panics naming `what`
/// once `timeout` has passed without it.
pub async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}
