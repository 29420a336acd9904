//! Per-pod retry backoff for evictions that did not take effect: refused by a PodDisruptionBudget
//! (HTTP 429), refused or failed otherwise (403 from a webhook, 422, 500 for a pod with two
//! budgets, no answer), or answered "gone" for a pod the cache still lists. While a pod backs off,
//! the planner considers the next candidate, as the eviction API's retry guidance suggests, so no
//! single pod can hold every other eviction up. Pure: time is passed in.
use std::{collections::HashMap, time::Duration};

use crate::cluster::actuator::{EvictOutcome, FailureKind};

use node_monitor_core::units::clock::Timestamp;

/// What the loop does after one eviction answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaction {
    /// Put the pod into (exponential) backoff: it is not a candidate until the backoff ends.
    pub back_off_pod: bool,
    /// Clear the pod's backoff and the API retry delay: the eviction took effect.
    pub took_effect: bool,
    /// Decide again at once, without the pod: the next candidate may be evicted now.
    pub next_candidate_now: bool,
    /// The API server is unavailable: decide again after the (doubling) API retry delay.
    pub retry_later: bool,
    /// The API server throttled the request: hold every eviction this long (the pod is not at
    /// fault and keeps its rank).
    pub hold_evictions: Option<Duration>,
    /// The `reason` label of `node_monitor_eviction_failures_total`, when this is a failure.
    pub failure: Option<&'static str>,
}

/// The label of an eviction the API answered "gone" for while the cache still listed the pod.
pub const FAILURE_GONE: &str = "gone";
/// The label of an eviction the API server throttled (429 without a disruption budget).
pub const FAILURE_THROTTLED: &str = "throttled";

/// The loop's reaction to an eviction outcome. Every outcome that leaves the pod in place for a
/// reason of its own (a budget, a webhook, a refusal) puts it into backoff, so the same pod is
/// never ranked first for ever. An unavailable API server or a throttling one is no pod's fault:
/// the pod keeps its rank and the whole loop waits, so that an outage never turns the node's
/// ranking over to the next candidates.
pub fn react(outcome: &EvictOutcome) -> Reaction {
    let none = Reaction {
        back_off_pod: false,
        took_effect: false,
        next_candidate_now: false,
        retry_later: false,
        hold_evictions: None,
        failure: None,
    };
    match outcome {
        EvictOutcome::Evicted | EvictOutcome::Escalated => Reaction {
            took_effect: true,
            ..none
        },
        EvictOutcome::DryRun => none,
        EvictOutcome::PdbBlocked => Reaction {
            back_off_pod: true,
            next_candidate_now: true,
            ..none
        },
        // The pod the cache lists is gone from the API: the cache is behind (a stalled watch
        // keeps it so for ever). Skip the pod until the cache catches up or the backoff ends.
        EvictOutcome::Gone => Reaction {
            back_off_pod: true,
            next_candidate_now: true,
            failure: Some(FAILURE_GONE),
            ..none
        },
        EvictOutcome::Throttled { retry_after } => Reaction {
            hold_evictions: Some(*retry_after),
            failure: Some(FAILURE_THROTTLED),
            ..none
        },
        // The API server is down or did not answer: no pod is at fault, and the next candidate
        // would fail the same way. The pod keeps its rank (as the kubelet's ranking does on its
        // next pass); no eviction request goes out before the API retry delay.
        EvictOutcome::Failed { kind, .. } if kind.api_unavailable() => Reaction {
            retry_later: true,
            failure: Some(kind.label()),
            ..none
        },
        EvictOutcome::Failed { kind, .. } => Reaction {
            back_off_pod: true,
            next_candidate_now: true,
            failure: Some(kind.label()),
            ..none
        },
    }
}

/// Every `reason` label [`react`] can give, for zero-initialised series.
pub fn failure_labels() -> impl Iterator<Item = &'static str> {
    [FAILURE_GONE, FAILURE_THROTTLED]
        .into_iter()
        .chain(FailureKind::ALL.into_iter().map(FailureKind::label))
}

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    until: Timestamp,
    delay: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    /// Records a refusal or failure for `uid` at `now`; the delay doubles per refusal up to `max`.
    pub fn refused(&mut self, uid: &str, now: Timestamp) -> Duration {
        let delay = match self.entries.get(uid) {
            Some(e) => (e.delay * 2).min(self.max),
            None => self.initial,
        };
        self.entries.insert(
            uid.to_owned(),
            Entry {
                until: now + delay,
                delay,
            },
        );
        delay
    }

    /// Is `uid` still backing off at `now`?
    pub fn active(&self, uid: &str, now: Timestamp) -> bool {
        self.entries.get(uid).is_some_and(|e| now < e.until)
    }

    /// Forgets pods that are gone or were evicted, and entries long expired.
    pub fn forget(&mut self, uid: &str) {
        self.entries.remove(uid);
    }

    /// Drops entries whose backoff ended more than `max` ago, so the map stays bounded.
    pub fn prune(&mut self, now: Timestamp) {
        let max = self.max;
        self.entries
            .retain(|_, e| now.saturating_since(e.until) < max);
    }

    /// When the earliest active backoff ends, so the loop can decide again then.
    pub fn next_expiry(&self, now: Timestamp) -> Option<Timestamp> {
        self.entries
            .values()
            .map(|e| e.until)
            .filter(|u| *u > now)
            .min()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(code: Option<u16>, kind: FailureKind) -> EvictOutcome {
        EvictOutcome::Failed {
            code,
            kind,
            reason: String::new(),
        }
    }

    /// (outcome, back off, next now, retry later, took effect, failure label)
    type OutcomeCase = (EvictOutcome, bool, bool, bool, bool, Option<&'static str>);

    /// No refusal of the pod's own keeps it a candidate: each puts it into backoff and lets the
    /// next candidate go at once. An unavailable API server backs no pod off: the loop retries
    /// later with the same ranking.
    #[test]
    fn every_refusal_backs_the_pod_off_and_an_outage_none() {
        use FailureKind::*;
        let cases: &[OutcomeCase] = &[
            (EvictOutcome::Evicted, false, false, false, true, None),
            (EvictOutcome::Escalated, false, false, false, true, None),
            (EvictOutcome::DryRun, false, false, false, false, None),
            (EvictOutcome::PdbBlocked, true, true, false, false, None),
            (EvictOutcome::Gone, true, true, false, false, Some("gone")),
            (
                failed(Some(500), MultiplePdbs),
                true,
                true,
                false,
                false,
                Some("multiple_pdbs"),
            ),
            (
                failed(Some(403), Forbidden),
                true,
                true,
                false,
                false,
                Some("forbidden"),
            ),
            (
                failed(Some(422), Invalid),
                true,
                true,
                false,
                false,
                Some("invalid"),
            ),
            (
                failed(Some(500), ServerError),
                true,
                true,
                false,
                false,
                Some("server_error"),
            ),
            (
                failed(Some(400), ClientError),
                true,
                true,
                false,
                false,
                Some("client_error"),
            ),
            (
                failed(Some(503), Unavailable),
                false,
                false,
                true,
                false,
                Some("unavailable"),
            ),
            (
                failed(None, Unavailable),
                false,
                false,
                true,
                false,
                Some("unavailable"),
            ),
            (
                failed(None, Timeout),
                false,
                false,
                true,
                false,
                Some("timeout"),
            ),
        ];
        for (outcome, back_off, now, later, effect, failure) in cases {
            let r = react(outcome);
            assert_eq!(
                (
                    r.back_off_pod,
                    r.next_candidate_now,
                    r.retry_later,
                    r.took_effect,
                    r.failure
                ),
                (*back_off, *now, *later, *effect, *failure),
                "{outcome:?}"
            );
        }
        for (outcome, ..) in cases {
            let hold = react(outcome).hold_evictions;
            let want = match outcome {
                EvictOutcome::Throttled { retry_after } => Some(*retry_after),
                _ => None,
            };
            assert_eq!(hold, want, "{outcome:?}");
        }
        let labels: Vec<_> = failure_labels().collect();
        for (outcome, .., failure) in cases {
            if let Some(f) = failure {
                assert!(labels.contains(f), "{outcome:?}: {f} not zero-initialised");
            }
        }
    }

    /// The answers the API server gives, classified as the metric reports them.
    #[test]
    fn failure_kinds_from_status() {
        let cases = [
            (
                403,
                "admission webhook \"deny.example\" denied the request",
                "forbidden",
            ),
            (422, "Eviction.policy \"p\" is invalid", "invalid"),
            (
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                "multiple_pdbs",
            ),
            (
                500,
                "Internal error occurred: failed calling webhook",
                "server_error",
            ),
            (503, "service unavailable", "unavailable"),
            (
                504,
                "the server was unable to return a response in the time allotted",
                "unavailable",
            ),
            (400, "bad request", "client_error"),
        ];
        for (code, message, want) in cases {
            assert_eq!(
                FailureKind::of_status(code, message).label(),
                want,
                "{code} {message}"
            );
        }
    }

    /// A pod that keeps failing is skipped while it backs off: the next candidate is ranked first.
    #[test]
    fn a_failing_pod_stops_holding_the_queue() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let ranked = ["two-pdbs", "next"];
        let first = |b: &Backoff, now| ranked.iter().copied().find(|uid| !b.active(uid, now));
        assert_eq!(first(&b, at(0)), Some("two-pdbs"));
        let r = react(&failed(Some(500), FailureKind::MultiplePdbs));
        assert!(r.back_off_pod && r.next_candidate_now);
        b.refused("two-pdbs", at(0));
        assert_eq!(
            first(&b, at(0)),
            Some("next"),
            "the next candidate in the same cycle"
        );
        // Bounded: the pod is tried again when its backoff ends, and backs off longer each time.
        assert_eq!(first(&b, at(1)), Some("two-pdbs"));
        assert_eq!(b.refused("two-pdbs", at(1)), Duration::from_secs(2));
        for _ in 0..10 {
            b.refused("two-pdbs", at(1));
        }
        assert_eq!(b.refused("two-pdbs", at(1)), Duration::from_secs(60));
    }

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_duration(Duration::from_secs(secs))
    }

    #[test]
    fn doubles_up_to_max_and_expires() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
        let steps = [(0, 1), (1, 2), (3, 4), (7, 4)];
        for (now, want) in steps {
            assert_eq!(
                b.refused("a", at(now)),
                Duration::from_secs(want),
                "refusal at {now}s"
            );
        }
        assert_eq!(b.next_expiry(at(7)), Some(at(11)));
        assert_eq!(
            b.next_expiry(at(11)),
            None,
            "expired entries do not schedule a wake-up"
        );
        assert!(b.active("a", at(10)));
        assert!(!b.active("a", at(11)));
        assert!(!b.active("other", at(0)));
    }

    #[test]
    fn forget_and_prune_bound_the_map() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
        b.refused("a", at(0));
        b.refused("b", at(0));
        b.forget("a");
        assert_eq!(b.len(), 1);
        b.prune(at(3));
        assert_eq!(b.len(), 1, "b's backoff ended 2 s ago, within max");
        b.prune(at(10));
        assert!(b.is_empty());
    }
}
