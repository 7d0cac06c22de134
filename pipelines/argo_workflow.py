"""An example Argo Workflow that uses the WorkflowTemplate ``elastic-step`` through
``templateRef``, as an existing workflow would: preprocess -> train -> evaluate, and
batch-predict on the validation split (``predictions/predictions.csv`` under the run's
directory).

  kubectl apply -n NS -f components/argo/workflow-template.yaml
  argo submit -n NS pipelines/argo_workflow.yaml -p work-dir=s3://BUCKET/elastic-step \
      -p image=REGISTRY/elastic-step:TAG

The CSV comes from the default artifact repository (key ``csv-key``); data, model,
checkpoints and predictions go under ``work-dir``, an object store that every pod reaches with the
credentials in the Secret ``storage-secret`` (keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
and AWS_ENDPOINT_URL for a server that is not AWS). The workflow's service account needs the
Role in manifests/rbac.yaml (docs/guides/security.md).
"""

from __future__ import annotations

import yaml
from hera.workflows import DAG, Parameter, RawArtifact, S3Artifact, Task, Workflow
from hera.workflows.models import TemplateRef

from elastic_step.components import IMAGE
from elastic_step.components.argo_templates import WORKFLOW_TEMPLATE
from elastic_step.examples import path_of

STORAGE_SECRET = "elastic-step-storage"
_FROM_SECRET = {"name": "main", "envFrom": [{"secretRef": {"name": STORAGE_SECRET}}]}
#: The credentials, as environment variables of the steps' containers ("main")...
STEP_CREDENTIALS = yaml.safe_dump({"containers": [_FROM_SECRET]}, sort_keys=False)
#: ... and of every worker and PS pod (the pod template of elastic-train and batch-predict).
WORKER_CREDENTIALS = yaml.safe_dump({"spec": {"containers": [_FROM_SECRET]}}, sort_keys=False)


def _step(name: str, template: str, **arguments) -> Task:
    arguments = {"image": "{{workflow.parameters.image}}", **arguments}
    return Task(
        name=name,
        template_ref=TemplateRef(name=WORKFLOW_TEMPLATE, template=template),
        arguments=[
            value
            if not isinstance(value, str)
            else Parameter(name=key.replace("_", "-"), value=value)
            for key, value in arguments.items()
        ],
    )


def example_workflow() -> Workflow:
    run_dir = "{{workflow.parameters.work-dir}}/{{workflow.name}}"
    with open(path_of("breast_cancer")) as f:
        model_def = f.read()
    with (
        Workflow(
            generate_name="elastic-step-example-",
            entrypoint="main",
            arguments=[
                Parameter(name="work-dir", value="s3://elastic-step/runs"),
                Parameter(name="csv-key", value="datasets/breast_cancer.csv"),
                Parameter(name="label", value="benign"),
                # The image, set once: every step runs in it, and the workers and PS too.
                Parameter(name="image", value=IMAGE),
            ],
            pod_spec_patch=STEP_CREDENTIALS,
        ) as workflow,
        DAG(name="main"),
    ):
        preprocess = _step(
            "preprocess",
            "preprocess",
            csv=S3Artifact(name="csv", key="{{workflow.parameters.csv-key}}"),
            label="{{workflow.parameters.label}}",
            output=f"{run_dir}/data",
        )
        train = _step(
            "train",
            "elastic-train",
            model_def=RawArtifact(name="model-def", data=model_def),
            pod_template=RawArtifact(name="pod-template", data=WORKER_CREDENTIALS),
            data=f"{run_dir}/data",
            output=f"{run_dir}/model",
            epochs="5",
            workers="2",
            max_workers="4",
            ps="1",
        )
        evaluate = _step("evaluate", "evaluate", model=f"{run_dir}/model", data=f"{run_dir}/data")
        predict = _step(
            "predict",
            "batch-predict",
            pod_template=RawArtifact(name="pod-template", data=WORKER_CREDENTIALS),
            model=f"{run_dir}/model",
            input=f"{run_dir}/data",
            split="validation",
            output=f"{run_dir}/predictions",
            workers="2",
        )
        preprocess >> train >> [evaluate, predict]
    return workflow
