"""Helpers shared by the Kubernetes tests: polling, pod manifests, process checks."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, watch

# Shared with the cluster's start (tests/cluster, put on sys.path by conftest.py).
from local_cluster import (  # noqa: F401 - the tests import them from here
    container_log,
    create_secret,
    wait_for,
)

#: The labels of the tests' own pods. The tests create them as the elastic-step-master
#: ServiceAccount, which manifests/admission-policy.yaml holds to the pods of a job.
TEST_POD_LABELS = {
    "app": "elastic-step-test",
    "app.kubernetes.io/managed-by": "elastic-step",
    "elastic-step/job": "kubelet-test",
}

#: A model with a least time per training batch (tests/cluster/paced_model.py): a job that
#: must outlive a test's steps does, however fast training has become.
PACED = Path(__file__).parents[1] / "cluster" / "paced_model.py"


def pod_manifest(
    name: str,
    command: list[str],
    *,
    cpu: str | None = None,
    priority_class: str | None = None,
    grace: int | None = None,
    env: list[dict[str, Any]] | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A single-container pod whose "image" is ignored and whose command runs as a process."""
    container: dict[str, Any] = {"name": "main", "image": "local/process", "command": command}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    if env:
        container["env"] = env
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    metadata: dict[str, Any] = {"name": name, "labels": dict(TEST_POD_LABELS)}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def pid_of(pod: client.V1Pod) -> int:
    """The process id the kubelet reports as the container id (process://<pid>)."""
    container_id = pod.status.container_statuses[0].container_id
    assert container_id.startswith("process://"), container_id
    return int(container_id.removeprefix("process://"))


def process_alive(pid: int) -> bool:
    """True while the pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def watch_pod(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    version: str,
    done: Callable[[str, client.V1Pod], bool],
    timeout: float = 60,
) -> dict[str, Any]:
    """Watch one pod from `version` until done(event_type, pod) is true; return that event."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stream = watch.Watch().stream(
            core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            resource_version=version,
            timeout_seconds=max(1, int(deadline - time.monotonic())),
        )
        for event in stream:
            pod = event["object"]
            version = pod.metadata.resource_version
            if done(event["type"], pod):
                return event
    raise TimeoutError(f"pod {name}: watched for {timeout}s without seeing the expected event")


def python_pod(
    name: str,
    script: str,
    *,
    labels: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
    volume_mounts: list[dict[str, Any]] | None = None,
    resources: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod whose one container runs a Python script with this interpreter (and its venv)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "local/python",
        "command": [sys.executable, "-c", script],
    }
    if env:
        container["env"] = env
    if volume_mounts:
        container["volumeMounts"] = volume_mounts
    if resources:
        container["resources"] = resources
    body_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container], **spec}
    metadata = {"name": name, "labels": {**TEST_POD_LABELS, **(labels or {})}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body_spec}


def field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def wait_terminal(
    core: client.CoreV1Api, namespace: str, name: str, timeout: float = 90
) -> client.V1Pod:
    """Wait until the pod is Succeeded or Failed and return it."""

    def terminal() -> client.V1Pod | None:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    return wait_for(f"pod {name} to finish", terminal, timeout=timeout)


def wait_running(
    core: client.CoreV1Api, namespace: str, name: str, timeout: float = 90
) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase == "Running":
            return pod
        if pod.status.phase in ("Succeeded", "Failed"):  # fail now, not at the timeout
            raise AssertionError(f"pod {name} ended: {pod.status}")
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout}s waiting for pod {name} Running")


def bound_claim(
    core: client.CoreV1Api, namespace: str, name: str, access_mode: str
) -> client.V1PersistentVolumeClaim:
    """Creates a 100Mi PersistentVolumeClaim and waits (60 s at most) until it is bound: the
    bound claim."""
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "accessModes": [access_mode],
                "resources": {"requests": {"storage": "100Mi"}},
            },
        },
    )

    def bound() -> client.V1PersistentVolumeClaim | None:
        pvc = core.read_namespaced_persistent_volume_claim(name, namespace)
        return pvc if pvc.status.phase == "Bound" else None

    return wait_for(f"the claim {name} to be bound", bound, timeout=60)


def last_json_line(text: str) -> Any:
    """The last line of a log that parses as JSON (pods print their findings that way)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise AssertionError(f"no JSON line in log:\n{text[-2000:]}")
