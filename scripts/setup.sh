#!/usr/bin/env bash
# One setup path for a fresh machine: Debian packages, the pinned Rust toolchains, bpf-linker, the
# control-plane binaries, the guest image and the real node's binaries.
# Idempotent and cached: a second run checks versions and returns in seconds.
#
# Usage: scripts/setup.sh [--with-control-plane] [--with-vm]
set -euo pipefail
cd "$(dirname "$0")/.."

HOST_TOOLCHAIN=1.99.0          # keep in step with rust-toolchain.toml
EBPF_TOOLCHAIN=nightly-2026-07-20  # LLVM 22, like bpf-linker's; keep in step with node-monitor/build.rs
BPF_LINKER_VERSION=0.13.0
LLVM_MAJOR=22
export CACHE="${NODE_MONITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/node-monitor}"
mkdir -p "$CACHE"

with_cp=0; with_vm=0
for a in "$@"; do
  case "$a" in
    --with-control-plane) with_cp=1 ;;
    --with-vm) with_vm=1 ;;
    *) echo "setup: unknown argument $a" >&2; exit 2 ;;
  esac
done

log() { echo "setup: $*" >&2; }
SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo

# --- Debian packages -----------------------------------------------------------------------------
APT_PACKAGES=(
  "llvm-${LLVM_MAJOR}-dev" "libpolly-${LLVM_MAJOR}-dev" zlib1g-dev libzstd-dev  # bpf-linker
  clang pkg-config                                                               # build tooling
  bpftool                                                                        # benchmarks (bpf stats)
  stress-ng                                                                      # memory pressure in tests
  prometheus                                                                     # promtool, dashboard queries
)
VM_PACKAGES=(qemu-system-x86 mmdebstrap)                                         # guest VM tier

((with_vm)) && APT_PACKAGES+=("${VM_PACKAGES[@]}")
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  # --no-remove: never let apt resolve a clash by removing packages the machine already has.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-remove --no-install-recommends \
    "${missing[@]}" >&2
  # The Debian prometheus package starts a server where an init system runs; the tests start their own.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi

# --- Rust toolchains ------------------------------------------------------------------------------
command -v rustup >/dev/null || { log "rustup is required (https://rustup.rs)"; exit 1; }
installed_toolchains=$(rustup toolchain list)
if ! grep -q "^${HOST_TOOLCHAIN}-" <<<"$installed_toolchains"; then
  log "installing Rust ${HOST_TOOLCHAIN}"
  rustup toolchain install "$HOST_TOOLCHAIN" --profile minimal --component clippy,rustfmt >&2
fi
if ! grep -q "^${EBPF_TOOLCHAIN}-" <<<"$installed_toolchains" \
   || ! rustup component list --toolchain "$EBPF_TOOLCHAIN" --installed 2>/dev/null | grep -q rust-src; then
  log "installing Rust ${EBPF_TOOLCHAIN} with rust-src (eBPF)"
  rustup toolchain install "$EBPF_TOOLCHAIN" --profile minimal --component rust-src >&2
fi

# --- bpf-linker (linked against the same LLVM as the eBPF nightly) ---------------------------------
export PATH="$HOME/.cargo/bin:$PATH"
if ! bpf-linker --version 2>/dev/null | grep -q "$BPF_LINKER_VERSION"; then
  log "installing bpf-linker ${BPF_LINKER_VERSION} against LLVM ${LLVM_MAJOR}"
  LLVM_PREFIX="/usr/lib/llvm-${LLVM_MAJOR}" cargo "+${HOST_TOOLCHAIN}" install bpf-linker \
    --version "$BPF_LINKER_VERSION" --locked --no-default-features --features "llvm-${LLVM_MAJOR}" >&2
fi

# --- Control plane (etcd, kube-apiserver, kube-controller-manager) -----------------------------------
if ((with_cp)); then
  assets=$(scripts/build-control-plane.sh)
  ln -sfn "$assets" "$CACHE/control-plane/current"

  # The prometheus-operator CRDs (ServiceMonitor, PrometheusRule), so the monitoring manifests are
  # applied server-side against the real API server (tests/tests/deploy_monitoring.rs). Taken from
  # the Go module proxy into a module cache of their own; `current` is what the tests read.
  PROMETHEUS_OPERATOR_VERSION=v0.85.0
  po="$CACHE/prometheus-operator"
  crds="$po/crds-${PROMETHEUS_OPERATOR_VERSION}"
  crd_files=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml)
  if [[ ! -s "$crds/${crd_files[0]}" || ! -s "$crds/${crd_files[1]}" ]]; then
    command -v go >/dev/null || { log "go is required for the prometheus-operator CRDs"; exit 1; }
    log "fetching the prometheus-operator ${PROMETHEUS_OPERATOR_VERSION} CRDs from the Go module proxy"
    mkdir -p "$po"
    moddir=$(cd "$po" && GOMODCACHE="$po/gomod" GOFLAGS=-mod=mod \
      go mod download -json "github.com/prometheus-operator/prometheus-operator@${PROMETHEUS_OPERATOR_VERSION}" \
      | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -d "$moddir" ]] || { log "go mod download gave no module directory"; exit 1; }
    rm -rf "$crds.tmp" && mkdir -p "$crds.tmp"
    for f in "${crd_files[@]}"; do
      install -m 0644 "$moddir/example/prometheus-operator-crd/$f" "$crds.tmp/$f"
    done
    rm -rf "$crds" && mv "$crds.tmp" "$crds"
    # Only the two files are kept; the module cache (read-only files) goes.
    GOMODCACHE="$po/gomod" go clean -modcache
  fi
  ln -sfn "$crds" "$po/current"
fi

# --- Guest VM image (Debian bookworm with systemd, for the VM tier) ---------------------------------
# and the real node's kubelet, kube-scheduler, containerd and pause (scripts/build-node.sh).
if ((with_vm)); then
  scripts/build-guest-image.sh >/dev/null
  node=$(scripts/build-node.sh)
  mkdir -p "$CACHE/node"
  ln -sfn "$node" "$CACHE/node/current"
fi

log "ok"
