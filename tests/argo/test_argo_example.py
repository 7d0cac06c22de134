"""The example Workflow, unchanged, run by Argo's own controller to Succeeded: every step
as Argo runs it (its init and wait containers, the emissary wrapping ``elastic-step``), the
training and prediction steps each starting their workers and PS as pods, outputs and
artifacts in the S3 bucket."""

from __future__ import annotations

import json

from argo_helpers import (
    PodRecorder,
    explain,
    job_name,
    nodes_named,
    read_json,
    read_workflow,
    step_pods,
    submit,
    wait_until_ended,
)
from kubernetes import client
from local_cluster import REPO


def test_the_example_workflow_succeeds_under_argos_controller(argo, s3_server):
    ns = argo.namespace
    with argo.cluster.admin() as api:
        core = client.CoreV1Api(api)
        name = submit(argo, REPO / "pipelines" / "argo_workflow.yaml")
        workflow = read_workflow(api, ns, name)
        recorder = PodRecorder(api, ns, job_name(workflow, "train"))
        try:
            workflow = wait_until_ended(api, ns, name, timeout=900)
        finally:
            recorder.stop()
        assert workflow["status"]["phase"] == "Succeeded", explain(argo, api, name)
        for step in ("preprocess", "train", "evaluate", "predict"):
            attempts = [n for n in nodes_named(workflow, step) if n["type"] == "Pod"]
            assert [n["phase"] for n in attempts] == ["Succeeded"], (step, attempts)

        # The training step's master started its workers and PS as pods.
        roles = recorder.roles()
        assert roles.get("worker", 0) >= 2 and roles.get("ps", 0) >= 1, recorder.seen

        # Every step ran as Argo runs it: init, wait, and the emissary wrapping elastic-step.
        (train_pod,) = [
            p
            for p in step_pods(core, ns, name)
            if p.metadata.annotations["workflows.argoproj.io/node-name"] == f"{name}.train(0)"
        ]
        assert [c.name for c in train_pod.spec.init_containers] == ["init"]
        assert [c.name for c in train_pod.spec.containers] == ["wait", "main"]
        main = train_pod.spec.containers[1]
        assert main.command[:2] == ["/var/run/argo/argoexec", "emissary"]
        assert main.command[-1] == "elastic-step" and main.args[0] == "train"

        # evaluate's output parameter and artifacts.
        (evaluate,) = [n for n in nodes_named(workflow, "evaluate") if n["type"] == "Pod"]
        outputs = evaluate["outputs"]
        parameters = {p["name"]: p["value"] for p in outputs["parameters"]}
        metrics = json.loads(parameters["metrics"])
        assert metrics["metrics"]["accuracy"] > 0.8 and metrics["loss"] > 0, metrics
        artifacts = {a["name"]: a["s3"]["key"] for a in outputs["artifacts"]}
        assert set(artifacts) >= {"metrics", "report"}
        keys = s3_server.keys(argo.bucket)
        for key in artifacts.values():
            assert key in keys, (key, keys)
        assert b"<svg" in s3_server.read(argo.bucket, artifacts["report"])

        # The model, and exact accounting of every epoch.
        model = f"runs/{name}/model"
        assert f"{model}/model.keras" in keys
        summary = read_json(s3_server, argo.bucket, f"{model}/summary.json")
        assert summary["phase"] == "succeeded"
        assert len(summary["epochs"]) == 5
        assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
        (predict,) = [n for n in nodes_named(workflow, "predict") if n["type"] == "Pod"]
        predicted = json.loads(
            {p["name"]: p["value"] for p in predict["outputs"]["parameters"]}["summary"]
        )
        assert predicted["phase"] == "succeeded", predicted
