"""How the Kubernetes backend reads a pod's state into the master's events and exit reasons,
and how it words an API refusal (no cluster needed)."""

from __future__ import annotations

import pytest

from elastic_step.backends.api import ExitReason
from elastic_step.backends.kubernetes_client import KubeCallError
from elastic_step.backends.kubernetes_watch import Phase, pod_state


def make_pod(
    phase="Running",
    *,
    terminated=None,
    waiting=None,
    conditions=(),
    deleting=False,
    reason=None,
    message=None,
    sidecar_running=False,
) -> dict:
    state = {"running": {}}
    if terminated is not None:
        state = {"terminated": terminated}
    elif waiting is not None:
        state = {"waiting": waiting}
    statuses = [{"name": "main", "state": state}]
    if sidecar_running:
        statuses.append({"name": "proxy", "state": {"running": {}}})
    status = {"phase": phase, "conditions": list(conditions), "containerStatuses": statuses}
    if reason:
        status["reason"], status["message"] = reason, message or ""
    metadata = {"name": "job-1-worker-0", "uid": "u"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        metadata["deletionGracePeriodSeconds"] = 30
    return {"metadata": metadata, "status": status}


def disruption(reason: str, message: str = "") -> dict:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}


ERROR_137 = {"exitCode": 137, "reason": "Error"}


@pytest.mark.parametrize(
    ("pod", "kw", "reason", "code", "words"),
    [
        (make_pod("Succeeded", terminated={"exitCode": 0, "reason": "Completed"}), {},
         ExitReason.COMPLETED, 0, "exit status 0"),
        (make_pod("Failed", terminated={"exitCode": 3, "reason": "Error"}), {},
         ExitReason.CRASHED, 3, "exit status 3"),
        (make_pod("Failed", terminated=ERROR_137), {}, ExitReason.CRASHED, 137, "SIGKILL"),
        (make_pod("Failed", terminated={"exitCode": 137, "reason": "OOMKilled"}), {},
         ExitReason.OOM_KILLED, 137, "OOMKilled"),
        (make_pod("Failed", terminated={"exitCode": 128, "reason": "StartError", "message": "no"}),
         {}, ExitReason.CRASHED, 128, "StartError"),
        (make_pod("Failed", terminated=ERROR_137, conditions=[
            disruption("PreemptionByScheduler", "Preempted by pod x on node n")]), {},
         ExitReason.PREEMPTED, 137, "PreemptionByScheduler: Preempted by pod x"),
        (make_pod("Failed", terminated=ERROR_137, conditions=[
            disruption("EvictionByEvictionAPI", "Eviction API: evicting")]), {},
         ExitReason.EVICTED, 137, "EvictionByEvictionAPI"),
        (make_pod("Failed", terminated=ERROR_137, conditions=[
            disruption("TerminationByKubelet", "node shutdown")]), {},
         ExitReason.EVICTED, 137, "TerminationByKubelet"),
        (make_pod("Failed", terminated=ERROR_137, deleting=True, conditions=[
            disruption("DeletionByTaintManager", "Taint manager: deleting")]), {},
         ExitReason.EVICTED, 137, "DeletionByTaintManager"),
        (make_pod("Running", deleting=True, conditions=[disruption("DeletionByPodGC", "gone")]),
         {"gone": True}, ExitReason.LOST, None, "DeletionByPodGC"),
        (make_pod("Failed", reason="Evicted", message="The node was low on memory."), {},
         ExitReason.EVICTED, None, "low on memory"),
        (make_pod("Failed", terminated=ERROR_137, deleting=True), {"deleted_by_master": True},
         ExitReason.DELETED, 137, "deleted by the master"),
        (make_pod("Failed", terminated={"exitCode": 1, "reason": "Error"}),
         {"deleted_by_master": True}, ExitReason.DELETED, 1, "deleted by the master"),
        (make_pod("Failed", terminated=ERROR_137, deleting=True), {},
         ExitReason.DELETED, 137, "not by the master"),
        (make_pod("Running"), {"gone": True}, ExitReason.DELETED, None, "not by the master"),
        (make_pod("Running", terminated=ERROR_137), {"disruption": ("PreemptionByScheduler", "p")},
         ExitReason.PREEMPTED, 137, "PreemptionByScheduler"),
        (make_pod("Failed", reason="OutOfcpu", message="Node didn't have enough resource"), {},
         ExitReason.LOST, None, "refused by its node: OutOfcpu"),
        (make_pod("Running", terminated={"exitCode": 2, "reason": "Error"}, sidecar_running=True),
         {}, ExitReason.CRASHED, 2, "exit status 2"),
    ],
    ids=["completed", "crashed", "signal", "oom", "start-error", "preempted", "evicted-api",
         "kubelet", "taint", "podgc", "node-pressure", "deleted-by-master",
         "asked-to-stop-before-it-crashed", "deleted-by-others", "gone", "sticky-disruption",
         "refused-by-node", "sidecar-keeps-pod-running"],
)  # fmt: skip
def test_how_a_pod_ended(pod, kw, reason, code, words) -> None:
    state = pod_state(pod, **kw)
    assert (state.phase, state.reason, state.exit_code) == (Phase.ENDED, reason, code)
    assert words in state.message and "\n" not in state.message
    assert state.reason.is_fault is (reason in (ExitReason.CRASHED, ExitReason.OOM_KILLED))


def test_running_and_pending() -> None:
    assert pod_state(make_pod("Running")).phase is Phase.RUNNING
    assert pod_state(make_pod("Running", deleting=True)).phase is Phase.RUNNING
    assert pod_state(make_pod("Unknown")).phase is Phase.NONE
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient cpu.\n preemption: 0/3 nodes",
    }
    state = pod_state(make_pod("Pending", conditions=[unschedulable], waiting={}))
    assert state == pod_state(make_pod("Pending", conditions=[unschedulable], waiting={}))
    assert state.phase is Phase.PENDING
    assert state.message == (
        "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes"
    )
    pulling = make_pod("Pending", waiting={"reason": "ImagePullBackOff", "message": "back-off"})
    assert pod_state(pulling).message == "ImagePullBackOff: back-off"
    creating = make_pod("Pending", waiting={"reason": "ContainerCreating"})
    assert pod_state(creating) == pod_state(make_pod("Pending", waiting={}))
    assert pod_state(creating).message == ""  # an ordinary step of a start: nothing to tell


def test_api_refusals_are_one_line() -> None:
    forbidden = KubeCallError(
        "create",
        "pods",
        "ml",
        403,
        'pods is forbidden: User "system:serviceaccount:ml:x"\ncannot create resource "pods"',
    )
    assert str(forbidden) == (
        'cannot create pods in namespace "ml": forbidden: pods is forbidden: User '
        '"system:serviceaccount:ml:x" cannot create resource "pods" (the master\'s Role lacks '
        "it: see manifests/rbac.yaml)"
    )
    assert forbidden.forbidden and not forbidden.transient and not forbidden.capacity
    quota = KubeCallError("create", "pods", "ml", 403, 'pods "p" is forbidden: exceeded quota: q')
    assert quota.capacity and not quota.forbidden
    security = KubeCallError("create", "pods", "ml", 403, 'violates PodSecurity "restricted"')
    assert "Pod Security admission" in str(security)
    assert KubeCallError("get", "pods", "ml", None, "timed out").transient
    assert KubeCallError("get", "pods", "ml", 503, "unavailable").transient
    assert KubeCallError("get", "pods", "ml", 429, "slow down").transient
    assert not KubeCallError("create", "pods", "ml", 422, "invalid").transient
    assert "no answer from the API server" in str(KubeCallError("get", "pods", "ml", None, "x"))
