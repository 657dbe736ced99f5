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

if [[ -x "$HELM" ]] && "$HELM" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  echo "helm $HELM_VERSION already at $HELM"
  exit 0
fi

command -v go >/dev/null || { echo "install-helm: go is needed (Go module proxy build)" >&2; exit 1; }
mkdir -p "$BIN_DIR"
# The version string helm prints comes from ldflags; without them `helm version` says v3.x-dev-ish defaults.
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
echo "building helm $HELM_VERSION from the Go module proxy into $BIN_DIR (first build takes minutes)"
GOBIN="$BIN_DIR" CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false" \
  go install -trimpath -ldflags "$LDFLAGS" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
"$HELM" version --short
