#!/usr/bin/env bash
# Build a Python virtual environment with ML Metadata 1.17.1 (MLMD's store as a library, with
# its gRPC service's Python stubs) once per this script, mlmd-requirements.txt and Python
# version, and print its directory. mlmd_server.py runs in it as the MLMD gRPC server that
# KFP's driver, launcher and UI talk to; the KFP tests' fixture (mlmd.py) calls this.
#
# No C++ MLMD server is packaged, and the wheel is built for CPython 3.11 only, hence
# python3.11 ($PYTHON overrides). Exactly the pinned set is installed (--no-deps, wheels
# only); pip and setuptools are removed afterwards, so that the venv holds nothing else and
# no script in it names the temporary directory it was built in.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
requirements="$here/mlmd-requirements.txt"
PYTHON="${PYTHON:-$(command -v python3.11 || true)}"
if [ -z "$PYTHON" ] && [ -x /usr/bin/python3.11 ]; then PYTHON=/usr/bin/python3.11; fi
if [ -z "$PYTHON" ]; then
  echo "error: python3.11 is needed to build ML Metadata's venv (its wheel is cp311 only)" >&2
  exit 127
fi
pyversion="$("$PYTHON" -c 'import platform; print(platform.python_version())')"
key="$(cat "$0" "$requirements" | sha256sum | cut -c1-16)-py$pyversion"
root="${ELASTIC_STEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastic-step}/mlmd"
cache="$root/$key"
if [ ! -x "$cache/bin/python" ]; then
  mkdir -p "$root"
  exec 9>"$root/.lock"
  flock 9
fi
if [ ! -x "$cache/bin/python" ]; then  # again: another build may have made it meanwhile
  echo "building ML Metadata's venv into $cache (cold: under a minute; then cached)" >&2
  start=$(date +%s)
  # A hidden sibling (the pruning below skips it) on the same filesystem, so mv is a rename.
  work="$(mktemp -d "$root/.build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  "$PYTHON" -m venv "$work/venv"
  pip=("$work/venv/bin/python" -m pip --disable-pip-version-check --no-input --quiet)
  nice -n "${BUILD_NICE:-10}" "${pip[@]}" install --no-deps --only-binary=:all: -r "$requirements"
  "${pip[@]}" check
  "${pip[@]}" uninstall --yes pip setuptools
  rm -f "$work/venv/bin/"[Aa]ctivate*
  "$work/venv/bin/python" -c 'import grpc, ml_metadata.metadata_store'
  rm -rf "$cache"
  mv "$work/venv" "$cache"
  echo "built in $(( $(date +%s) - start ))s" >&2
  ls -1dt "$root"/*/ 2>/dev/null | tail -n +3 | xargs -r rm -rf
fi
touch "$cache"  # marks it recently used
echo "$cache"
