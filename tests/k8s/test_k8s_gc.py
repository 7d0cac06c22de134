"""Owner references: the garbage collector removes pods whose owner is gone."""

from __future__ import annotations

import sys
import uuid

from k8s_helpers import pid_of, pod_manifest, process_alive, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _gone(core: client.CoreV1Api, name: str, namespace: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        return err.status == 404
    return False


def _running(core: client.CoreV1Api, name: str, namespace: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == "Running" else None


def test_pod_whose_owner_is_deleted_is_garbage_collected(cluster, sa_api) -> None:
    # As in elastic-step: the master pod owns its worker pods.
    core = client.CoreV1Api(sa_api)
    ns = cluster.namespace
    suffix = uuid.uuid4().hex[:6]
    master = core.create_namespaced_pod(ns, pod_manifest(f"master-{suffix}", SLEEP))
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": master.metadata.name,
        "uid": master.metadata.uid,
        "controller": True,
    }
    worker_name = f"worker-{suffix}"
    core.create_namespaced_pod(ns, pod_manifest(worker_name, SLEEP, owner=owner, grace=5))
    worker = wait_for("worker Running", lambda: _running(core, worker_name, ns), timeout=60)
    pid = pid_of(worker)
    assert process_alive(pid)

    core.delete_namespaced_pod(master.metadata.name, ns, grace_period_seconds=0)
    wait_for("the worker to be collected", lambda: _gone(core, worker_name, ns), timeout=90)
    assert not process_alive(pid)


def test_pod_with_a_live_owner_stays(cluster, sa_api, admin_api) -> None:
    admin = client.CoreV1Api(admin_api)
    core = client.CoreV1Api(sa_api)
    ns = cluster.namespace
    config_map = admin.create_namespaced_config_map(
        ns, {"metadata": {"name": f"owner-{uuid.uuid4().hex[:6]}"}}
    )
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": config_map.metadata.name,
        "uid": config_map.metadata.uid,
    }
    name = f"owned-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod(ns, pod_manifest(name, SLEEP, owner=owner))
    wait_for("owned pod Running", lambda: _running(core, name, ns), timeout=60)
    admin.delete_namespaced_config_map(config_map.metadata.name, ns)
    wait_for("the owned pod to be collected", lambda: _gone(core, name, ns), timeout=90)
