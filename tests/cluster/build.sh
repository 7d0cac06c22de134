#!/usr/bin/env bash
# Build the test control plane once per source hash and print the binary's path.
# The Makefile and the pytest fixture both call this; nothing else builds it.
#
# patches/kubernetes-*.patch are applied to a copy of k8s.io/kubernetes that replaces the
# module for this build only (go build -modfile); the module cache itself is never modified.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
GO="${GO:-$(command -v go || true)}"
if [ -z "$GO" ] && [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; fi
if [ -z "$GO" ]; then
  echo "error: the Go toolchain is needed to build the test control plane (https://go.dev/dl/)" >&2
  exit 127
fi
sources="$(cd "$here" && find . -name '*.go' -o -name go.mod -o -name go.sum -o -name '*.patch' | LC_ALL=C sort)"
key="$(cd "$here" && cat $sources | sha256sum | cut -c1-16)-$("$GO" env GOVERSION)"
root="${ELASTIC_STEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastic-step}/cluster"
cache="$root/$key"
bin="$cache/elastic-step-cluster"
if [ ! -x "$bin" ]; then
  echo "building the Kubernetes control plane into $cache (cold: tens of minutes on 2 cores; then cached)" >&2
  mkdir -p "$cache"
  start=$(date +%s)
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  # Module and build caches stay in Go's default places (~/go/pkg/mod, ~/.cache/go-build).
  (cd "$here" && "$GO" mod download k8s.io/kubernetes)
  moddir="$(cd "$here" && "$GO" list -m -f '{{.Dir}}' k8s.io/kubernetes)"
  cp "$here/go.mod" "$here/go.sum" "$work/"
  if compgen -G "$here/patches/kubernetes-*.patch" >/dev/null; then
    # Go refuses overlays of files in the module cache, so k8s.io/kubernetes is replaced by
    # a hard-linked copy (a plain copy across filesystems) with the patched files rewritten.
    # Its path is fixed so that the build cache serves every unchanged package next time.
    mkdir -p "$root-src"
    exec 9>"$root-src/.lock"
    flock 9
    src="$root-src/$(basename "$moddir")"
    rm -rf "$src"
    cp -al "$moddir" "$src" 2>/dev/null || { rm -rf "$src"; cp -a "$moddir" "$src"; }
    # Directories only: the files may be the module cache's own (hard links).
    find "$src" -type d -exec chmod u+w {} +
    for p in "$here"/patches/kubernetes-*.patch; do
      for f in $(sed -n 's/^+++ \([^[:space:]]*\).*/\1/p' "$p"); do
        cp --remove-destination "$moddir/$f" "$src/$f"  # own inode: never the cache's
        chmod u+w "$src/$f"
      done
      patch -p0 -d "$src" --forward --batch --quiet < "$p" || {
        echo "error: $p does not apply to $moddir" >&2
        exit 1
      }
    done
    (cd "$here" && "$GO" mod edit -modfile="$work/go.mod" -replace "k8s.io/kubernetes=$src")
  fi
  (cd "$here" && nice -n "${BUILD_NICE:-10}" "$GO" build -modfile="$work/go.mod" \
    -ldflags="-s -w" -o "$bin.tmp.$$" .)
  mv "$bin.tmp.$$" "$bin"
  echo "built in $(( $(date +%s) - start ))s" >&2
  # Binaries of other sources are about 120 MB each. Keep the three most recently used:
  # worktrees of different branches on one machine would otherwise delete each other's
  # binary and rebuild in turn.
  ls -1dt "$root"/*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
fi
touch "$cache"  # marks it recently used
echo "$bin"
