"""Session fixture: a real Kubernetes control plane on 127.0.0.1 plus a process kubelet,
started by tests/cluster/local_cluster.py (see there; the benchmarks start it the same way).

Tests get an admin kubeconfig and one for the elastic-step-master ServiceAccount, bound to
the Role in manifests/rbac.yaml.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/cluster: local_cluster, which k8s_helpers imports too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from k8s_helpers import wait_for
from kubernetes import client
from local_cluster import Cluster, ClusterStartError, build_binary, start_cluster

_BINARY: Path | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    # A cold build takes many minutes; doing it here keeps it out of any test's timeout.
    global _BINARY
    try:
        _BINARY = build_binary()
    except ClusterStartError as err:
        pytest.exit(str(err), 1)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(
                start_cluster(
                    tmp_path_factory.mktemp("k8s"),
                    _BINARY,
                    # The tests hand pods files in their own directories, as a shared
                    # volume would.
                    host_paths=[tmp_path_factory.getbasetemp()],
                )
            )
        except ClusterStartError as err:
            pytest.fail(str(err))
        print(f"\nKubernetes control plane and kubelet ready in {time.monotonic() - started:.1f}s")
        yield cluster


@pytest.fixture
def admin_api(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = cluster.admin()
    yield api
    api.close()


@pytest.fixture
def sa_api(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = cluster.service_account()
    yield api
    api.close()


@pytest.fixture(autouse=True)
def _clean_namespace(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with no pods left over in the test namespace."""
    yield
    if "cluster" not in request.fixturenames:
        return
    cluster: Cluster = request.getfixturevalue("cluster")
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        core.delete_collection_namespaced_pod(cluster.namespace, grace_period_seconds=0)

        def empty() -> bool:
            return not core.list_namespaced_pod(cluster.namespace).items

        wait_for("the test namespace to be empty", empty, timeout=60)
