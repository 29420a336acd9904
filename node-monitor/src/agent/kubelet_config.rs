//! Coexisting with the kubelet: its own eviction thresholds, read from its command line,
//! configuration file and drop-ins (`nodeMonitor.kubeletConfigPath`, `auto` by default:
//! [`super::kubelet_source`]), set against node-monitor's by
//! [`node_monitor_core::config::kubelet_thresholds`].
//!
//! They are read on the decision loop's first cycle and again on the first cycle after each
//! [`REREAD_INTERVAL`] (a few kilobytes, once a minute); the comparison runs on every cycle with
//! that cycle's capacities, and what it finds is logged once per change and exported as
//! `node_monitor_kubelet_config_read`, `node_monitor_kubelet_config_source` and
//! `node_monitor_kubelet_threshold_preempts`. A configuration not found, unreadable or
//! malformed is logged once (naming the file and, when malformed, the field and value) and
//! counted; it never stops the agent.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::time::Instant;
use tracing::{info, warn};

use node_monitor_core::{
    config::kubelet_thresholds::{Comparison, Kind, Precedence, compare, parse_kubelet_layers},
    config::{ConfigSource, KUBELET_CONFIG_AUTO},
    signals::threshold::Threshold,
    signals::{Signal, SignalObservation},
};

use super::kubelet_source::{self, Origin};
use crate::metrics::{KubeletSourceLabels, Metrics, ThresholdLabels};

/// How often the kubelet's configuration file is read again.
pub(super) const REREAD_INTERVAL: Duration = Duration::from_secs(60);

/// What the last read of the kubelet's configuration found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    /// Read from these sources.
    Read(Vec<Origin>),
    /// Nothing found: what was looked for.
    NotFound(Vec<String>),
    Unreadable(String),
    Malformed(String),
}

/// The kubelet's thresholds as last read, and what was last reported about them.
#[derive(Debug)]
pub(super) struct KubeletThresholds {
    /// `None`: find it (`auto`); else the one file to read.
    path: Option<String>,
    proc_root: PathBuf,
    /// The kubelet's PID at the last look, looked at first the next time.
    kubelet_pid: Option<u32>,
    read_at: Option<Instant>,
    kubelet: Option<Vec<Threshold>>,
    status: Option<Status>,
    verdicts: Option<BTreeMap<(Signal, Kind), Precedence>>,
}

impl KubeletThresholds {
    /// Reads the file at `path`, or with `auto` finds the kubelet's configuration through the
    /// host's procfs at `proc_root`; `None` when the setting is off (empty).
    pub(super) fn new(path: &str, proc_root: &Path) -> Option<Self> {
        (!path.is_empty()).then(|| Self {
            path: (path != KUBELET_CONFIG_AUTO).then(|| path.to_owned()),
            proc_root: proc_root.to_path_buf(),
            kubelet_pid: None,
            read_at: None,
            kubelet: None,
            status: None,
            verdicts: None,
        })
    }

    /// The last look, for the guarantees the agent publishes.
    pub(super) fn fact(&self) -> node_monitor_core::guarantees::KubeletConfig {
        use node_monitor_core::guarantees::KubeletConfig as K;
        match &self.status {
            None => K::Pending,
            Some(Status::Read(origins)) => K::Read(
                origins
                    .iter()
                    .map(Origin::name)
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            Some(Status::NotFound(searched)) => K::Missing(format!(
                "not found (no kubelet command line in the host's /proc; looked at {})",
                searched.join(", ")
            )),
            Some(Status::Unreadable(e)) => K::Missing(format!("unreadable: {e}")),
            Some(Status::Malformed(e)) => K::Missing(format!("malformed: {e}")),
        }
    }

    /// Reads the file when due, compares its thresholds with `ours` at the capacities of
    /// `observed`, and reports what changed.
    pub(super) fn check(
        &mut self,
        now: Instant,
        ours: &[Threshold],
        observed: &BTreeMap<Signal, SignalObservation>,
        metrics: &Metrics,
    ) {
        if self
            .read_at
            .is_none_or(|at| now.saturating_duration_since(at) >= REREAD_INTERVAL)
        {
            self.read_at = Some(now);
            self.read(metrics);
        }
        let comparisons = self
            .kubelet
            .as_ref()
            .map(|k| compare(k, ours, observed))
            .unwrap_or_default();
        let verdicts: BTreeMap<(Signal, Kind), Precedence> = comparisons
            .iter()
            .map(|c| ((c.signal, c.kind), c.precedence))
            .collect();
        if self.verdicts.as_ref() == Some(&verdicts) {
            return;
        }
        let before = self.verdicts.take().unwrap_or_default();
        metrics.kubelet.threshold_preempts.clear();
        for c in &comparisons {
            metrics
                .kubelet
                .threshold_preempts
                .get_or_create(&ThresholdLabels {
                    eviction_signal: c.signal.as_str().to_owned(),
                    kind: c.kind.as_str().to_owned(),
                })
                .set(i64::from(c.precedence == Precedence::KubeletFirst));
            if before.get(&(c.signal, c.kind)) != Some(&c.precedence) {
                report(c);
            }
        }
        self.verdicts = Some(verdicts);
    }

    /// Finds, reads and parses the kubelet's configuration; logs a change of outcome once.
    fn read(&mut self, metrics: &Metrics) {
        let (status, kubelet, warnings) =
            match kubelet_source::find(&self.proc_root, self.path.as_deref(), self.kubelet_pid) {
                Err(e) => (
                    Status::Unreadable(format!("{}: {}", e.path, e.error)),
                    None,
                    vec![],
                ),
                Ok(found) if !found.anything() => (Status::NotFound(found.searched), None, vec![]),
                Ok(found) => {
                    self.kubelet_pid = found.kubelet_pid();
                    let file = found
                        .file
                        .as_ref()
                        .map(|(name, text)| ConfigSource { name, text });
                    let drop_ins: Vec<ConfigSource<'_>> = found
                        .drop_ins
                        .iter()
                        .map(|(name, text)| ConfigSource { name, text })
                        .collect();
                    match parse_kubelet_layers(file, &drop_ins, &found.flags) {
                        Ok(k) => (Status::Read(found.origins), Some(k.thresholds), k.warnings),
                        Err(e) => (
                            Status::Malformed(crate::telemetry::error_chain(&e)),
                            None,
                            vec![],
                        ),
                    }
                }
            };
        metrics
            .kubelet
            .config_read
            .set(i64::from(matches!(status, Status::Read(_))));
        if self.status.as_ref() != Some(&status) {
            metrics.kubelet.config_source.clear();
            if let Status::Read(origins) = &status {
                for o in origins {
                    metrics
                        .kubelet
                        .config_source
                        .get_or_create(&KubeletSourceLabels {
                            kind: o.kind().to_owned(),
                            source: o.name(),
                        })
                        .set(1);
                }
            }
            log_status(&status, kubelet.as_ref().map_or(0, Vec::len));
            for w in &warnings {
                info!(warning = %w, "kubelet configuration");
            }
        }
        self.status = Some(status);
        self.kubelet = kubelet;
    }
}

/// What a new outcome of the read says, once.
fn log_status(status: &Status, thresholds: usize) {
    match status {
        Status::Read(origins) => info!(
            sources = %origins.iter().map(Origin::name).collect::<Vec<_>>().join(", "),
            thresholds,
            "read the kubelet's eviction thresholds"
        ),
        Status::NotFound(searched) => warn!(
            searched = %searched.join(", "),
            "the kubelet's configuration was not found (no kubelet command line in the host's \
             /proc, no file in the places looked at): cannot tell which signals the kubelet acts \
             on first; set nodeMonitor.kubeletConfigPath and mount the file \
             (node_monitor_kubelet_config_read is 0)"
        ),
        Status::Unreadable(e) => warn!(
            error = %e,
            "cannot read the kubelet's configuration (nodeMonitor.kubeletConfigPath)"
        ),
        Status::Malformed(e) => warn!(
            error = %e,
            "the kubelet's configuration has a malformed eviction setting; its thresholds are \
             not compared"
        ),
    }
}

/// A verdict that changed, logged once.
fn report(c: &Comparison) {
    let kubelet = c.kubelet.as_deref().unwrap_or_default();
    match c.precedence {
        Precedence::KubeletFirst => warn!(
            signal = %c.signal, kind = c.kind.as_str(), kubelet, node_monitor = %c.node_monitor,
            "the kubelet acts first: its own eviction threshold is at or above node-monitor's, \
             so node-monitor adds nothing for this signal; raise node-monitor's threshold above \
             the kubelet's"
        ),
        Precedence::NodeMonitorFirst => info!(
            signal = %c.signal, kind = c.kind.as_str(), kubelet, node_monitor = %c.node_monitor,
            "node-monitor acts before the kubelet for this signal"
        ),
        Precedence::KubeletUnset => info!(
            signal = %c.signal, kind = c.kind.as_str(), node_monitor = %c.node_monitor,
            "the kubelet has no eviction threshold for this signal"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use node_monitor_core::config;

    fn gauge(m: &Metrics, signal: &str, kind: &str) -> Option<i64> {
        let text = m.encode();
        let needle = format!(
            "node_monitor_kubelet_threshold_preempts{{eviction_signal=\"{signal}\",kind=\"{kind}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|v| v.trim().parse().ok())
    }

    fn read_gauge(m: &Metrics) -> i64 {
        m.kubelet.config_read.get()
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRUSR).expect("mkfifo");
        let m = Metrics::new();
        let mut k =
            KubeletThresholds::new(&path.display().to_string(), Path::new("/proc")).expect("on");
        k.check(Instant::now(), &[], &BTreeMap::new(), &m);
        assert_eq!(read_gauge(&m), 0);
        assert!(
            matches!(&k.status, Some(Status::Unreadable(e)) if e.contains("not a regular file")),
            "{:?}",
            k.status
        );
    }

    #[test]
    fn off_when_empty() {
        assert!(KubeletThresholds::new("", Path::new("/proc")).is_none());
    }

    #[test]
    fn reads_compares_and_rereads_after_the_interval() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        let ours = config::load(
            Some("evictionHard:\n  memory.available: 300Mi\n"),
            &config::EvictionOverrides::default(),
        )
        .expect("config")
        .thresholds;
        let observed = BTreeMap::new();
        let m = Metrics::new();
        let mut k =
            KubeletThresholds::new(&path.display().to_string(), Path::new("/proc")).expect("on");
        let t0 = Instant::now();

        k.check(t0, &ours, &observed, &m);
        assert_eq!(read_gauge(&m), 0, "missing file");
        assert_eq!(gauge(&m, "memory.available", "hard"), None);

        std::fs::write(&path, "evictionHard:\n  memory.available: 500Mi\n").expect("write");
        k.check(t0 + Duration::from_secs(1), &ours, &observed, &m);
        assert_eq!(read_gauge(&m), 0, "not read again before the interval");

        k.check(t0 + REREAD_INTERVAL, &ours, &observed, &m);
        assert_eq!(read_gauge(&m), 1);
        assert_eq!(gauge(&m, "memory.available", "hard"), Some(1));

        std::fs::write(&path, "evictionHard:\n  memory.available: 100Mi\n").expect("write");
        k.check(t0 + 2 * REREAD_INTERVAL, &ours, &observed, &m);
        assert_eq!(gauge(&m, "memory.available", "hard"), Some(0));

        std::fs::write(&path, "evictionHard:\n  memory.available: lots\n").expect("write");
        k.check(t0 + 3 * REREAD_INTERVAL, &ours, &observed, &m);
        assert_eq!(read_gauge(&m), 0, "malformed");
        assert_eq!(gauge(&m, "memory.available", "hard"), None);
        assert!(matches!(&k.status, Some(Status::Malformed(e))
            if e.contains("config.yaml") && e.contains("evictionHard") && e.contains("lots")));
    }
}
