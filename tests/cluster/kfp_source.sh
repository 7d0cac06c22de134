# Kubeflow Pipelines' release tarball, which build_kfp.sh and build_kfp_ui.sh build from
# (sourced by both). The KFP Go module is not on the module proxy: the source is the
# release's tarball in ../shared/upstream/ beside the checkout (KFP_SOURCE overrides),
# checked by its sha256.
KFP_VERSION=2.17.0
KFP_SHA256=b08772058cd0a9e9e113018300c51222abca0356b7df6b398a58bdc8b1353640
KFP_COMMIT=4a3592cb2dd0a91a4652ab93893ec8beda1f3158  # the tag's commit (the UI reports it)
KFP_SOURCE="${KFP_SOURCE:-$(dirname "${BASH_SOURCE[0]}")/../../../shared/upstream/kubeflow-pipelines-$KFP_VERSION.tar.gz}"

# Exits with a message unless KFP_SOURCE is the release's tarball.
check_kfp_source() {
  if [ ! -f "$KFP_SOURCE" ]; then
    echo "error: $KFP_SOURCE not found (KFP $KFP_VERSION's source; set KFP_SOURCE)" >&2
    exit 1
  fi
  echo "$KFP_SHA256  $KFP_SOURCE" | sha256sum --check --quiet - || {
    echo "error: $KFP_SOURCE is not KFP $KFP_VERSION's release tarball (sha256 differs)" >&2
    exit 1
  }
}
