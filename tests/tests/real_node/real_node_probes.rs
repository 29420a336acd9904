//! The kernel probes on each real node's kernel (`node_monitor_tests::kernel_probes`): every
//! program's load state, a memcg OOM kill attributed to its pod's cgroup, memcg reclaim stalls
//! and refused reboot(2) calls, as `node-monitor trace --json` reports them. Run as the last step
//! before each boot ends (or, on the k3s node, before its power-off): bookworm's 6.1 on the
//! kubeadm node, bullseye's 5.10 on the failover pair's kind node, bookworm-backports' 6.12 on the k3s node.
use std::time::Duration;

use node_monitor_tests::{
    e2e, kernel_probes,
    real_node::{RealNode, scenario::guest_step},
    vm::GuestKernel,
};

/// `node-monitor trace --json` on the node's kernel, beside the node's kubelet and node-monitor's
/// own pod.
pub(crate) async fn the_kernel_probes_on_this_nodes_kernel(
    node: &mut RealNode,
    kernel: GuestKernel,
) {
    for b in kernel_probes::BINARIES {
        node.put_file(b, &e2e::binary(b))
            .unwrap_or_else(|e| panic!("{b} into the payload (cargo build --bins): {e:#}"));
    }
    let (uid, cid) = kernel_probes::ids();
    guest_step(
        node,
        "the kernel probes (node-monitor trace --json)",
        &kernel_probes::step_script(&uid, &cid),
        Duration::from_secs(420),
    )
    .await;
    let report = node.report();
    let read = |f: &str| {
        node.read_out(&format!("probes/{f}"))
            .unwrap_or_else(|e| panic!("{e}\n{report}"))
            .trim()
            .to_owned()
    };
    kernel_probes::check(kernel, &uid, &cid, &read, &report);
}
