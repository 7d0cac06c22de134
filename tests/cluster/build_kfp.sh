#!/usr/bin/env bash
# Build Kubeflow Pipelines 2.17.0's backend once per Go version, and print the directory
# that holds it: the API server (`apiserver`), the persistence agent (`persistence-agent`),
# the v2 driver (`driver`) and launcher (`launcher-v2`), with what an install applies beside
# them (the ScheduledWorkflow CRD; the Roles of the pipelines' ServiceAccount and of the
# persistence agent; the API server's config.json without its MLflow plugin).
# The KFP tests' fixture and the Makefile call this; nothing else builds them.
#
# The source is the release's tarball (kfp_source.sh). Every module its go.mod requires
# comes from the proxy. The API server needs cgo (its
# sqlite3 driver), so a C compiler too.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/kfp_source.sh"
GO="${GO:-$(command -v go || true)}"
if [ -z "$GO" ] && [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; fi
if [ -z "$GO" ]; then
  echo "error: the Go toolchain is needed to build Kubeflow Pipelines (https://go.dev/dl/)" >&2
  exit 127
fi
key="$KFP_VERSION-$(cat "$0" "$here/kfp_source.sh" | sha256sum | cut -c1-8)-$("$GO" env GOVERSION)"
root="${ELASTIC_STEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastic-step}/kfp"
cache="$root/$key"
if [ ! -x "$cache/apiserver" ]; then
  check_kfp_source
  echo "building Kubeflow Pipelines $KFP_VERSION into $cache (cold: about 5 minutes on 2 cores; then cached)" >&2
  start=$(date +%s)
  mkdir -p "$root"
  exec 9>"$root/.lock"
  flock 9
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  src="$root-src/$KFP_VERSION"  # a fixed path, so that the build cache serves it next time
  rm -rf "$src" && mkdir -p "$src"
  tar -xzf "$KFP_SOURCE" -C "$src" --strip-components=1
  mkdir -p "$work/bin"
  (cd "$src" && nice -n "${BUILD_NICE:-10}" "$GO" build -ldflags="-s -w" \
    -o "$work/bin/" ./backend/src/apiserver ./backend/src/agent/persistence \
    ./backend/src/v2/cmd/driver ./backend/src/v2/cmd/launcher-v2)
  mv "$work/bin/persistence" "$work/bin/persistence-agent"
  rm -rf "$cache" && mkdir -p "$cache"
  manifests="$src/manifests/kustomize/base/pipeline"
  cp "$manifests/cluster-scoped/scheduled-workflow-crd.yaml" \
    "$manifests/pipeline-runner-role.yaml" "$manifests/ml-pipeline-persistenceagent-role.yaml" \
    "$cache/"
  # The release's config.json enables an MLflow plugin that every run creation would try to
  # reach; the tests run without it.
  python3 - "$src/backend/src/apiserver/config/config.json" "$cache/config.json" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
config.pop("plugins", None)
json.dump(config, open(sys.argv[2], "w"), indent=2)
EOF
  mv "$work/bin/"* "$cache/"
  echo "built in $(( $(date +%s) - start ))s" >&2
  ls -1dt "$root"/*/ 2>/dev/null | tail -n +3 | xargs -r rm -rf
fi
touch "$cache"  # marks it recently used
echo "$cache"
