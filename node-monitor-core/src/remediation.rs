//! Pure decisions of `node-monitor remediate`: when a node is dead, whether fencing it now is
//! safe (zone states and storm protection), how fast nodes may be fenced (per-zone token
//! buckets), and how a fencing operation moves from isolation to release to recovery.
//!
//! No I/O, no async; time is passed in. Two clocks appear, never mixed:
//! - [`Timestamp`]: the controller's monotonic clock, for liveness observations and rate limits;
//! - [`UnixMillis`]: the controller's wall clock, for the persisted fencing operation (it must
//!   survive a restart, so it cannot be monotonic).
//!
//! Times written by a node (its Lease's `renewTime`, its agent's heartbeats and last gasp) are
//! [`WallMicros`] and are only ever compared with other times written by the same node, never with
//! the controller's clock: a node whose clock is off must not look dead.
//!
//! The zone logic follows the node lifecycle controller
//! (<https://github.com/kubernetes/kubernetes/blob/master/pkg/controller/nodelifecycle/node_lifecycle_controller.go>:
//! `ComputeZoneState`, `handleDisruption`, `setLimiterInZone`, `ReducedQPSFunc`,
//! `HealthyQPSFunc`); the fencing steps follow the node-fencing design proposal (isolation, then
//! power management, then recovery; skip fencing when too many nodes are unresponsive).
//!
//! One file per concern: [`config`] (the settings), [`liveness`] (is a node dead), [`zones`]
//! (zone states and storm protection), [`rate`] (per-zone token buckets), [`operation`] (the
//! persisted fencing operation and its vocabulary), [`fencing`] (the fencing state machine) and
//! [`out_of_service`] (the taint a release applies and the pods it spares). Everything public is
//! re-exported here: `node_monitor_core::remediation::X` names any of it.
pub mod admission;
pub mod config;
pub mod fencing;
pub mod liveness;
pub mod operation;
pub mod out_of_service;
pub mod rate;
pub mod zones;

#[cfg(test)]
mod test_support;

pub use config::*;
pub use fencing::*;
pub use liveness::*;
pub use operation::*;
pub use out_of_service::*;
pub use rate::*;
pub use zones::*;

#[cfg(doc)]
use crate::units::clock::Timestamp;

/// Microseconds since the Unix epoch, as written by a node (Lease `renewTime`, condition times).
pub type WallMicros = i64;
/// Milliseconds since the Unix epoch on the controller's clock.
pub type UnixMillis = i64;
