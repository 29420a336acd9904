//! Leader election on a coordination.k8s.io Lease, following client-go's `leaderelection`
//! (`tryAcquireOrRenew`): the holder renews every retry period; another candidate takes over only
//! when it has seen the record unchanged for a whole lease duration on its own clock (never by
//! comparing the holder's timestamps with its clock); every write carries the resourceVersion, so
//! two candidates can never both win. A holder that cannot renew within the renew deadline stops
//! acting. On a clean stop the holder releases the Lease so a successor need not wait.
//!
//! Renewal runs in a task of its own ([`spawn`]), never between the controller's passes: a pass
//! that takes long (a release deleting many pods) cannot make the lease lapse, and when
//! leadership is lost the pass in flight is abandoned at once ([`run_while_leading`]). A
//! candidate waits for the lease duration the record states (`leaseDurationSeconds`, written by
//! the holder), not its own.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{PostParams, Resource as _},
};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{error, info, warn};

use super::ApiHealth;

use node_monitor_core::remediation::LeaderSettings;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What a candidate does with the current record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or the holder stopped renewing: take it.
    Acquire,
    /// We hold it: renew.
    Renew,
    /// Someone else holds it and renews.
    Follow { holder: String },
}

/// client-go's rule: an empty holder or one whose record has not changed for `lease_duration`
/// (as observed by us, `unchanged_for`) may be replaced; our own record is renewed.
pub fn decide(
    holder: Option<&str>,
    me: &str,
    unchanged_for: Duration,
    lease_duration: Duration,
) -> Decision {
    match holder {
        None | Some("") => Decision::Acquire,
        Some(h) if h == me => Decision::Renew,
        Some(_) if unchanged_for >= lease_duration => Decision::Acquire,
        Some(h) => Decision::Follow {
            holder: h.to_owned(),
        },
    }
}

/// How long a holder's record must stay unchanged before another candidate may take over: the
/// `leaseDurationSeconds` the record states (the holder's promise), else our own setting.
pub fn takeover_after(record_seconds: Option<i32>, own: Duration) -> Duration {
    match record_seconds {
        Some(s) if s > 0 => Duration::from_secs(u64::from(s.unsigned_abs())),
        _ => own,
    }
}

/// `leaseTransitions` after a write: one more when the holder changes, saturating (the counter
/// is an `int32` any client may have written; a negative one restarts at 0).
pub fn next_transitions(recorded: Option<i32>, holder_changed: bool) -> i32 {
    recorded
        .unwrap_or(0)
        .max(0)
        .saturating_add(i32::from(holder_changed))
}

/// Errors of one election round.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("{action} Lease {namespace}/{name}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{action} Lease {namespace}/{name}: no answer within {REQUEST_TIMEOUT:?}")]
    Timeout {
        action: &'static str,
        namespace: String,
        name: String,
    },
}

/// The record as last observed, and when it last changed on our clock.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    holder: Option<String>,
    renew: Option<Timestamp>,
    transitions: Option<i32>,
}

/// One candidate.
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    identity: String,
    settings: LeaderSettings,
    observed: Option<(Observed, Instant)>,
    leading: bool,
    last_renewed: Option<Instant>,
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, identity: &str, settings: LeaderSettings) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            settings,
            observed: None,
            leading: false,
            last_renewed: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn is_leading(&self) -> bool {
        self.leading
    }

    async fn bounded<T>(
        &self,
        action: &'static str,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, kube::Error>, LeaderError> {
        tokio::time::timeout(REQUEST_TIMEOUT, fut)
            .await
            .map_err(|_| LeaderError::Timeout {
                action,
                namespace: self.namespace.clone(),
                name: self.settings.lease_name.clone(),
            })
    }

    fn api_err(&self, action: &'static str, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            action,
            namespace: self.namespace.clone(),
            name: self.settings.lease_name.clone(),
            source: Box::new(source),
        }
    }

    /// One round: returns whether we lead after it. An error leaves leadership as it was until
    /// the renew deadline passes (see [`LeaderElector::renew_deadline_passed`]).
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaderError> {
        let name = self.settings.lease_name.clone();
        let now = Instant::now();
        let current = match self.bounded("get", self.api.get_opt(&name)).await? {
            Ok(l) => l,
            Err(e) => return Err(self.api_err("get", e)),
        };
        let Some(lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(None, true)),
            };
            return match self
                .bounded("create", self.api.create(&PostParams::default(), &lease))
                .await?
            {
                Ok(_) => Ok(self.won(now, true)),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(self.lost()),
                Err(e) => Err(self.api_err("create", e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let seen = Observed {
            holder: spec.holder_identity.clone(),
            renew: spec.renew_time.as_ref().map(|t| t.0),
            transitions: spec.lease_transitions,
        };
        match &self.observed {
            Some((o, _)) if *o == seen => {}
            _ => self.observed = Some((seen, now)),
        }
        let unchanged_for = self
            .observed
            .as_ref()
            .map_or(Duration::ZERO, |(_, at)| now.saturating_duration_since(*at));
        let decision = decide(
            spec.holder_identity.as_deref(),
            &self.identity,
            unchanged_for,
            takeover_after(spec.lease_duration_seconds, self.settings.lease_duration),
        );
        let acquiring = match decision {
            Decision::Follow { holder } => {
                if self.leading {
                    warn!(%holder, "another replica holds the leader lease");
                }
                return Ok(self.lost());
            }
            Decision::Acquire => true,
            Decision::Renew => false,
        };
        let mut updated = lease.clone();
        updated.spec = Some(self.spec(Some(&spec), acquiring));
        // The resourceVersion read above is the precondition: a concurrent winner makes this 409.
        updated.metadata.resource_version = lease.meta().resource_version.clone();
        match self
            .bounded(
                "update",
                self.api.replace(&name, &PostParams::default(), &updated),
            )
            .await?
        {
            Ok(_) => Ok(self.won(now, acquiring)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(self.lost()),
            Err(e) => Err(self.api_err("update", e)),
        }
    }

    fn spec(&self, old: Option<&LeaseSpec>, acquiring: bool) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let transitions = old.and_then(|o| o.lease_transitions);
        let holder_changed = old
            .and_then(|o| o.holder_identity.as_deref())
            .is_some_and(|h| !h.is_empty() && h != self.identity);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.settings.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: if acquiring {
                Some(now.clone())
            } else {
                old.and_then(|o| o.acquire_time.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(next_transitions(transitions, holder_changed)),
            ..LeaseSpec::default()
        }
    }

    fn won(&mut self, now: Instant, acquired: bool) -> bool {
        if !self.leading || acquired {
            info!(identity = %self.identity, lease = %self.settings.lease_name, "leading");
        }
        self.leading = true;
        self.last_renewed = Some(now);
        true
    }

    fn lost(&mut self) -> bool {
        self.leading = false;
        false
    }

    /// While leading: the last successful renewal is older than the renew deadline. The caller
    /// must stop acting (client-go's `OnStoppedLeading`).
    pub fn renew_deadline_passed(&self) -> bool {
        self.leading
            && self
                .last_renewed
                .is_none_or(|t| t.elapsed() > self.settings.renew_deadline)
    }

    /// Stops leading without touching the Lease (after the renew deadline passed).
    pub fn step_down(&mut self) {
        self.leading = false;
    }

    /// Gives the Lease up on a clean stop (client-go's `ReleaseOnCancel`): the holder is cleared
    /// so a successor takes over at once.
    pub async fn release(&mut self) {
        if !self.leading {
            return;
        }
        self.leading = false;
        let name = self.settings.lease_name.clone();
        let Ok(Ok(Some(mut lease))) = self.bounded("get", self.api.get_opt(&name)).await else {
            return;
        };
        let mine = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(self.identity.as_str());
        if !mine {
            return;
        }
        let now = MicroTime(Timestamp::now());
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(now.clone());
            spec.acquire_time = Some(now);
        }
        match self
            .bounded(
                "release",
                self.api.replace(&name, &PostParams::default(), &lease),
            )
            .await
        {
            Ok(Ok(_)) => info!(lease = %name, "leader lease released"),
            Ok(Err(e)) => warn!(error = %e, lease = %name, "could not release the leader lease"),
            Err(e) => warn!(error = %e, "could not release the leader lease"),
        }
    }
}

/// The renewal task: [`spawn`] returns it.
pub struct Renewal {
    /// Whether this replica leads, as of the last round (false once the renew deadline passed).
    pub leading: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Renewal {
    /// Stops renewing and releases the Lease if held.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Runs election rounds every `retryPeriod` in a task of its own. While leading, a round is cut
/// off when the renew deadline passes, and leadership is given up then: the controller stops
/// acting within the renew deadline of the last renewal, whatever the API server does.
pub fn spawn(mut elector: LeaderElector, api_health: Arc<ApiHealth>) -> Renewal {
    let (tx, leading) = watch::channel(false);
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        loop {
            let deadline = elector
                .last_renewed
                .filter(|_| elector.leading)
                .map(|t| t + elector.settings.renew_deadline);
            let round = elector.try_acquire_or_renew();
            let outcome = match deadline {
                Some(d) => tokio::time::timeout_at(d.into(), round).await.ok(),
                None => Some(round.await),
            };
            match outcome {
                Some(Ok(_)) => api_health.ok(),
                Some(Err(e)) => {
                    warn!(error = %node_monitor_service::telemetry::error_chain(&e), "leader election round failed");
                }
                None => warn!("leader election round cut off at the renew deadline"),
            }
            if elector.renew_deadline_passed() {
                error!("could not renew the leader lease within the renew deadline; standing down");
                elector.step_down();
            }
            tx.send_if_modified(|l| {
                let changed = *l != elector.leading;
                *l = elector.leading;
                changed
            });
            let wait = elector.settings.retry_period;
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stopped.changed() => break,
            }
        }
        tx.send_replace(false);
        elector.release().await;
    });
    Renewal {
        leading,
        stop,
        task,
    }
}

/// Runs `work` while `leading` says so: `None` when leadership was lost (or already was) before
/// it finished — the work is dropped at its next await point and must not be resumed.
pub async fn run_while_leading<F: Future>(
    work: F,
    leading: &mut watch::Receiver<bool>,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        _ = leading.wait_for(|l| !*l) => None,
        out = work => Some(out),
    }
}

#[cfg(test)]
mod tests;
