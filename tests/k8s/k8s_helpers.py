"""Helpers shared by the Kubernetes tests: polling, pod manifests, process checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, watch


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.2
) -> Any:
    """Poll check() until it returns something truthy; fail the test with `what` if not."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as err:  # keep polling; report the last error on timeout
            last_error = err
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


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
    metadata: dict[str, Any] = {"name": name, "labels": {"app": "elastic-step-test"}}
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
