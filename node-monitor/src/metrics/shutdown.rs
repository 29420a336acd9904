//! The graceful shutdown manager's and the reboot probe's metrics (`shutdown`, the reboot path
//! of `ebpf`): a group of the agent's registry that registers itself.
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use super::{PhaseLabels, ReasonLabels, Reg};

/// The shutdown group's families, `node_monitor_shutdown_*`, `node_monitor_reboot_requests_*`
/// and `node_monitor_last_gasp_realtime`.
#[derive(Debug, Default)]
pub struct ShutdownMetrics {
    /// `node_monitor_shutdown_inhibitor_held`.
    pub inhibitor_held: Gauge,
    /// `node_monitor_shutdown_phase_start_time_seconds`.
    pub phase_start_time_seconds: Family<PhaseLabels, Gauge<f64, AtomicU64>>,
    /// `node_monitor_shutdown_phase_end_time_seconds`.
    pub phase_end_time_seconds: Family<PhaseLabels, Gauge<f64, AtomicU64>>,
    /// `node_monitor_shutdowns_bypassing_inhibitor`.
    pub bypassing_inhibitor: Counter,
    /// `node_monitor_shutdown_last_gasps_suppressed`.
    pub last_gasps_suppressed: Counter,
    /// `node_monitor_last_gasp_realtime`.
    pub last_gasp_realtime: Gauge,
    /// `node_monitor_reboot_requests_refused`.
    pub reboot_requests_refused: Family<ReasonLabels, Counter>,
    /// `node_monitor_reboot_requests_unverified`.
    pub reboot_requests_unverified: Counter,
    /// `node_monitor_shutdown_budget_seconds`.
    pub budget_seconds: Gauge<f64, AtomicU64>,
    /// `node_monitor_shutdown_inhibit_delay_max_seconds`.
    pub inhibit_delay_max_seconds: Gauge<f64, AtomicU64>,
}

impl ShutdownMetrics {
    /// Adds every family of the group to the agent's registry.
    pub fn register(&self, reg: &mut Reg) {
        reg.add(
            "shutdown_inhibitor_held",
            "1 while the systemd-logind delay inhibitor is held",
            self.inhibitor_held.clone(),
        );
        reg.add(
            "shutdown_phase_start_time_seconds",
            "Unix time at which a graceful shutdown phase started",
            self.phase_start_time_seconds.clone(),
        );
        reg.add(
            "shutdown_phase_end_time_seconds",
            "Unix time at which a graceful shutdown phase ended",
            self.phase_end_time_seconds.clone(),
        );
        reg.add(
            "shutdowns_bypassing_inhibitor",
            "Reboots or power-offs seen by the kernel probe without a preceding PrepareForShutdown",
            self.bypassing_inhibitor.clone(),
        );
        reg.add(
            "shutdown_last_gasps_suppressed",
            "Last gasps not sent because one went out less than 10 minutes earlier",
            self.last_gasps_suppressed.clone(),
        );
        reg.add(
            "last_gasp_realtime",
            "1 when the last gasp's thread runs at SCHED_FIFO priority (CAP_SYS_NICE granted); 0 when refused or no last gasp is configured",
            self.last_gasp_realtime.clone(),
        );
        reg.add(
            "reboot_requests_refused",
            "reboot(2) calls the kernel refuses or confines to a child PID namespace, by reason; never a shutdown",
            self.reboot_requests_refused.clone(),
        );
        reg.add(
            "reboot_requests_unverified",
            "reboot(2) calls whose caller the probe could not check; never taken for a shutdown",
            self.reboot_requests_unverified.clone(),
        );
        reg.add(
            "shutdown_budget_seconds",
            "Sum of the graceful shutdown groups' periods",
            self.budget_seconds.clone(),
        );
        reg.add(
            "shutdown_inhibit_delay_max_seconds",
            "systemd-logind's InhibitDelayMaxSec as last read",
            self.inhibit_delay_max_seconds.clone(),
        );
    }
}
