"""Stopping, retrying and deleting a run under Argo's own controller, with no signal path:
the test kubelet serves no ``pods/exec``, so the controller's ``argoexec kill`` never
reaches the master, and the master learns of each from the API (kubernetes_run.py).

- ``argo stop`` and ``argo terminate`` during training, and a stop of a training step that
  runs below a launcher swallowing signals (a stand-in for KFP's), by ``argo stop`` and by
  what KFP's Terminate does (``spec.activeDeadlineSeconds`` set to 0): every worker and PS
  pod is gone within 20 s, the Workflow ends Failed, the job's state stays.
- ``argo stop`` then ``argo retry``: the job resumes from its state, accounting exact.
- the master's pod deleted mid-training: Argo's retryStrategy starts a new pod, whose
  master adopts the running workers (no worker restarts), accounting exact.
- the Workflow deleted while the job runs: within 60 s no object of the job remains.

Each job trains a paced model (tests/cluster/paced_model.py) on the example's data,
preprocessed once into the bucket.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import pytest
from argo_helpers import (
    ENDED,
    GROUP,
    VERSION,
    explain,
    job_name,
    job_pods,
    nodes_named,
    read_json,
    read_workflow,
    seconds_until,
    step_pods,
    submit,
    train_only_workflow,
    wait_for_training,
    wait_until_ended,
)
from kubernetes import client
from local_cluster import container_log, wait_for

from elastic_step.backends import kubernetes_pods as pods

#: More than any test waits for: the job is always mid-training when it is stopped.
ENDLESS = 500
#: A job that ends within the test, and that its steps catch mid-training: 12 epochs of 114
#: paced batches last at least 17 s with 2 workers.
SHORT = 12


def _start(argo, api, s3_server, data: str, epochs: int, **kw) -> tuple[str, str, str]:
    """Submits a training-only Workflow and waits until it trains: (workflow, job, the
    output's key prefix in the bucket)."""
    key = f"jobs/{uuid.uuid4().hex[:8]}/model"
    manifest = train_only_workflow(data, f"s3://{argo.bucket}/{key}", epochs=epochs, **kw)
    name = submit(argo, manifest)
    job = job_name(read_workflow(api, argo.namespace, name), "train")
    wait_for_training(s3_server, argo.bucket, key, version=3, timeout=300)
    return name, job, key


class _StartedRun(NamedTuple):
    """A training-only Workflow that trains, and the API clients of the test that started it."""

    api: client.ApiClient
    core: client.CoreV1Api
    name: str
    job: str
    key: str


@contextmanager
def _started(argo, s3_server, data: str, epochs: int, **kw) -> Iterator[_StartedRun]:
    """:func:`_start` under an admin API client, held open while the test runs."""
    with argo.cluster.admin() as api:
        name, job, key = _start(argo, api, s3_server, data, epochs, **kw)
        yield _StartedRun(api, client.CoreV1Api(api), name, job, key)


def _master_log(argo, api, name: str, attempt: int = 0) -> str:
    core = client.CoreV1Api(api)
    node = f"{name}.train({attempt})"
    for pod in step_pods(core, argo.namespace, name):
        if pod.metadata.annotations.get("workflows.argoproj.io/node-name") == node:
            return container_log(argo.cluster.workdir, pod)
    raise AssertionError(f"no pod of node {node}")


def _job_objects(api, ns: str, job: str) -> dict[str, list[str]]:
    """The names of the job's objects, by kind."""
    selector = pods.job_selector(job)
    core = client.CoreV1Api(api)
    lists = {
        "pods": core.list_namespaced_pod,
        "services": core.list_namespaced_service,
        "secrets": core.list_namespaced_secret,
        "configmaps": core.list_namespaced_config_map,
        "leases": client.CoordinationV1Api(api).list_namespaced_lease,
    }
    return {
        kind: sorted(o.metadata.name for o in list_(ns, label_selector=selector).items)
        for kind, list_ in lists.items()
    }


#: How each stop is made, and what the master says it saw.
STOPS = {
    "argo stop": "spec.shutdown is Stop",
    "argo terminate": "spec.shutdown is Terminate",
    "argo stop, below a launcher": "spec.shutdown is Stop",
    # What KFP's Terminate does to the run's Workflow; KFP's launcher is in between too.
    "activeDeadlineSeconds 0, below a launcher": "spec.activeDeadlineSeconds is 0",
}


@pytest.mark.parametrize("how", list(STOPS))
def test_a_stopped_workflow_leaves_no_pod_of_the_job_within_20_s(
    argo, s3_server, training_data, how
):
    ns = argo.namespace
    launcher = how.endswith("launcher")
    with _started(argo, s3_server, training_data, ENDLESS, launcher=launcher) as started:
        api, core, name, job, _ = started
        assert len(job_pods(core, ns, job)) == 3, explain(argo, api, name)
        if how.startswith("argo"):
            argo.cli(how.split()[1].rstrip(","), name)
        else:
            client.CustomObjectsApi(api).patch_namespaced_custom_object(
                GROUP, VERSION, ns, "workflows", name, {"spec": {"activeDeadlineSeconds": 0}}
            )
        elapsed = seconds_until(lambda: not job_pods(core, ns, job), timeout=20)
        print(f"{how}: the job's last pod was gone {elapsed:.1f} s after the shutdown")
        workflow = wait_until_ended(api, ns, name, timeout=60)
        assert workflow["status"]["phase"] == "Failed", explain(argo, api, name)
        log = _master_log(argo, api, name)
        assert f"the run is stopped (Workflow {name}: {STOPS[how]}" in log, log
        if launcher:
            assert "launcher: running" in log, log
        # A stop keeps the job resumable: its Lease and state stay with the Workflow.
        objects = _job_objects(api, ns, job)
        assert objects["pods"] == [] and objects["services"] == [], objects
        assert objects["leases"] == [f"{job}-master"] and objects["configmaps"], objects
        assert objects["secrets"] == [], objects  # the job's secret is derived, not stored
        argo.cli("delete", name)


def test_argo_retry_after_argo_stop_resumes_the_job(argo, s3_server, training_data):
    ns = argo.namespace
    with _started(argo, s3_server, training_data, SHORT) as (api, core, name, job, key):
        argo.cli("stop", name)
        seconds_until(lambda: not job_pods(core, ns, job), timeout=20)
        workflow = wait_until_ended(api, ns, name, timeout=60)
        assert workflow["status"]["phase"] == "Failed", explain(argo, api, name)
        stopped_at = read_json(s3_server, argo.bucket, f"{key}/status.json")["model_version"]

        argo.cli("retry", name)

        def settled() -> str:
            # `argo retry` empties the phase; the controller then runs the Workflow again, or
            # ends it at once (nothing left to retry), which is no reason to wait on.
            phase = _phase(api, ns, name)
            return phase if phase in ("Running", *ENDED) else ""

        phase = wait_for("the retried workflow to run", settled)
        assert phase == "Running", explain(argo, api, name)
        workflow = wait_until_ended(api, ns, name, timeout=600)
        assert workflow["status"]["phase"] == "Succeeded", explain(argo, api, name)
        summary = read_json(s3_server, argo.bucket, f"{key}/summary.json")
        assert summary["phase"] == "succeeded"
        assert len(summary["epochs"]) == SHORT
        assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
        assert summary["restarts"]["master"] == 1, summary["restarts"]
        logs = "\n".join(
            container_log(argo.cluster.workdir, pod)
            for pod in step_pods(core, ns, name)
            if pod.status.phase == "Succeeded"
        )
        assert f"resuming the job in s3://{argo.bucket}/{key}" in logs, logs
        assert stopped_at > 0
        argo.cli("delete", name)


def test_a_deleted_master_pod_is_retried_and_adopts_the_workers(argo, s3_server, training_data):
    ns = argo.namespace
    with _started(argo, s3_server, training_data, SHORT) as (api, core, name, job, key):
        members = core.list_namespaced_pod(ns, label_selector=pods.job_selector(job)).items
        (master,) = [
            p
            for p in step_pods(core, ns, name)
            if p.metadata.annotations["workflows.argoproj.io/node-name"] == f"{name}.train(0)"
        ]
        core.delete_namespaced_pod(master.metadata.name, ns)  # its grace period: a SIGTERM
        deleted = time.monotonic()

        def adopted() -> bool:
            try:
                return "adopted" in _master_log(argo, api, name, attempt=1)
            except (AssertionError, OSError):
                return False

        wait_for("the retried step's master to adopt the job", adopted, timeout=240)
        elapsed = time.monotonic() - deleted
        print(f"master pod deleted -> the retry's master adopted the job in {elapsed:.1f} s")
        workflow = wait_until_ended(api, ns, name, timeout=600)
        assert workflow["status"]["phase"] == "Succeeded", explain(argo, api, name)
        attempts = {n["displayName"]: n["phase"] for n in nodes_named(workflow, "train")}
        # The first attempt ends as Error ("pod deleted") when the controller sees the pod go
        # first, or as Failed when it first sees the master's exit (143, after its SIGTERM).
        first_attempt = attempts.pop("train(0)")
        assert first_attempt in ("Error", "Failed"), explain(argo, api, name)
        assert attempts == {"train": "Succeeded", "train(1)": "Succeeded"}, attempts
        first = container_log(argo.cluster.workdir, master)
        assert "leaving workers and PS running for the next master" in first, first
        log = _master_log(argo, api, name, attempt=1)
        adopted_line = log.split("adopted", 1)[1].split("\n", 1)[0]
        lost = [p for p in members if p.metadata.name.removeprefix(f"{job}-") not in adopted_line]
        assert not lost, _lost_report(argo, core, lost, first, log)
        summary = read_json(s3_server, argo.bucket, f"{key}/summary.json")
        assert summary["restarts"] == {"worker": 0, "ps": 0, "master": 1}, summary["restarts"]
        assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
        argo.cli("delete", name)


def _lost_report(argo, core, lost: list, first_master: str, second_master: str) -> str:
    """Why instances were not adopted: how their pods ended, the ends of their logs, and of
    both masters' logs."""
    parts = [f"the first master's log, last lines:\n{first_master[-3000:]}"]
    for pod in lost:
        try:
            now = core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
            statuses = [(s.name, s.state.to_dict()) for s in now.status.container_statuses or []]
            phase = now.status.phase
        except client.ApiException as e:  # the master deletes the pods of the lost
            phase, statuses = f"gone ({e.status})", []
        log = container_log(argo.cluster.workdir, pod)
        parts.append(
            f"{pod.metadata.name}: phase {phase}, containers {statuses}; "
            f"log, last lines:\n{log[-3000:]}"
        )
    parts.append(f"the retried master's log:\n{second_master}")
    return "\n\n".join(parts)


def test_deleting_the_workflow_removes_every_object_of_the_job_within_60_s(
    argo, s3_server, training_data
):
    ns = argo.namespace
    with _started(argo, s3_server, training_data, ENDLESS) as (api, _, name, job, _):
        before = _job_objects(api, ns, job)
        assert len(before["pods"]) == 3 and before["leases"], before
        argo.cli("delete", name)
        nothing = {"pods": [], "services": [], "secrets": [], "configmaps": [], "leases": []}
        elapsed = seconds_until(lambda: _job_objects(api, ns, job) == nothing, timeout=60)
        print(f"argo delete: no object of the job left after {elapsed:.1f} s")


def _phase(api, ns: str, name: str) -> str:
    return read_workflow(api, ns, name).get("status", {}).get("phase", "")
