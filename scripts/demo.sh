#!/usr/bin/env bash
# The main job: a self-contained demo on this machine (root). It installs what it needs, starts a
# real control plane on loopback, registers this machine as a node through the kubelet stand-in,
# runs pods and the real agent, drives one pod's memory up, shows what happened, and cleans up.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --with-control-plane
export PATH="$HOME/.cargo/bin:$PATH"
CACHE="${NODE_MONITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/node-monitor}"
export KUBEBUILDER_ASSETS="$CACHE/control-plane/current"
[[ $(id -u) -eq 0 ]] || { echo "demo: run as root (it creates cgroups and loads eBPF programs)" >&2; exit 1; }
cargo build --bins --locked -q
exec target/debug/nm-demo
