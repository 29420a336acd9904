//! What an eviction request is and what its answer means: the outcome, the failure kinds and
//! how a 429 is told apart (a disruption budget or throttling).
use super::*;

/// One eviction to carry out, as the plan describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionRequest {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Never 0: a zero grace period through the API is a force delete that skips the kubelet.
    pub grace_period_seconds: u32,
    /// The threshold that drives it is hard (PDB escalation applies only then).
    pub hard: bool,
    /// The kubelet's signal name.
    pub signal: String,
    /// The kubelet-style eviction message.
    pub message: String,
    /// The kubelet's eviction Event annotations (`offending_containers`,
    /// `offending_containers_usage`, `starved_resource`, …): they go on the pod's Event, as the
    /// kubelet's `evictPod` records them (`recorder.AnnotatedEventf`).
    pub annotations: BTreeMap<String, String>,
}

/// What happened to an eviction request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictOutcome {
    /// The API accepted the eviction.
    Evicted,
    /// Dry-run: decided and reported, nothing touched.
    DryRun,
    /// A PDB blocked it (429 with a `DisruptionBudget` cause) and the policy says respect, or the
    /// threshold is soft.
    PdbBlocked,
    /// The API server throttled the request (429 from API Priority and Fairness or the
    /// max-in-flight filter: no `DisruptionBudget` cause). Never escalated; every eviction waits
    /// `retry_after` (the server's `Retry-After`, bounded).
    Throttled { retry_after: Duration },
    /// A PDB blocked it under a hard threshold and the pod was deleted with the planned grace.
    Escalated,
    /// The pod (with this UID) no longer exists.
    Gone,
    /// Any other API answer, or none: the pod backs off and the next candidate is considered.
    Failed {
        code: Option<u16>,
        kind: FailureKind,
        reason: String,
    },
}

/// Why an eviction request failed, for `node_monitor_eviction_failures_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// 403: RBAC, an admission policy or a webhook refused it.
    Forbidden,
    /// 422: the request was invalid for this pod.
    Invalid,
    /// 500 because more than one PodDisruptionBudget selects the pod (the eviction API refuses
    /// such pods for ever; only a delete gets rid of them).
    MultiplePdbs,
    /// Another 5xx answer from the API server (a failing webhook, etcd trouble).
    ServerError,
    /// 502, 503, 504, or no answer at all (connection refused, reset, TLS): the API server is
    /// unavailable rather than refusing this pod.
    Unavailable,
    /// No answer within the API timeout.
    Timeout,
    /// Another 4xx answer.
    ClientError,
}

impl FailureKind {
    /// Every kind, for zero-initialised metric series.
    pub const ALL: [FailureKind; 7] = [
        Self::Forbidden,
        Self::Invalid,
        Self::MultiplePdbs,
        Self::ServerError,
        Self::Unavailable,
        Self::Timeout,
        Self::ClientError,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Forbidden => "forbidden",
            Self::Invalid => "invalid",
            Self::MultiplePdbs => "multiple_pdbs",
            Self::ServerError => "server_error",
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::ClientError => "client_error",
        }
    }

    /// The API server as a whole, not this pod, is the problem: retrying other pods at once would
    /// only fail the same way.
    pub fn api_unavailable(self) -> bool {
        matches!(self, Self::Unavailable | Self::Timeout)
    }

    /// The kind of an answered request, from its HTTP code and Status message.
    pub fn of_status(code: u16, message: &str) -> Self {
        match code {
            403 => Self::Forbidden,
            422 => Self::Invalid,
            500 if message.contains("more than one PodDisruptionBudget") => Self::MultiplePdbs,
            502..=504 => Self::Unavailable,
            500..=599 => Self::ServerError,
            _ => Self::ClientError,
        }
    }

    /// The kind of a failed request: its Status when the API answered, else whether the
    /// transport timed out.
    pub fn of_error(e: &kube::Error) -> (Option<u16>, Self) {
        if let kube::Error::Api(s) = e {
            return (Some(s.code), Self::of_status(s.code, &s.message));
        }
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::TimedOut
            {
                return (None, Self::Timeout);
            }
            if err.is::<tokio::time::error::Elapsed>() {
                return (None, Self::Timeout);
            }
            cur = err.source();
        }
        (None, Self::Unavailable)
    }
}

impl EvictOutcome {
    /// The metric label for this outcome.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::DryRun => "dry_run",
            Self::PdbBlocked => "pdb_blocked",
            Self::Throttled { .. } => "throttled",
            Self::Escalated => "escalated",
            Self::Gone => "gone",
            Self::Failed { .. } => "failed",
        }
    }

    /// The eviction took effect (the pod will terminate).
    pub fn took_effect(&self) -> bool {
        matches!(self, Self::Evicted | Self::Escalated)
    }
}

/// The cause type the eviction API puts on a refusal by a PodDisruptionBudget
/// (`policyv1.DisruptionBudgetCause`, k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go).
pub const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";
/// Bounds on a throttled eviction path's wait: a `Retry-After` outside them is clamped, none means
/// the shortest.
pub const RETRY_AFTER_MIN: Duration = Duration::from_secs(1);
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(30);

/// What an eviction answer other than success means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A PodDisruptionBudget refused it: 429 whose Status carries a `DisruptionBudget` cause.
    DisruptionBudget { message: String },
    /// The server throttled the request: 429 without that cause (API Priority and Fairness,
    /// max-in-flight), with its `Retry-After` bounded to [`RETRY_AFTER_MIN`]..[`RETRY_AFTER_MAX`].
    Throttled { retry_after: Duration },
    /// 404, or 409 (the UID precondition failed): the pod meant is gone.
    Gone,
    /// Anything else.
    Failed {
        code: u16,
        kind: FailureKind,
        message: String,
    },
}

/// Classifies a non-2xx answer to an eviction: the HTTP code, the `Retry-After` header and the
/// body (a `Status` from the registry; plain text from the APF and max-in-flight filters). Only a
/// 429 whose Status names a `DisruptionBudget` cause is a PDB: a throttled request is never
/// mistaken for one, so it is never escalated to a delete.
pub fn classify_refusal(code: u16, retry_after: Option<&str>, body: &[u8]) -> Refusal {
    let status: Option<kube::core::Status> = serde_json::from_slice(body).ok();
    let message = status.as_ref().map_or_else(
        || String::from_utf8_lossy(body).trim().to_owned(),
        |s| s.message.clone(),
    );
    match code {
        429 => {
            let pdb = status.as_ref().is_some_and(|s| {
                s.details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.reason == DISRUPTION_BUDGET_CAUSE))
            });
            if pdb {
                return Refusal::DisruptionBudget { message };
            }
            let header = retry_after.and_then(|v| v.trim().parse::<u64>().ok());
            let details = status
                .as_ref()
                .and_then(|s| s.details.as_ref())
                .map(|d| u64::from(d.retry_after_seconds))
                .filter(|s| *s > 0);
            let secs = header
                .or(details)
                .map_or(RETRY_AFTER_MIN, Duration::from_secs);
            Refusal::Throttled {
                retry_after: secs.clamp(RETRY_AFTER_MIN, RETRY_AFTER_MAX),
            }
        }
        404 | 409 => Refusal::Gone,
        _ => Refusal::Failed {
            code,
            kind: FailureKind::of_status(code, &message),
            message,
        },
    }
}
