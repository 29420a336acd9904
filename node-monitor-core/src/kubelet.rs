//! The kubelet's layout and the identities it gives: its cgroup layout (which pod and container a
//! cgroup path belongs to), the pod as the eviction decision sees it, and the node's name.

pub mod layout;
pub mod node_name;
pub mod pod;
