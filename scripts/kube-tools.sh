#!/usr/bin/env bash
# Builds the Kubernetes test tools from the Go module proxy: etcd, the control plane
# (kube-apiserver, kube-controller-manager, kube-scheduler), the kubelet (a node in the test VM),
# helm and kubeconform, into ~/.cache/palisade/kube/bin (or
# $PALISADE_KUBE_BIN). A tool already built at the pinned version is kept, so only a cold cache
# pays for the builds.
set -euo pipefail

kube_version=v1.33.13
etcd_version=v3.5.21
helm_version=v4.3.1
kubeconform_version=v0.8.0

bin=${PALISADE_KUBE_BIN:-$HOME/.cache/palisade/kube/bin}
mkdir -p "$bin"
# A Go from go.dev, or Debian's (scripts/install.sh), which fetches the toolchain each module
# asks for.
export PATH=/usr/local/go/bin:$PATH CGO_ENABLED=0 GOTOOLCHAIN=auto
# The build cache of kube-apiserver alone is ~2 GB and is of no use once the binary exists.
GOCACHE=$(mktemp -d)
export GOCACHE
trap 'chmod -R u+w "$GOCACHE"; rm -rf "$GOCACHE"' EXIT

# fresh NAME VERSION: true when $bin/NAME is missing or was built at another version.
fresh() { [ "$(cat "$bin/$1.version" 2>/dev/null)" != "$2" ]; }
built() { echo "$2" > "$bin/$1.version"; echo "kube-tools: built $1 $2" >&2; }

# etcd and k8s.io/kubernetes cannot be `go install`ed (their go.mod has replace directives):
# each is built from a scratch module that requires it.
scratch_module() {
  local dir=$1 requirement=$2 import=$3
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && go mod init palisade.dev/kube-tools >/dev/null 2>&1 \
    && printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$import" > tools.go \
    && go mod edit -require "$requirement")
}

if fresh etcd "$etcd_version"; then
  work=$(mktemp -d)
  scratch_module "$work" "go.etcd.io/etcd/server/v3@$etcd_version" go.etcd.io/etcd/server/v3
  (cd "$work" && go mod tidy && go build -trimpath -o "$bin/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "$work"
  built etcd "$etcd_version"
fi

# The Kubernetes binaries, built together (one build shares their packages).
kube_binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
stale=()
for binary in "${kube_binaries[@]}"; do
  fresh "$binary" "$kube_version" && stale+=("$binary")
done
if [ ${#stale[@]} -gt 0 ]; then
  work=$(mktemp -d)
  scratch_module "$work" "k8s.io/kubernetes@$kube_version" k8s.io/kubernetes/cmd/kube-apiserver
  # k8s.io/kubernetes replaces its staging modules with local directories; the published
  # modules of the same release (v0.X.Y for v1.X.Y) stand in for them.
  gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$kube_version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  staging_version=v0.${kube_version#v1.}
  for module in $(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*|\1|p' "$gomod"); do
    (cd "$work" && go mod edit -replace "$module=$module@$staging_version")
  done
  version_flags=""
  for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_flags+=" -X $package.gitVersion=$kube_version -X $package.gitMajor=1"
    version_flags+=" -X $package.gitMinor=$(echo "$kube_version" | cut -d. -f2) -X $package.gitTreeState=clean"
  done
  packages=()
  for binary in "${stale[@]}"; do
    packages+=("k8s.io/kubernetes/cmd/$binary")
    printf 'import _ "k8s.io/kubernetes/cmd/%s"\n' "$binary" >> "$work/tools.go"
  done
  (cd "$work" && go mod tidy \
    && go build -trimpath -ldflags "$version_flags" -o "$bin/" "${packages[@]}")
  rm -rf "$work"
  for binary in "${stale[@]}"; do built "$binary" "$kube_version"; done
fi

if fresh helm "$helm_version"; then
  GOBIN=$bin go install "helm.sh/helm/v4/cmd/helm@$helm_version"
  built helm "$helm_version"
fi

if fresh kubeconform "$kubeconform_version"; then
  GOBIN=$bin go install "github.com/yannh/kubeconform/cmd/kubeconform@$kubeconform_version"
  built kubeconform "$kubeconform_version"
fi
