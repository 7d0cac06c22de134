"""Kubeflow Pipelines 2.17.0's own API server on the test control plane, over Argo's
controller (tests/cluster/kfp_backend.py): what a user does with ``kfp.Client(host=...)``.

The compiled example pipeline is uploaded and listed; a run of it becomes an Argo Workflow
in the namespace, labelled with the run's id and run as ``pipeline-runner``; and KFP's
Terminate sets that Workflow's ``spec.activeDeadlineSeconds`` to 0, which is what the
elastic-step master reads as a stop (kubernetes_run.py). The driver, the launcher and ML
Metadata, which a run's steps need, are not started here yet.
"""

from __future__ import annotations

import uuid

import kfp
import pytest
from argo_helpers import GROUP, VERSION
from kubernetes import client
from local_cluster import REPO, wait_for

# kfp.Client warns that it needs a backend of at least 2.0.0-beta.2: this one is 2.17.0.
pytestmark = pytest.mark.filterwarnings("ignore:This client only works:FutureWarning")


def test_the_api_server_takes_the_example_pipeline_and_terminate_sets_a_zero_deadline(
    argo, kfp_api
):
    ns = argo.namespace
    user = kfp.Client(host=kfp_api.http)
    name = f"elastic-step-example-{uuid.uuid4().hex[:6]}"
    pipeline = user.upload_pipeline(str(REPO / "pipelines" / "kfp_pipeline.yaml"), name)
    listed = user.list_pipelines(page_size=100).pipelines or []
    assert pipeline.pipeline_id in [p.pipeline_id for p in listed]
    (version,) = user.list_pipeline_versions(pipeline.pipeline_id).pipeline_versions
    experiment = user.create_experiment(f"exp-{name}")
    run = user.run_pipeline(
        experiment.experiment_id,
        name,
        pipeline_id=pipeline.pipeline_id,
        version_id=version.pipeline_version_id,
        params={"csv_uri": "minio://mlpipeline/data.csv", "label": "benign",
                "model_def_uri": "minio://mlpipeline/model.py"},
    )  # fmt: skip
    with argo.cluster.admin() as api:
        workflows = client.CustomObjectsApi(api)

        def the_runs_workflow() -> dict | None:
            found = workflows.list_namespaced_custom_object(
                GROUP, VERSION, ns, "workflows", label_selector=f"pipeline/runid={run.run_id}"
            )["items"]
            return found[0] if found else None

        workflow = wait_for("the run's Workflow", the_runs_workflow, timeout=60)
        assert workflow["spec"]["serviceAccountName"] == "pipeline-runner"
        user.terminate_run(run.run_id)

        def deadline() -> bool:
            spec = the_runs_workflow()["spec"]
            return spec.get("activeDeadlineSeconds") == 0

        wait_for("KFP's Terminate to reach the Workflow", deadline, timeout=30)
        user.delete_run(run.run_id)
