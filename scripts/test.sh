#!/usr/bin/env bash
# The test command: installs what the tests need (scripts/setup.sh), then runs every tier that this
# machine supports. Root-only tiers fail loudly when they cannot run; they never skip.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --with-control-plane --with-vm
export PATH="$HOME/.cargo/bin:$PATH"
CACHE="${NODE_MONITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/node-monitor}"
export KUBEBUILDER_ASSETS="$CACHE/control-plane/current"

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== unit, kernel, control-plane and end-to-end tiers"
# Kernel state (cgroups, probes) is shared: one test at a time.
cargo test --workspace --locked -- --test-threads=1
