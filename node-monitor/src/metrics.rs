//! The agent's Prometheus metrics. One prefix (`node_monitor_`), Prometheus naming (`_total`
//! counters, base units, seconds), and the kubelet's signal names verbatim in the
//! `eviction_signal` label.
//!
//! The agent has its own registry ([`Metrics`], [`agent`]) and serves only its own families;
//! remediate's (`node_monitor_remediation_*`) live in its own crate. What both share (the prefix,
//! the registration that remembers every family, the text encoding) is
//! [`node_monitor_service::metrics`], re-exported here.
//!
//! This is a leaf: anything may record into it; it imports nothing from the rest of the binary.
//! docs/metrics.md lists every family of each product; a test fails when they disagree.
pub mod agent;
pub mod eviction;
pub mod flight;
pub mod kernel;
pub mod kubelet;
mod labels;
pub mod lease;
pub mod pods;
pub mod shutdown;
pub mod wakeup;

pub use self::agent::*;
pub use node_monitor_service::metrics::{
    BuildLabels, Exposition, Family_, PREFIX, ReasonLabels, Reg, encode_registry, set_one_hot,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The family names in an exposition (`# TYPE <name> <type>` lines; counters without their
    /// `_total` sample suffix).
    fn exposed(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    }

    /// The agent's endpoint exposes none of remediate's families, nor lists them.
    #[test]
    fn the_agent_exposes_only_its_own_families() {
        let remediation = format!("{PREFIX}_remediation_");
        let agent = exposed(&Metrics::new().encode());
        assert!(agent.len() >= 10, "{agent:?}");
        for name in &agent {
            assert!(
                !name.starts_with(&remediation),
                "the agent's /metrics exposes {name}"
            );
        }
        assert!(
            Metrics::new()
                .families()
                .iter()
                .all(|f| !f.name.starts_with(&remediation))
        );
    }
}
