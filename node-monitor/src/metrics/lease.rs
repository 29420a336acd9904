//! The liveness Lease renewer's metrics (`cluster::liveness_lease`).
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};

use super::Reg;

/// The label of `node_monitor_liveness_lease_renewals_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RenewalLabels {
    /// The renewal's outcome (`renewed`, `created`, `conflict`, …), or `error`.
    pub result: String,
}

/// The renewer's metrics (detached from any registry unless given the agent's).
#[derive(Clone, Debug, Default)]
pub struct RenewalMetrics {
    /// `node_monitor_liveness_lease_renewals_total`.
    pub renewals: Family<RenewalLabels, Counter>,
    /// `node_monitor_liveness_lease_last_renewal_timestamp_seconds`.
    pub last_renewal: Gauge<f64, AtomicU64>,
}

impl RenewalMetrics {
    /// Adds both families to the agent's registry.
    pub fn register(&self, reg: &mut Reg) {
        reg.add(
            "liveness_lease_renewals",
            "Renewals of the agent's liveness Lease by result: renewed (patched), created, conflict (created meanwhile by another writer: nothing written), error",
            self.renewals.clone(),
        );
        reg.add(
            "liveness_lease_last_renewal_timestamp_seconds",
            "Unix time of the last renewal that wrote the agent's liveness Lease (renewed or created); 0 until one does",
            self.last_renewal.clone(),
        );
    }

    /// Counts one renewal with its `result`; one that wrote the Lease moves the last renewal's
    /// time to `unix_secs`.
    pub fn record(&self, result: &str, wrote: bool, unix_secs: f64) {
        self.renewals
            .get_or_create(&RenewalLabels {
                result: result.to_owned(),
            })
            .inc();
        if wrote {
            self.last_renewal.set(unix_secs);
        }
    }
}
