"""The Kubeflow Pipelines v2 components: preprocess, elastic-train, evaluate and
batch-predict.

They are lightweight Python components that run in the project's image with nothing
installed at run time (``install_kfp_package=False``): air-gapped clusters work, and so does
``kfp.local.SubprocessRunner(use_venv=False)``. Each body only calls steps.py, so the code
that runs is the image's own. Another image: ``task.set_container_image(...)`` on a task.

A component's parameters are its command's flags, under the same names and with the same
defaults, but for the deviations listed in parameters.py; the steps turn them back into the
flags (tests/unit/test_component_parameters.py checks both). An empty parameter is its flag
left out.

KFP copies a function's source into the component, so the signatures hold only literals and
names that ``from kfp.dsl import *`` and ``from typing import *`` provide there. kfp reads
``dict | None`` as an artifact type, hence ``Optional``.
"""

from typing import Dict, List, NamedTuple, Optional  # noqa: UP035 - see the module

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
    fill_missing: str = "",
    one_hot: bool = False,
    max_vocabulary: int = 0,
    min_frequency: int = 1,
    oov_buckets: int = 1,
    hash_buckets: str = "",
    runner: str = "local",
    beam_options: List[str] | None = None,  # noqa: UP006 - see elastic_train.volumes
):
    """Turns a CSV file with a header row into train and validation TFRecord shards and
    schema.json (`elastic-step preprocess`).

    Args:
        csv: The CSV file, or Parquet: a file or a directory of them, whose schema gives
            the column types.
        label: The label column.
        data: train/, validation/ and schema.json; its metadata counts the records.
        shards: Shards per split.
        validation_fraction: Fraction of the rows held out for validation.
        seed: Seed of the split.
        categorical: Comma-separated columns to treat as categorical.
        label_type: auto, class or numeric.
        fill_missing: Allow empty values in numeric columns and read them as the train
            split's mean, 0, or a number: mean, zero or VALUE (default: an error).
        one_hot: The default feed gives categorical columns as one-hot vectors instead of
            vocabulary ids.
        max_vocabulary: At most the N most frequent values of each categorical column get
            ids of their own (0: every value).
        min_frequency: Only values seen at least N times get ids of their own.
        oov_buckets: Ids shared by the values not in a vocabulary, each value hashed to one.
        hash_buckets: Categorical columns without a vocabulary, such as ids, each value
            hashed to one of N ids: COLUMN=N, comma-separated.
        runner: local, or beam: as an Apache Beam pipeline, with the same output.
        beam_options: Options of the Beam pipeline, each --name=value, such as
            --runner=DataflowRunner (default: Beam's local runner, in the step).
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
    records_per_task: int = 0,
    seed: int = 0,
    evaluation_steps: int = 0,
    checkpoint_steps: int = 200,
    keep_checkpoints: int = 3,
    staleness_modulation: bool = True,
    local_steps: int = 0,
    outer_optimizer: str = "average",
    early_stopping: str = "",
    keep_best: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "",
    grow_after: float = 10.0,
    auto_workers: bool = False,
    auto_workers_gain: float = 0.5,
    standby: int = 0,
    max_restarts: int = 3,
    max_task_retries: int = 3,
    task_timeout: float = 120.0,
    master_timeout: float = 300.0,
    metrics_port: int = -1,
    backend: str = "kubernetes",
    image: str = "",
    image_pull_policy: str = "",
    image_pull_secret: List[str] | None = None,  # noqa: UP006 - see volumes
    service_account: str = "",
    worker_cpu: str = "",
    worker_memory: str = "",
    worker_gpu: int = 0,
    ps_cpu: str = "",
    ps_memory: str = "",
    node_selector: List[str] | None = None,  # noqa: UP006 - see volumes
    toleration: List[str] | None = None,  # noqa: UP006 - see volumes
    worker_priority_class: str = "",
    high_priority_class: str = "",
    high_priority_fraction: float = 0.0,
    storage_secret: str = "",
    volumes: List[str] | None = None,  # noqa: UP006 - kfp reads list[str] | None as an artifact
    env: List[str] | None = None,  # noqa: UP006 - see volumes
    pod_template: Optional[Dict] = None,  # noqa: UP006, UP045 - see the module
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
        records_per_task: Records per task (0: up to 512, or 16 batches with local_steps set).
        seed: Seed of the task order and of the model's initial values.
        evaluation_steps: Also evaluate every N model versions (0: at epoch ends only).
        checkpoint_steps: PS checkpoints every N model versions.
        keep_checkpoints: Checkpoints kept.
        staleness_modulation: Divide the PS's learning rate by the staleness of each
            gradient, where workers push gradients (local_steps 1) and the rate is a
            constant.
        local_steps: Steps a worker runs on its own copy of the model before it pushes the
            change (1: every gradient goes to the PS's optimizer; 0: chosen by the master so
            that each worker pushes at least 8 times an epoch, at most 16).
        outer_optimizer: How the PS applies a worker's change with local_steps > 1: average
            or nesterov.
        early_stopping: METRIC[:PATIENCE[:min|max]]: end training once PATIENCE evaluation
            rounds in a row have not beaten the best (default: train every epoch).
        mlflow_tracking_uri: Log params, metrics by model version, summary, report and model
            to an MLflow run at this server (default: KFP's MLflow plugin's run, when it is
            on; else $MLFLOW_TRACKING_URI; else none).
        mlflow_experiment: The MLflow experiment of a run the step makes (default:
            $MLFLOW_EXPERIMENT_ID or $MLFLOW_EXPERIMENT_NAME, else elastic-step).
        keep_best: METRIC[:min|max]: save the model of the best evaluation round instead of
            the last.
        grow_after: With max_workers: add a worker once all have run this many seconds.
        auto_workers: Size the job itself between workers and max_workers from its
            examples/s: add a worker while each added one pays, give back one that does not
            or that stays pending.
        auto_workers_gain: With auto_workers: what an added worker must add to examples/s, as
            a fraction of the examples/s per worker before it.
        standby: Extra worker pods kept started, TensorFlow and the model loaded, that
            train nothing: one takes a dead worker's slot at once. Each holds a worker's
            resources while idle.
        max_restarts: Relaunches per slot of a process that crashed or was OOM-killed.
        max_task_retries: Retries of a failing task before the job fails.
        task_timeout: Seconds without a finished batch before a worker loses its task.
        master_timeout: Seconds that workers and PS wait for an absent master, and that the
            job runs with no worker or a PS missing before it fails.
        metrics_port: Serve Prometheus metrics on this port of the master (0: any free one,
            named in status.json; -1: no endpoint).
        backend: kubernetes or local.
        image: Image of worker and PS pods (default: this step's).
        image_pull_policy: Always, IfNotPresent or Never (default: the cluster's).
        image_pull_secret: Secrets to pull the image with.
        service_account: ServiceAccount of worker and PS pods (default: none).
        worker_cpu: CPU of each worker pod, a Kubernetes quantity (default: unset).
        worker_memory: Memory of each worker pod (default: unset).
        worker_gpu: GPUs of each worker pod.
        ps_cpu: CPU of each PS pod (default: unset).
        ps_memory: Memory of each PS pod (default: unset).
        node_selector: Node labels, each KEY=VALUE, that worker and PS pods need.
        toleration: Taints that worker and PS pods tolerate, each KEY[=VALUE]:EFFECT.
        worker_priority_class: PriorityClass of worker pods.
        high_priority_class: PriorityClass of PS pods and of high_priority_fraction of the
            worker slots.
        high_priority_fraction: Fraction of worker slots that get high_priority_class.
        storage_secret: A Secret with the object store's credentials for worker and PS pods
            (KFP's own: mlpipeline-minio-artifact); this step needs them too.
        volumes: PersistentVolumeClaims mounted in every worker and PS pod, each
            "claim=NAME,mount=/PATH[,readonly][,subpath=DIR]".
        env: Environment variables of worker and PS pods, each NAME=VALUE.
        pod_template: A pod (or pod spec) merged into every worker and PS pod; containers
            merge by name, the elastic-step container is "main".
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
    records_per_task: int = 0,
    grow_after: float = 10.0,
    auto_workers: bool = False,
    auto_workers_gain: float = 0.5,
    standby: int = 0,
    max_restarts: int = 3,
    max_task_retries: int = 3,
    task_timeout: float = 120.0,
    master_timeout: float = 300.0,
    metrics_port: int = -1,
    backend: str = "kubernetes",
    image: str = "",
    image_pull_policy: str = "",
    image_pull_secret: List[str] | None = None,  # noqa: UP006 - see elastic_train.volumes
    service_account: str = "",
    worker_cpu: str = "",
    worker_memory: str = "",
    worker_gpu: int = 0,
    node_selector: List[str] | None = None,  # noqa: UP006 - see elastic_train.volumes
    toleration: List[str] | None = None,  # noqa: UP006 - see elastic_train.volumes
    worker_priority_class: str = "",
    high_priority_class: str = "",
    high_priority_fraction: float = 0.0,
    storage_secret: str = "",
    volumes: List[str] | None = None,  # noqa: UP006 - see elastic_train.volumes
    env: List[str] | None = None,  # noqa: UP006 - see elastic_train.volumes
    pod_template: Optional[Dict] = None,  # noqa: UP006, UP045 - see the module
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
        records_per_task: Records per task (0: 512).
        grow_after: With max_workers: add a worker once all have run this many seconds.
        auto_workers: Size the job itself between workers and max_workers from its
            examples/s: add a worker while each added one pays, give back one that does not
            or that stays pending.
        auto_workers_gain: With auto_workers: what an added worker must add to examples/s, as
            a fraction of the examples/s per worker before it.
        standby: Extra worker pods kept started, TensorFlow and the model loaded, that
            train nothing: one takes a dead worker's slot at once. Each holds a worker's
            resources while idle.
        max_restarts: Relaunches per slot of a process that crashed or was OOM-killed.
        max_task_retries: Retries of a failing task before the job fails.
        task_timeout: Seconds without a finished batch before a worker loses its task.
        master_timeout: Seconds that workers wait for an absent master, and that the job
            runs with no worker before it fails.
        metrics_port: Serve Prometheus metrics on this port of the master (0: any free one,
            named in status.json; -1: no endpoint).
        backend: kubernetes or local.
        image: Image of worker pods (default: this step's).
        image_pull_policy: Always, IfNotPresent or Never (default: the cluster's).
        image_pull_secret: Secrets to pull the image with.
        service_account: ServiceAccount of worker pods (default: none).
        worker_cpu: CPU of each worker pod, a Kubernetes quantity (default: unset).
        worker_memory: Memory of each worker pod (default: unset).
        worker_gpu: GPUs of each worker pod.
        node_selector: Node labels, each KEY=VALUE, that worker pods need.
        toleration: Taints that worker pods tolerate, each KEY[=VALUE]:EFFECT.
        worker_priority_class: PriorityClass of worker pods.
        high_priority_class: PriorityClass of high_priority_fraction of the worker slots.
        high_priority_fraction: Fraction of worker slots that get high_priority_class.
        storage_secret: A Secret with the object store's credentials for worker pods (KFP's
            own: mlpipeline-minio-artifact); this step needs them too.
        volumes: PersistentVolumeClaims mounted in every worker pod, each
            "claim=NAME,mount=/PATH[,readonly][,subpath=DIR]".
        env: Environment variables of worker pods, each NAME=VALUE.
        pod_template: A pod (or pod spec) merged into every worker pod; containers merge by
            name, the elastic-step container is "main".
        job_name: Names the job's pods and state (default: derived from the run and task).
        task_name: Pass dsl.PIPELINE_TASK_NAME_PLACEHOLDER: with the run's id, it names the job.

    Returns:
        job_name: The job's name; its pods are <job_name>-worker-N.
    """
    arguments = dict(locals())  # every parameter, by name
    from elastic_step.components.steps import predict_step

    return (predict_step(**arguments),)
