"""The Argo Workflows templates: preprocess, elastic-train, evaluate and batch-predict, in one
WorkflowTemplate ``elastic-step`` that workflows use through ``templateRef``.

Each is a container template that runs the ``elastic-step`` command in the project's image,
with the template's parameters as flags. Data and models are given as locations, object-store
URIs (``s3://``, ``gs://``, ``minio://``) or paths on a volume that every pod mounts: the
job's workers and PS run in pods of their own and read and write there directly.
Files that only the step's own pod needs (the CSV, the model definition, the worker pod
template) are Argo input artifacts, so they may come from any artifact source, ``raw`` text
included.

elastic-train and batch-predict name their job from ``{{workflow.uid}}`` and ``{{node.name}}``
(:data:`identity.ARGO_JOB_NAME`): a retry of the step, or ``argo retry`` of the workflow,
resumes the same job and adopts its pods, and no two workflows share a job.

A template's parameters are its command's flags, kebab-case, with the command's defaults
(parameters.py lists the deviations; tests/unit/test_component_parameters.py checks them).
"""

from __future__ import annotations

from hera.workflows import (
    Artifact,
    Container,
    EmptyDirVolume,
    Env,
    FieldEnv,
    NoneArchiveStrategy,
    Parameter,
    RawArtifact,
    Resources,
    RetryStrategy,
    WorkflowTemplate,
)
from hera.workflows.models import Capabilities, SeccompProfile, SecurityContext, ValueFrom

from elastic_step.backends.kubernetes_pods import LABEL_MASTER
from elastic_step.components import IMAGE
from elastic_step.components.identity import ARGO_JOB_NAME
from elastic_step.components.parameters import (
    ARGO,
    argo_value,
    command_flags,
    default_of,
    parameter_name,
)

WORKFLOW_TEMPLATE = "elastic-step"
INPUTS = "/tmp/inputs"
OUTPUTS = "/tmp/outputs"
#: Where an elastic job step copies its summary.json, read back as its outputs.
SUMMARY_FILE = f"{OUTPUTS}/summary.json"
#: Retries of a step that runs a job (train, predict); a retry resumes the job. Bad input
#: (exit 2) is not retried.
JOB_RETRIES = 2


def _hardened(*, cpu: str, memory: str) -> dict:
    """What every step's container runs with: the restricted Pod Security Standard (non-root,
    no privilege, no capability, the runtime's seccomp profile), a read-only image with an
    emptyDir on /tmp (HOME there too: what the step writes besides its outputs), and
    resource requests, so that the pod is not BestEffort, first to be evicted."""
    return {
        "security_context": SecurityContext(
            run_as_non_root=True,
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            capabilities=Capabilities(drop=["ALL"]),
            seccomp_profile=SeccompProfile(type="RuntimeDefault"),
        ),
        "volumes": [EmptyDirVolume(name="tmp", mount_path="/tmp")],
        "resources": Resources(cpu_request=cpu, memory_request=memory),
    }


#: The environment of every step: see :func:`_hardened`.
_STEP_ENV = [Env(name="HOME", value="/tmp")]
#: A master needs little CPU (the workers and PS do the work); preprocess and evaluate run
#: TensorFlow themselves.
_MASTER_STEP = {"cpu": "250m", "memory": "1Gi"}
_WORK_STEP = {"cpu": "500m", "memory": "1Gi"}


def _value(name: str) -> str:
    return f"{{{{inputs.parameters.{name}}}}}"


def _flags(*names: str) -> list[str]:
    """``--NAME {{inputs.parameters.NAME}}`` for each parameter."""
    argv: list[str] = []
    for name in names:
        argv += [f"--{name}", _value(name)]
    return argv


def _parameters(
    command: str, descriptions: dict[str, str], *, image: str = IMAGE
) -> list[Parameter]:
    """Input parameters of a template that runs ``elastic-step COMMAND``, described: a flag's
    has the command's default (or none, if the flag is required), and ``image`` (of the
    step, not a flag of preprocess and evaluate) defaults to ``image``."""
    flags = {parameter_name(command, flag, ARGO): flag for flag in command_flags(command).values()}
    parameters = []
    for name, text in descriptions.items():
        flag = flags.get(name)
        if flag is not None and flag.required:
            parameters.append(Parameter(name=name, description=text))
            continue
        default = image if flag is None else argo_value(default_of(command, flag, ARGO))
        parameters.append(Parameter(name=name, description=text, default=default))
    return parameters


def _preprocess() -> Container:
    return Container(
        name="preprocess",
        image=_value("image"),
        env=_STEP_ENV,
        **_hardened(**_WORK_STEP),
        command=["elastic-step"],
        args=[
            "preprocess",
            "--input",
            f"{INPUTS}/data.csv",
            *_flags("label", "output", "shards", "validation-fraction", "seed"),
            *_flags("categorical", "label-type", "fill-missing", "one-hot", "runner"),
            *_flags("max-vocabulary", "min-frequency", "oov-buckets", "hash-buckets"),
        ],
        inputs=[
            Artifact(name="csv", path=f"{INPUTS}/data.csv"),
            *_parameters(
                "preprocess",
                {
                    "label": "the label column",
                    "output": "where the data goes (a URI or a path on a shared volume)",
                    "shards": "shards per split",
                    "validation-fraction": "fraction of the rows held out for validation",
                    "seed": "seed of the split",
                    "categorical": "comma-separated columns to treat as categorical",
                    "label-type": "auto, class or numeric",
                    "fill-missing": "allow empty values in numeric columns and read them as "
                    "the train split's mean, 0, or a number: mean, zero or VALUE (default: "
                    "an error)",
                    "one-hot": "true: the default feed gives categorical columns as one-hot "
                    "vectors, not vocabulary ids",
                    "max-vocabulary": "at most the N most frequent values of each categorical "
                    "column get ids of their own (0: every value)",
                    "min-frequency": "only values seen at least N times get ids of their own",
                    "oov-buckets": "ids shared by the values not in a vocabulary, each value "
                    "hashed to one",
                    "hash-buckets": "categorical columns without a vocabulary, such as ids, "
                    "each value hashed to one of N ids: COLUMN=N, comma-separated",
                    "runner": "local, or beam: as an Apache Beam pipeline on Beam's local "
                    "runner in the step's pod, with the same output",
                    "image": "the elastic-step image",
                },
            ),
        ],
    )


#: --max-workers of a job: below --workers it means no growth (the command's default).
_MAX_WORKERS = "{{=max(asInt(inputs.parameters.workers), asInt(inputs.parameters['max-workers']))}}"


#: The limits of an elastic job (train, predict), and its Prometheus endpoint, described.
_JOB_LIMITS = {
    "grow-after": "with max-workers: add a worker once all have run this many seconds",
    "auto-workers": "size the job itself between workers and max-workers from its examples/s: "
    "add a worker while each added one pays, give back one that does not or stays pending",
    "auto-workers-gain": "with auto-workers: what an added worker must add to examples/s, as a "
    "fraction of the examples/s per worker before it",
    "standby": "extra worker pods kept started, TensorFlow and the model loaded, that train "
    "nothing: one takes a dead worker's slot at once; each holds a worker's resources while idle",
    "max-restarts": "relaunches per slot of a process that crashed or was OOM-killed",
    "max-task-retries": "retries of a failing task before the job fails",
    "task-timeout": "seconds without a finished batch before a worker loses its task",
    "master-timeout": "seconds that the job's pods wait for an absent master, and that the "
    "job runs with a member missing before it fails",
    "metrics-port": "serve Prometheus metrics on this port of the step's pod (0: any free "
    "one, named in status.json; default: no endpoint)",
}


def _master_env() -> list[FieldEnv]:
    """The master finds its own pod, and listens on its IP."""
    return [
        FieldEnv(name="ELASTIC_STEP_POD_NAME", field_path="metadata.name"),
        FieldEnv(name="ELASTIC_STEP_POD_IP", field_path="status.podIP"),
    ]


def _job_args(command: str, *args: str) -> list[str]:
    """An elastic job's command line: on Kubernetes, named so that a retry resumes it, with
    the pod template, and its summary.json where the step's outputs are read."""
    return [
        command,
        *("--backend", "kubernetes", "--job-name", ARGO_JOB_NAME),
        *("--pod-template", f"{INPUTS}/pod-template.yaml"),
        *args,
        *("--summary-output", SUMMARY_FILE),
    ]


def _summary_parameter(description: str) -> Parameter:
    """The output parameter of a job template: the job's summary.json (``_job_args``)."""
    return Parameter(
        name="summary", description=description, value_from=ValueFrom(path=SUMMARY_FILE)
    )


def _job_retries() -> RetryStrategy:
    """A retry resumes the job (same name); bad input (exit 2) is not retried."""
    return RetryStrategy(
        limit=str(JOB_RETRIES), retry_policy="Always", expression="lastRetry.exitCode != '2'"
    )


def _pod_template() -> RawArtifact:
    """A pod (or pod spec) merged into every pod of the job: volumes, env from Secrets,
    priorityClassName, node selectors. By default nothing: {}."""
    return RawArtifact(name="pod-template", path=f"{INPUTS}/pod-template.yaml", data="{}\n")


#: On the pod of a step that runs a master: manifests/network-policy.yaml admits such pods
#: to the job's PS (the master pulls the model from them), and only the jobs' pods to them.
_MASTER_LABELS = {LABEL_MASTER: "true"}


def _elastic_train() -> Container:
    return Container(
        name="elastic-train",
        labels=_MASTER_LABELS,
        image=_value("image"),
        command=["elastic-step"],
        args=_job_args(
            "train",
            "--model-def",
            f"{INPUTS}/model_def.py",
            *_flags("data", "output", "epochs", "batch-size", "workers", "min-workers"),
            "--max-workers",
            _MAX_WORKERS,
            *_flags("ps", "records-per-task", "seed", "image"),
            *_flags("worker-cpu", "worker-memory", "worker-gpu", "ps-cpu", "ps-memory"),
            *_flags("evaluation-steps", "checkpoint-steps", "keep-checkpoints"),
            *_flags("staleness-modulation", "local-steps", "outer-optimizer"),
            *_flags("early-stopping", "keep-best", *_JOB_LIMITS),
            *_flags("mlflow-tracking-uri", "mlflow-experiment"),
        ),
        env=[*_master_env(), *_STEP_ENV],
        **_hardened(**_MASTER_STEP),
        retry_strategy=_job_retries(),
        inputs=[
            # The model definition: a Python file from any artifact source, raw text too.
            Artifact(name="model-def", path=f"{INPUTS}/model_def.py"),
            _pod_template(),
            *_parameters(
                "train",
                {
                    "data": "what preprocess wrote (a URI or a path on a shared volume)",
                    "output": "where the model, summary and checkpoints go",
                    "epochs": "passes over the training data",
                    "batch-size": "records per batch",
                    "workers": "workers to start",
                    "min-workers": "the job fails below this many",
                    "max-workers": "grow up to this many workers while all run",
                    "ps": "parameter server shards",
                    "records-per-task": "records per task (0: up to 512, or 16 batches with "
                    "local-steps set)",
                    "seed": "seed of the task order and of the initial values",
                    "image": "the elastic-step image, of this step and of worker and PS pods",
                    "worker-cpu": "CPU of each worker pod",
                    "worker-memory": "memory of each worker pod",
                    "worker-gpu": "GPUs of each worker pod",
                    "ps-cpu": "CPU of each PS pod",
                    "ps-memory": "memory of each PS pod",
                    "evaluation-steps": "also evaluate every N model versions (0: at epoch "
                    "ends only)",
                    "checkpoint-steps": "PS checkpoints every N model versions",
                    "keep-checkpoints": "checkpoints kept",
                    "staleness-modulation": "true: divide the PS's learning rate by the "
                    "staleness of each gradient, where workers push gradients (local-steps 1) "
                    "and the rate is a constant",
                    "local-steps": "steps a worker runs on its own copy of the model before "
                    "it pushes the change (1: every gradient goes to the PS's optimizer; 0: "
                    "chosen by the master so that each worker pushes at least 8 times an "
                    "epoch, at most 16)",
                    "outer-optimizer": "how the PS applies a worker's change with local-steps "
                    "> 1: average or nesterov",
                    "early-stopping": "METRIC[:PATIENCE[:min|max]]: end training once "
                    "PATIENCE evaluation rounds in a row have not beaten the best (default: "
                    "train every epoch)",
                    "keep-best": "METRIC[:min|max]: save the model of the best evaluation "
                    "round instead of the last",
                    **_JOB_LIMITS,
                    "mlflow-tracking-uri": "log params, metrics by model version, summary, "
                    "report and model to an MLflow run at this server, named by the job "
                    "(default: $MLFLOW_TRACKING_URI of the step, else none)",
                    "mlflow-experiment": "the run's MLflow experiment (default: "
                    "$MLFLOW_EXPERIMENT_NAME of the step, else elastic-step)",
                },
            ),
        ],
        # What KFP's elastic-train gives as its metrics, summary and job_name: summary.json
        # holds the final metrics, examples_per_second and the job's name.
        outputs=[
            _summary_parameter(
                "the job's summary.json: final metrics, per-epoch accounting, restarts, "
                "examples_per_second, job_name"
            ),
            Artifact(name="summary", path=SUMMARY_FILE),
        ],
    )


def _evaluate() -> Container:
    return Container(
        name="evaluate",
        image=_value("image"),
        env=_STEP_ENV,
        **_hardened(**_WORK_STEP),
        command=["elastic-step"],
        args=[
            "evaluate",
            *_flags("model", "data", "split", "batch-size"),
            "--metrics-output",
            f"{OUTPUTS}/metrics.json",
            "--report",
            f"{OUTPUTS}/report.html",
        ],
        inputs=_parameters(
            "evaluate",
            {
                "model": "what elastic-train wrote",
                "data": "what preprocess wrote",
                "split": "the split to evaluate",
                "batch-size": "records per batch",
                "image": "the elastic-step image",
            },
        ),
        outputs=[
            Parameter(
                name="metrics",
                description="the evaluation as JSON: loss, metrics, confusion matrix, ROC",
                value_from=ValueFrom(path=f"{OUTPUTS}/metrics.json"),
            ),
            Artifact(name="metrics", path=f"{OUTPUTS}/metrics.json"),
            # Not archived, so that the Argo UI shows the page.
            Artifact(name="report", path=f"{OUTPUTS}/report.html", archive=NoneArchiveStrategy()),
        ],
    )


def _batch_predict() -> Container:
    return Container(
        name="batch-predict",
        labels=_MASTER_LABELS,
        image=_value("image"),
        command=["elastic-step"],
        args=_job_args(
            "predict",
            *_flags("model", "input", "output", "split", "batch-size", "workers", "min-workers"),
            "--max-workers",
            _MAX_WORKERS,
            *_flags("records-per-task", "image", "worker-cpu", "worker-memory", "worker-gpu"),
            *_flags(*_JOB_LIMITS),
        ),
        env=[*_master_env(), *_STEP_ENV],
        **_hardened(**_MASTER_STEP),
        retry_strategy=_job_retries(),
        inputs=[
            _pod_template(),
            *_parameters(
                "predict",
                {
                    "model": "what elastic-train wrote (a URI or a path on a shared volume)",
                    "input": "a CSV file with the model's feature columns, or what preprocess "
                    "wrote (a URI or a path on a shared volume)",
                    "output": "where predictions.csv, summary.json and the job's state go",
                    "split": "the split to predict, when input is what preprocess wrote",
                    "batch-size": "records per batch",
                    "workers": "workers to start",
                    "min-workers": "the job fails below this many",
                    "max-workers": "grow up to this many workers while all run",
                    "records-per-task": "records per task (0: 512)",
                    "image": "the elastic-step image, of this step and of worker pods",
                    "worker-cpu": "CPU of each worker pod",
                    "worker-memory": "memory of each worker pod",
                    "worker-gpu": "GPUs of each worker pod",
                    **_JOB_LIMITS,
                },
            ),
        ],
        outputs=[
            _summary_parameter(
                "the job's summary.json: records, records_predicted, where predictions.csv "
                "is, restarts"
            ),
        ],
    )


def workflow_template() -> WorkflowTemplate:
    """The WorkflowTemplate ``elastic-step`` with the four templates."""
    with WorkflowTemplate(
        name=WORKFLOW_TEMPLATE,
        annotations={
            "workflows.argoproj.io/description": "elastic-step: preprocess a CSV file, train "
            "elastically with workers and parameter servers started by the training step, "
            "evaluate the model, and predict with it as an elastic job."
        },
        labels={"app.kubernetes.io/name": "elastic-step"},
    ) as template:
        _preprocess()
        _elastic_train()
        _evaluate()
        _batch_predict()
    return template
