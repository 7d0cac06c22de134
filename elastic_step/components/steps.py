"""What each KFP component does in its container: it runs the ``elastic-step`` command in
this process, with flags made from its artifacts and parameters, then records the outputs.

The components in kfp_components.py only call these functions: the code that runs is the
image's. A parameter becomes its flag by the rules of parameters.py, and
tests/unit/test_component_parameters.py holds the components to the command's flags.
Artifacts are ``kfp.dsl`` artifacts; see locations.py for which of an artifact's paths the
job uses. Bad input ends a step as it ends the command: one line on stderr, exit status 2.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from kfp.dsl import HTML, Artifact, ClassificationMetrics, Dataset, Metrics, Model

from elastic_step.backends.kubernetes_options import parse_volume
from elastic_step.components.identity import kfp_job_name
from elastic_step.components.locations import shared_location
from elastic_step.components.parameters import KFP, arguments, command_flags, parameter_name
from elastic_step.data import storage
from elastic_step.data.schema import Schema
from elastic_step.errors import ElasticStepError, InputError
from elastic_step.kubernetes_flags import FLAG_DEFAULTS
from elastic_step.output_layout import OutputLayout

BACKENDS = ("kubernetes", "local")
_Step = TypeVar("_Step", bound=Callable[..., Any])


def as_the_cli(step: _Step) -> _Step:
    """``step``, ending on bad input as ``elastic-step`` does: its one line on stderr (as
    cli.main words it) and the error's exit status, no traceback."""

    @functools.wraps(step)
    def run(**parameters):
        try:
            return step(**parameters)
        except ElasticStepError as e:
            print(f"elastic-step: error: {e}", file=sys.stderr)
            raise SystemExit(e.exit_code) from None

    return run  # type: ignore[return-value]


def run_cli(argv: list[str]) -> None:
    """Runs ``elastic-step ARGV`` here; a non-zero status ends the step with that status
    (the command has printed its one-line error)."""
    from elastic_step.cli import main

    status = main(argv)
    if status:
        raise SystemExit(status)


@as_the_cli
def preprocess_step(*, csv: Dataset, data: Dataset, **parameters: object) -> None:
    """Preprocesses the CSV into ``data``; the record counts go into its metadata."""
    run_cli(
        [
            "preprocess",
            *["--input", csv.path, "--output", data.path],
            *arguments("preprocess", parameters),
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
    return _temporary_file("model_def.py", model_def_text)


def _temporary_file(name: str, text: str) -> str:
    path = os.path.join(tempfile.mkdtemp(prefix="elastic-step-"), name)
    with open(path, "w") as f:
        f.write(text)
    return path


@dataclass(frozen=True, kw_only=True)
class JobCommand:
    """The ``elastic-step`` command of a step that runs an elastic job (train, predict)."""

    argv: list[str]
    #: Where the job writes its results, state and summary.json.
    output: str
    job_name: str


@functools.cache
def _kubernetes_parameters(command: str) -> frozenset[str]:
    """The KFP parameters that are flags of the Kubernetes backend, by the CLI's own list."""
    return frozenset(
        name
        for flag in command_flags(command).values()
        if flag.dest in FLAG_DEFAULTS and (name := parameter_name(command, flag, KFP))
    )


def job_command(
    command: str,
    *,
    inputs: Mapping[str, Artifact],
    output: Artifact,
    flags: Mapping[str, str],
    parameters: Mapping[str, Any],
) -> JobCommand:
    """``elastic-step COMMAND`` (train or predict) with the step's ``parameters``, reading
    ``inputs`` (by flag) and writing ``output`` where the job's pods reach them, plus the
    ``flags`` that the step makes itself. The job is named by identity.py."""
    values = dict(parameters)
    backend = values.get("backend", "kubernetes")
    if backend not in BACKENDS:
        raise InputError(f"backend must be one of {', '.join(BACKENDS)}, got '{backend}'")
    mounts = [parse_volume(text) for text in values.get("volumes") or []]
    out = shared_location(output, backend=backend, volumes=mounts)
    name = kfp_job_name(
        job_name=values.pop("job_name", ""),
        task_name=values.pop("task_name", ""),
        output=out,
        env=os.environ,
    )
    if backend == "local":  # the command refuses the pods' settings there: none are made
        values = {k: v for k, v in values.items() if k not in _kubernetes_parameters(command)}
    if values.get("pod_template"):  # KFP's is the pod itself; the command reads a file
        values["pod_template"] = _temporary_file(
            "pod_template.yaml", yaml.safe_dump(values["pod_template"])
        )
    given = {
        **{
            flag: shared_location(artifact, backend=backend, volumes=mounts)
            for flag, artifact in inputs.items()
        },
        "--output": out,
        "--job-name": name,
        **flags,
    }
    argv = [command, *(item for pair in given.items() for item in pair)]
    return JobCommand(argv=argv + arguments(command, values), output=out, job_name=name)


def train_command(
    *,
    dataset: Dataset,
    model: Model,
    model_def: Artifact | None = None,
    model_def_text: str = "",
    **parameters: object,
) -> JobCommand:
    """The command that trains on ``dataset`` into ``model`` (``parameters``: the
    component's others; ``model_def_text`` is written to a file for it)."""
    return job_command(
        "train",
        inputs={"--data": dataset},
        output=model,
        flags={"--model-def": model_def_file(model_def, model_def_text)},
        parameters=parameters,
    )


@as_the_cli
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


@as_the_cli
def evaluate_step(
    *,
    model: Model,
    dataset: Dataset,
    metrics: Metrics,
    classification: ClassificationMetrics,
    report: HTML,
    **parameters: object,
) -> None:
    """Evaluates the model; the whole evaluation is the metrics artifact's file, and the
    report (with the training's summary.json from the model) is the HTML artifact."""
    run_cli(
        [
            "evaluate",
            *["--model", model.path, "--data", dataset.path],
            *["--metrics-output", metrics.path, "--report", report.path],
            *arguments("evaluate", parameters),
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
    split: str = "validation",
    **parameters: object,
) -> JobCommand:
    """The command that runs ``model`` over ``data`` into ``predictions``, and copies the
    job's summary.json to ``summary`` (``parameters``: the component's others). ``data`` is
    a CSV file, or what preprocess wrote (a directory), whose ``split`` is read; the
    launcher's local copy of ``data`` tells which."""
    is_data_dir = os.path.isdir(data.path)
    return job_command(
        "predict",
        inputs={"--model": model, "--input": data},
        output=predictions,
        flags={"--summary-output": summary.path},
        parameters={**parameters, "split": split if is_data_dir else None},
    )


@as_the_cli
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
