"""The real scheduler against the process kubelet's fixed capacity: Pending, preemption, growth."""

from __future__ import annotations

import sys
import uuid

from k8s_helpers import pid_of, pod_manifest, process_alive, wait_for, watch_pod
from kubernetes import client

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _phase(core: client.CoreV1Api, name: str, namespace: str, phase: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == phase else None


def _unschedulable(core: client.CoreV1Api, name: str, namespace: str) -> bool:
    pod = core.read_namespaced_pod(name, namespace)
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or []
    )


def test_pod_larger_than_the_node_stays_pending(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    name = _name("too-big")
    core.create_namespaced_pod(cluster.namespace, pod_manifest(name, SLEEP, cpu="8"))
    wait_for("Unschedulable", lambda: _unschedulable(core, name, cluster.namespace), timeout=60)
    pod = core.read_namespaced_pod(name, cluster.namespace)
    assert pod.status.phase == "Pending"
    assert not pod.spec.node_name


def test_higher_priority_pod_preempts_lower_priority_one(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    ns = cluster.namespace
    low, high = _name("low"), _name("high")
    core.create_namespaced_pod(
        ns, pod_manifest(low, SLEEP, cpu="3", priority_class="elastic-step-low", grace=2)
    )
    victim = wait_for("low Running", lambda: _phase(core, low, ns, "Running"), timeout=60)
    assert victim.spec.priority == 1000
    pid = pid_of(victim)

    # 3 of 4 CPUs are taken, so the 2-CPU high-priority pod fits only by preempting.
    core.create_namespaced_pod(
        ns, pod_manifest(high, SLEEP, cpu="2", priority_class="elastic-step-high")
    )
    marks: list[str | None] = []  # per status seen: the DisruptionTarget reason, if any

    def record(kind: str, pod: client.V1Pod) -> bool:
        conditions = pod.status.conditions or []
        target = [c.reason for c in conditions if c.type == "DisruptionTarget"]
        marks.append(target[0] if target else None)
        return kind == "DELETED"

    watch_pod(core, ns, low, victim.metadata.resource_version, record, timeout=90)
    assert "PreemptionByScheduler" in marks
    # The kubelet's own status updates (terminating, terminal) keep the scheduler's condition.
    first = marks.index("PreemptionByScheduler")
    assert all(m == "PreemptionByScheduler" for m in marks[first:]), marks
    assert not process_alive(pid)
    winner = wait_for("high Running", lambda: _phase(core, high, ns, "Running"), timeout=60)
    assert winner.spec.node_name == cluster.node_name
    assert process_alive(pid_of(winner))


def test_pending_pod_starts_when_capacity_frees(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    ns = cluster.namespace
    first, second = _name("first"), _name("second")
    short = [sys.executable, "-c", "import time; time.sleep(4)"]
    core.create_namespaced_pod(ns, pod_manifest(first, short, cpu="3"))
    wait_for("first Running", lambda: _phase(core, first, ns, "Running"), timeout=60)
    core.create_namespaced_pod(ns, pod_manifest(second, SLEEP, cpu="3"))
    wait_for("second Unschedulable", lambda: _unschedulable(core, second, ns), timeout=60)

    wait_for("first Succeeded", lambda: _phase(core, first, ns, "Succeeded"), timeout=60)
    # A finished pod no longer holds its CPU: the scheduler binds the pending one.
    pod = wait_for("second Running", lambda: _phase(core, second, ns, "Running"), timeout=90)
    assert pod.spec.node_name == cluster.node_name
