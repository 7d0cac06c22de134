"""An example Kubeflow Pipelines pipeline: preprocess -> elastic-train -> evaluate, and
batch-predict over the CSV with the trained model.

Upload pipelines/kfp_pipeline.yaml in the KFP UI (or with ``kfp.Client().upload_pipeline``)
and start a run with the URIs of a CSV file and of a model definition, and the CSV's label
column (for example elastic_step/examples/breast_cancer.py, for scikit-learn's breast cancer
data). Its parameters are the components' (and so the CLI's flags), under the same names.
The run's service account needs the Role in manifests/rbac.yaml (docs/guides/security.md).
"""

from kfp import dsl, kubernetes

from elastic_step.components import IMAGE
from elastic_step.components.kfp_components import (
    batch_predict,
    elastic_train,
    evaluate,
    preprocess,
)


@dsl.pipeline(
    name="elastic-step-example",
    description="Preprocess a CSV file, train elastically with workers and parameter servers "
    "started by the training step, evaluate the model, and predict every row of the CSV.",
)
def elastic_step_pipeline(
    csv_uri: str,
    label: str,
    model_def_uri: str,
    fill_missing: str = "",
    one_hot: bool = False,
    epochs: int = 5,
    batch_size: int = 64,
    workers: int = 2,
    max_workers: int = 4,
    ps: int = 1,
    records_per_task: int = 512,
    backend: str = "kubernetes",
    worker_cpu: str = "1",
    worker_memory: str = "2Gi",
    ps_cpu: str = "1",
    ps_memory: str = "2Gi",
    storage_secret: str = "mlpipeline-minio-artifact",
    early_stopping: str = "",
    keep_best: str = "",
    image: str = IMAGE,
) -> None:
    csv = dsl.importer(artifact_uri=csv_uri, artifact_class=dsl.Dataset, reimport=False)
    # No display name on an importer: KFP 2.17's importer records its display name as its
    # task's name in ML Metadata, and the driver of the task that reads its output then
    # finds no producer (issue 20's note).
    model_def = dsl.importer(
        artifact_uri=model_def_uri, artifact_class=dsl.Artifact, reimport=False
    )
    data = preprocess(csv=csv.output, label=label, fill_missing=fill_missing, one_hot=one_hot)
    # What the training and the prediction jobs are both given: their workers and tasks, and
    # where and as what they run.
    job_settings = dict(
        workers=workers,
        max_workers=max_workers,
        records_per_task=records_per_task,
        backend=backend,
        worker_cpu=worker_cpu,
        worker_memory=worker_memory,
        storage_secret=storage_secret,
        # Resolved by KFP only as a task's whole input: with the run's id, it names the job,
        # so that a retry of the step (a new pod) resumes the same job.
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    train = elastic_train(
        dataset=data.outputs["data"],
        model_def=model_def.output,
        epochs=epochs,
        batch_size=batch_size,
        ps=ps,
        ps_cpu=ps_cpu,
        ps_memory=ps_memory,
        early_stopping=early_stopping,
        keep_best=keep_best,
        **job_settings,
    )
    evaluation = evaluate(model=train.outputs["model"], dataset=data.outputs["data"])
    # Every row of the CSV, its label column ignored: the predictions beside the labels.
    predict = batch_predict(model=train.outputs["model"], data=csv.output, **job_settings)
    # KFP's cache knows an input artifact by its ML Metadata id, not its content: a model
    # definition or CSV file changed at the same URI is the same artifact to it, so a cached
    # training would be a stale model. Training runs every time; the other steps are
    # functions of their inputs and may come from the cache.
    train.set_caching_options(False)
    # The image, set once: every step runs in it, and the workers and PS in the step's own.
    for task in (data, train, evaluation, predict):
        task.set_container_image(image)
    # Requests, so that no step's pod is BestEffort (first to be evicted; refused where the
    # namespace asks for requests). A master needs little: its workers and PS do the work.
    for task, cpu in ((data, "500m"), (train, "250m"), (evaluation, "500m"), (predict, "250m")):
        task.set_cpu_request(cpu).set_memory_request("1Gi")
    # No set_retry: KFP retries every failure, a bad setting's exit status 2 too, and not a
    # deleted pod; KFP's Retry of the run resumes the job instead (docs/guides/pipelines.md,
    # "Retries").
    for job in (train, predict):
        # Runs a master: manifests/network-policy.yaml lets it reach its job's PS.
        kubernetes.add_pod_label(job, "elastic-step/master", "true")
        # The master reads its inputs and writes its outputs at their object-store URIs
        # itself (its workers, in other pods, cannot see the launcher's local copies), so it
        # needs the store's credentials too; minio:// finds KFP's own store by its default
        # endpoint.
        kubernetes.use_secret_as_env(
            job,
            secret_name=storage_secret,
            secret_key_to_env={
                "accesskey": "AWS_ACCESS_KEY_ID",
                "secretkey": "AWS_SECRET_ACCESS_KEY",
            },
        )
