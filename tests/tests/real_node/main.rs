//! The real-node tier (the guest VM with a real kubelet and containerd, under /tmp/nm-vm.lock):
//! node-monitor installed from its own manifests. One test binary for the tier (`cargo test -p
//! node-monitor-tests --test real_node`); each module is one concern, run alone with a filter (`--
//! real_node::`).
mod real_node;
mod real_node_failover;
mod real_node_helm;
mod real_node_predict;
mod real_node_probes;
mod real_node_shutdown;
