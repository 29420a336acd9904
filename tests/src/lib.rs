//! Test harness shared by node-monitor's integration tiers.
pub mod cgroup;
