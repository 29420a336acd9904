//! The loop's flight-recorder hook: after a pass's eviction requests, one sample of what it
//! observed and decided (the pod figures it already holds; PSI from one file) goes to the
//! recorder in the live view, and its gauges are updated. The pass an OOM kill wakes reads the
//! pods ([`read_pods_for`]), so a record shows the pods' working sets around a kill even on a
//! calm node, where no other pass reads them; the killed pod is kept in the samples whatever its
//! rank.
use node_monitor_core::signals::threshold::Threshold;

use super::report::CycleReport;
use crate::{live::LiveView, metrics::Metrics};

/// Records the pass of `report` in the flight recorder of `live`, and its gauges.
pub(super) fn record(
    live: &LiveView,
    metrics: &Metrics,
    thresholds: &[Threshold],
    report: &CycleReport,
) {
    let psi = live.psi_path().and_then(|p| crate::flight::read_psi(&p));
    let figures = report.figures_by_age();
    let at_ms = crate::live::unix_ms();
    let sample = crate::flight::sample_of(
        at_ms,
        thresholds,
        &report.observations,
        &report.decision,
        &report.pods,
        figures,
        psi,
    );
    // Read in this pass: every pod's figure is offered, for the pod of an OOM kill recorded
    // before or after this sample.
    let read_now = figures
        .filter(|(age, _)| *age == 0)
        .map(|(_, f)| crate::flight::named_figures(&report.pods, f));
    let (records, bytes) = live.flight_sample_with_pods(sample, read_now);
    metrics
        .flight
        .records
        .set(i64::try_from(records).unwrap_or(i64::MAX));
    metrics
        .flight
        .recorder_bytes
        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
}

/// The PSI file the recorder reads: the one the PSI wake-up source watches on this host.
pub(super) fn psi_path(layout: &crate::sampler::Layout) -> Option<std::path::PathBuf> {
    match crate::wakeup::WakeupConfig::for_layout(layout).psi {
        crate::wakeup::SourceSetting::Path(p) => Some(p),
        _ => None,
    }
}

/// Keeps the frozen flight records in `nodeMonitor.stateDir` across restarts: those of an earlier
/// run are restored into `live`, and each record is written there when it freezes and when its
/// tail ends. An empty `stateDir`, a directory that cannot be created or a thread that cannot
/// start leave the records in memory only (logged; never fatal).
pub(super) fn persist_flight(live: &LiveView, state_dir: &str, metrics: &Metrics) {
    use crate::flight::store;
    let store = match store::open(state_dir) {
        None => {
            tracing::info!("nodeMonitor.stateDir is empty: flight records are kept in memory only");
            return;
        }
        Some(Err((dir, e))) => {
            tracing::warn!(dir = %dir.display(), error = %e,
                           "no state directory: flight records are kept in memory only");
            metrics
                .flight
                .store_errors
                .get_or_create(&crate::metrics::ReasonLabels {
                    reason: "write".to_owned(),
                })
                .inc();
            return;
        }
        Some(Ok(s)) => s,
    };
    let restored = store.restore(&metrics.flight.store_errors);
    match store::FlightWriter::spawn(store, metrics.flight.store_errors.clone()) {
        Ok(writer) => live.persist_flight(restored, writer),
        Err(e) => {
            tracing::warn!(error = %e, "flight records are kept in memory only");
        }
    }
}

/// How long a stop waits for the flight records to reach the disk.
const FLIGHT_FLUSH_BOUND: std::time::Duration = std::time::Duration::from_secs(3);

/// At a stop, beside the other stop work: the flight records, an open tail included, written
/// to the state directory within [`FLIGHT_FLUSH_BOUND`].
pub(super) fn flush_on_stop(live: std::sync::Arc<LiveView>) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        if live.flush_flight(FLIGHT_FLUSH_BOUND) == Some(false) {
            tracing::warn!(bound = ?FLIGHT_FLUSH_BOUND,
                           "the flight records were not written in time at the stop");
        }
    })
}
