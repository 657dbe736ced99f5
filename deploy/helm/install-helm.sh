#!/usr/bin/env bash
# Install the helm binary used by the chart tests into <repo>/.cache/bin/helm, from the Go module proxy
# (no Docker, no curl | sh). Idempotent: a second run with the same version returns at once; Go's build and
# module caches make a rebuild after a version bump fast.
#
#   deploy/helm/install-helm.sh            # installs HELM_VERSION (default below)
#   HELM_VERSION=v3.x.y deploy/helm/install-helm.sh
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN_DIR="$REPO/.cache/bin"
HELM="$BIN_DIR/helm"
STAMP="$BIN_DIR/helm.stamp"

command -v go >/dev/null || { echo "install-helm: go is needed (Go module proxy build)" >&2; exit 1; }
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

# helm's release builds stamp the version and the Kubernetes version that `helm template` and `helm lint`
# assume (from the k8s.io/client-go it is built with); a bare `go install` would assume Kubernetes 1.20.
gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
k8s_minor="$(sed -n 's/^[[:space:]]*k8s\.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$gomod" | head -n1)"
[[ -n "$k8s_minor" ]] || { echo "install-helm: cannot read the k8s.io/client-go version from $gomod" >&2; exit 1; }
want="helm $HELM_VERSION kube 1.$k8s_minor"

if [[ -x "$HELM" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "$want already at $HELM"
  exit 0
fi

mkdir -p "$BIN_DIR"
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in pkg/lint/rules pkg/chartutil; do
  LDFLAGS+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$k8s_minor"
done
echo "building $want from the Go module proxy into $BIN_DIR (the first build takes minutes)"
GOBIN="$BIN_DIR" CGO_ENABLED=0 go install -trimpath -ldflags "$LDFLAGS" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
"$HELM" version --short
echo "$want" > "$STAMP"
