#!/usr/bin/env bash
# The test command: `cargo xtask test` (xtask/src/tiers.rs) installs what the tests need, then runs
# fmt, clippy -D warnings and every tier, one test at a time. Root-only tiers (kernel, control
# plane, end to end, guest VM, real node) fail loudly when they cannot run; they never skip.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bootstrap.sh
exec cargo xtask test "$@"
