"""The elastic-step-master Role allows what the master needs and nothing else."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException


def _status(call) -> int:
    try:
        call()
    except ApiException as err:
        return err.status
    return 200


def test_role_allows_what_the_master_needs(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    ns = cluster.namespace
    assert _status(lambda: core.list_namespaced_pod(ns)) == 200
    assert _status(lambda: core.list_namespaced_event(ns)) == 200
    service = {
        "metadata": {"name": "ps-0", "labels": {"app.kubernetes.io/managed-by": "elastic-step"}},
        "spec": {"clusterIP": "None", "ports": [{"port": 2222}], "selector": {"app": "ps"}},
    }
    core.create_namespaced_service(ns, service)
    assert core.read_namespaced_service("ps-0", ns).spec.cluster_ip == "None"
    core.delete_namespaced_service("ps-0", ns)


@pytest.mark.parametrize(
    "request_",
    [
        "list secrets",
        "read secret in another namespace",
        "list pods in another namespace",
        "create deployment",
        "list nodes",
        "patch pod status",
        "delete namespace",
    ],
)
def test_requests_outside_the_role_get_403(cluster, sa_api, admin_api, request_) -> None:
    core, apps = client.CoreV1Api(sa_api), client.AppsV1Api(sa_api)
    ns = cluster.namespace
    deployment = {
        "metadata": {"name": "nope"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "x", "command": ["true"]}]},
            },
        },
    }
    calls = {
        "list secrets": lambda: core.list_namespaced_secret(ns),
        "read secret in another namespace": lambda: core.read_namespaced_secret(
            "anything", "default"
        ),
        "list pods in another namespace": lambda: core.list_namespaced_pod("default"),
        "create deployment": lambda: apps.create_namespaced_deployment(ns, deployment),
        "list nodes": lambda: core.list_node(),
        "patch pod status": lambda: core.patch_namespaced_pod_status(
            "anything", ns, {"status": {"phase": "Failed"}}
        ),
        "delete namespace": lambda: core.delete_namespace(ns),
    }
    assert _status(calls[request_]) == 403
    # The same request as the admin is not refused, so the 403 is RBAC's doing.
    assert client.CoreV1Api(admin_api).read_namespace(ns).status.phase == "Active"
