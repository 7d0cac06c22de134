#!/usr/bin/env bash
# Build the test control plane once per source hash and print the binary's path.
# The Makefile and the pytest fixture both call this; nothing else builds it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
GO="${GO:-$(command -v go || true)}"
if [ -z "$GO" ] && [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; fi
if [ -z "$GO" ]; then
  echo "error: the Go toolchain is needed to build the test control plane (https://go.dev/dl/)" >&2
  exit 127
fi
sources="$(cd "$here" && find . -name '*.go' -o -name go.mod -o -name go.sum | LC_ALL=C sort)"
key="$(cd "$here" && cat $sources | sha256sum | cut -c1-16)-$("$GO" env GOVERSION)"
root="${ELASTIC_STEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastic-step}/cluster"
cache="$root/$key"
bin="$cache/elastic-step-cluster"
if [ ! -x "$bin" ]; then
  echo "building the Kubernetes control plane into $cache (cold: tens of minutes on 2 cores; then cached)" >&2
  mkdir -p "$cache"
  start=$(date +%s)
  # Module and build caches stay in Go's default places (~/go/pkg/mod, ~/.cache/go-build).
  (cd "$here" && nice -n "${BUILD_NICE:-10}" "$GO" build -ldflags="-s -w" -o "$bin.tmp.$$" .)
  mv "$bin.tmp.$$" "$bin"
  echo "built in $(( $(date +%s) - start ))s" >&2
  # Binaries of older sources are dead weight (about 120 MB each).
  find "$root" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
fi
echo "$bin"
