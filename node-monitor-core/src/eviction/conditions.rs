//! The wording of the node conditions and taints the agent publishes for a decision: one
//! `NodeMonitor*Pressure` condition per pressure the kubelet knows, with node-monitor's reasons
//! and messages, and the optional `node-monitor.io/*-pressure` NoSchedule taints.
use crate::{
    contract::names::{pressure_condition, pressure_taint},
    eviction::{Decision, MetReason},
    signals::threshold::{NodeConditionType, signal_condition},
};

/// One agent-owned pressure condition, as the agent writes it on its Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedCondition {
    /// The condition type (`NodeMonitorMemoryPressure`, …).
    pub type_: &'static str,
    /// True while the pressure holds.
    pub status: bool,
    /// `NodeMonitorHas<Pressure>` or `NodeMonitorNo<Pressure>`.
    pub reason: String,
    /// What was observed: the signal, its available amount and the threshold, when one is met.
    pub message: String,
}

/// Every pressure condition for `decision`, in the order of [`NodeConditionType::ALL`]: the ones
/// the decision reports as true are true, with the first met threshold of their signal in the
/// message; the others are false.
pub fn published_conditions(decision: &Decision) -> Vec<PublishedCondition> {
    NodeConditionType::ALL
        .iter()
        .map(|&c| {
            let status = condition_status(decision, c);
            let met = decision
                .thresholds_met
                .iter()
                .rev()
                .find(|m| signal_condition(m.signal) == c);
            let name = c.as_str();
            PublishedCondition {
                type_: pressure_condition(c),
                status,
                reason: if status {
                    format!("NodeMonitorHas{name}")
                } else {
                    format!("NodeMonitorNo{name}")
                },
                message: match (status, met) {
                    (true, Some(m)) if m.reason == MetReason::Predicted => format!(
                        "{} available {} above threshold {}, but the node is predicted to run \
                         out of memory before an eviction at the threshold could take effect",
                        m.signal, m.available, m.quantity
                    ),
                    (true, Some(m)) => format!(
                        "{} available {} below threshold {}",
                        m.signal, m.available, m.quantity
                    ),
                    (true, None) => format!("node-monitor observes {name}"),
                    (false, _) => format!("node-monitor observes no {name}"),
                },
            }
        })
        .collect()
}

/// Whether the decision reports `condition` as true.
pub fn condition_status(decision: &Decision, condition: NodeConditionType) -> bool {
    decision
        .conditions
        .iter()
        .rev()
        .find(|c| c.condition == condition)
        .is_some_and(|c| c.status)
}

/// The NoSchedule taint of each pressure and whether it should be on for `decision` (only when
/// `nodeMonitor.taintOnPressure` is set and not a dry run).
pub fn pressure_taints(decision: &Decision) -> Vec<(&'static str, bool)> {
    NodeConditionType::ALL
        .iter()
        .map(|&c| (pressure_taint(c), condition_status(decision, c)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::{ConfigSource, EvictionOverrides, load_sources},
        eviction::{EvictionState, synchronize},
        signals::{Observations, Signal, SignalObservation},
        units::clock::Timestamp,
    };

    const GI: i64 = 1 << 30;

    fn decide(available: i64, at_secs: u64, state: &mut EvictionState) -> Decision {
        let config = load_sources(
            &[ConfigSource {
                name: "test",
                text: "evictionHard:\n  memory.available: 1Gi\n",
            }],
            &EvictionOverrides::default(),
        )
        .expect("config");
        let observations = Observations {
            signals: [(
                Signal::MemoryAvailable,
                SignalObservation {
                    available,
                    capacity: 10 * GI,
                },
            )]
            .into_iter()
            .collect(),
            pods: Default::default(),
            ..Default::default()
        };
        synchronize(
            state,
            &config,
            &observations,
            &[],
            Timestamp::from_secs(at_secs),
        )
    }

    #[test]
    fn a_met_threshold_names_the_signal_and_both_amounts() {
        let d = decide(GI / 2, 0, &mut EvictionState::new());
        let published = published_conditions(&d);
        assert_eq!(
            published[0],
            PublishedCondition {
                type_: "NodeMonitorMemoryPressure",
                status: true,
                reason: "NodeMonitorHasMemoryPressure".into(),
                message: format!(
                    "memory.available available {} below threshold {}",
                    GI / 2,
                    GI
                ),
            }
        );
        assert_eq!(
            published[1],
            PublishedCondition {
                type_: "NodeMonitorDiskPressure",
                status: false,
                reason: "NodeMonitorNoDiskPressure".into(),
                message: "node-monitor observes no DiskPressure".into(),
            }
        );
        assert_eq!(published.len(), NodeConditionType::ALL.len());
        assert_eq!(
            pressure_taints(&d),
            [
                ("node-monitor.io/memory-pressure", true),
                ("node-monitor.io/disk-pressure", false),
                ("node-monitor.io/pid-pressure", false),
            ]
        );
    }

    #[test]
    fn a_condition_held_through_its_transition_period_says_so_without_a_threshold() {
        let mut state = EvictionState::new();
        let _ = decide(GI / 2, 0, &mut state);
        // Recovered, but within the 5 min pressure transition period: still true, nothing met.
        let d = decide(5 * GI, 10, &mut state);
        assert!(d.thresholds_met.is_empty());
        let memory = &published_conditions(&d)[0];
        assert!(memory.status);
        assert_eq!(memory.message, "node-monitor observes MemoryPressure");
    }
}
