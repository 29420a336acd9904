//! The units every decision is written in: Kubernetes quantities, Go durations and a monotonic
//! timestamp the caller passes in.

pub mod clock;
pub mod duration;
pub mod quantity;
