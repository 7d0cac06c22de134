"""One job through the faults a cluster deals out. Its master is a pod with only the project's
Role, and its --output is on a PersistentVolumeClaim that every pod of the job mounts:

- the node has room for one worker of two: the job starts with one, and grows to two when
  capacity frees up;
- a higher-priority pod preempts a worker: that counts as preemption, not as the worker's
  fault, and the worker is replaced once there is room again;
- a second master pod of the same --job-name starts while the first runs: it never writes the
  job's state, and gives up with one line;
- the PS pod is deleted: its replacement restores the model from its checkpoint on the claim.

Accounting stays exact throughout, and the model is saved on the claim.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8s_helpers import bound_claim, container_log
from k8s_helpers import wait_for as poll
from kubernetes import client
from kubernetes.utils import parse_quantity
from test_k8s_backend_support import (
    clean_namespace,
    digits_fixture,  # noqa: F401 - the fixture digits
    master_pod_manifest,
    new_job_name,
    paced_train_argv,
    pod_log,
    read_status,
    restricted_fixture,  # noqa: F401 - the fixture restricted
    restricted_pod,
)

from elastic_step.backends import kubernetes_pods as pods

HIGH, LOW = "elastic-step-high", "elastic-step-low"
SHARED = "/shared"


def _free_millicpu(core: client.CoreV1Api, node: str) -> int:
    """CPU the scheduler still has to give on ``node``: allocatable less what bound pods ask."""
    allocatable = parse_quantity(core.read_node(node).status.allocatable["cpu"])
    bound = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    asked = sum(
        parse_quantity((c.resources.requests or {}).get("cpu", "0"))
        for pod in bound
        if pod.status.phase not in ("Succeeded", "Failed")
        for c in pod.spec.containers
        if c.resources is not None
    )
    return int((allocatable - asked) * 1000)


def _sleeper(name: str, millicpu: int, seconds: int) -> dict:
    """A high-priority pod asking for ``millicpu``: never a victim of the job's pods."""
    pod = restricted_pod(
        name,
        [sys.executable, "-c", f"import time; time.sleep({seconds})"],
        resources={"requests": {"cpu": f"{millicpu}m"}, "limits": {"cpu": f"{millicpu}m"}},
    )
    pod["spec"]["priorityClassName"] = HIGH
    return pod


class _StateWatch:
    """Samples the job's lease holder and the state's token in the background until stopped."""

    def __init__(self, cluster, ns: str, lease: str, head: str) -> None:
        self.holders: set[str] = set()
        self.tokens: set[int] = set()
        self._args = (cluster, ns, lease, head)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        cluster, ns, lease, head = self._args
        with cluster.admin() as api:
            core, coordination = client.CoreV1Api(api), client.CoordinationV1Api(api)
            while not self._stop.wait(0.5):
                holder = coordination.read_namespaced_lease(lease, ns).spec.holder_identity
                self.holders.add(holder)
                document = core.read_namespaced_config_map(head, ns).data["head"]
                self.tokens.add(json.loads(document)["token"])

    def stop(self) -> tuple[set[str], set[int]]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.holders, self.tokens


def _master(name: str, argv: list[str], claim: str) -> dict:
    pod = master_pod_manifest(name, argv)
    pod["spec"]["priorityClassName"] = HIGH
    pod["spec"]["volumes"] = [{"name": "shared", "persistentVolumeClaim": {"claimName": claim}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "shared", "mountPath": SHARED}]
    return pod


@pytest.fixture
def claim(cluster, restricted) -> Iterator[str]:
    """A claim every pod of the job mounts; the namespace is left clean, pass or fail."""
    name, ns = f"shared-{new_job_name()}", restricted.name
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        bound_claim(core, ns, name, "ReadWriteMany")
        try:
            yield name
        finally:
            clean_namespace(cluster, ns)
            core.delete_namespaced_persistent_volume_claim(name, ns)


# About 3 minutes on 2 idle cores. The job must outlive the second master's wait for the lease
# (35 s) and the preemption and PS loss after it, however fast training has become: its model
# paces each training batch (tests/cluster/paced_model.py), so 24 epochs last at least 108 s.
@pytest.mark.timeout(600)
def test_a_job_rides_out_a_small_node_preemption_a_second_master_and_a_lost_ps(
    cluster, restricted, digits, claim
):
    ns, job = restricted.name, new_job_name()
    argv = paced_train_argv(
        digits, f"{SHARED}/run", job,
        "--batch-size", "4", "--records-per-task", "32", "--epochs", "24",
        "--workers", "2", "--min-workers", "1", "--ps", "1", "--checkpoint-steps", "20",
        "--worker-cpu", "1", "--ps-cpu", "1",
        "--worker-priority-class", LOW, "--high-priority-class", HIGH,
        "--volume", f"claim={claim},mount={SHARED}",
    )  # fmt: skip
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        coordination = client.CoordinationV1Api(api)
        output = Path(cluster.pvc_root) / ns / claim / "run"  # the claim's data, seen from here

        def status() -> dict:
            return read_status(output)

        def log_of(name: str) -> str:
            return pod_log(cluster, core, name, ns)

        first = f"{job}-step-1"

        def running_workers() -> list[str]:
            phase = core.read_namespaced_pod(first, ns).status.phase
            assert phase in ("Pending", "Running"), log_of(first)
            return [w["id"] for w in status().get("workers", []) if w["state"] == "running"]

        # Room for the PS and one worker only.
        blocker = f"{job}-blocker"
        room = _free_millicpu(core, cluster.node_name) - 2000
        assert room > 0, "the test needs a node with more than 2 CPUs free"
        core.create_namespaced_pod(ns, _sleeper(blocker, room, 600))
        poll(
            "the blocker running",
            lambda: core.read_namespaced_pod(blocker, ns).status.phase == "Running",
            timeout=60,
        )

        core.create_namespaced_pod(ns, _master(first, argv, claim))
        poll(
            "training under way with one worker",
            lambda: status().get("model_version", 0) >= 2,
            timeout=240,
        )
        assert len(running_workers()) == 1, status()
        waiting = [w for w in status()["workers"] if w["state"] == "pending"]
        assert len(waiting) == 1, status()

        # A second master of the same job, while the first holds the lease.
        second = f"{job}-step-2"
        lease = f"{job}-master"
        holder = coordination.read_namespaced_lease(lease, ns).spec.holder_identity
        assert holder.startswith(f"{first}:"), holder
        head = f"{job}-state"
        token = json.loads(core.read_namespaced_config_map(head, ns).data["head"])["token"]
        watching = _StateWatch(cluster, ns, lease, head)
        core.create_namespaced_pod(ns, _master(second, argv, claim))

        # Capacity frees up: the pending worker joins.
        core.delete_namespaced_pod(blocker, ns, grace_period_seconds=0)
        poll("two workers", lambda: len(running_workers()) == 2, timeout=120)

        # A higher-priority pod that fits only by preempting one worker (not the PS or master,
        # whose priority is as high as its own); it leaves after a while.
        preemptor = f"{job}-preemptor"
        need = _free_millicpu(core, cluster.node_name) + 1000
        core.create_namespaced_pod(ns, _sleeper(preemptor, need, 15))
        poll(
            "a worker preempted",
            lambda: status().get("restarts_by_reason", {}).get("preempted") == 1,
            timeout=120,
        )
        poll("the preempted worker replaced", lambda: len(running_workers()) == 2, timeout=120)

        # The PS pod is deleted: its replacement restores the last checkpoint from the claim.
        checkpoints = output / "checkpoints"
        assert any(checkpoints.rglob("version-*.npz")), sorted(checkpoints.rglob("*"))
        ps_uid = core.read_namespaced_pod(f"{job}-ps-0", ns).metadata.uid
        core.delete_namespaced_pod(f"{job}-ps-0", ns)

        def second_gave_up() -> bool:
            assert core.read_namespaced_pod(first, ns).status.phase == "Running", (
                "the job ended before the second master gave up: give it more epochs\n"
                + log_of(second)
            )
            return core.read_namespaced_pod(second, ns).status.phase in ("Succeeded", "Failed")

        poll("the second master to give up", second_gave_up, timeout=120)
        # All the while the first master kept the lease, and the state kept its token.
        holders, tokens = watching.stop()
        assert holders == {holder} and tokens == {token}, (holders, tokens)
        refused = core.read_namespaced_pod(second, ns)
        assert refused.status.container_statuses[0].state.terminated.exit_code == 2
        assert "another master is running the job" in log_of(second), log_of(second)

        def finished() -> bool:
            phase = core.read_namespaced_pod(first, ns).status.phase
            assert phase in ("Running", "Succeeded"), log_of(first)
            return phase == "Succeeded"

        poll("the job to finish", finished, timeout=300)
        summary = json.loads((output / "summary.json").read_text())
        assert summary["phase"] == "succeeded"
        assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
        assert summary["restarts_by_reason"] == {"preempted": 1, "deleted": 1}, summary
        assert summary["restarts"] == {"worker": 1, "ps": 1, "master": 0}, summary
        # The preempted worker's tasks went back to the queue, not as failures of theirs.
        log = container_log(cluster.workdir, core.read_namespaced_pod(first, ns))
        assert "counts as a failure" not in log, log[-3000:]
        [restore] = summary["ps_restores"]
        assert restore["restored_version"] > 0, restore
        assert (output / "model.keras").exists()
        assert ps_uid not in {p.metadata.uid for p in core.list_namespaced_pod(ns).items}
        selector = pods.job_selector(job)
        assert not core.list_namespaced_pod(ns, label_selector=selector).items
