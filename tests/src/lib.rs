//! Test harness shared by node-monitor's integration tiers.
pub mod cgroup;
pub mod control_plane;
pub mod e2e;
pub mod manifests;
pub mod real_node;
pub mod standin;
pub mod vm;
pub mod wait;
pub mod workload;
