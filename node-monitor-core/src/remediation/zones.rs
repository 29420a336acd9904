//! Zones and storm protection: each zone's state and fencing rate (the node lifecycle
//! controller's rules) and the cluster-wide reasons to fence nothing at all.
use std::{collections::BTreeMap, time::Duration};

use super::StormConfig;
use crate::contract::names::OPT_OUT_ANNOTATION;

/// Where a node is, by its topology labels: the node lifecycle controller's zone key
/// (`GetZoneKey`, k8s.io/component-helpers/node/topology: the beta labels first, then the GA
/// ones; both empty is the zone `""`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ZoneKey {
    /// `topology.kubernetes.io/region` (or its beta label).
    pub region: String,
    /// `topology.kubernetes.io/zone` (or its beta label).
    pub zone: String,
}

impl ZoneKey {
    /// The zone key of a node with these labels.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> ZoneKey {
        let get = |beta: &str, ga: &str| {
            labels
                .get(beta)
                .or_else(|| labels.get(ga))
                .cloned()
                .unwrap_or_default()
        };
        ZoneKey {
            region: get(
                "failure-domain.beta.kubernetes.io/region",
                "topology.kubernetes.io/region",
            ),
            zone: get(
                "failure-domain.beta.kubernetes.io/zone",
                "topology.kubernetes.io/zone",
            ),
        }
    }

    /// For metric labels and messages: `region:zone`, or `zone` alone, or `""`.
    pub fn label(&self) -> String {
        match (self.region.is_empty(), self.zone.is_empty()) {
            (true, true) => String::new(),
            (true, false) => self.zone.clone(),
            _ => format!("{}:{}", self.region, self.zone),
        }
    }
}

/// A zone's state (the node lifecycle controller's `ZoneState`, without its transient `Initial`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ZoneState {
    /// Fewer unhealthy nodes than the thresholds: the normal fencing rate.
    Normal,
    /// More than two nodes and at least `unhealthyZoneThreshold` of the zone unhealthy.
    PartialDisruption,
    /// No healthy node left in the zone.
    FullDisruption,
}

impl ZoneState {
    /// Every state, for the one-hot `node_monitor_remediation_zone_state`.
    pub const ALL: [ZoneState; 3] = [
        ZoneState::Normal,
        ZoneState::PartialDisruption,
        ZoneState::FullDisruption,
    ];

    /// The `state` label of `node_monitor_remediation_zone_state`.
    pub fn as_str(self) -> &'static str {
        match self {
            ZoneState::Normal => "Normal",
            ZoneState::PartialDisruption => "PartialDisruption",
            ZoneState::FullDisruption => "FullDisruption",
        }
    }
}

/// `ComputeZoneState`: no healthy node → full disruption; more than two unhealthy nodes and
/// at least `threshold` of the zone unhealthy → partial disruption; else normal.
pub fn compute_zone_state(healthy: usize, unhealthy: usize, threshold: f64) -> ZoneState {
    #[expect(clippy::cast_precision_loss, reason = "node counts are far below 2^52")]
    let fraction = unhealthy as f64 / (healthy + unhealthy).max(1) as f64;
    if healthy == 0 && unhealthy > 0 {
        ZoneState::FullDisruption
    } else if unhealthy > 2 && fraction >= threshold {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// The fencing rate of a zone (`setLimiterInZone`): normal and fully disrupted zones get the
/// normal rate (`HealthyQPSFunc`); a partially disrupted zone gets the secondary rate when it is
/// larger than the large-cluster threshold and none otherwise (`ReducedQPSFunc`).
pub fn zone_fence_rate(state: ZoneState, zone_size: usize, cfg: &StormConfig) -> f64 {
    match state {
        ZoneState::Normal | ZoneState::FullDisruption => cfg.node_fence_rate,
        ZoneState::PartialDisruption => {
            if zone_size > cfg.large_cluster_size_threshold as usize {
                cfg.secondary_node_fence_rate
            } else {
                0.0
            }
        }
    }
}

/// One zone's standing.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneStatus {
    /// Nodes in the zone.
    pub size: usize,
    /// Of them, unhealthy (suspect, dead or not Ready).
    pub unhealthy: usize,
    /// The zone's state.
    pub state: ZoneState,
    /// Nodes the zone may fence per second.
    pub rate: f64,
}

/// Why a node that looks dead is not being fenced (now).
#[derive(Debug, Clone, PartialEq)]
pub enum SkipReason {
    /// The controller cannot reach the API server reliably: its own view is suspect.
    ControllerPartitioned {
        /// How long since the controller last reached the API server.
        api_silent: Duration,
    },
    /// Every zone is fully disrupted: the management side is more likely cut off than every
    /// node dead (`handleDisruption` stops all evictions then).
    AllZonesDisrupted {
        /// Nodes in the cluster.
        nodes: usize,
    },
    /// Too many nodes are unhealthy at once (the fencing proposal's storm rule).
    TooManyUnhealthy {
        /// Unhealthy nodes.
        unhealthy: usize,
        /// Nodes in the cluster.
        total: usize,
    },
    /// The node's zone has a fencing rate of 0 (a small, partially disrupted zone).
    ZoneDisruption {
        /// The zone's label ([`ZoneKey::label`]).
        zone: String,
        /// The zone's state.
        state: ZoneState,
        /// Unhealthy nodes in the zone.
        unhealthy: usize,
        /// Nodes in the zone.
        size: usize,
    },
    /// The zone's rate limit has no token now.
    RateLimited {
        /// The zone's label ([`ZoneKey::label`]).
        zone: String,
    },
    /// No fencing configuration applies to the node: it can never be confirmed off.
    NoFenceConfig,
    /// The fencing configuration cannot be read or is invalid.
    FenceConfigError {
        /// What is wrong with it.
        error: String,
    },
    /// Left out by `nodeSelector` or the opt-out annotation.
    NotEligible,
    /// Dry run: decided, not done.
    DryRun,
}

impl SkipReason {
    /// The `reason` label of `node_monitor_remediation_skips_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::ControllerPartitioned { .. } => "controller_partitioned",
            Self::AllZonesDisrupted { .. } => "all_zones_disrupted",
            Self::TooManyUnhealthy { .. } => "too_many_unhealthy",
            Self::ZoneDisruption { .. } => "zone_disruption",
            Self::RateLimited { .. } => "rate_limited",
            Self::NoFenceConfig => "no_fence_config",
            Self::FenceConfigError { .. } => "fence_config_error",
            Self::NotEligible => "not_eligible",
            Self::DryRun => "dry_run",
        }
    }

    /// Every value of [`SkipReason::label`], for initialising the metric's series.
    pub const LABELS: [&'static str; 9] = [
        "controller_partitioned",
        "all_zones_disrupted",
        "too_many_unhealthy",
        "zone_disruption",
        "rate_limited",
        "no_fence_config",
        "fence_config_error",
        "not_eligible",
        "dry_run",
    ];

    /// A sentence for the `FencingSkipped` Event and the logs.
    pub fn message(&self) -> String {
        match self {
            Self::ControllerPartitioned { api_silent } => format!(
                "fencing skipped: the controller has not reached the API server for {:.1}s and may itself be partitioned",
                api_silent.as_secs_f64()
            ),
            Self::AllZonesDisrupted { nodes } => format!(
                "fencing skipped: all {nodes} nodes look unhealthy at once (every zone in FullDisruption); the management network is more likely at fault"
            ),
            Self::TooManyUnhealthy { unhealthy, total } => format!(
                "fencing skipped: {unhealthy} of {total} nodes are unhealthy, at or above maxUnhealthyFraction (fencing storm protection)"
            ),
            Self::ZoneDisruption {
                zone,
                state,
                unhealthy,
                size,
            } => format!(
                "fencing skipped: zone {zone:?} is in {} ({unhealthy} of {size} nodes unhealthy); its fencing rate is 0",
                state.as_str()
            ),
            Self::RateLimited { zone } => {
                format!("fencing deferred: the fencing rate limit of zone {zone:?} is exhausted")
            }
            Self::NoFenceConfig => "fencing skipped: no fencing configuration applies to this node (fence-config-<node> or fence-config-default); its workload is never released without confirmed fencing".to_owned(),
            Self::FenceConfigError { error } => {
                format!("fencing skipped: the fencing configuration is unusable: {error}")
            }
            Self::NotEligible => {
                format!("fencing skipped: the node is excluded by nodeSelector or the {OPT_OUT_ANNOTATION} annotation")
            }
            Self::DryRun => "dry run: the node would be fenced now".to_owned(),
        }
    }
}

/// The cluster as storm protection sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// Each zone's standing.
    pub zones: BTreeMap<ZoneKey, ZoneStatus>,
    /// Nodes counted.
    pub total: usize,
    /// Of them, unhealthy.
    pub unhealthy: usize,
    /// A cluster-wide reason to fence nothing now.
    pub blocked: Option<SkipReason>,
}

impl Assessment {
    /// Whether a node of `zone` may start (or continue) fencing, before its rate limit.
    pub fn admits(&self, zone: &ZoneKey) -> Result<(), SkipReason> {
        if let Some(b) = &self.blocked {
            return Err(b.clone());
        }
        match self.zones.get(zone) {
            Some(z) if z.rate <= 0.0 => Err(SkipReason::ZoneDisruption {
                zone: zone.label(),
                state: z.state,
                unhealthy: z.unhealthy,
                size: z.size,
            }),
            _ => Ok(()),
        }
    }
}

/// Zone states and cluster-wide storm rules from every node's zone and health (`unhealthy`:
/// suspect or dead by its Lease, or not Ready), and the time since the controller last reached
/// the API server.
pub fn assess(
    nodes: impl IntoIterator<Item = (ZoneKey, bool)>,
    api_silent: Duration,
    cfg: &StormConfig,
) -> Assessment {
    let mut counts: BTreeMap<ZoneKey, (usize, usize)> = BTreeMap::new();
    for (zone, unhealthy) in nodes {
        let c = counts.entry(zone).or_default();
        if unhealthy {
            c.1 += 1;
        } else {
            c.0 += 1;
        }
    }
    let mut zones = BTreeMap::new();
    let (mut total, mut unhealthy) = (0, 0);
    for (zone, (healthy, bad)) in counts {
        let state = compute_zone_state(healthy, bad, cfg.unhealthy_zone_threshold);
        let size = healthy + bad;
        total += size;
        unhealthy += bad;
        zones.insert(
            zone,
            ZoneStatus {
                size,
                unhealthy: bad,
                state,
                rate: zone_fence_rate(state, size, cfg),
            },
        );
    }
    #[expect(clippy::cast_precision_loss, reason = "node counts are far below 2^52")]
    let fraction = unhealthy as f64 / total.max(1) as f64;
    let blocked = if api_silent > cfg.api_stale_after {
        Some(SkipReason::ControllerPartitioned { api_silent })
    } else if total > 0 && zones.values().all(|z| z.state == ZoneState::FullDisruption) {
        Some(SkipReason::AllZonesDisrupted { nodes: total })
    } else if unhealthy >= 2 && fraction >= cfg.max_unhealthy_fraction {
        Some(SkipReason::TooManyUnhealthy { unhealthy, total })
    } else {
        None
    };
    Assessment {
        zones,
        total,
        unhealthy,
        blocked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remediation::test_support::*;

    #[test]
    fn zone_key_prefers_beta_labels_like_get_zone_key() {
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let cases = [
            (l(&[]), "", ""),
            (l(&[("topology.kubernetes.io/zone", "a")]), "", "a"),
            (
                l(&[
                    ("topology.kubernetes.io/zone", "a"),
                    ("failure-domain.beta.kubernetes.io/zone", "b"),
                    ("topology.kubernetes.io/region", "r"),
                ]),
                "r",
                "b",
            ),
        ];
        for (labels, region, zone) in cases {
            let k = ZoneKey::from_labels(&labels);
            assert_eq!(
                (k.region.as_str(), k.zone.as_str()),
                (region, zone),
                "{labels:?}"
            );
        }
        assert_eq!(
            ZoneKey {
                region: "r".into(),
                zone: "z".into()
            }
            .label(),
            "r:z"
        );
    }

    #[test]
    fn zone_state_matches_compute_zone_state() {
        // (healthy, unhealthy, expected) with threshold 0.55
        let cases = [
            (3, 0, ZoneState::Normal),
            (0, 1, ZoneState::FullDisruption),
            (0, 5, ZoneState::FullDisruption),
            (0, 0, ZoneState::Normal),
            (1, 2, ZoneState::Normal), // 67 % but only two unhealthy
            (1, 3, ZoneState::PartialDisruption),
            (2, 3, ZoneState::PartialDisruption),  // 60 %
            (3, 3, ZoneState::Normal),             // 50 %
            (9, 11, ZoneState::PartialDisruption), // exactly 55 %
        ];
        for (h, u, want) in cases {
            assert_eq!(
                compute_zone_state(h, u, 0.55),
                want,
                "{h} healthy {u} unhealthy"
            );
        }
    }

    #[test]
    fn zone_rates_follow_set_limiter_in_zone() {
        let cfg = storm();
        let cases = [
            (ZoneState::Normal, 10, 0.1),
            (ZoneState::FullDisruption, 10, 0.1),
            (ZoneState::PartialDisruption, 50, 0.0), // not larger than the threshold
            (ZoneState::PartialDisruption, 51, 0.01),
        ];
        for (state, size, want) in cases {
            assert!(
                (zone_fence_rate(state, size, &cfg) - want).abs() < 1e-12,
                "{state:?} {size}"
            );
        }
    }

    #[test]
    fn storm_protection_table() {
        let cfg = storm();
        let nodes = |spec: &[(&str, bool)]| -> Vec<(ZoneKey, bool)> {
            spec.iter().map(|(zn, u)| (z(zn), *u)).collect()
        };
        // (nodes, api silent s, blocked label, zone to ask about, admits?)
        type Row = (
            Vec<(ZoneKey, bool)>,
            u64,
            Option<&'static str>,
            &'static str,
            bool,
        );
        let cases: Vec<Row> = vec![
            // One dead node of three: fence.
            (
                nodes(&[("a", true), ("a", false), ("b", false)]),
                0,
                None,
                "a",
                true,
            ),
            // A single-node zone fully down while another zone is fine: the NLC's normal rate.
            (
                nodes(&[("a", false), ("a", false), ("b", true)]),
                0,
                None,
                "b",
                true,
            ),
            // Two of three unhealthy: cluster-wide storm rule.
            (
                nodes(&[("a", true), ("a", true), ("b", false)]),
                0,
                Some("too_many_unhealthy"),
                "a",
                false,
            ),
            // Every node unhealthy: the management side is suspect.
            (
                nodes(&[("a", true), ("b", true)]),
                0,
                Some("all_zones_disrupted"),
                "a",
                false,
            ),
            // The controller has not reached the API for 7 s (> 6 s).
            (
                nodes(&[("a", true), ("a", false), ("b", false)]),
                7,
                Some("controller_partitioned"),
                "a",
                false,
            ),
        ];
        for (n, silent, blocked, zone, admits) in cases {
            let a = assess(n.clone(), Duration::from_secs(silent), &cfg);
            assert_eq!(a.blocked.as_ref().map(SkipReason::label), blocked, "{n:?}");
            assert_eq!(a.admits(&z(zone)).is_ok(), admits, "{n:?}");
        }
    }

    #[test]
    fn a_partially_disrupted_small_zone_fences_nothing() {
        let mut cfg = storm();
        cfg.max_unhealthy_fraction = 0.9;
        // zone a: 3 of 4 unhealthy (75 %, more than two) → PartialDisruption, rate 0.
        let n = vec![
            (z("a"), true),
            (z("a"), true),
            (z("a"), true),
            (z("a"), false),
            (z("b"), false),
            (z("b"), false),
        ];
        let a = assess(n, Duration::ZERO, &cfg);
        assert_eq!(a.blocked, None);
        assert_eq!(a.zones[&z("a")].state, ZoneState::PartialDisruption);
        let err = a.admits(&z("a")).expect_err("rate 0");
        assert_eq!(err.label(), "zone_disruption");
        assert!(
            err.message().contains("PartialDisruption"),
            "{}",
            err.message()
        );
        assert!(a.admits(&z("b")).is_ok());
        // The same zone in a large cluster gets the secondary rate instead.
        cfg.large_cluster_size_threshold = 3;
        let n = vec![
            (z("a"), true),
            (z("a"), true),
            (z("a"), true),
            (z("a"), false),
        ];
        let a = assess(n, Duration::ZERO, &cfg);
        assert!((a.zones[&z("a")].rate - 0.01).abs() < 1e-12);
    }
}
