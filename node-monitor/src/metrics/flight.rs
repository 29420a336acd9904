//! The OOM flight recorder's metrics (`flight`): a group of the agent's registry that registers
//! itself.
use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use super::{ReasonLabels, Reg};

/// The flight recorder's families, `node_monitor_flight_*`.
#[derive(Debug, Default)]
pub struct FlightMetrics {
    /// `node_monitor_flight_records`.
    pub records: Gauge,
    /// `node_monitor_flight_recorder_bytes`.
    pub recorder_bytes: Gauge,
    /// `node_monitor_flight_store_errors`.
    pub store_errors: Family<ReasonLabels, Counter>,
}

impl FlightMetrics {
    /// Adds every family of the group to the agent's registry.
    pub fn register(&self, reg: &mut Reg) {
        reg.add(
            "flight_records",
            "OOM flight records kept (one per OOM kill or eviction, with the trajectory of the seconds before it; at most 16)",
            self.records.clone(),
        );
        reg.add(
            "flight_recorder_bytes",
            "Approximate heap the OOM flight recorder holds: its window of samples and events and its records",
            self.recorder_bytes.clone(),
        );
        reg.add(
            "flight_store_errors",
            "Flight record file problems by reason: corrupt, oversized or unreadable at start (the file set aside, no record restored), write (records stay in memory)",
            self.store_errors.clone(),
        );
    }
}
