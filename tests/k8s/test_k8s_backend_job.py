"""A whole training job through the Kubernetes backend on the test control plane: the
master (here a process outside the cluster, acting as the elastic-step-master ServiceAccount)
runs its PS and workers as pods in a namespace that enforces the ``restricted`` Pod Security
Standard, survives a worker pod deleted by someone else (a standby pod takes its slot), and
leaves nothing running; its state stays until the run's owner is deleted.

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
    paced_train_argv,
    pod_log,
    read_status,
    restricted_fixture,  # noqa: F401 - the fixture restricted
    restricted_pod,
)

from elastic_step.backends import kubernetes_pods as pods


def test_a_job_runs_through_the_kubernetes_backend(cluster, restricted, digits, tmp_path):
    ns, job = restricted.name, new_job_name()
    output = tmp_path / "run"
    argv = paced_train_argv(
        digits, output, job,
        # Epochs enough to outlast a standby's loading (its windows compile before it is
        # ready), however fast training has become: 15 epochs of 180 paced batches last at
        # least 34 s with 2 workers.
        "--batch-size", "8", "--records-per-task", "64", "--epochs", "15",
        "--workers", "2", "--ps", "1", "--standby", "1",
        "--kubeconfig", str(restricted.master_kubeconfig),
        "--namespace", ns, "--image", "local/process", "--ps-cpu", "1",
    )  # fmt: skip
    log_path = tmp_path / "master.log"
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
                ready = "standby-0 is ready" in log_path.read_text()
                return ready and status().get("model_version", 0) >= 4

            poll("training under way, a standby ready", training, timeout=240)
            assert [m["id"] for m in status()["standby"]] == ["standby-0"]
            standby = core.read_namespaced_pod(f"{job}-standby-0", ns)
            assert standby.metadata.labels[pods.LABEL_ROLE] == "standby"
            ps_pod = core.read_namespaced_pod(f"{job}-ps-0", ns)
            env = {e.name: e for e in ps_pod.spec.containers[0].env}
            assert (
                env["ELASTIC_STEP_CPU_LIMIT"].value_from.resource_field_ref.resource == "limits.cpu"
            )
            # Its own token and the PS's certificate (mutual TLS: on with pods), no job secret.
            for variable in ("ELASTIC_STEP_TOKEN", "ELASTIC_STEP_TLS_CERT", "ELASTIC_STEP_TLS_KEY"):
                assert env[variable].value_from.secret_key_ref.name == f"{job}-secret"
            assert "ELASTIC_STEP_JOB_SECRET" not in env
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
        # The ready standby took the slot at once; a new standby started behind it.
        assert summary["standby"] == {"slots": 1, "promoted": 1}
        log = log_path.read_text()
        assert "standby-0 takes worker slot 0" in log and "launched standby-1" in log
        # The task it held, if any (a worker between tasks holds none, and a SIGTERM does
        # not wait), went back to the queue once, and not as a failure of its own; the exact
        # accounting above shows that nothing was lost either way.
        log = log_path.read_text()
        assert len(re.findall(r"re-queued .+ of worker-0\n", log)) <= 1, log[-3000:]
        assert "counts as a failure" not in log, log[-3000:]
        assert summary["metrics"]["accuracy"] > 0.8
        assert (output / "model.keras").exists()

        assert "closing the state store failed" not in log, log[-3000:]
        started = time.monotonic()
        idle = {"pods": [], "services": [], "secrets": []}
        poll("nothing of the job running", lambda: _job_objects(core, ns, job) == idle, timeout=20)
        assert time.monotonic() - started < 20
        # Its state stays with its owner (a finished job is not run twice); deleting the
        # owner forgets the job.
        assert _state_objects(api, ns, job) == {
            "configmaps": True,
            "leases": [f"{job}-master"],
        }
        core.delete_namespaced_config_map(f"{job}-owner", ns, propagation_policy="Background")
        nothing = {"configmaps": False, "leases": []}
        poll("the job's state gone", lambda: _state_objects(api, ns, job) == nothing, timeout=60)
        assert _job_objects(core, ns, job) == {"pods": [], "services": [], "secrets": []}
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
    # The job must still run when the second master starts, however fast training has
    # become: its model paces each training batch, so 8 epochs of batches of 8 last at least
    # 18 s of training after the test has seen it under way.
    argv = paced_train_argv(
        digits, output, job,
        "--batch-size", "8", "--records-per-task", "64", "--epochs", "8", "--workers", "2",
        "--ps", "1",
    )  # fmt: skip
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


# Calls each RPC of the master, by its Service name, with no credentials: plain TCP.
STRANGER = """
import sys, grpc
from elastic_step.rpc import master_pb2, master_pb2_grpc
stub = master_pb2_grpc.MasterStub(grpc.insecure_channel(sys.argv[1]))
calls = [
    ("Register", master_pb2.RegisterRequest(role=master_pb2.PS, name="ps-0", address="x:1")),
    ("GetPSAddresses", master_pb2.GetPSAddressesRequest()),
    ("NextTask", master_pb2.NextTaskRequest(worker="worker-0")),
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
    """A pod without the job's Secret reaches the master's port and gets no call through:
    with mutual TLS (on with pods) it cannot even complete a connection."""
    name = f"stranger-{new_job_name()}"
    command = [sys.executable, "-c", STRANGER, master]
    env = [{"name": "PYTHONPATH", "value": str(REPO)}]
    core.create_namespaced_pod(ns, restricted_pod(name, command, env=env))

    def done():
        pod = core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = poll("the stranger pod to finish", done, timeout=120)
    log = container_log(cluster.workdir, pod)
    methods = ("Register", "GetPSAddresses", "NextTask", "Heartbeat")
    words = [line.split() for line in log.splitlines()]
    codes = dict(w for w in words if len(w) == 2 and w[0] in methods)
    assert pod.status.phase == "Succeeded", log
    assert codes == dict.fromkeys(methods, "UNAVAILABLE"), log


def _exists(core: client.CoreV1Api, name: str, ns: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
    except client.rest.ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def _start_master_pod_job(
    cluster, core, ns: str, digits: Path, output: Path
) -> tuple[str, list[str], str]:
    """A master pod running a job, once its training is under way: (job, its command, master
    pod)."""
    job = new_job_name()
    # Paced: the job outlasts two stops and a resume, however fast training has become.
    argv = paced_train_argv(
        digits, output, job,
        "--batch-size", "8", "--records-per-task", "64", "--epochs", "12", "--workers", "2",
        "--ps", "1",
    )  # fmt: skip
    name = f"{job}-step"
    core.create_namespaced_pod(ns, master_pod_manifest(name, argv))

    def training() -> bool:
        pod = core.read_namespaced_pod(name, ns)
        assert pod.status.phase in ("Pending", "Running"), container_log(cluster.workdir, pod)
        return read_status(output).get("model_version", 0) >= 2

    poll("training under way", training, timeout=240)
    return job, argv, name


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


def test_a_stopped_job_keeps_its_state_and_the_same_command_resumes_it(
    cluster, restricted, digits, tmp_path
):
    """Two stops of a bare master pod, each followed by the same command: a SIGTERM alone
    (what Argo's and KFP's signal path sends), then an ordinary delete of the master's pod.
    Each time the workers and PS are gone within 20 s, the state stays, and the next master
    resumes the job; at the end the accounting is exact."""
    ns = restricted.name
    output = tmp_path / "run"
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        job, argv, master = _start_master_pod_job(cluster, core, ns, digits, output)
        stopped = {"pods": [], "services": [], "secrets": []}
        for attempt, how in enumerate(("SIGTERM", "delete"), start=1):
            pod = core.read_namespaced_pod(master, ns)
            if how == "SIGTERM":
                os.kill(pid_of(core.read_namespaced_pod(master, ns)), signal.SIGTERM)
            else:
                core.delete_namespaced_pod(master, ns)  # the pod's grace period: a SIGTERM
            started = time.monotonic()
            poll(
                "no pod, Service or worker Secret of the job",
                lambda: _job_objects(core, ns, job) == stopped,
                timeout=20,
            )
            elapsed = time.monotonic() - started
            print(f"stop by {how}: the job's pods were gone after {elapsed:.1f} s")
            assert elapsed < 20
            log = container_log(cluster.workdir, pod)
            assert "the run is stopped" in log and "the same command resumes it" in log, log
            if how == "SIGTERM":
                pod = poll(
                    "the master to exit",
                    lambda m=master: (
                        (p := core.read_namespaced_pod(m, ns)).status.phase == "Failed" and p
                    ),
                    timeout=30,
                )
                terminated = pod.status.container_statuses[0].state.terminated
                assert terminated.exit_code == 128 + signal.SIGTERM
            else:
                poll("the master pod gone", lambda m=master: not _exists(core, m, ns), timeout=40)
                log = container_log(cluster.workdir, pod)
                assert f"pod {master} is being deleted" in log, log
            assert _state_objects(api, ns, job)["leases"] == [f"{job}-master"]
            version = read_status(output)["model_version"]  # where the stopped master left it
            master = f"{job}-step-{attempt + 1}"
            core.create_namespaced_pod(ns, master_pod_manifest(master, argv))
            if attempt == 1:

                def resumed(m=master, v=version) -> bool:
                    log = container_log(cluster.workdir, core.read_namespaced_pod(m, ns))
                    training = read_status(output).get("model_version", 0) > v + 2
                    return "resuming the job" in log and training

                poll("the resumed job training", resumed, timeout=240)

        def finished() -> bool:
            pod = core.read_namespaced_pod(master, ns)
            assert pod.status.phase in ("Pending", "Running", "Succeeded"), pod_log(
                cluster, core, master, ns
            )
            return pod.status.phase == "Succeeded"

        poll("the job to finish", finished, timeout=600)
        log = container_log(cluster.workdir, core.read_namespaced_pod(master, ns))
        assert "resuming the job" in log, log[-3000:]
        summary = json.loads((output / "summary.json").read_text())
        assert summary["phase"] == "succeeded"
        assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
        assert summary["restarts"]["master"] == 2, summary["restarts"]
    clean_namespace(cluster, ns)


def test_an_evicted_master_leaves_its_pods_for_the_next_master(
    cluster, restricted, digits, tmp_path
):
    ns = restricted.name
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        job, _, master = _start_master_pod_job(cluster, core, ns, digits, tmp_path / "run")
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


def _state_objects(api: client.ApiClient, ns: str, job: str) -> dict:
    """Whether the job's state ConfigMaps exist, and its Leases."""
    selector = pods.job_selector(job)
    configmaps = client.CoreV1Api(api).list_namespaced_config_map(ns, label_selector=selector)
    leases = client.CoordinationV1Api(api).list_namespaced_lease(ns, label_selector=selector)
    return {
        "configmaps": bool(configmaps.items),
        "leases": [lease.metadata.name for lease in leases.items],
    }
