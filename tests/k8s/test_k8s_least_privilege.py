"""Least privilege, proven by the real apiserver: a token of the elastic-step-master
ServiceAccount, bound by manifests/rbac.yaml and held by manifests/admission-policy.yaml, is
refused (403) whatever it asks beyond elastic-step's own objects. The refusals that RBAC
cannot express (a delete, a create, a patch of a kind the master does write) come from the
admission policy, which the test cluster applies as shipped."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from local_cluster import add_namespace

NS = "es-least-privilege"
MANAGED = {"app.kubernetes.io/managed-by": "elastic-step"}
JOB_POD = {**MANAGED, "elastic-step/job": "job-a", "elastic-step/role": "worker"}


def _pod(name: str, labels: dict[str, str]) -> dict:
    # Bound to a node that does not exist: it stays Pending, and nothing runs.
    container = {"name": "main", "image": "local/python", "command": [sys.executable, "-V"]}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": "no-such-node", "containers": [container]},
    }


@dataclass
class Tenant:
    master: client.CoreV1Api
    admin: client.CoreV1Api
    discovery: client.DiscoveryV1Api  # the master's


@pytest.fixture(scope="module")
def tenant(cluster) -> Iterator[Tenant]:
    kubeconfig = add_namespace(cluster.admin_kubeconfig, NS, cluster.workdir / f"{NS}.kubeconfig")
    with cluster.admin() as admin_api, config.new_client_from_config(str(kubeconfig)) as api:
        admin = client.CoreV1Api(admin_api)
        # What others keep in the namespace, and a pod of an elastic-step job.
        admin.create_namespaced_pod(NS, _pod("other-app", {"app": "other"}))
        admin.create_namespaced_pod(NS, _pod("job-a-worker-0", JOB_POD))
        admin.create_namespaced_secret(
            NS, {"metadata": {"name": "mlpipeline-minio-artifact"}, "stringData": {"k": "v"}}
        )
        admin.create_namespaced_config_map(
            NS, {"metadata": {"name": "other-settings"}, "data": {"k": "v"}}
        )
        # The namespace's key, as the first master (or an admin) makes it.
        admin.create_namespaced_secret(
            NS,
            {
                "metadata": {"name": "elastic-step-keys", "labels": MANAGED},
                "stringData": {"key": "k" * 64},
            },
        )
        yield Tenant(client.CoreV1Api(api), admin, client.DiscoveryV1Api(api))
        admin.delete_namespace(NS)


def _status(call: Callable[[], object]) -> tuple[int, str]:
    try:
        call()
    except ApiException as err:
        return err.status, err.body or ""
    return 200, ""


def _refusals(tenant: Tenant) -> dict[str, Callable[[], object]]:
    master = tenant.master
    unlabelled = {"metadata": {"name": "made-up"}}
    # An EndpointSlice, labelled as elastic-step's, that would give the other app's Service
    # an address of the master's choosing.
    hijack = {
        "metadata": {
            "name": "job-a-master",
            "labels": {
                **MANAGED,
                "elastic-step/job": "job-a",
                "kubernetes.io/service-name": "other-app",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.9.9.9"]}],
    }
    return {
        "patch a pod of another app": lambda: master.patch_namespaced_pod(
            "other-app", NS, {"metadata": {"labels": {"x": "y"}}}
        ),
        "patch a pod of a job": lambda: master.patch_namespaced_pod(
            "job-a-worker-0", NS, {"spec": {"containers": [{"name": "main", "image": "evil"}]}}
        ),
        "delete a pod of another app": lambda: master.delete_namespaced_pod("other-app", NS),
        "read an unrelated Secret": lambda: master.read_namespaced_secret(
            "mlpipeline-minio-artifact", NS
        ),
        "list Secrets": lambda: master.list_namespaced_secret(NS),
        "overwrite an unrelated Secret": lambda: master.patch_namespaced_secret(
            "mlpipeline-minio-artifact", NS, {"stringData": {"k": "mine"}}
        ),
        "create a pod with no labels": lambda: master.create_namespaced_pod(
            NS, _pod("made-up", {})
        ),
        "create a pod that is no job's": lambda: master.create_namespaced_pod(
            NS, _pod("made-up", MANAGED)
        ),
        "create an unlabelled Secret": lambda: master.create_namespaced_secret(NS, unlabelled),
        "create an unlabelled Service": lambda: master.create_namespaced_service(
            NS, {**unlabelled, "spec": {"clusterIP": "None", "ports": [{"port": 1}]}}
        ),
        "patch an unrelated ConfigMap": lambda: master.patch_namespaced_config_map(
            "other-settings", NS, {"data": {"k": "mine"}}
        ),
        "delete an unrelated ConfigMap": lambda: master.delete_namespaced_config_map(
            "other-settings", NS
        ),
        "take an unrelated ConfigMap over": lambda: master.patch_namespaced_config_map(
            "other-settings", NS, {"metadata": {"labels": MANAGED}}
        ),
        "replace the namespace's key": lambda: master.patch_namespaced_secret(
            "elastic-step-keys", NS, {"stringData": {"key": "m" * 64}}
        ),
        "delete the namespace's key": lambda: master.delete_namespaced_secret(
            "elastic-step-keys", NS
        ),
        "give another Service addresses": lambda: tenant.discovery.create_namespaced_endpoint_slice(
            NS, hijack
        ),
    }


# By whom each refusal is made: RBAC (the verb or the name is not granted) or the admission
# policy (the verb is granted, for elastic-step's objects only).
BY_POLICY = {
    "delete a pod of another app",
    "overwrite an unrelated Secret",
    "create a pod with no labels",
    "create a pod that is no job's",
    "create an unlabelled Secret",
    "create an unlabelled Service",
    "patch an unrelated ConfigMap",
    "delete an unrelated ConfigMap",
    "take an unrelated ConfigMap over",
    "replace the namespace's key",
    "delete the namespace's key",
    "give another Service addresses",
}


def test_the_master_token_is_refused_beyond_its_own_objects(tenant: Tenant) -> None:
    refusals = _refusals(tenant)
    assert set(refusals) > BY_POLICY
    for what, call in refusals.items():
        status, body = _status(call)
        assert status == 403, f"{what}: {status} {body}"
        if what in BY_POLICY:
            assert "manifests/admission-policy.yaml" in body, f"{what}: {body}"
        else:
            assert "cannot" in body and "admission-policy" not in body, f"{what}: {body}"
    # Nothing was changed: the other app's pod and Secret are as they were.
    assert tenant.admin.read_namespaced_pod("other-app", NS).metadata.labels == {"app": "other"}
    secret = tenant.admin.read_namespaced_secret("mlpipeline-minio-artifact", NS)
    assert secret.data == {"k": "dg=="}


def test_the_master_token_may_do_its_job(tenant: Tenant) -> None:
    """What the master does is allowed (dry runs: nothing is made), so the 403s above are
    the policy's and RBAC's doing, not a token that works for nothing."""
    master = tenant.master
    allowed = {
        "create a pod of a job": lambda: master.create_namespaced_pod(
            NS, _pod("job-a-worker-1", JOB_POD), dry_run="All"
        ),
        "delete a pod of a job": lambda: master.delete_namespaced_pod(
            "job-a-worker-0", NS, dry_run="All"
        ),
        "create its job's Secret": lambda: master.create_namespaced_secret(
            NS, {"metadata": {"name": "job-a-secret", "labels": MANAGED}}, dry_run="All"
        ),
        "list pods": lambda: master.list_namespaced_pod(NS, label_selector="elastic-step/job"),
    }
    for what, call in allowed.items():
        status, body = _status(call)
        assert status == 200, f"{what}: {status} {body}"
    # The one Secret it may read: the namespace's key.
    status, _ = _status(lambda: master.read_namespaced_secret("elastic-step-keys", NS))
    assert status == 200
    own_slice = {
        "metadata": {
            "name": "job-a-master",
            "labels": {
                **MANAGED,
                "elastic-step/job": "job-a",
                "kubernetes.io/service-name": "job-a-master",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.9.9.9"]}],
    }
    status, body = _status(
        lambda: tenant.discovery.create_namespaced_endpoint_slice(NS, own_slice, dry_run="All")
    )
    assert status == 200, body
