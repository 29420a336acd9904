//! The node API's contract, which the agent serves and `kubectl node-monitor` calls: its paths,
//! the header that carries the caller's token through the API server's pod proxy, its bounds,
//! and its time format ([`crate::flight::utc`]). docs/cli.md describes the answers.

/// The agent's status: its configuration in force, the last decision, recent evictions.
pub const STATUS_PATH: &str = "/node-monitor/v1/status";
/// The live explain of the last decision.
pub const EXPLAIN_PATH: &str = "/node-monitor/v1/explain";
/// Recent kernel events, attributed to pods.
pub const TRACE_PATH: &str = "/node-monitor/v1/trace";
/// The OOM flight recorder's records (docs/runbook.md).
pub const FLIGHT_PATH: &str = "/node-monitor/v1/flight";
/// The header that carries the caller's bearer token through the pod proxy (which drops
/// `Authorization`).
pub const TOKEN_HEADER: &str = "x-node-monitor-token";
/// The most events one `trace` answer carries.
pub const TRACE_PAGE_MAX: usize = 1024;
/// The longest token the node API accepts (service-account and OIDC tokens are a few KiB).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
