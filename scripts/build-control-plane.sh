#!/usr/bin/env bash
# Builds etcd, kube-apiserver and kube-controller-manager from Go modules, once, and caches the
# binaries keyed by version. Prints the directory that holds them (usable as KUBEBUILDER_ASSETS).
#
# k8s.io/kubernetes requires its staging modules at v0.0.0 (resolved by `replace` to ./staging in its
# own tree); a module that imports it must replace each of them with the published version that
# matches the release (v1.X.Y <-> v0.X.Y). The list is read from the release's own go.mod so it
# stays right across versions.
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
mkdir -p "$WORK/k8s" "$WORK/etcd" "$OUT.tmp"
staging_version="v0.${K8S_VERSION#v1.}"

# --- kube-apiserver and kube-controller-manager -------------------------------------------------
cd "$WORK/k8s"
cat > go.mod <<MOD
module node-monitor.local/control-plane

go 1.26
MOD
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
GO
log "resolving k8s.io/kubernetes@${K8S_VERSION}"
go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" >/dev/null
modfile="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/${K8S_VERSION}.mod"
# Every "k8s.io/x => ./staging/src/k8s.io/x" line names a staging module.
staging=$(sed -n 's#^\s*\(k8s.io/[^ ]*\) => ./staging/src/.*#\1#p' "$modfile")
[[ -n "$staging" ]] || { log "no staging modules found in $modfile"; exit 1; }
go mod edit -require="k8s.io/kubernetes@${K8S_VERSION}"
for m in $staging; do
  go mod edit -replace="$m=$m@${staging_version}"
done
log "go mod tidy ($(echo "$staging" | wc -w) staging modules at ${staging_version})"
GOFLAGS=-mod=mod go mod tidy >&2
log "building kube-apiserver and kube-controller-manager (several minutes on 2 cores)"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${K8S_VERSION#v1.}" \
  -o "$OUT.tmp/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager >&2

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
