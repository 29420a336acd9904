#!/usr/bin/env bash
# The main job: `cargo xtask demo`, a self-contained demo on this machine (root). It installs what it
# needs, starts a real control plane on loopback, registers this machine as a node through the
# kubelet stand-in, runs pods and the real agent, drives one pod's memory up, shows what happened,
# and cleans up.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bootstrap.sh
exec cargo xtask demo
