"""A whole training job through the Kubernetes backend on the test control plane: the
master (here a process outside the cluster, acting as the elastic-step-master ServiceAccount)
runs its PS and workers as pods in a namespace that enforces the ``restricted`` Pod Security
Standard, survives a worker pod deleted by someone else, and leaves nothing behind.

(A master running as a pod needs the test cluster to resolve Service names; see
test_k8s_backend.py for what it does as a pod.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from k8s_helpers import wait_for as poll
from kubernetes import client
from test_k8s_backend_support import (
    REPO,
    clean_namespace,
    new_job_name,
    restricted_fixture,  # noqa: F401 - the fixture restricted
)

from elastic_step.backends import kubernetes_pods as pods
from elastic_step.demo import write_digits_csv
from elastic_step.examples import path_of


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("digits")
    write_digits_csv(str(root / "digits.csv"))
    subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(root / "digits.csv"),
         "--label", "digit", "--output", str(root / "data")],
        cwd=REPO, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return root / "data"


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
