"""What the e2e tests hand the CLI as a user would: model definition files (their text), and
``elastic-step`` run in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import records_exact

#: ``model()`` over two numeric columns ``a`` and ``b``, for 2 classes.
TWO_COLUMN_MODEL = """
def model():
    inputs = {n: keras.Input(shape=(), name=n) for n in ("a", "b")}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in ("a", "b")])
    return keras.Model(inputs, keras.layers.Dense(2)(x))
"""

_LOSS = """
def loss(labels, outputs):
    return keras.ops.mean(
        keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
    )
"""

_ACCURACY = """
def metrics():
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}
"""


def classifier_definition(
    model: str, *, optimizer: str, accuracy: bool = False, preamble: str = ""
) -> str:
    """A classifier's model definition file: ``import keras``, ``preamble`` (more imports, a
    feed), ``model`` (the source of its ``model()``, giving logits), the mean sparse
    categorical cross-entropy as its loss, ``optimizer()`` returning the expression
    ``optimizer``, and with ``accuracy`` an accuracy metric."""
    optimizer_fn = f"\ndef optimizer():\n    return {optimizer}\n"
    return (
        "import keras\n" + preamble + model + _LOSS + optimizer_fn + (_ACCURACY if accuracy else "")
    )


def mlp_classifier(width: int, hidden: int, classes: int, *, optimizer: str, **kwargs) -> str:
    """A :func:`classifier_definition` of a Keras Sequential: one vector input of ``width``
    (the default feed's, numeric columns and one-hot ones), a ``hidden`` ReLU layer, and
    ``classes`` logits."""
    model = f"""
def model():
    return keras.Sequential([
        keras.Input(shape=({width},)),
        keras.layers.Dense({hidden}, activation="relu"),
        keras.layers.Dense({classes}),
    ])
"""
    return classifier_definition(model, optimizer=optimizer, **kwargs)


def write_job_inputs(
    directory: Path, csv_name: str, rows: list[str], model: str
) -> tuple[Path, Path, Path]:
    """Writes ``rows`` (a header first) as ``directory/csv_name`` and ``model`` as
    ``directory/model.py``; returns the CSV's path and the data and run directories a job
    preprocesses into and trains into."""
    (directory / csv_name).write_text("\n".join(rows) + "\n")
    (directory / "model.py").write_text(model)
    return directory / csv_name, directory / "data", directory / "run"


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``elastic-step ARGS`` in a subprocess, its output captured as text; a run that takes
    longer than ``timeout`` seconds is killed (subprocess.TimeoutExpired)."""
    return subprocess.run(
        [sys.executable, "-m", "elastic_step", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train_summary(model_def: Path, data: Path, run: Path, *flags: str) -> dict:
    """``elastic-step train`` of ``model_def`` on ``data`` into ``run`` with ``flags``: the
    summary of a run that exited 0 having trained every epoch's records exactly."""
    train = run_cli(
        "train", "--model-def", str(model_def), "--data", str(data), "--output", str(run), *flags
    )
    assert train.returncode == 0, train.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert records_exact(summary), summary["epochs"]
    return summary


def evaluate(run: Path, data: Path, metrics: Path) -> dict:
    """``elastic-step evaluate`` of the model trained in ``run`` on ``data``: the metrics file
    it writes at ``metrics``, read."""
    evaluated = run_cli("evaluate", "--model", str(run), "--data", str(data),
                        "--metrics-output", str(metrics))  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    return json.loads(metrics.read_text())
