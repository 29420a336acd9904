#!/usr/bin/env bash
# One setup path for a fresh machine: `cargo xtask setup` (xtask/src/setup.rs) installs Debian's
# packages, the pinned Rust toolchains and bpf-linker, and with the flags builds the control plane,
# the guest image and the real node's binaries. Idempotent and cached.
#
# Usage: scripts/setup.sh [--with-control-plane] [--with-vm]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bootstrap.sh
exec cargo xtask setup "$@"
