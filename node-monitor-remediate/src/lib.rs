//! node-monitor remediate (`node-monitor-remediate`): fast, safe failover when a node dies.
//!
//! A leader-elected controller (a Deployment, not a DaemonSet) that watches every node's Lease and
//! its node agent's heartbeats, finds a dead node within a few missed renewals (or at once from
//! the agent's last gasp), refuses to act during fencing storms or when it may be partitioned
//! itself, fences the node (isolation, then power management, per the node-fencing proposal) and
//! only once fencing is confirmed releases its workload: the `node.kubernetes.io/out-of-service`
//! taint (KEP-2268) and the deletion of the pods still bound to it, so ReplicaSets, StatefulSets
//! and the attach-detach controller recover at once. When the node comes back it runs recovery
//! and removes the taint. See docs/remediate.md.
//!
//! Layout: [`node_monitor_core::remediation`] decides (pure); [`facts`] translates API objects;
//! [`methods`] reads the fence configuration; [`exec`] runs fence agents; [`store`] keeps
//! operations in the API; [`leader`] elects; [`controller`] ties them together through its
//! [`ports`], which [`kube_ports`] implements on the API server; [`metrics`] are its own
//! families; [`admission_check`] looks whether the NodeFence status policy is in force; [`fence_qmp`] is
//! the QMP fence agent (`fence_qmp`, a binary of its own) for QEMU virtual machines. It builds on the shared service library (client, Events, endpoint, logging) and
//! the core, without the agent, eBPF or D-Bus.
pub mod admission_check;
pub mod controller;
pub mod exec;
pub mod facts;
pub mod fence_qmp;
pub mod kube_ports;
pub mod leader;
pub mod methods;
pub mod metrics;
pub mod ports;
pub mod run;
pub mod store;
pub mod watch_health;

pub use run::{Args, lease_check_interval, load_config, run};
pub use watch_health::{
    ApiHealth, NODE_LEASE_NAMESPACE, WatchFreshness, confirm_lease_watch, confirm_watch,
};
