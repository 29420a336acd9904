#!/usr/bin/env bash
# The test command: installs what the tests need (scripts/setup.sh), then runs every tier. Root-only
# tiers (kernel, control plane, end to end, guest VM) fail loudly when they cannot run; they never skip.
#
# Cargo commands run on the whole workspace but the eBPF crate, which node-monitor's build script
# builds for the BPF target (never for the host). The `tests` crate is not a default member, so it is
# named here through `--workspace`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --with-control-plane --with-vm
export PATH="$HOME/.cargo/bin:$PATH"
CACHE="${NODE_MONITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/node-monitor}"
export KUBEBUILDER_ASSETS="$CACHE/control-plane/current"

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --exclude node-monitor-ebpf --all-targets --locked -- -D warnings

echo "== build (the integration tiers run the binaries)"
cargo build --bins --locked

echo "== images for the real-node tier: OCI archives built offline (target/images/)"
cargo xtask image pause --binary "$CACHE/node/current/pause"
cargo xtask image workload --profile debug
cargo xtask image node-monitor

echo "== unit, kernel, control-plane, end-to-end, guest VM and real-node tiers"
# Kernel state (cgroups, probes) is shared: one test at a time.
cargo test --workspace --exclude node-monitor-ebpf --locked -- --test-threads=1
