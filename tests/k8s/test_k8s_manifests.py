"""Every object in manifests/ passes the real apiserver's validation (server-side dry run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import utils

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
OBJECT_FILES = sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")


def test_the_kustomization_lists_the_shared_manifests() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {
        "rbac.yaml",
        "priority-classes.yaml",
        "network-policy.yaml",
        "admission-policy.yaml",
    }
    assert all((MANIFESTS / name).is_file() for name in listed)


@pytest.mark.parametrize("path", OBJECT_FILES, ids=lambda p: p.name)
def test_each_manifest_is_valid_on_the_apiserver(cluster, admin_api, path: Path) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert documents, f"{path.name} holds no object"
    for document in documents:
        # The test cluster already holds the shared manifests: a new name, so that the
        # dry run validates the object instead of answering "already exists".
        document["metadata"]["name"] += "-dry-run"
        # Creates nothing: the apiserver validates and admits the object, then drops it.
        utils.create_from_dict(admin_api, document, namespace=cluster.namespace, dry_run="All")
