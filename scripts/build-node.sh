#!/usr/bin/env bash
# Builds what the real-node tier's guest runs besides Debian's packages, once, and caches it keyed by
# version: the kubelet and kube-scheduler (the control plane's k8s.io/kubernetes version; the tier's
# control plane schedules its DaemonSet and pods with it), containerd 2.x with ctr and
# the runc shim (from containerd's Go module), and the pause binary (the kubelet's own
# build/pause/linux/pause.c, compiled static). Prints the directory that holds them.
#
# runc and the CNI plugins come from Debian inside the guest image (scripts/build-guest-image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VERSION="${K8S_VERSION:-v1.36.3}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.2.9}"
CACHE="${NODE_MONITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/node-monitor}"
OUT="$CACHE/node/k8s-${K8S_VERSION}-containerd-${CONTAINERD_VERSION}"
BINARIES=(kubelet kube-scheduler containerd ctr containerd-shim-runc-v2 pause)

complete() { for b in "${BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done; }
if complete; then echo "$OUT"; exit 0; fi

command -v go >/dev/null || { echo "build-node: go is not installed" >&2; exit 1; }
command -v cc >/dev/null || { echo "build-node: a C compiler is needed for pause" >&2; exit 1; }
log() { echo "build-node: $*" >&2; }
# shellcheck source=lib/k8s-module.sh
source scripts/lib/k8s-module.sh
rm -rf "$OUT.tmp"; mkdir -p "$OUT.tmp"
WORK="$CACHE/node/build"

# --- kubelet -------------------------------------------------------------------------------------
k8s_module "$WORK/kubelet-${K8S_VERSION}" node-monitor.local/kubelet \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler
log "building kubelet and kube-scheduler ${K8S_VERSION}"
( cd "$WORK/kubelet-${K8S_VERSION}" && CGO_ENABLED=0 go build -trimpath -ldflags "$(k8s_ldflags)" \
    -o "$OUT.tmp/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler >&2 )

# --- pause: the kubelet's own source, from the same module ---------------------------------------
k8s_dir=$(cd "$WORK/kubelet-${K8S_VERSION}" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
pause_c="$k8s_dir/build/pause/linux/pause.c"
[[ -f "$pause_c" ]] || { log "no $pause_c in the k8s.io/kubernetes module"; exit 1; }
log "building pause from $pause_c"
cc -Os -Wall -Werror -static -DVERSION="node-monitor-${K8S_VERSION}" -o "$OUT.tmp/pause" "$pause_c"
strip "$OUT.tmp/pause"

# --- containerd, ctr, containerd-shim-runc-v2 ----------------------------------------------------
cd_dir="$WORK/containerd-${CONTAINERD_VERSION}"
mkdir -p "$cd_dir"
(
  cd "$cd_dir"
  printf 'module node-monitor.local/containerd\n\ngo 1.26\n' > go.mod
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/containerd/containerd/v2/cmd/containerd"\n\t_ "github.com/containerd/containerd/v2/cmd/ctr"\n\t_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"\n)\n' > tools.go
  go mod edit -require="github.com/containerd/containerd/v2@${CONTAINERD_VERSION}"
  GOFLAGS=-mod=mod go mod tidy >&2
  log "building containerd ${CONTAINERD_VERSION}"
  CGO_ENABLED=0 go build -tags "no_btrfs no_devmapper" -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}" \
    -o "$OUT.tmp/" github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/ctr github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 >&2
)

rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo "$OUT"
