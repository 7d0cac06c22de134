"""The Kubeflow Pipelines v2 components: preprocess, elastic-train, evaluate and
batch-predict.

They are lightweight Python components that run in the project's image with nothing
installed at run time (``install_kfp_package=False``): air-gapped clusters work, and so does
``kfp.local.SubprocessRunner(use_venv=False)``. Each body only calls steps.py, so the code
that runs is the image's own. Another image: ``task.set_container_image(...)`` on a task.

KFP copies a function's source into the component, so the signatures hold only literals and
names that ``from kfp.dsl import *`` and ``from typing import *`` provide there.
"""

from typing import List, NamedTuple  # noqa: UP035 - see elastic_train.volumes

from kfp import dsl
from kfp.dsl import HTML, Artifact, ClassificationMetrics, Dataset, Input, Metrics, Model, Output

from elastic_step.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def preprocess(
    csv: Input[Dataset],
    label: str,
    data: Output[Dataset],
    shards: int = 4,
    validation_fraction: float = 0.2,
    seed: int = 0,
    categorical: str = "",
    label_type: str = "auto",
):
    """Turns a CSV file with a header row into train and validation TFRecord shards and
    schema.json (`elastic-step preprocess`).

    Args:
        csv: The CSV file.
        label: The label column.
        data: train/, validation/ and schema.json; its metadata counts the records.
        shards: Shards per split.
        validation_fraction: Fraction of the rows held out for validation.
        seed: Seed of the split.
        categorical: Comma-separated columns to treat as categorical.
        label_type: auto, class or numeric.
    """
    arguments = dict(locals())  # every parameter, by name
    from elastic_step.components.steps import preprocess_step

    preprocess_step(**arguments)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def elastic_train(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    summary: Output[Artifact],
    # Not `Input[Artifact] | None`: KFP's backend hands an imported artifact over without
    # its schema title, and kfp's executor then instantiates the annotation itself.
    model_def: Input[Artifact] = None,
    model_def_text: str = "",
    epochs: int = 1,
    batch_size: int = 64,
    workers: int = 2,
    min_workers: int = 1,
    max_workers: int = 0,
    ps: int = 1,
    records_per_task: int = 512,
    seed: int = 0,
    backend: str = "kubernetes",
    image: str = "",
    worker_cpu: str = "",
    worker_memory: str = "",
    ps_cpu: str = "",
    ps_memory: str = "",
    worker_priority_class: str = "",
    storage_secret: str = "",
    volumes: List[str] | None = None,  # noqa: UP006 - kfp reads list[str] | None as an artifact
    job_name: str = "",
    task_name: str = "",
) -> NamedTuple("TrainOutputs", [("job_name", str)]):
    """Elastic, fault-tolerant training (`elastic-step train`): the master runs in this step
    and starts its workers and parameter servers, as pods (backend "kubernetes") or as local
    processes (backend "local").

    Args:
        dataset: What preprocess wrote.
        model: The model (model.keras, saved_model/), with the job's state, checkpoints and logs.
        metrics: The final evaluation's metrics and the steady-state examples_per_second.
        summary: The job's summary.json: per-epoch accounting, evaluations and restarts.
        model_def: The model definition file; or give model_def_text (exactly one).
        model_def_text: The model definition's Python source.
        epochs: Passes over the training data.
        batch_size: Records per batch.
        workers: Workers to start.
        min_workers: The job fails below this many.
        max_workers: Grow up to this many workers while all run (0: no growth).
        ps: Parameter server shards.
        records_per_task: Records per task.
        seed: Seed of the task order and of the model's initial values.
        backend: kubernetes or local.
        image: Image of worker and PS pods (default: this step's).
        worker_cpu: CPU of each worker pod, a Kubernetes quantity (default: unset).
        worker_memory: Memory of each worker pod (default: unset).
        ps_cpu: CPU of each PS pod (default: unset).
        ps_memory: Memory of each PS pod (default: unset).
        worker_priority_class: PriorityClass of worker pods.
        storage_secret: A Secret with the object store's credentials for worker and PS pods
            (KFP's own: mlpipeline-minio-artifact); this step needs them too.
        volumes: PersistentVolumeClaims mounted in every worker and PS pod, each
            "claim=NAME,mount=/PATH[,readonly][,subpath=DIR]".
        job_name: Names the job's pods and state (default: derived from the run and task).
        task_name: Pass dsl.PIPELINE_TASK_NAME_PLACEHOLDER: with the run's id, it names the job.

    Returns:
        job_name: The job's name; its pods are <job_name>-worker-N and <job_name>-ps-N.
    """
    arguments = dict(locals())  # every parameter, by name
    from elastic_step.components.steps import train_step

    return (train_step(**arguments),)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(
    model: Input[Model],
    dataset: Input[Dataset],
    metrics: Output[Metrics],
    classification: Output[ClassificationMetrics],
    report: Output[HTML],
    split: str = "validation",
    batch_size: int = 256,
):
    """Evaluates a trained model on one split (`elastic-step evaluate`).

    Args:
        model: What elastic-train wrote.
        dataset: What preprocess wrote.
        metrics: The loss and the model definition's metrics; its file is the whole evaluation.
        classification: The confusion matrix, and the ROC curve for a binary label.
        report: The HTML report of the evaluation and the training.
        split: The split to evaluate.
        batch_size: Records per batch.
    """
    arguments = dict(locals())  # every parameter, by name
    from elastic_step.components.steps import evaluate_step

    evaluate_step(**arguments)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def batch_predict(
    model: Input[Model],
    data: Input[Dataset],
    predictions: Output[Dataset],
    summary: Output[Artifact],
    split: str = "validation",
    batch_size: int = 256,
    workers: int = 2,
    min_workers: int = 1,
    max_workers: int = 0,
    records_per_task: int = 512,
    backend: str = "kubernetes",
    image: str = "",
    worker_cpu: str = "",
    worker_memory: str = "",
    worker_priority_class: str = "",
    storage_secret: str = "",
    volumes: List[str] | None = None,  # noqa: UP006 - see elastic_train.volumes
    job_name: str = "",
    task_name: str = "",
) -> NamedTuple("PredictOutputs", [("job_name", str)]):
    """Runs a trained model over a CSV file or a split of a dataset as an elastic job
    (`elastic-step predict`): the master runs in this step and starts its workers, as pods
    (backend "kubernetes") or as local processes (backend "local"); workers that die are
    replaced, and every input row gets exactly one prediction.

    Args:
        model: What elastic-train wrote.
        data: A CSV file with the model's feature columns (its label column may be there),
            or what preprocess wrote (then split says which split).
        predictions: predictions.csv (index, then class for a classifier, then the model's
            outputs; one row per input row, in input order), with the job's summary.json and
            state; its metadata: rows, columns, job_name and, for a classifier, class_counts.
        summary: The job's summary.json: records, records_predicted, restarts.
        split: The split of a preprocess dataset to predict (not used for a CSV file).
        batch_size: Records per batch.
        workers: Workers to start.
        min_workers: The job fails below this many.
        max_workers: Grow up to this many workers while all run (0: no growth).
        records_per_task: Records per task.
        backend: kubernetes or local.
        image: Image of worker pods (default: this step's).
        worker_cpu: CPU of each worker pod, a Kubernetes quantity (default: unset).
        worker_memory: Memory of each worker pod (default: unset).
        worker_priority_class: PriorityClass of worker pods.
        storage_secret: A Secret with the object store's credentials for worker pods (KFP's
            own: mlpipeline-minio-artifact); this step needs them too.
        volumes: PersistentVolumeClaims mounted in every worker pod, each
            "claim=NAME,mount=/PATH[,readonly][,subpath=DIR]".
        job_name: Names the job's pods and state (default: derived from the run and task).
        task_name: Pass dsl.PIPELINE_TASK_NAME_PLACEHOLDER: with the run's id, it names the job.

    Returns:
        job_name: The job's name; its pods are <job_name>-worker-N.
    """
    arguments = dict(locals())  # every parameter, by name
    from elastic_step.components.steps import predict_step

    return (predict_step(**arguments),)
