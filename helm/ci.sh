#!/usr/bin/env bash
# Offline validation of the telha-cascade Helm chart. Needs only the Go
# toolchain: Helm, the Kubernetes types and the PromQL parser come from the
# Go module proxy through helm/go.mod (a separate module, so none of it
# enters the worker's go.mod).
#
#   bash helm/ci.sh        # from the repository root (or from anywhere)
#
# Steps: helm lint --strict (chart defaults and every ci/*-values.yaml),
# helm template of the same into a temporary directory, then `go test` in
# helm/, which strictly decodes every rendered object and checks the
# chart's contracts (see helm/doc.go). Exits non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

chart=telha-cascade
release=telha
namespace=graph

start=$(date +%s)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "== helm/ci.sh: $(go version)"

# Build the Helm CLI from helm/go.mod's tool directive (pinned version,
# checked against go.sum) once per machine: the binary is kept in the user's
# cache under a key of go.mod, go.sum and the Go version, so a second run
# (and CI on the same machine) reuses it instead of building for minutes.
# TELHA_HELM_CACHE moves the cache; deleting it forces a rebuild.
key="$(cat go.mod go.sum <(go version) | sha256sum | cut -c1-16)"
cache="${TELHA_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/telha-cascade/helm}"
export HELM_BIN="$cache/helm-$key"
if [ -x "$HELM_BIN" ]; then
  echo "== helm (cached: $HELM_BIN)"
else
  echo "== build helm (go tool, pinned in helm/go.mod) into $HELM_BIN"
  mkdir -p "$cache"
  go build -o "$HELM_BIN.tmp.$$" helm.sh/helm/v4/cmd/helm
  mv "$HELM_BIN.tmp.$$" "$HELM_BIN"
fi
"$HELM_BIN" version --short

# Keep Helm's own state out of the user's home.
export HELM_CACHE_HOME="$tmp/helm/cache" HELM_CONFIG_HOME="$tmp/helm/config" HELM_DATA_HOME="$tmp/helm/data"

shopt -s nullglob
ci_values=("$chart"/ci/*-values.yaml)
if [ "${#ci_values[@]}" -eq 0 ]; then
  echo "no $chart/ci/*-values.yaml files" >&2
  exit 1
fi

echo "== helm lint --strict"
"$HELM_BIN" lint --strict "$chart" --namespace "$namespace"
for f in "${ci_values[@]}"; do
  echo "-- with $f"
  "$HELM_BIN" lint --strict "$chart" --namespace "$namespace" -f "$f"
done

echo "== helm template"
render_dir="$tmp/rendered"
mkdir -p "$render_dir"
"$HELM_BIN" template "$release" "./$chart" --namespace "$namespace" > "$render_dir/chart-defaults.yaml"
echo "-- chart defaults: $(grep -c '^kind:' "$render_dir/chart-defaults.yaml") objects"
for f in "${ci_values[@]}"; do
  name="$(basename "$f" -values.yaml)"
  "$HELM_BIN" template "$release" "./$chart" --namespace "$namespace" -f "$f" > "$render_dir/$name.yaml"
  echo "-- $f: $(grep -c '^kind:' "$render_dir/$name.yaml") objects"
done
export TELHA_RENDER_DIR="$render_dir"

echo "== container image (no engine: go-containerregistry, scratch base)"
go run ./cmd/build-image -repo .. -out "$tmp/telha-cascade.tar" \
  -version "$(git -C .. describe --tags --always --dirty 2>/dev/null || echo dev)" \
  -revision "$(git -C .. rev-parse HEAD 2>/dev/null || echo unknown)"
export TELHA_IMAGE_TAR="$tmp/telha-cascade.tar"

echo "== go vet (helm module)"
go vet ./...

echo "== go test (helm module)"
go test -count=1 ./...

echo "== helm/ci.sh: OK in $(( $(date +%s) - start ))s"
