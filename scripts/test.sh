#!/usr/bin/env bash
# The test command: `cargo xtask test` (xtask/src/tiers.rs) installs what the tests need, then runs
# fmt, clippy -D warnings and every tier, one test at a time. Root-only tiers (kernel, control
# plane, end to end, guest VM, real node) fail loudly when they cannot run; they never skip.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bootstrap.sh
# One build from a fresh clone gains nothing from incremental compilation, which would keep about
# 5 GB more in target/ (docs/testing.md, "Disk"). Set CARGO_INCREMENTAL=1 to keep it.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
exec cargo xtask test "$@"
