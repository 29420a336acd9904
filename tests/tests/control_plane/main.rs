//! The control-plane tier (a real API server and etcd; root for the kubelet stand-ins): the agent's
//! API calls, the eviction API, the clean stop, remediate. One test binary for the tier (`cargo
//! test -p node-monitor-tests --test control_plane`); each module is one concern, run alone with a
//! filter (`-- control_plane::`).
mod control_plane;
mod eviction_api;
mod node_release;
mod remediate;
