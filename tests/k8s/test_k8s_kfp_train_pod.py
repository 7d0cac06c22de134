"""The compiled elastic-train component, run as KFP runs it: its own command and arguments from
components/kfp/elastic_train.yaml, in a pod of a run (the ``pipeline/runid`` label,
``KFP_POD_NAME``), with the executor input a KFP driver would give it. Its artifacts live on an
S3-compatible server (moto, on loopback), so its worker and PS pods, which see nothing of the
step's files, read the data and write checkpoints and the model there.

What the KFP launcher does around the command (download inputs, upload outputs) is not here:
the step must not need it, as its inputs and outputs are the artifacts' remote URIs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from k8s_helpers import container_log, create_secret, wait_terminal
from kubernetes import client
from s3_server import REGION
from test_k8s_backend_support import (
    REPO,
    clean_namespace,
    master_pod_manifest,
    restricted_fixture,  # noqa: F401 - the fixture restricted
)

from elastic_step.backends import kubernetes_pods as pods
from elastic_step.components.identity import job_name_for
from elastic_step.examples import path_of

COMPONENT = REPO / "components" / "kfp" / "elastic_train.yaml"
OUTPUTS = "/tmp/kfp_outputs"  # where KFP's driver puts the executor output file


def _artifact(name: str, schema: str, uri: str) -> dict:
    return {
        "artifacts": [{"name": name, "type": {"schemaTitle": schema}, "uri": uri, "metadata": {}}]
    }


def _executor_input(bucket: str, secret: str) -> dict:
    run = f"s3://{bucket}/pipeline-root/run-1/elastic-train"
    return {
        "inputs": {
            "artifacts": {"dataset": _artifact("dataset", "system.Dataset", f"s3://{bucket}/data")},
            "parameterValues": {
                "model_def_text": Path(path_of("digits")).read_text(),
                # A model version is a push, one per task here: 5 epochs of 45 tasks pass
                # the PS's first checkpoint (every 200 versions by default).
                "epochs": 5,
                "batch_size": 32,
                "records_per_task": 32,
                "workers": 2,
                "ps": 1,
                "seed": 7,
                "backend": "kubernetes",
                "storage_secret": secret,
                "task_name": "elastic-train",
            },
        },
        "outputs": {
            "artifacts": {
                "model": _artifact("model", "system.Model", f"{run}/model"),
                "metrics": _artifact("metrics", "system.Metrics", f"{run}/metrics"),
                "summary": _artifact("summary", "system.Artifact", f"{run}/summary"),
            },
            "parameters": {"job_name": {"outputFile": f"{OUTPUTS}/job_name"}},
            "outputFile": f"{OUTPUTS}/output_metadata.json",
        },
    }


def _step_pod(name: str, run_id: str, executor_input: dict, secret: str) -> dict:
    """The step's pod, as KFP's Argo workflow makes it for this component."""
    spec = yaml.safe_load(COMPONENT.read_text())
    container = spec["deploymentSpec"]["executors"]["exec-elastic-train"]["container"]
    args = [json.dumps(executor_input) if a == "{{$}}" else a for a in container["args"]]
    pod = master_pod_manifest(name, container["command"] + args)
    main = pod["spec"]["containers"][0]
    main["env"] = [
        {"name": "KFP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "KFP_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        # The image's python3 is this environment's; its package is this checkout.
        {"name": "PATH", "value": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        {"name": "PYTHONPATH", "value": str(REPO)},
    ]
    main["envFrom"] = [{"secretRef": {"name": secret}}]  # kfp-kubernetes' use_secret_as_env
    # Local paths of the artifacts, as the launcher lays them out (nothing is read there).
    main["volumeMounts"] = [
        {"name": "s3", "mountPath": "/s3"},
        {"name": "kfp-outputs", "mountPath": OUTPUTS},
    ]
    pod["spec"]["volumes"] = [
        {"name": "s3", "emptyDir": {}},
        {"name": "kfp-outputs", "emptyDir": {}},
    ]
    pod["metadata"]["labels"]["pipeline/runid"] = run_id
    return pod


@pytest.fixture
def digits_in_s3(s3_env, tmp_path) -> str:
    """A bucket holding scikit-learn's digits, preprocessed: returns the bucket."""
    from elastic_step.demo import write_digits_csv

    bucket = s3_env.new_bucket()
    csv = tmp_path / "digits.csv"
    write_digits_csv(str(csv))
    subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(csv),
         "--label", "digit", "--output", f"s3://{bucket}/data"],
        cwd=REPO, check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    return bucket


def test_the_train_component_runs_as_a_step_pod_on_s3(cluster, restricted, s3_env, digits_in_s3):
    ns, bucket = restricted.name, digits_in_s3
    secret, run_id = f"s3-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    name = f"elastic-train-{uuid.uuid4().hex[:6]}"
    server_env = s3_env.env()
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        s3_credentials = {
            "AWS_ACCESS_KEY_ID": server_env["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": server_env["AWS_SECRET_ACCESS_KEY"],
            "AWS_ENDPOINT_URL": server_env["AWS_ENDPOINT_URL"],
            "AWS_REGION": REGION,
        }
        create_secret(api, ns, secret, s3_credentials)
        try:
            executor_input = _executor_input(bucket, secret)
            core.create_namespaced_pod(ns, _step_pod(name, run_id, executor_input, secret))
            pod = wait_terminal(core, ns, name, timeout=300)
            log = container_log(cluster.workdir, pod)
            assert pod.status.phase == "Succeeded", log[-4000:]

            # The job was named by the run and the task, so a retried step finds it again.
            job = job_name_for(run_id, "elastic-train")
            assert f"job {job}" in log, log[-4000:]
            pod_dir = cluster.workdir / "pods" / f"{ns}_{name}_{pod.metadata.uid[:8]}"
            outputs = pod_dir / "volumes" / "kfp-outputs"
            executor_output = json.loads((outputs / "output_metadata.json").read_text())
            assert executor_output["parameterValues"]["job_name"] == job
            artifacts = executor_output["artifacts"]
            [metrics] = artifacts["metrics"]["artifacts"]
            assert 0.5 < metrics["metadata"]["accuracy"] <= 1.0, metrics
            [model] = artifacts["model"]["artifacts"]
            assert model["metadata"]["job_name"] == job and model["metadata"]["epochs"] == 5
            model_uri = executor_input["outputs"]["artifacts"]["model"]["artifacts"][0]["uri"]
            assert model["uri"] == model_uri

            # Data, checkpoints and the model are on the object store, not in any pod.
            prefix = model_uri.removeprefix(f"s3://{bucket}/")
            keys = s3_env.keys(bucket, prefix)
            assert f"{prefix}/model.keras" in keys and f"{prefix}/summary.json" in keys, keys
            assert any("/checkpoints/ps-0-of-1/version-" in k for k in keys), keys
            summary = json.loads(s3_env.read(bucket, f"{prefix}/summary.json"))
            assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
            assert not core.list_namespaced_pod(ns, label_selector=pods.job_selector(job)).items
        finally:
            core.delete_namespaced_secret(secret, ns)
            clean_namespace(cluster, ns)
