"""The Kubernetes backend passes the Backend contract (tests/contracts/backend_contract.py),
on the test control plane, as the elastic-step-master ServiceAccount, in a namespace where
Pod Security admission enforces the ``restricted`` standard on every pod it makes."""

from __future__ import annotations

import sys

import pytest
from backend_contract import BackendContract, BackendHarness
from kubernetes import client
from test_k8s_backend_support import (
    clean_namespace,
    make_backend,
    new_job_name,
    restricted_fixture,  # noqa: F401 - the fixture restricted
    start_master_pod,
)

from elastic_step.backends.kubernetes import KubernetesBackend


class KubernetesHarness(BackendHarness):
    start_timeout_s = 30.0

    def __init__(self, kubeconfig, namespace: str, master_pod: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.master_pod = master_pod
        self.job = new_job_name()
        self.backends: list[KubernetesBackend] = []

    def new_backend(self) -> KubernetesBackend:
        backend = make_backend(self.kubeconfig, self.namespace, self.job, self.master_pod)
        self.backends.append(backend)
        return backend

    def command(self, code: str) -> list[str]:
        return [sys.executable, "-c", code]

    def cleanup(self) -> None:
        backend = self.new_backend()
        backend.remove_job_objects()
        for b in self.backends:
            b.close()


@pytest.fixture
def harness(cluster, restricted):
    with cluster.admin() as api:
        master = start_master_pod(client.CoreV1Api(api), restricted.name)
    harness = KubernetesHarness(restricted.master_kubeconfig, restricted.name, master)
    yield harness
    harness.cleanup()
    clean_namespace(cluster, restricted.name)


class TestKubernetesBackendContract(BackendContract):
    pass
