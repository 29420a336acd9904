//! Prometheus metrics. One prefix (`node_monitor_`), Prometheus naming (`_total` counters, base
//! units, seconds), and the kubelet's signal names verbatim in the `eviction_signal` label.
//!
//! Each product has its own registry and serves only its own families: the agent's
//! ([`Metrics`], [`agent`]) and `node-monitor remediate`'s ([`RemediateMetrics`], [`remediate`],
//! `node_monitor_remediation_*`); both carry `node_monitor_build_info`. This module holds what they
//! share: the prefix, the registration that remembers every family, the text encoding.
//!
//! This is a leaf: anything may record into it; it imports nothing from the rest of the binary.
//! docs/metrics.md lists every family of each product; a test fails when they disagree.
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{MetricType, TypedMetric, info::Info},
    registry::Registry,
};

pub mod agent;
mod labels;
pub mod lease;
pub mod remediate;

pub use self::agent::*;
pub use self::remediate::*;

pub const PREFIX: &str = "node_monitor";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// What a `/metrics` endpoint serves: one product's registry in the text exposition format.
pub trait Exposition: Send + Sync + 'static {
    /// The text exposition format.
    fn encode(&self) -> String;
}

/// A registry in the text exposition format.
pub(super) fn encode_registry(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    // Writing into a String cannot fail.
    let _ = encode(&mut out, registry);
    out
}

/// A registered family: its scraped name and OpenMetrics type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family_ {
    pub name: String,
    pub kind: &'static str,
}

/// Registers and remembers each family, so the list cannot drift from what is exported.
pub(super) struct Reg {
    pub(super) registry: Registry,
    pub(super) families: Vec<Family_>,
}

impl Reg {
    /// An empty registry with the [`PREFIX`].
    pub(super) fn new() -> Self {
        Self {
            registry: Registry::with_prefix(PREFIX),
            families: Vec::new(),
        }
    }

    /// `node_monitor_build_info{version}`: every product's endpoint has it.
    pub(super) fn add_build_info(&mut self, help: &str) {
        let info = Info::new(BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_owned(),
        });
        self.add("build", help, info);
    }

    pub(super) fn add<M: prometheus_client::registry::Metric + TypedMetric>(
        &mut self,
        name: &str,
        help: &str,
        metric: M,
    ) {
        let suffix = match M::TYPE {
            MetricType::Counter => "_total",
            MetricType::Info => "_info",
            _ => "",
        };
        self.families.push(Family_ {
            name: format!("{PREFIX}_{name}{suffix}"),
            kind: M::TYPE.as_str_static(),
        });
        self.registry.register(name, help, metric);
    }
}

trait StaticName {
    fn as_str_static(&self) -> &'static str;
}

impl StaticName for MetricType {
    fn as_str_static(&self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::Info => "info",
            MetricType::Unknown => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The family names in an exposition (`# TYPE <name> <type>` lines; counters without their
    /// `_total` sample suffix). A labelled family shows once it has a series; the unlabelled ones
    /// always do.
    fn exposed(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn each_endpoint_exposes_only_its_own_families() {
        let remediation = format!("{PREFIX}_remediation_");
        let build = format!("{PREFIX}_build");
        let agent = exposed(&Metrics::new().encode());
        assert!(agent.len() >= 10, "{agent:?}");
        for name in &agent {
            assert!(
                !name.starts_with(&remediation),
                "the agent's /metrics exposes {name}"
            );
        }
        let remediate = exposed(&RemediateMetrics::new().encode());
        assert!(remediate.len() >= 5, "{remediate:?}");
        for name in &remediate {
            assert!(
                name.starts_with(&remediation) || *name == build,
                "remediate's /metrics exposes {name}"
            );
        }
        // Nor does the list of every family, labelled ones included (what the docs check reads).
        assert!(
            Metrics::new()
                .families()
                .iter()
                .all(|f| !f.name.starts_with(&remediation))
        );
    }
}
