"""What the run's object and the master's own pod ask of the master (kubernetes_run.py): a
stop of the run, a handover to the next master, or nothing (no cluster needed; the k8s and
Argo suites show the same against the real apiserver and Argo's controller)."""

from __future__ import annotations

import pytest

from elastic_step.backends.api import StopKind
from elastic_step.backends.kubernetes_run import UNREAD, stop_request_of

WORKFLOW = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "wf", "uid": "w1"}
JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j1"}
OWNER_CM = {"apiVersion": "v1", "kind": "ConfigMap", "name": "es-1-owner", "uid": "c1"}


def run(uid="w1", deleting=False, spec=None, status=None) -> dict:
    metadata = {"uid": uid}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    return {"metadata": metadata, "spec": spec or {}, "status": status or {}}


def pod(deleting=False, disruption=None) -> dict:
    metadata = {"name": "m"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    conditions = []
    if disruption:
        conditions.append(
            {"type": "DisruptionTarget", "status": "True", "reason": disruption, "message": "x"}
        )
    return {"metadata": metadata, "status": {"conditions": conditions}}


@pytest.mark.parametrize(
    ("owner", "the_run", "master", "kind", "words"),
    [
        # The run goes on: nothing to do.
        (WORKFLOW, run(status={"phase": "Running"}), pod(), None, ""),
        (WORKFLOW, UNREAD, pod(), None, ""),
        (None, UNREAD, UNREAD, None, ""),
        # Argo's stop and terminate, and KFP's Terminate.
        (WORKFLOW, run(spec={"shutdown": "Stop"}), pod(), StopKind.STOP, "spec.shutdown is Stop"),
        (WORKFLOW, run(spec={"shutdown": "Terminate"}), pod(), StopKind.STOP, "is Terminate"),
        (WORKFLOW, run(spec={"activeDeadlineSeconds": 0}), pod(), StopKind.STOP, "is 0"),
        (WORKFLOW, run(spec={"activeDeadlineSeconds": 600}), pod(), None, ""),
        (WORKFLOW, run(status={"phase": "Failed"}), pod(), StopKind.STOP, "has ended (Failed)"),
        # The run deleted: the stop wins over the pod's own deletion.
        (WORKFLOW, None, pod(deleting=True), StopKind.STOP, "Workflow wf was deleted"),
        (WORKFLOW, run(deleting=True), pod(deleting=True), StopKind.STOP, "is being deleted"),
        (WORKFLOW, run(uid="other"), pod(), StopKind.STOP, "another object now has its name"),
        (OWNER_CM, None, pod(), StopKind.STOP, "ConfigMap es-1-owner was deleted"),
        # A batch Job suspended or failed.
        (JOB, run(uid="j1", spec={"suspend": True}), pod(), StopKind.STOP, "is suspended"),
        (
            JOB,
            run(uid="j1", status={"conditions": [{"type": "Failed", "status": "True"}]}),
            pod(),
            StopKind.STOP,
            "has failed",
        ),
        # The master's pod deleted: moved by the platform, retried by an engine, or stopped.
        (OWNER_CM, run(uid="c1"), pod(True, "PreemptionByScheduler"), StopKind.HANDOVER, "Preempt"),
        (WORKFLOW, run(), pod(deleting=True), StopKind.HANDOVER, "Workflow wf starts it again"),
        (JOB, run(uid="j1"), None, StopKind.HANDOVER, "was deleted; Job train starts it again"),
        (OWNER_CM, run(uid="c1"), pod(deleting=True), StopKind.STOP, "pod m is being deleted"),
        (None, UNREAD, None, StopKind.STOP, "pod m was deleted"),
    ],
)
def test_stop_request_of(owner, the_run, master, kind, words):
    request = stop_request_of(owner, the_run, "m", master)
    if kind is None:
        assert request is None
        return
    assert request.kind is kind
    assert words in request.reason


def test_a_master_outside_a_pod_reads_only_its_run():
    assert stop_request_of(OWNER_CM, run(uid="c1"), None, UNREAD) is None
    assert stop_request_of(OWNER_CM, None, None, UNREAD).kind is StopKind.STOP
