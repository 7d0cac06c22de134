"""A whole training job through the Kubernetes backend on the test control plane: the
master (here a process outside the cluster, acting as the elastic-step-master ServiceAccount)
runs its PS and workers as pods in a namespace that enforces the ``restricted`` Pod Security
Standard, survives a worker pod deleted by someone else, and leaves nothing behind.

Then the master itself as a pod, with only the project's Role: it is replaced mid-job by
another pod of the same --job-name, which adopts the running pods.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from k8s_helpers import container_log, pid_of
from k8s_helpers import wait_for as poll
from kubernetes import client
from test_k8s_backend_support import (
    REPO,
    clean_namespace,
    digits_fixture,  # noqa: F401 - the fixture digits
    master_pod_manifest,
    new_job_name,
    pod_log,
    read_status,
    restricted_fixture,  # noqa: F401 - the fixture restricted
    restricted_pod,
)

from elastic_step.backends import kubernetes_pods as pods
from elastic_step.examples import path_of


def test_a_job_runs_through_the_kubernetes_backend(cluster, restricted, digits, tmp_path):
    ns, job = restricted.name, new_job_name()
    output = tmp_path / "run"
    argv = [
        sys.executable, "-m", "elastic_step", "train",
        "--model-def", path_of("digits"), "--data", str(digits), "--output", str(output),
        "--batch-size", "32", "--records-per-task", "64", "--seed", "7", "--epochs", "3",
        "--workers", "2", "--ps", "1", "--job-name", job,
        "--backend", "kubernetes", "--kubeconfig", str(restricted.master_kubeconfig),
        "--namespace", ns, "--image", "local/process", "--ps-cpu", "1",
        # The process kubelet runs pods on this machine: they import this checkout.
        "--env", f"PYTHONPATH={REPO}",
    ]  # fmt: skip
    log_path = tmp_path / "master.log"
    selector = pods.job_selector(job)
    with cluster.admin() as api, open(log_path, "w") as log:
        core = client.CoreV1Api(api)
        master = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:

            def status() -> dict:
                try:
                    return json.loads((output / "status.json").read_text())
                except (OSError, ValueError):
                    return {}

            def training() -> bool:
                assert master.poll() is None, log_path.read_text()[-3000:]
                return status().get("model_version", 0) >= 4

            poll("training under way", training, timeout=240)
            ps_pod = core.read_namespaced_pod(f"{job}-ps-0", ns)
            env = {e.name: e for e in ps_pod.spec.containers[0].env}
            assert (
                env["ELASTIC_STEP_CPU_LIMIT"].value_from.resource_field_ref.resource == "limits.cpu"
            )
            assert env["ELASTIC_STEP_JOB_SECRET"].value_from.secret_key_ref.name == f"{job}-secret"
            # Someone deletes a worker's pod: not its fault, replaced.
            core.delete_namespaced_pod(f"{job}-worker-0", ns)
            assert master.wait(timeout=300) == 0, log_path.read_text()[-3000:]
        finally:
            if master.poll() is None:
                master.kill()
                master.wait()
        summary = json.loads((output / "summary.json").read_text())
        assert summary["phase"] == "succeeded"
        assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
        assert summary["restarts_by_reason"] == {"deleted": 1}, summary["restarts_by_reason"]
        # The task it held, if any (a worker between tasks holds none, and a SIGTERM does
        # not wait), went back to the queue once, and not as a failure of its own; the exact
        # accounting above shows that nothing was lost either way.
        log = log_path.read_text()
        assert len(re.findall(r"re-queued .+ of worker-0\n", log)) <= 1, log[-3000:]
        assert "counts as a failure" not in log, log[-3000:]
        assert summary["metrics"]["accuracy"] > 0.8
        assert (output / "model.keras").exists()

        def nothing_left() -> bool:
            return not (
                core.list_namespaced_pod(ns, label_selector=selector).items
                or core.list_namespaced_service(ns, label_selector=selector).items
                or core.list_namespaced_secret(ns, label_selector=selector).items
                or core.list_namespaced_config_map(ns, label_selector=selector).items
            )

        started = time.monotonic()
        poll("no object of the job left", nothing_left, timeout=20)
        assert time.monotonic() - started < 20
    clean_namespace(cluster, ns)


def test_a_master_pod_replaced_mid_job_is_found_again_by_its_service(
    cluster, restricted, digits, tmp_path
):
    """The master runs as a pod with only the project's Role (in-cluster configuration),
    listens on its pod IP and advertises its Service's DNS name. Its pod is lost mid-job
    (deleted with no grace: SIGKILL); a new master pod, with another name and IP, takes the
    job over, adopts the running pods and re-points the Service, and the workers reach it by
    the same name."""
    ns, job = restricted.name, new_job_name()
    output = tmp_path / "run"
    argv = [
        sys.executable, "-m", "elastic_step", "train",
        "--model-def", path_of("digits"), "--data", str(digits), "--output", str(output),
        "--batch-size", "32", "--records-per-task", "64", "--seed", "7", "--epochs", "4",
        "--workers", "2", "--ps", "1", "--job-name", job, "--backend", "kubernetes",
        "--env", f"PYTHONPATH={REPO}",
    ]  # fmt: skip
    with cluster.admin() as api:
        core = client.CoreV1Api(api)

        def status() -> dict:
            return read_status(output)

        def log_of(name: str) -> str:
            return pod_log(cluster, core, name, ns)

        first = f"{job}-step-1"
        core.create_namespaced_pod(ns, master_pod_manifest(first, argv))

        def training() -> bool:
            phase = core.read_namespaced_pod(first, ns).status.phase
            assert phase in ("Pending", "Running"), log_of(first)
            return status().get("model_version", 0) >= 4

        poll("training under way", training, timeout=240)
        first_pod = core.read_namespaced_pod(first, ns)
        assert status()["master"].startswith(f"{job}-master.{ns}.svc:")
        workers = {
            p.metadata.name: p.metadata.uid
            for p in core.list_namespaced_pod(ns, label_selector=pods.job_selector(job)).items
        }
        assert set(workers) == {f"{job}-ps-0", f"{job}-worker-0", f"{job}-worker-1"}
        for name in workers:  # owned by the job's ConfigMap, not by the master's pod
            owners = core.read_namespaced_pod(name, ns).metadata.owner_references
            assert [(o.kind, o.name) for o in owners] == [("ConfigMap", f"{job}-owner")]
        _strangers_are_refused(cluster, core, ns, status()["master"])

        core.delete_namespaced_pod(first, ns, grace_period_seconds=0)
        poll("the first master gone", lambda: not _exists(core, first, ns), timeout=30)
        second = f"{job}-step-2"
        core.create_namespaced_pod(ns, master_pod_manifest(second, argv))

        def finished() -> bool:
            phase = core.read_namespaced_pod(second, ns).status.phase
            assert phase in ("Pending", "Running", "Succeeded"), log_of(second)
            return phase == "Succeeded"

        poll("the second master to finish the job", finished, timeout=300)
        second_pod = core.read_namespaced_pod(second, ns)
        assert second_pod.status.pod_ip != first_pod.status.pod_ip
        summary = json.loads((output / "summary.json").read_text())
        assert summary["phase"] == "succeeded"
        assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
        assert summary["restarts"] == {"worker": 0, "ps": 0, "master": 1}, summary
        log = log_of(second)
        assert "adopted" in log and "worker-0" in log, log
        selector = pods.job_selector(job)
        assert not core.list_namespaced_pod(ns, label_selector=selector).items
        assert not core.list_namespaced_service(ns, label_selector=selector).items
    clean_namespace(cluster, ns)


# Calls each RPC of the master, by its Service name, with no credentials.
STRANGER = """
import sys, grpc
from elastic_step.rpc import master_pb2, master_pb2_grpc
stub = master_pb2_grpc.MasterStub(grpc.insecure_channel(sys.argv[1]))
calls = [
    ("Register", master_pb2.RegisterRequest(role=master_pb2.PS, name="ps-0", address="x:1")),
    ("GetPSAddresses", master_pb2.GetPSAddressesRequest()),
    ("GetTask", master_pb2.GetTaskRequest(worker="worker-0")),
    ("ReportTask", master_pb2.ReportTaskRequest(worker="worker-0", task_id=0, ok=True)),
    ("Heartbeat", master_pb2.HeartbeatRequest(name="worker-0")),
]
for method, request in calls:
    try:
        getattr(stub, method)(request, timeout=20)
        print(method, "OK")
    except grpc.RpcError as e:
        print(method, e.code().name)
"""


def _strangers_are_refused(cluster, core: client.CoreV1Api, ns: str, master: str) -> None:
    """A pod without the job's Secret reaches the master's port and is refused every call."""
    name = f"stranger-{new_job_name()}"
    command = [sys.executable, "-c", STRANGER, master]
    env = [{"name": "PYTHONPATH", "value": str(REPO)}]
    core.create_namespaced_pod(ns, restricted_pod(name, command, env=env))

    def done():
        pod = core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = poll("the stranger pod to finish", done, timeout=120)
    log = container_log(cluster.workdir, pod)
    methods = ("Register", "GetPSAddresses", "GetTask", "ReportTask", "Heartbeat")
    words = [line.split() for line in log.splitlines()]
    codes = dict(w for w in words if len(w) == 2 and w[0] in methods)
    assert pod.status.phase == "Succeeded", log
    assert codes == dict.fromkeys(methods, "UNAUTHENTICATED"), log


def _exists(core: client.CoreV1Api, name: str, ns: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
    except client.rest.ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def _start_master_pod_job(cluster, core, ns: str, digits: Path, output: Path) -> tuple[str, str]:
    """A master pod running a job, once its training is under way: (job, master pod)."""
    job = new_job_name()
    argv = [
        sys.executable, "-m", "elastic_step", "train",
        "--model-def", path_of("digits"), "--data", str(digits), "--output", str(output),
        "--batch-size", "32", "--records-per-task", "64", "--seed", "7", "--epochs", "20",
        "--workers", "2", "--ps", "1", "--job-name", job, "--backend", "kubernetes",
        "--env", f"PYTHONPATH={REPO}",
    ]  # fmt: skip
    name = f"{job}-step"
    core.create_namespaced_pod(ns, master_pod_manifest(name, argv))

    def training() -> bool:
        pod = core.read_namespaced_pod(name, ns)
        assert pod.status.phase in ("Pending", "Running"), container_log(cluster.workdir, pod)
        return read_status(output).get("model_version", 0) >= 2

    poll("training under way", training, timeout=240)
    return job, name


def _job_objects(core: client.CoreV1Api, ns: str, job: str) -> dict[str, list[str]]:
    selector = pods.job_selector(job)
    return {
        "pods": [
            p.metadata.name for p in core.list_namespaced_pod(ns, label_selector=selector).items
        ],
        "services": [
            s.metadata.name for s in core.list_namespaced_service(ns, label_selector=selector).items
        ],
        "secrets": [
            s.metadata.name for s in core.list_namespaced_secret(ns, label_selector=selector).items
        ],
    }


def test_sigterm_with_no_disruption_stops_the_run_and_leaves_nothing_within_20_s(
    cluster, restricted, digits, tmp_path
):
    """What Argo and KFP do to stop a run: SIGTERM to the step's process, no pod deletion."""
    ns = restricted.name
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        job, master = _start_master_pod_job(cluster, core, ns, digits, tmp_path / "run")
        os.kill(pid_of(core.read_namespaced_pod(master, ns)), signal.SIGTERM)
        signalled = time.monotonic()
        nothing = {"pods": [], "services": [], "secrets": []}
        poll("no pod, Service or Secret of the job", lambda: _job_objects(core, ns, job) == nothing,
             timeout=20)  # fmt: skip
        elapsed = time.monotonic() - signalled
        print(f"the job's objects were gone {elapsed:.1f} s after SIGTERM")
        assert elapsed < 20
        pod = poll(
            "the master to exit",
            lambda: (p := core.read_namespaced_pod(master, ns)).status.phase == "Failed" and p,
            timeout=30,
        )
        assert pod.status.container_statuses[0].state.terminated.exit_code == 128 + signal.SIGTERM
    clean_namespace(cluster, ns)


def test_an_evicted_master_leaves_its_pods_for_the_next_master(
    cluster, restricted, digits, tmp_path
):
    ns = restricted.name
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        job, master = _start_master_pod_job(cluster, core, ns, digits, tmp_path / "run")
        before = _job_objects(core, ns, job)
        uids = {
            p.metadata.name: p.metadata.uid
            for p in core.list_namespaced_pod(ns, label_selector=pods.job_selector(job)).items
        }
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=master, namespace=ns))
        core.create_namespaced_pod_eviction(master, ns, eviction)
        poll("the master pod gone", lambda: not _exists(core, master, ns), timeout=60)
        after = _job_objects(core, ns, job)
        assert after == before and len(after["pods"]) == 3, (before, after)
        assert uids == {
            p.metadata.name: p.metadata.uid
            for p in core.list_namespaced_pod(ns, label_selector=pods.job_selector(job)).items
        }
        core.delete_namespaced_config_map(f"{job}-owner", ns, propagation_policy="Background")
    clean_namespace(cluster, ns)
