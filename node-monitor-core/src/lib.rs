//! node-monitor's decision core: pure logic, no I/O, no async, time passed in.
//!
//! Every decision node-monitor takes is a function of observations and `now` that returns actions:
//! the eviction pipeline (signals, thresholds, ranking, headroom, the decision), the graceful
//! shutdown plan, the remediation state machine, and the values they are made of (quantities,
//! durations, the kubelet's cgroup layout). The agent and `remediate` translate between the outside
//! world and these values; nothing here touches a file, a socket or a clock.
//!
//! This crate builds and tests on stable Rust alone (`cargo test -p node-monitor-core`): no eBPF
//! toolchain, no runtime, no Kubernetes client.
#![warn(missing_docs)]

pub mod agent_config;
pub mod arming;
pub mod config;
pub mod contract;
pub mod eviction;
pub mod flight;
pub mod guarantees;
pub mod kubelet;
pub mod release;
pub mod remediation;
pub mod shutdown;
pub mod signals;
pub mod units;

/// The settings of the property tests (`mod prop` next to the code they test, docs/testing.md):
/// proptest's defaults (256 cases, `PROPTEST_CASES` overrides), without regression files: a
/// failing input found once is kept as a table-test case instead.
#[cfg(test)]
pub(crate) fn proptest_config() -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}
