#![cfg(test)]
//! Fixtures shared by the tests of the remediation modules.
use std::time::Duration;

use super::*;

pub(super) fn detection() -> DetectionConfig {
    DetectionConfig {
        missed_renewals: 3,
        renew_interval: None,
        suspect_after_renewals: 1.5,
        agent_heartbeat_timeout: Duration::from_secs(90),
        agent_lease_timeout: Duration::from_secs(8),
        agent_kubelet_corroboration: 1.2,
    }
}

pub(super) fn facts(name: &str, renew: Option<i64>) -> NodeFacts {
    NodeFacts {
        name: name.to_owned(),
        zone: ZoneKey::default(),
        ready: ReadyStatus::True,
        lease: Some(LeaseFacts {
            renew_time: renew,
            duration_seconds: Some(40),
        }),
        agent_heartbeat: None,
        agent_lease: None,
        last_gasp: None,
        eligible: true,
        boot_id: None,
        ready_heartbeat: None,
    }
}

pub(super) fn storm() -> StormConfig {
    RemediationConfig::default().storm
}

pub(super) fn z(name: &str) -> ZoneKey {
    ZoneKey {
        region: String::new(),
        zone: name.to_owned(),
    }
}

pub(super) fn new_op() -> FenceOp {
    let mut f = facts("n1", Some(1_000));
    f.boot_id = Some("boot-1".to_owned());
    f.ready_heartbeat = Some(800);
    FenceOp::new(
        &f,
        "uid-1",
        &DeathEvidence::LeaseExpired {
            silent: Duration::from_secs(30),
            renew_interval: Duration::from_secs(10),
            missed: 3,
        },
        0,
    )
}
