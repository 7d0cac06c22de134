#!/usr/bin/env bash
# Build Argo Workflows' workflow-controller, argoexec and the argo CLI once per version and
# Go version, and print the directory that holds them, with Argo's CRDs (crds/) and the
# executor's Role (executor-role.yaml). The Argo tests' fixture and the
# Makefile call this; nothing else builds them.
#
# The source is the module github.com/argoproj/argo-workflows/v4 from the Go module proxy,
# copied out of the (read-only) module cache and mended in two places: the CLI embeds
# ui/dist/app, where a placeholder page stands in for the UI, which the tests do not use (as
# Argo's own Makefile does when the UI is not built); and a file that the module's zip lacks
# is restored (below).
set -euo pipefail
ARGO_VERSION="${ARGO_VERSION:-v4.1.4}"
GO="${GO:-$(command -v go || true)}"
if [ -z "$GO" ] && [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; fi
if [ -z "$GO" ]; then
  echo "error: the Go toolchain is needed to build Argo Workflows (https://go.dev/dl/)" >&2
  exit 127
fi
module=github.com/argoproj/argo-workflows/v4
key="$ARGO_VERSION-$(sha256sum "$0" | cut -c1-8)-$("$GO" env GOVERSION)"
root="${ELASTIC_STEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastic-step}/argo"
cache="$root/$key"
if [ ! -x "$cache/argo" ]; then
  echo "building Argo Workflows $ARGO_VERSION into $cache (cold: about 4 minutes on 2 cores; then cached)" >&2
  start=$(date +%s)
  mkdir -p "$root"
  exec 9>"$root/.lock"
  flock 9
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  moddir="$(cd "$work" && "$GO" mod download -json "$module@$ARGO_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -d "$moddir" ] || { echo "error: go mod download $module@$ARGO_VERSION failed" >&2; exit 1; }
  src="$root-src/$ARGO_VERSION"  # a fixed path, so that the build cache serves it next time
  rm -rf "$src" && mkdir -p "$(dirname "$src")"
  cp -r "$moddir" "$src" && chmod -R u+w "$src"
  mkdir -p "$src/ui/dist/app" && echo "Argo's UI is not built here" > "$src/ui/dist/app/index.html"
  # In Argo's repository signal_linux.go is a symbolic link to signal_darwin.go; module zips
  # drop links, and argoexec does not compile without it.
  osspecific="$src/workflow/executor/osspecific"
  [ -e "$osspecific/signal_linux.go" ] || cp "$osspecific/signal_darwin.go" "$osspecific/signal_linux.go"
  ldflags="-s -w -X $module.version=$ARGO_VERSION -X $module.gitTag=$ARGO_VERSION"
  mkdir -p "$work/bin"
  (cd "$src" && GOFLAGS="-tags=kubernetes_protomessage_one_more_release" CGO_ENABLED=0 \
    nice -n "${BUILD_NICE:-10}" "$GO" build -ldflags="$ldflags" -o "$work/bin/" \
    ./cmd/workflow-controller ./cmd/argoexec ./cmd/argo)
  rm -rf "$cache" && mkdir -p "$cache/crds"
  # What an install applies besides the binaries: the CRDs (the minimal ones, as Argo's
  # quick start installs them) and the emissary executor's Role.
  cp "$src"/manifests/base/crds/minimal/argoproj.io_*.yaml "$cache/crds/"
  cp "$src/manifests/quick-start/base/executor/emissary/executor-role.yaml" "$cache/"
  mv "$work/bin/"* "$cache/"
  echo "built in $(( $(date +%s) - start ))s" >&2
  ls -1dt "$root"/*/ 2>/dev/null | tail -n +3 | xargs -r rm -rf
fi
touch "$cache"  # marks it recently used
echo "$cache"
