//! Pure decision logic: no I/O, no async, time passed in.
pub mod clock;
pub mod config;
pub mod duration;
pub mod eviction;
pub mod headroom;
pub mod kubelet_layout;
pub mod node_name;
pub mod pod;
pub mod quantity;
pub mod rank;
pub mod release;
pub mod remediation;
pub mod shutdown;
pub mod signals;
pub mod threshold;
