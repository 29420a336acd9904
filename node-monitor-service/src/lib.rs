//! node-monitor's shared service library: what every long-running product (the agent, remediate)
//! does the same way around its own decisions. The Kubernetes client ([`client`]) and the one
//! writer of Events ([`events`]); the endpoint with `/metrics`, `/healthz` and `/readyz` and its
//! connection limits ([`http`]); the metrics base each product registers its families on
//! ([`metrics`]); logging ([`telemetry`]); and jitter for periodic API work ([`jitter`]).
//!
//! Nothing here knows eBPF, the kernel or D-Bus: remediate builds on it without the agent's
//! toolchain (`cargo xtask layers` checks it from `cargo tree`).
pub mod client;
pub mod events;
pub mod http;
pub mod jitter;
pub mod metrics;
pub mod taint;
pub mod telemetry;
