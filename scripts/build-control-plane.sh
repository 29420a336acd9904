#!/usr/bin/env bash
# Builds etcd, kube-apiserver and kube-controller-manager from Go modules, once, and caches the
# binaries keyed by version. Prints the directory that holds them (usable as KUBEBUILDER_ASSETS).
# The Go module that imports k8s.io/kubernetes is made by scripts/lib/k8s-module.sh.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE="${NODE_MONITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/node-monitor}"
OUT="$CACHE/control-plane/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}"

if [[ -x "$OUT/kube-apiserver" && -x "$OUT/kube-controller-manager" && -x "$OUT/etcd" ]]; then
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-control-plane: go is not installed" >&2; exit 1; }
log() { echo "build-control-plane: $*" >&2; }

WORK="$CACHE/control-plane/build-${K8S_VERSION}"
mkdir -p "$WORK/etcd" "$OUT.tmp"
cd "$(dirname "$0")/.."
# shellcheck source=lib/k8s-module.sh
source scripts/lib/k8s-module.sh

# --- kube-apiserver and kube-controller-manager -------------------------------------------------
k8s_module "$WORK/k8s" node-monitor.local/control-plane \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
log "building kube-apiserver and kube-controller-manager (several minutes on 2 cores)"
( cd "$WORK/k8s" && CGO_ENABLED=0 go build -trimpath -ldflags "$(k8s_ldflags)" \
    -o "$OUT.tmp/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager >&2 )

# --- etcd ----------------------------------------------------------------------------------------
cd "$WORK/etcd"
cat > go.mod <<MOD
module node-monitor.local/etcd

go 1.26
MOD
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
go mod edit -require="go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
GOFLAGS=-mod=mod go mod tidy >&2
log "building etcd ${ETCD_VERSION}"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT.tmp/etcd" go.etcd.io/etcd/server/v3 >&2

rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "$OUT"
