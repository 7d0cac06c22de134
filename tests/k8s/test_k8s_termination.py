"""How containers end, as a real kubelet reports it: OOMKilled, signals, restarts, eviction."""

from __future__ import annotations

import uuid
from typing import Any

from k8s_helpers import (
    container_log,
    pid_of,
    process_alive,
    python_pod,
    wait_for,
    wait_running,
    wait_terminal,
    watch_pod,
)
from kubernetes import client

SLEEP = "import time; time.sleep(600)"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _run_to_its_end(
    cluster, sa_api, prefix: str, script: str, *, timeout: float = 90, **pod_options: Any
) -> client.V1Pod:
    """Runs ``script`` in a new pod (python_pod's ``pod_options``), created as the
    ServiceAccount; the pod once it has ended."""
    core = client.CoreV1Api(sa_api)
    name = _name(prefix)
    core.create_namespaced_pod(cluster.namespace, python_pod(name, script, **pod_options))
    return wait_terminal(core, cluster.namespace, name, timeout=timeout)


def test_container_over_its_memory_limit_is_oom_killed(cluster, sa_api) -> None:
    hog = (
        "import sys\n"
        "print(open('/proc/self/cgroup').read(), flush=True)\n"
        "chunks = []\n"
        "while True:\n"
        "    chunks.append(b'x' * (8 << 20))\n"  # written pages: charged to the cgroup
    )
    limits = {"memory": "96Mi"}
    resources = {"requests": limits, "limits": limits}
    done = _run_to_its_end(cluster, sa_api, "oom", hog, timeout=90, resources=resources)
    status = done.status.container_statuses[0]
    terminated = status.state.terminated
    assert done.status.phase == "Failed"
    assert (terminated.reason, terminated.exit_code, terminated.signal) == ("OOMKilled", 137, 9)
    assert status.restart_count == 0
    # It ran in a memory cgroup of its own, not in the kubelet's.
    assert f"{done.metadata.uid[:8]}-main" in container_log(cluster.workdir, done)


def test_exit_code_and_signal_of_a_killed_container(cluster, sa_api) -> None:
    sigterm = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    done = _run_to_its_end(cluster, sa_api, "sigterm", sigterm)
    status = done.status.container_statuses[0]
    terminated = status.state.terminated
    assert done.status.phase == "Failed"
    assert (terminated.reason, terminated.exit_code, terminated.signal) == ("Error", 143, 15)
    assert terminated.started_at and terminated.finished_at
    assert status.restart_count == 0 and status.last_state.terminated is None


def test_on_failure_restarts_in_place_and_records_last_state(cluster, sa_api) -> None:
    # Fails the first time, succeeds the second: the emptyDir outlives the container.
    script = (
        "import os, sys\n"
        "if not os.path.exists('/state/ran'):\n"
        "    open('/state/ran', 'w').close()\n"
        "    sys.exit(3)\n"
    )
    done = _run_to_its_end(
        cluster,
        sa_api,
        "flaky",
        script,
        timeout=60,
        volume_mounts=[{"name": "state", "mountPath": "/state"}],
        volumes=[{"name": "state", "emptyDir": {}}],
        restartPolicy="OnFailure",
    )
    status = done.status.container_statuses[0]
    assert done.status.phase == "Succeeded"
    assert status.restart_count == 1
    assert status.state.terminated.reason == "Completed"
    assert status.last_state.terminated.exit_code == 3
    assert status.last_state.terminated.reason == "Error"


def test_eviction_sets_disruption_target_and_the_kubelet_keeps_it(
    cluster, sa_api, admin_api
) -> None:
    core, admin = client.CoreV1Api(sa_api), client.CoreV1Api(admin_api)
    policy = client.PolicyV1Api(admin_api)
    ns, name = cluster.namespace, _name("evictee")
    handle = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "time.sleep(600)\n"
    )
    label = {"evict": name}
    core.create_namespaced_pod(ns, python_pod(name, handle, labels=label))
    pod = wait_running(core, ns, name)
    pid = pid_of(pod)
    # A budget that allows one disruption: the disruption controller must have counted the
    # healthy pod (an integer minAvailable: bare pods have no scale to take a ratio of).
    budget = _name("pdb")
    policy.create_namespaced_pod_disruption_budget(
        ns,
        {
            "metadata": {"name": budget},
            "spec": {"minAvailable": 0, "selector": {"matchLabels": label}},
        },
    )
    wait_for(
        "the budget's status",
        lambda: (
            policy.read_namespaced_pod_disruption_budget(budget, ns).status.disruptions_allowed == 1
        ),
        timeout=30,
    )
    version = core.read_namespaced_pod(name, ns).metadata.resource_version
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns))
    admin.create_namespaced_pod_eviction(name, ns, eviction)

    seen: list[client.V1Pod] = []

    def record(kind: str, pod: client.V1Pod) -> bool:
        if kind != "DELETED":
            seen.append(pod)
        return kind == "DELETED"

    watch_pod(core, ns, name, version, record, timeout=60)
    assert not process_alive(pid)

    def disruption(pod: client.V1Pod) -> client.V1PodCondition | None:
        return next((c for c in pod.status.conditions or [] if c.type == "DisruptionTarget"), None)

    marked = [p for p in seen if disruption(p)]
    assert marked, [p.status.conditions for p in seen]
    condition = disruption(marked[0])
    assert (condition.status, condition.reason) == ("True", "EvictionByEvictionAPI")
    # Every later status the kubelet wrote (terminating, then terminal) still carries it.
    later = seen[seen.index(marked[0]) :]
    assert all(disruption(p) for p in later)
    final = later[-1]
    assert final.status.phase == "Succeeded"  # exited 0 on SIGTERM
    assert final.status.container_statuses[0].state.terminated.exit_code == 0
    policy.delete_namespaced_pod_disruption_budget(budget, ns)
