//! The end-to-end tier (root, a control plane, the binaries): the agent against a kubelet stand-in,
//! and `kubectl node-monitor` through the API server's pod proxy. One test binary for the tier
//! (`cargo test -p node-monitor-tests --test e2e`); each module is one concern, run alone with a
//! filter (`-- e2e::`).
mod attack;
mod e2e;
mod kubectl_plugin;
