#!/usr/bin/env bash
# Install the tools the chart tests use, into <repo>/.cache/bin, from the Go module proxy (no Docker, no
# curl | sh):
#   helm       helm.sh/helm/v3 at HELM_VERSION, for `helm lint` and `helm template`;
#   kubecheck     deploy/helm/kubecheck: decodes rendered manifests strictly into the k8s.io/api types;
#   composecheck  deploy/composecheck: loads deploy/compose.yaml with the Compose Specification's loader;
#   rulecheck     deploy/helm/rulecheck: the chart's PrometheusRule and the dashboard's PromQL through
#                 Prometheus' own rule and PromQL parsers (what `promtool check rules` runs, without building
#                 promtool and its service discovery).
# Idempotent: each tool is rebuilt only when its version or sources change (a stamp file records them); Go's
# module and build caches make a rebuild fast. The first helm build takes a few minutes on 2 cores.
#
#   deploy/helm/install-helm.sh
#   HELM_VERSION=v3.x.y deploy/helm/install-helm.sh
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN_DIR="$REPO/.cache/bin"

command -v go >/dev/null || { echo "install-helm: go is needed (Go module proxy build)" >&2; exit 1; }
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
export CGO_ENABLED=0
mkdir -p "$BIN_DIR"

up_to_date() {  # up_to_date TOOL WANT: the binary exists and was built from WANT
  [[ -x "$BIN_DIR/$1" && -f "$BIN_DIR/$1.stamp" && "$(cat "$BIN_DIR/$1.stamp")" == "$2" ]]
}

install_helm() {
  # helm's release builds stamp the version and the Kubernetes version that `helm template` and `helm lint`
  # assume (from the k8s.io/client-go it is built with); a bare `go install` would assume Kubernetes 1.20.
  local gomod k8s_minor want ldflags pkg
  gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
  k8s_minor="$(sed -n 's/^[[:space:]]*k8s\.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$gomod" | head -n1)"
  [[ -n "$k8s_minor" ]] || { echo "install-helm: no k8s.io/client-go version in $gomod" >&2; exit 1; }
  want="helm $HELM_VERSION kube 1.$k8s_minor"
  if up_to_date helm "$want"; then
    echo "$want already at $BIN_DIR/helm"
    return
  fi
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$k8s_minor"
  done
  echo "building $want from the Go module proxy into $BIN_DIR"
  GOBIN="$BIN_DIR" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  "$BIN_DIR/helm" version --short
  echo "$want" > "$BIN_DIR/helm.stamp"
}

install_checker() {  # install_checker NAME SOURCE_DIR: a small Go program of this repository
  local name="$1" src="$2" want
  want="$name $(cat "$src/main.go" "$src/go.mod" "$src/go.sum" | sha256sum | cut -c1-16) $(go env GOVERSION)"
  if up_to_date "$name" "$want"; then
    echo "$name already at $BIN_DIR/$name"
    return
  fi
  echo "building $name into $BIN_DIR"
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/$name" .)
  echo "$want" > "$BIN_DIR/$name.stamp"
}

install_helm
install_checker kubecheck "$REPO/deploy/helm/kubecheck"
install_checker composecheck "$REPO/deploy/composecheck"
install_checker rulecheck "$REPO/deploy/helm/rulecheck"
