//! Prometheus metrics. One prefix (`node_monitor_`), Prometheus naming (`_total` counters, base
//! units, seconds), and the kubelet's signal names verbatim in the `eviction_signal` label.
//!
//! Each product has its own registry and serves only its own families: the agent's and
//! remediate's (`node_monitor_remediation_*`); both carry `node_monitor_build_info`. This module
//! holds what they share: the prefix, the registration that remembers every family, the text
//! encoding. Each product's families live in its own crate and register themselves through
//! [`Reg`]; docs/metrics.md lists every family of each product, and a test fails when they
//! disagree.
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{MetricType, TypedMetric, family::Family, gauge::Gauge, info::Info},
    registry::Registry,
};

pub const PREFIX: &str = "node_monitor";

/// Sets a one-hot state family: the series of `state` is 1, those of the other `states` 0.
/// `labels` makes a state's label set.
pub fn set_one_hot<L>(
    family: &Family<L, Gauge>,
    states: &[&str],
    state: &str,
    labels: impl Fn(&str) -> L,
) where
    L: Clone + std::hash::Hash + Eq,
{
    for s in states {
        family.get_or_create(&labels(s)).set(i64::from(*s == state));
    }
}

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
pub fn encode_registry(registry: &Registry) -> String {
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
pub struct Reg {
    pub registry: Registry,
    pub families: Vec<Family_>,
}

impl Default for Reg {
    fn default() -> Self {
        Self::new()
    }
}

impl Reg {
    /// An empty registry with the [`PREFIX`].
    pub fn new() -> Self {
        Self {
            registry: Registry::with_prefix(PREFIX),
            families: Vec::new(),
        }
    }

    /// `node_monitor_build_info{version}`: every product's endpoint has it.
    pub fn add_build_info(&mut self, help: &str) {
        let info = Info::new(BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_owned(),
        });
        self.add("build", help, info);
    }

    pub fn add<M: prometheus_client::registry::Metric + TypedMetric>(
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
    use prometheus_client::metrics::{counter::Counter, gauge::Gauge};

    use super::*;

    /// Every family registered is remembered with its scraped name and type, and exposed.
    #[test]
    fn registered_families_are_remembered_as_scraped() {
        let mut reg = Reg::new();
        reg.add_build_info("Build information.");
        reg.add("widgets", "Widgets seen.", Counter::<u64>::default());
        reg.add("depth", "Depth.", Gauge::<i64>::default());
        let names: Vec<(&str, &str)> = reg
            .families
            .iter()
            .map(|f| (f.name.as_str(), f.kind))
            .collect();
        assert_eq!(
            names,
            [
                ("node_monitor_build_info", "info"),
                ("node_monitor_widgets_total", "counter"),
                ("node_monitor_depth", "gauge"),
            ]
        );
        let text = encode_registry(&reg.registry);
        for name in [
            "node_monitor_build_info",
            "node_monitor_widgets_total",
            "node_monitor_depth",
        ] {
            assert!(text.contains(name), "{name} missing from {text}");
        }
    }
}
