"""What the Kubeflow Pipelines tests share: the example pipeline uploaded and run as a user
runs it, with ``kfp.Client(host=...)``, and a run's state read back from KFP's API."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import boto3
import kfp
import requests
from kfp_backend import KFP_BUCKET
from kubernetes import client
from local_cluster import REPO, container_log, wait_for

from elastic_step.components.identity import job_name_for
from elastic_step.examples import path_of

EXAMPLE_PACKAGE = REPO / "pipelines" / "kfp_pipeline.yaml"
PIPELINE_NAME = "elastic-step-example"  # the name in the compiled package
#: Where the example's inputs are in KFP's bucket (tests/argo/conftest.py puts them there).
CSV_URI = f"minio://{KFP_BUCKET}/datasets/breast_cancer.csv"
MODEL_DEF_URI = f"minio://{KFP_BUCKET}/models/breast_cancer.py"
#: A small job on the test node (4 CPUs, 8 GiB): the pipeline's defaults ask for 1 CPU and
#: 2 GiB per worker and PS.
SMALL = {
    "worker_cpu": "0.5",
    "worker_memory": "768Mi",
    "ps_cpu": "0.5",
    "ps_memory": "768Mi",
    "max_workers": 2,
}
FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED")
TASKS_SETTLE = 30.0
TRAIN_TASK = "elastic-train"
#: The init container that puts KFP's launcher into an executor's pod (argocompiler).
KFP_LAUNCHER = "kfp-launcher"


def upload_example_inputs(s3_client_kwargs: dict[str, str], csv: Path) -> None:
    s3 = boto3.client("s3", **s3_client_kwargs)
    s3.upload_file(str(csv), KFP_BUCKET, "datasets/breast_cancer.csv")
    s3.upload_file(str(path_of("breast_cancer")), KFP_BUCKET, "models/breast_cancer.py")


def client_for(http: str) -> kfp.Client:
    return kfp.Client(host=http)


def run_example(user: kfp.Client, **params: object) -> str:
    """Uploads the compiled example pipeline under a new name and starts a run of it with
    the example's inputs and ``params``; the run's id."""
    name = f"elastic-step-example-{uuid.uuid4().hex[:6]}"
    pipeline = user.upload_pipeline(str(EXAMPLE_PACKAGE), name)
    (version,) = user.list_pipeline_versions(pipeline.pipeline_id).pipeline_versions
    experiment = user.create_experiment(f"exp-{name}")
    run = user.run_pipeline(
        experiment.experiment_id,
        name,
        pipeline_id=pipeline.pipeline_id,
        version_id=version.pipeline_version_id,
        params={"csv_uri": CSV_URI, "label": "benign", "model_def_uri": MODEL_DEF_URI, **params},
    )
    return run.run_id


def wait_for_run(user: kfp.Client, run_id: str, timeout: float, leaving: str | None = None):
    """The run once KFP shows it in a final state (after it has left state ``leaving``) and
    its tasks too. KFP's API server stores a finished run's state before its tasks', so for a
    moment a SUCCEEDED run lists RUNNING tasks; a task still unfinished TASKS_SETTLE seconds
    after its run is left for the caller's assertions to show."""
    left = leaving is None
    final_since: float | None = None

    def ended():
        nonlocal left, final_since
        run = user.get_run(run_id)
        left = left or str(run.state) != leaving
        if not (left and str(run.state) in FINAL_STATES):
            return None
        final_since = final_since or time.monotonic()
        settled = set(task_states(run).values()) <= set(FINAL_STATES)
        return run if settled or time.monotonic() - final_since > TASKS_SETTLE else None

    return wait_for(f"run {run_id} to end", ended, timeout=timeout, interval=2.0)


def train_job_name(run_id: str) -> str:
    """The training step's job (elastic_step.components.identity)."""
    return job_name_for(run_id, TRAIN_TASK)


def task_states(run) -> dict[str, str]:
    """The state of each task that KFP's API names, by name: the components', their drivers'
    and executors' (a name shown twice keeps a state other than SUCCEEDED)."""
    states: dict[str, str] = {}
    for task in run.run_details.task_details or []:
        if task.display_name is None:  # an Argo node of KFP's templates, not a task
            continue
        if states.get(task.display_name, "SUCCEEDED") == "SUCCEEDED":
            states[task.display_name] = str(task.state)
    return states


def train_output_keys(s3_server, run_id: str) -> list[str]:
    """Every key under the training step's outputs in KFP's bucket (the model's directory,
    which the master writes itself, and the launcher's uploads)."""
    return s3_server.keys(KFP_BUCKET, f"v2/artifacts/{PIPELINE_NAME}/{run_id}/{TRAIN_TASK}/")


def wait_for_training(s3_server, run_id: str, version: int, timeout: float) -> dict:
    """The training job's status.json once it shows at least model ``version``."""

    def training() -> dict | None:
        for key in train_output_keys(s3_server, run_id):
            if key.endswith("/model/status.json"):
                status = json.loads(s3_server.read(KFP_BUCKET, key))
                if status.get("model_version", 0) >= version:
                    return status
        return None

    return wait_for("training under way", training, timeout=timeout, interval=1.0)


def training_pods(core: client.CoreV1Api, ns: str, run_id: str) -> list[client.V1Pod]:
    """The pods of the run's training step, where its master runs (each attempt's): KFP's
    executor pods (the ones with its launcher as an init container) whose command runs the
    elastic_train component. Not its driver's pods, whose ``--container`` argument holds the
    same command as JSON."""
    found = []
    for pod in core.list_namespaced_pod(ns, label_selector=f"pipeline/runid={run_id}").items:
        main = next((c for c in pod.spec.containers if c.name == "main"), None)
        init = {c.name for c in pod.spec.init_containers or []}
        if main is None or KFP_LAUNCHER not in init:
            continue
        if "def elastic_train(" in " ".join([*(main.command or []), *(main.args or [])]):
            found.append(pod)
    return found


def master_pod(core: client.CoreV1Api, ns: str, run_id: str) -> client.V1Pod:
    """The running pod of the run's training step."""
    for pod in training_pods(core, ns, run_id):
        if pod.status.phase == "Running":
            return pod
    raise AssertionError(f"no running training pod in run {run_id}")


def retry_run(http: str, run_id: str) -> None:
    """KFP's Retry of a failed run, as the UI's button asks it of the API server."""
    response = requests.post(f"{http}/apis/v2beta1/runs/{run_id}:retry", timeout=30)
    assert response.ok, (response.status_code, response.text)


def master_log(
    workdir: Path, core: client.CoreV1Api, ns: str, run_id: str, *, other_than: client.V1Pod
) -> str:
    """The whole log of the run's training pod other than ``other_than`` (a retry's)."""
    for pod in training_pods(core, ns, run_id):
        if pod.metadata.uid != other_than.metadata.uid:
            return container_log(workdir, pod)
    raise AssertionError(f"no other training pod in run {run_id}")
