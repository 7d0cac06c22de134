"""elastic_step/kube/client.py: the one module that constructs Kubernetes API clients, where it
finds its configuration and namespace; and the kube package's place on the ground floor."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.config import incluster_config

from elastic_step.errors import InputError
from elastic_step.kube import client as kube_client
from elastic_step.kube.client import (
    address_toward,
    context_namespace,
    default_namespace,
    load_api_client,
)

PACKAGE = Path(__file__).resolve().parents[2] / "elastic_step"
#: What constructs an API client, or loads the configuration one is made from.
CONSTRUCTS = re.compile(
    r"\bApiClient\(|load_incluster_config|load_kube_config|new_client_from_config"
)

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: NAMESPACE}}]
current-context: x
"""


def test_only_kube_client_constructs_api_clients() -> None:
    found = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if CONSTRUCTS.search(path.read_text())
    )
    assert found == ["elastic_step/kube/client.py"]


def test_the_kube_package_imports_only_errors_of_elastic_step() -> None:
    for path in (PACKAGE / "kube").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):  # lazy imports included
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                if name.startswith("elastic_step."):
                    assert name == "elastic_step.errors" or name.startswith("elastic_step.kube")


@pytest.fixture
def outside_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube_client, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "none"))
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.replace("NAMESPACE", "ml"))
    return path


def test_a_named_kubeconfig_gives_the_client_and_its_context_namespace(outside_a_pod) -> None:
    api_client, namespace, in_cluster = load_api_client(str(outside_a_pod))
    assert isinstance(api_client, client.ApiClient)
    assert api_client.configuration.host == "https://127.0.0.1:6443"
    assert (namespace, in_cluster) == ("ml", False)
    assert address_toward(api_client) == "127.0.0.1"


def test_kubeconfig_env_is_read_at_each_call(
    outside_a_pod, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.write_text(KUBECONFIG.replace("NAMESPACE", "elsewhere"))
    monkeypatch.setenv("KUBECONFIG", str(outside_a_pod))
    assert load_api_client(None)[1] == "ml"
    monkeypatch.setenv("KUBECONFIG", str(other))
    assert load_api_client(None)[1] == "elsewhere"
    assert context_namespace() == default_namespace() == "elsewhere"
    assert default_namespace(str(outside_a_pod)) == "ml"


def test_the_pod_namespace_comes_first(
    outside_a_pod, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    own = tmp_path / "namespace"
    own.write_text("team-a\n")
    monkeypatch.setattr(kube_client, "SERVICE_ACCOUNT_NAMESPACE", str(own))
    assert default_namespace(str(outside_a_pod)) == "team-a"


def test_no_configuration_is_one_input_error(
    outside_a_pod, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(InputError, match=r"cannot load the kubeconfig .*missing"):
        load_api_client(str(tmp_path / "missing"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    with pytest.raises(InputError, match="cannot use the in-cluster Kubernetes configuration"):
        load_api_client(None)  # no ServiceAccount token here
