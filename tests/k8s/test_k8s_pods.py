"""Pods through the real API as the master ServiceAccount, run by the process kubelet."""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from k8s_helpers import pid_of, pod_manifest, process_alive, wait_for, watch_pod
from kubernetes import client
from kubernetes.client.rest import ApiException

PY = sys.executable
SLEEP = "import time; time.sleep(600)"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _running(kind: str, pod: client.V1Pod) -> bool:
    return kind in ("ADDED", "MODIFIED") and pod.status.phase == "Running"


def _terminal(kind: str, pod: client.V1Pod) -> bool:
    return pod.status.phase in ("Succeeded", "Failed")


def test_service_account_pod_lifecycle_with_watch(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    name = _name("lifecycle")
    env_file = cluster.workdir / f"{name}.env.json"
    fields = {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_UID": "metadata.uid",
        "POD_IP": "status.podIP",
        "NODE_NAME": "spec.nodeName",
    }
    env: list[dict[str, Any]] = [
        {"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in fields.items()
    ]
    env.append({"name": "GREETING", "value": "hello $(POD_NAME)"})
    script = (
        "import json, os, sys, time\n"
        "keys = [*sys.argv[2:]]\n"
        "json.dump({k: os.environ.get(k) for k in keys}, open(sys.argv[1], 'w'))\n"
        "time.sleep(600)\n"
    )
    command = [PY, "-c", script, str(env_file), *fields, "GREETING"]
    created = core.create_namespaced_pod(cluster.namespace, pod_manifest(name, command, env=env))
    assert created.status.phase == "Pending"

    event = watch_pod(core, cluster.namespace, name, created.metadata.resource_version, _running)
    pod = event["object"]
    assert pod.spec.node_name == cluster.node_name
    pod_ip = pod.status.pod_ip
    assert pod_ip.startswith("127.") and pod_ip != "127.0.0.1", pod_ip
    assert [i.ip for i in pod.status.pod_i_ps] == [pod_ip]
    assert pod.status.container_statuses[0].state.running is not None
    pid = pid_of(pod)
    assert process_alive(pid)

    seen = wait_for("the pod's env dump", lambda: json.loads(env_file.read_text()))
    assert seen == {
        "POD_NAME": name,
        "POD_NAMESPACE": cluster.namespace,
        "POD_UID": created.metadata.uid,
        "POD_IP": pod_ip,
        "NODE_NAME": cluster.node_name,
        "GREETING": f"hello {name}",
    }

    deleting = core.delete_namespaced_pod(name, cluster.namespace)
    watch_pod(
        core,
        cluster.namespace,
        name,
        deleting.metadata.resource_version,
        lambda kind, _: kind == "DELETED",
    )
    # The kubelet removes the object only after the process has ended.
    assert not process_alive(pid)


def test_exit_codes_and_reasons(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    cases = {
        "ok": ([PY, "-c", "pass"], "Succeeded", 0, "Completed"),
        "fail": ([PY, "-c", "raise SystemExit(3)"], "Failed", 3, "Error"),
        "killed": ([PY, "-c", "import os; os.kill(os.getpid(), 9)"], "Failed", 137, "Error"),
        "missing": (["/nonexistent/binary"], "Failed", 128, "StartError"),
    }
    names = {case: _name(f"exit-{case}") for case in cases}
    for case, (command, *_) in cases.items():
        core.create_namespaced_pod(cluster.namespace, pod_manifest(names[case], command))
    for case, (_, phase, code, reason) in cases.items():

        def finished(name: str = names[case]) -> client.V1Pod | None:
            pod = core.read_namespaced_pod(name, cluster.namespace)
            return pod if pod.status.phase in ("Succeeded", "Failed") else None

        pod = wait_for(f"pod {case} to finish", finished, timeout=60)
        terminated = pod.status.container_statuses[0].state.terminated
        assert (pod.status.phase, terminated.exit_code, terminated.reason) == (phase, code, reason)


def test_grace_period_sigterm_then_sigkill(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    stubborn, polite = _name("ignores-term"), _name("handles-term")
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    handle = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "time.sleep(600)\n"
    )
    core.create_namespaced_pod(
        cluster.namespace, pod_manifest(stubborn, [PY, "-c", ignore], grace=2)
    )
    core.create_namespaced_pod(
        cluster.namespace, pod_manifest(polite, [PY, "-c", handle], grace=60)
    )
    pids = {}
    for name in (stubborn, polite):
        pod = wait_for(
            f"{name} Running",
            lambda n=name: _is_running(core.read_namespaced_pod(n, cluster.namespace)),
        )
        pids[name] = pid_of(pod)
    time.sleep(1)  # let the interpreters install their SIGTERM handlers

    for name, at_least, at_most, code in ((stubborn, 2, 15, 137), (polite, 0, 10, 0)):
        started = time.monotonic()
        deleting = core.delete_namespaced_pod(name, cluster.namespace)
        last: dict[str, client.V1Pod] = {}

        def record(kind: str, pod: client.V1Pod, store=last) -> bool:
            if kind == "MODIFIED":
                store["pod"] = pod
            return kind == "DELETED"

        watch_pod(core, cluster.namespace, name, deleting.metadata.resource_version, record)
        elapsed = time.monotonic() - started
        assert at_least - 0.5 <= elapsed <= at_most, (name, elapsed)
        assert not process_alive(pids[name])
        terminated = last["pod"].status.container_statuses[0].state.terminated
        assert terminated.exit_code == code, (name, terminated)


def _is_running(pod: client.V1Pod) -> client.V1Pod | None:
    return pod if pod.status.phase == "Running" else None


def test_eviction_kills_the_process(cluster, sa_api, admin_api) -> None:
    # Eviction is not in the master's Role; the admin stands in for a drain.
    core = client.CoreV1Api(sa_api)
    name = _name("evicted")
    core.create_namespaced_pod(cluster.namespace, pod_manifest(name, [PY, "-c", SLEEP], grace=1))
    pod = wait_for(
        "Running", lambda: _is_running(core.read_namespaced_pod(name, cluster.namespace))
    )
    pid = pid_of(pod)
    eviction = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=name, namespace=cluster.namespace)
    )
    client.CoreV1Api(admin_api).create_namespaced_pod_eviction(name, cluster.namespace, eviction)
    wait_for("the evicted pod's process to end", lambda: not process_alive(pid), timeout=30)
    wait_for("the evicted pod to be removed", lambda: not _exists(core, name, cluster.namespace))


def test_node_reports_capacity_and_stays_ready(cluster, admin_api) -> None:
    core = client.CoreV1Api(admin_api)
    node = core.read_node(cluster.node_name)
    for resource, value in cluster.node_capacity.items():
        assert node.status.allocatable[resource] == value
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
    leases = client.CoordinationV1Api(admin_api)
    first = leases.read_namespaced_lease(cluster.node_name, "kube-node-lease").spec.renew_time
    wait_for(
        "the node Lease to be renewed",
        lambda: (
            leases.read_namespaced_lease(cluster.node_name, "kube-node-lease").spec.renew_time
            > first
        ),
        timeout=20,
    )


def _exists(core: client.CoreV1Api, name: str, namespace: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True
