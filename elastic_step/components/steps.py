"""What each KFP component does in its container: it runs the ``elastic-step`` command in
this process, with flags made from its artifacts and parameters, then records the outputs.

The components in kfp_components.py only call these functions: the code that runs is the
image's, and a component and the command line cannot drift apart. Artifacts are
``kfp.dsl`` artifacts; see locations.py for which of an artifact's paths the job uses.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from kfp.dsl import HTML, Artifact, ClassificationMetrics, Dataset, Metrics, Model

from elastic_step.backends.kubernetes_options import parse_volume
from elastic_step.components.identity import kfp_job_name
from elastic_step.components.locations import shared_location
from elastic_step.data import storage
from elastic_step.data.schema import Schema
from elastic_step.errors import InputError
from elastic_step.output_layout import OutputLayout

BACKENDS = ("kubernetes", "local")


def run_cli(argv: list[str]) -> None:
    """Runs ``elastic-step ARGV`` here; a non-zero status ends the step with that status
    (the command has printed its one-line error)."""
    from elastic_step.cli import main

    status = main(argv)
    if status:
        raise SystemExit(status)


def flags(values: Mapping[str, object]) -> list[str]:
    """``--flag value`` for each value that is set (not None, not an empty string)."""
    argv: list[str] = []
    for flag, value in values.items():
        if value is not None and value != "":
            argv += [flag, str(value)]
    return argv


def preprocess_step(
    *,
    csv: Dataset,
    label: str,
    data: Dataset,
    shards: int,
    validation_fraction: float,
    seed: int,
    categorical: str,
    label_type: str,
) -> None:
    """Preprocesses the CSV into ``data``; the record counts go into its metadata."""
    run_cli(
        [
            "preprocess",
            *flags(
                {
                    "--input": csv.path,
                    "--label": label,
                    "--output": data.path,
                    "--shards": shards,
                    "--validation-fraction": validation_fraction,
                    "--seed": seed,
                    "--categorical": categorical,
                    "--label-type": label_type,
                }
            ),
        ]
    )
    schema = Schema.load(data.path)
    data.metadata.update(
        {
            "label": schema.label,
            "label_kind": schema.label_kind,
            "columns": len(schema.columns),
            **{
                f"{split}_records": sum(shard.records for shard in shards)
                for split, shards in schema.splits.items()
            },
        }
    )


def model_def_file(model_def: Artifact | None, model_def_text: str) -> str:
    """The model definition's file: the artifact's, or ``model_def_text`` written to one."""
    if (model_def is None) == (not model_def_text):
        given = "both" if model_def is not None else "neither"
        raise InputError(
            "elastic-train takes exactly one model definition, the model_def artifact or "
            f"model_def_text, got {given}"
        )
    if model_def is not None:
        return model_def.path
    # Only the master reads this file; it copies the source to the output for the others.
    path = os.path.join(tempfile.mkdtemp(prefix="elastic-step-"), "model_def.py")
    with open(path, "w") as f:
        f.write(model_def_text)
    return path


@dataclass(frozen=True, kw_only=True)
class JobCommand:
    """The ``elastic-step`` command of a step that runs an elastic job (train, predict)."""

    argv: list[str]
    #: Where the job writes its results, state and summary.json.
    output: str
    job_name: str


@dataclass(frozen=True, kw_only=True)
class ElasticJob:
    """The settings that every job-running component shares: where its workers run, how
    many, as what pods, and the job's name (see identity.py)."""

    backend: str
    workers: int
    min_workers: int
    max_workers: int
    records_per_task: int
    image: str
    worker_cpu: str
    worker_memory: str
    worker_priority_class: str
    storage_secret: str
    volumes: list[str] | None
    job_name: str
    task_name: str

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise InputError(f"backend must be one of {', '.join(BACKENDS)}, got '{self.backend}'")

    def command(
        self,
        command: str,
        *,
        inputs: Mapping[str, Artifact],
        output: Artifact,
        options: Mapping[str, object],
        kubernetes_options: Mapping[str, object] | None = None,
    ) -> JobCommand:
        """``elastic-step COMMAND`` reading ``inputs`` (by flag) and writing ``output`` where
        the job's pods reach them, with the command's own ``options``, and
        ``kubernetes_options`` besides the shared ones for backend "kubernetes"."""
        mounts = [parse_volume(text) for text in self.volumes or []]
        locations = {
            flag: shared_location(artifact, backend=self.backend, volumes=mounts)
            for flag, artifact in inputs.items()
        }
        out = shared_location(output, backend=self.backend, volumes=mounts)
        name = kfp_job_name(
            job_name=self.job_name, task_name=self.task_name, output=out, env=os.environ
        )
        argv = [
            command,
            *flags(
                {
                    **locations,
                    "--output": out,
                    "--job-name": name,
                    "--backend": self.backend,
                    "--workers": self.workers,
                    "--min-workers": self.min_workers,
                    # 0: no growth (the command's default, --max-workers equal to --workers).
                    "--max-workers": self.max_workers or None,
                    "--records-per-task": self.records_per_task,
                    **options,
                }
            ),
        ]
        if self.backend == "kubernetes":
            argv += flags(
                {
                    "--image": self.image,
                    "--worker-cpu": self.worker_cpu,
                    "--worker-memory": self.worker_memory,
                    "--worker-priority-class": self.worker_priority_class,
                    "--storage-secret": self.storage_secret,
                    **(kubernetes_options or {}),
                }
            )
            for text in self.volumes or []:
                argv += ["--volume", text]
        return JobCommand(argv=argv, output=out, job_name=name)


def train_command(
    *,
    dataset: Dataset,
    model: Model,
    model_def: Artifact | None = None,
    model_def_text: str,
    epochs: int,
    batch_size: int,
    ps: int,
    seed: int,
    ps_cpu: str,
    ps_memory: str,
    **job,
) -> JobCommand:
    """The command that trains on ``dataset`` into ``model``, with the component's settings
    (``job``: those of :class:`ElasticJob`; ``model_def_text`` is written to a file for it)."""
    settings = ElasticJob(**job)
    return settings.command(
        "train",
        inputs={"--data": dataset},
        output=model,
        options={
            "--model-def": model_def_file(model_def, model_def_text),
            "--epochs": epochs,
            "--batch-size": batch_size,
            "--ps": ps,
            "--seed": seed,
        },
        kubernetes_options={"--ps-cpu": ps_cpu, "--ps-memory": ps_memory},
    )


def train_step(*, metrics: Metrics, summary: Artifact, **parameters) -> str:
    """Runs the training job (``parameters``: those of :func:`train_command`); returns its
    job name."""
    command = train_command(**parameters)
    run_cli(command.argv)
    record_training(
        output=command.output,
        model=parameters["model"],
        metrics=metrics,
        summary=summary,
        job_name=command.job_name,
    )
    return command.job_name


def record_training(
    *, output: str, model: Model, metrics: Metrics, summary: Artifact, job_name: str
) -> None:
    """The job's summary.json as the summary artifact, its final metrics and throughput as
    metrics, and the job's name and model version on the model."""
    document = json.loads(storage.read_text(OutputLayout(output).summary))
    with open(summary.path, "w") as f:
        json.dump(document, f, indent=2)
    for name, value in (document.get("metrics") or {}).items():
        if isinstance(value, int | float):
            metrics.log_metric(name, value)
    if document.get("examples_per_second") is not None:
        metrics.log_metric("examples_per_second", document["examples_per_second"])
    model.metadata.update(
        {
            "job_name": job_name,
            "model_version": document.get("model_version"),
            "epochs": len(document.get("epochs") or []),
        }
    )


def evaluate_step(
    *,
    model: Model,
    dataset: Dataset,
    metrics: Metrics,
    classification: ClassificationMetrics,
    report: HTML,
    split: str,
    batch_size: int,
) -> None:
    """Evaluates the model; the whole evaluation is the metrics artifact's file, and the
    report (with the training's summary.json from the model) is the HTML artifact."""
    run_cli(
        [
            "evaluate",
            *flags(
                {
                    "--model": model.path,
                    "--data": dataset.path,
                    "--split": split,
                    "--metrics-output": metrics.path,
                    "--batch-size": batch_size,
                    "--report": report.path,
                }
            ),
        ]
    )
    with open(metrics.path) as f:
        evaluation = json.load(f)
    record_evaluation(evaluation, metrics=metrics, classification=classification)


def record_evaluation(
    evaluation: dict, *, metrics: Metrics, classification: ClassificationMetrics
) -> None:
    """Scalars as metrics; the confusion matrix and, for binary labels, the ROC curve as
    classification metrics (what the KFP UI draws)."""
    metrics.log_metric("loss", evaluation["loss"])
    metrics.log_metric("records", evaluation["records"])
    for name, value in evaluation["metrics"].items():
        if isinstance(value, int | float):
            metrics.log_metric(name, value)
    matrix = evaluation.get("confusion_matrix")
    if matrix is not None:
        classification.log_confusion_matrix(
            [str(label) for label in matrix["labels"]], matrix["matrix"]
        )
    roc = evaluation.get("roc")
    if roc:
        classification.log_roc_curve(
            [point["fpr"] for point in roc],
            [point["tpr"] for point in roc],
            [point["threshold"] for point in roc],
        )


def predict_command(
    *,
    model: Model,
    data: Dataset,
    predictions: Dataset,
    summary: Artifact,
    split: str,
    batch_size: int,
    **job,
) -> JobCommand:
    """The command that runs ``model`` over ``data`` into ``predictions``, and copies the
    job's summary.json to ``summary`` (``job``: those of :class:`ElasticJob`). ``data`` is a
    CSV file, or what preprocess wrote (a directory), whose ``split`` is read; the launcher's
    local copy of ``data`` tells which."""
    is_data_dir = os.path.isdir(data.path)
    return ElasticJob(**job).command(
        "predict",
        inputs={"--model": model, "--input": data},
        output=predictions,
        options={
            "--split": split if is_data_dir else None,
            "--batch-size": batch_size,
            "--summary-output": summary.path,
        },
    )


def predict_step(**parameters) -> str:
    """Runs the prediction job (``parameters``: those of :func:`predict_command`); returns
    its job name."""
    command = predict_command(**parameters)
    run_cli(command.argv)
    record_predictions(
        output=command.output,
        predictions=parameters["predictions"],
        summary=parameters["summary"],
        job_name=command.job_name,
    )
    return command.job_name


def record_predictions(
    *, output: str, predictions: Dataset, summary: Artifact, job_name: str
) -> None:
    """On the predictions artifact: the rows of predictions.csv, its columns, with a
    ``class`` column the rows per predicted class, the job's name and its throughput."""
    rows = 0
    classes: Counter[str] = Counter()
    with storage.open_file(OutputLayout(output).predictions, "rb") as raw:
        reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
        header = next(reader)
        has_class = header[1:2] == ["class"]
        for row in reader:
            rows += 1
            if has_class:
                classes[row[1]] += 1
    predictions.metadata.update({"rows": rows, "columns": header, "job_name": job_name})
    if has_class:
        predictions.metadata["class_counts"] = dict(sorted(classes.items()))
    with open(summary.path) as f:
        rate = json.load(f).get("examples_per_second")
    if rate is not None:
        predictions.metadata["examples_per_second"] = rate
