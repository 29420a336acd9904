//! How current remediate's view of the API is: when it last heard from the API server
//! ([`ApiHealth`]), and whether the node Lease watch still delivers ([`WatchFreshness`],
//! confirmed against a list by [`confirm_lease_watch`]). A stale view makes live nodes look dead,
//! so the controller acts only on a fresh one.
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, runtime::reflector};
use tracing::{info, warn};

/// The namespace of node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// When the controller last heard from the API server (any successful request or watch event).
#[derive(Debug)]
pub struct ApiHealth {
    last_ok: Mutex<Instant>,
}

impl Default for ApiHealth {
    fn default() -> Self {
        Self {
            last_ok: Mutex::new(Instant::now()),
        }
    }
}

impl ApiHealth {
    pub fn ok(&self) {
        self.ok_at(Instant::now());
    }

    /// The last success was at `at` (tests set a past one this way).
    pub fn ok_at(&self, at: Instant) {
        if let Ok(mut t) = self.last_ok.lock() {
            *t = at;
        }
    }

    /// Time since the last success.
    pub fn silent_for(&self) -> Duration {
        self.last_ok.lock().map_or(Duration::MAX, |t| t.elapsed())
    }
}

/// How current the watched node Leases are, tracked apart from [`ApiHealth`]: every other request
/// (leader election, writes) can succeed while the Lease watch has stopped delivering, and a
/// stale Lease cache makes live nodes look dead. Confirmed by [`confirm_lease_watch`]: a fresh
/// list of the Leases that the cache has caught up with. On tokio's clock.
#[derive(Debug, Default)]
pub struct WatchFreshness {
    confirmed: Mutex<Option<tokio::time::Instant>>,
}

impl WatchFreshness {
    /// The cache was current as of `at`.
    pub fn confirm(&self, at: tokio::time::Instant) {
        if let Ok(mut c) = self.confirmed.lock()
            && c.is_none_or(|prev| prev < at)
        {
            *c = Some(at);
        }
    }

    /// How old the cached view may be; `None` before the first confirmation.
    pub fn age(&self) -> Option<Duration> {
        self.confirmed
            .lock()
            .ok()
            .and_then(|c| c.map(|t| t.elapsed()))
    }
}

/// Confirms the Lease cache against a list every `every`: the list's start time counts once the
/// cache holds every listed Lease at its listed version or later (it is given up to `every` to
/// catch up). A watch that stopped delivering never catches up, so its view ages.
pub async fn confirm_lease_watch(
    api: Api<Lease>,
    cache: reflector::Store<Lease>,
    freshness: Arc<WatchFreshness>,
    every: Duration,
) {
    confirm_watch(
        || {
            let api = api.clone();
            async move {
                let list = api.list_metadata(&kube::api::ListParams::default()).await?;
                Ok::<_, kube::Error>(
                    list.items
                        .iter()
                        .filter_map(|l| {
                            Some((
                                l.metadata.name.clone()?,
                                l.metadata.resource_version.clone()?,
                            ))
                        })
                        .collect(),
                )
            }
        },
        |name| {
            cache
                .get(&reflector::ObjectRef::new(name).within(NODE_LEASE_NAMESPACE))
                .and_then(|l| l.metadata.resource_version.clone())
        },
        &freshness,
        every,
    )
    .await;
}

/// [`confirm_lease_watch`] on its ports: `list` gives each listed object's name and
/// resourceVersion; `cached` the cached version of a name. Runs until dropped; a list that gets
/// no answer within `every` (at least a second) counts as a failed one.
pub async fn confirm_watch<L, F, E>(
    mut list: L,
    cached: impl Fn(&str) -> Option<String>,
    freshness: &WatchFreshness,
    every: Duration,
) where
    L: FnMut() -> F,
    F: Future<Output = Result<Vec<(String, String)>, E>>,
    E: std::fmt::Display,
{
    let mut was_current = true;
    loop {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(every.max(Duration::from_secs(1)), list()).await {
            Ok(Ok(listed)) => {
                let deadline = started + every;
                let current = loop {
                    let caught_up = node_monitor_core::remediation::watch_caught_up(
                        listed.iter().map(|(n, v)| (n.as_str(), v.as_str())),
                        &cached,
                    );
                    if caught_up || tokio::time::Instant::now() >= deadline {
                        break caught_up;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                };
                if current {
                    freshness.confirm(started);
                    if !was_current {
                        info!("the node Lease watch caught up again");
                    }
                } else if was_current {
                    warn!(
                        "the node Lease watch lags a fresh list; no node is judged dead until it catches up"
                    );
                }
                was_current = current;
            }
            Ok(Err(e)) => warn!(error = %e, "could not list node Leases to check the watch"),
            Err(_) => warn!("listing node Leases to check the watch got no answer"),
        }
        tokio::time::sleep_until(started + every).await;
    }
}

#[cfg(test)]
mod tests;
