#!/usr/bin/env bash
# The test command: installs what the tests need (scripts/setup.sh), then runs every tier. Root-only
# tiers (kernel, control plane, end to end, guest VM) fail loudly when they cannot run; they never skip.
#
# Cargo commands run on the workspace's default members: the eBPF crate is built for the BPF target
# by node-monitor's build script, never for the host.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --with-control-plane --with-vm
export PATH="$HOME/.cargo/bin:$PATH"
CACHE="${NODE_MONITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/node-monitor}"
export KUBEBUILDER_ASSETS="$CACHE/control-plane/current"

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings

echo "== build (the integration tiers run the binaries)"
cargo build --bins --locked

echo "== images for the real-node tier: OCI archives built offline (target/images/)"
cargo xtask image pause --binary "$CACHE/node/current/pause"
cargo xtask image workload --profile debug
cargo xtask image node-monitor

echo "== unit, kernel, control-plane, end-to-end, guest VM and real-node tiers"
# Kernel state (cgroups, probes) is shared: one test at a time.
cargo test --locked -- --test-threads=1
