# Sourced by the build scripts. k8s_module DIR MODULE PKG...: makes DIR a Go module that imports the
# k8s.io/kubernetes commands PKG... at $K8S_VERSION, ready for `go build`.
#
# k8s.io/kubernetes requires its staging modules at v0.0.0 (resolved by `replace` to ./staging in its
# own tree); a module that imports it must replace each of them with the published version that
# matches the release (v1.X.Y <-> v0.X.Y). The list is read from the release's own go.mod so it
# stays right across versions.
k8s_module() {
  local dir=$1 module=$2; shift 2
  local staging_version="v0.${K8S_VERSION#v1.}" modfile staging m
  mkdir -p "$dir"
  (
    cd "$dir"
    printf 'module %s\n\ngo 1.26\n' "$module" > go.mod
    {
      printf '//go:build tools\n\npackage tools\n\nimport (\n'
      for m in "$@"; do printf '\t_ "%s"\n' "$m"; done
      printf ')\n'
    } > tools.go
    echo "k8s-module: resolving k8s.io/kubernetes@${K8S_VERSION}" >&2
    go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" >/dev/null
    modfile="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/${K8S_VERSION}.mod"
    # Every "k8s.io/x => ./staging/src/k8s.io/x" line names a staging module.
    staging=$(sed -n 's#^\s*\(k8s.io/[^ ]*\) => ./staging/src/.*#\1#p' "$modfile")
    [[ -n "$staging" ]] || { echo "k8s-module: no staging modules found in $modfile" >&2; exit 1; }
    go mod edit -require="k8s.io/kubernetes@${K8S_VERSION}"
    for m in $staging; do
      go mod edit -replace="$m=$m@${staging_version}"
    done
    echo "k8s-module: go mod tidy ($(echo "$staging" | wc -w) staging modules at ${staging_version})" >&2
    GOFLAGS=-mod=mod go mod tidy >&2
  )
}

# The -ldflags that stamp a Kubernetes binary with its version.
k8s_ldflags() {
  echo "-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "${K8S_VERSION#v1.}" | cut -d. -f1)"
}
