"""Watching a real training run, and ending it well: the Prometheus endpoint and status
during the run, TensorBoard events, early stopping and the kept best model afterwards.

One run serves every assertion. Its model gets worse at every evaluation round by
construction: the loss it minimizes is minus the cross-entropy that its ``xent`` metric
measures, so SGD climbs ``xent`` and round 0 (the end of epoch 1) is the best round for sure.
On the training batches too, then, the ``xent`` metric the workers report is minus the loss.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import TrainRun, mid_epoch, records_exact
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing import event_accumulator

pytestmark = pytest.mark.e2e

WORSENING_MODEL = """
import keras

PIXELS = [f"pixel_{i}" for i in range(64)]

def model():
    inputs = {n: keras.Input(shape=(), name=n) for n in PIXELS}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in PIXELS])
    return keras.Model(inputs, keras.layers.Dense(10)(x))

def loss(labels, outputs):
    # Minus the cross-entropy: training climbs it, so xent gets worse at every round.
    return -keras.ops.mean(
        keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
    )

def optimizer():
    return keras.optimizers.SGD(0.05)

def metrics():
    return {
        "xent": keras.metrics.SparseCategoricalCrossentropy(from_logits=True),
        "accuracy": keras.metrics.SparseCategoricalAccuracy(),
    }
"""

EPOCHS = 6
PATIENCE = 2


def _metrics(url: str) -> dict[tuple[str, tuple], float]:
    """The endpoint's samples by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every tf.summary scalar series in the event files, as (step, value) pairs."""
    import tensorflow as tf

    accumulator = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    return {
        tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]
        for tag in accumulator.Tags()["tensors"]
    }


@pytest.fixture(scope="module")
def watched(tmp_path_factory, digits_data):
    """The run, what its endpoint and `status` showed while it ran, and its evaluate."""
    root = tmp_path_factory.mktemp("watched")
    model_def = root / "worsening.py"
    model_def.write_text(WORSENING_MODEL)
    run = TrainRun(
        digits_data,
        root / "run",
        "--workers", "2", "--epochs", str(EPOCHS), "--metrics-port", "0",
        "--early-stopping", f"xent:{PATIENCE}", "--keep-best", "xent",
        model_def=str(model_def),
    ).start()  # fmt: skip
    try:
        # Held in its first epoch once a rate is known, so that a fast run cannot end first.
        with run.held(lambda s: mid_epoch(s) and s.get("eta_s") is not None) as status:
            scraped = _metrics(f"http://{status['metrics_endpoint']}/metrics")
            shown = subprocess.run(
                [sys.executable, "-m", "elastic_step", "status", str(run.output)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        assert run.wait() == 0, run.log()[-3000:]
    finally:
        run.kill_all()
    result = subprocess.run(
        [sys.executable, "-m", "elastic_step", "evaluate", "--model", str(run.output),
         "--data", str(digits_data), "--metrics-output", str(root / "metrics.json")],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return {
        "run": run,
        "scraped": scraped,
        "status_text": shown.stdout,
        "summary": run.summary(),
        "status": run.status(),
        "evaluated": json.loads((root / "metrics.json").read_text()),
    }


def test_the_endpoint_parses_and_shows_live_workers_and_tasks_done(watched) -> None:
    scraped = watched["scraped"]
    assert scraped[("elastic_step_instances", (("role", "worker"), ("state", "running")))] >= 1
    assert scraped[("elastic_step_instances", (("role", "ps"), ("state", "running")))] == 1
    assert scraped[("elastic_step_tasks", (("kind", "train"), ("state", "done")))] >= 1
    todo = scraped[("elastic_step_tasks", (("kind", "train"), ("state", "todo")))]
    assert todo > 0  # six epochs planned, the endpoint was read in the first
    assert ("elastic_step_model_version", ()) in scraped
    # A training task was reported: its window's mean loss and metrics so far.
    train = {m: scraped[("elastic_step_train", (("metric", m),))] for m in ("loss", "xent")}
    assert math.isclose(train["xent"], -train["loss"], rel_tol=1e-4)
    assert 0 <= scraped[("elastic_step_train", (("metric", "accuracy"),))] <= 1
    assert scraped[("elastic_step_train_model_version", ())] >= 1


def test_status_shows_elapsed_eta_and_the_latest_evaluation(watched) -> None:
    text = watched["status_text"]
    assert "elapsed: " in text and "eta: " in text, text
    final = subprocess.run(
        [sys.executable, "-m", "elastic_step", "status", str(watched["run"].output)],
        capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    last = max(watched["summary"]["evaluations"], key=lambda e: e["round"])
    assert f"latest evaluation: round {last['round']} " in final, final
    assert "stopped: early stopping: xent (min) did not improve" in final, final
    window = watched["summary"]["train_loss"][-1]
    assert (
        f"training: model v{window['min_model_version']}-v{window['max_model_version']}, " in final
    )


def test_early_stopping_ends_training_with_exact_accounting(watched) -> None:
    summary = watched["summary"]
    stop = summary["early_stop"]
    assert summary["phase"] == "succeeded"
    # Round 0 is the best; rounds 1 and 2 do not beat it: patience 2 runs out at round 2.
    assert (stop["best_round"], stop["round"], stop["patience"]) == (0, 2, PATIENCE)
    # The epoch that round 2 ended and, if a worker had begun it, the next one; no more.
    assert stop["last_epoch"] in (3, 4) and stop["epochs"] == EPOCHS
    assert [e["epoch"] for e in summary["epochs"]] == list(range(1, stop["last_epoch"] + 1))
    assert records_exact(summary)
    ends = [e for e in summary["evaluations"] if e["trigger"] == "epoch-end"]
    assert [e["epoch"] for e in ends] == list(range(1, stop["last_epoch"] + 1))
    xent = [e["metrics"]["xent"] for e in sorted(ends, key=lambda e: e["round"])]
    assert xent == sorted(xent) and xent[0] < xent[-1]


def test_keep_best_exports_the_best_rounds_model(watched) -> None:
    summary, evaluated = watched["summary"], watched["evaluated"]
    kept = summary["kept_model"]
    best = next(e for e in summary["evaluations"] if e["round"] == 0)
    assert kept["round"] == 0 and kept["metrics"] == best["metrics"] == summary["metrics"]
    # Every task of the round measured the model that was kept.
    assert best["min_model_version"] == best["model_version"] == kept["model_version"]
    assert math.isclose(evaluated["metrics"]["xent"], best["metrics"]["xent"], rel_tol=1e-5)
    assert math.isclose(evaluated["loss"], best["metrics"]["loss"], rel_tol=1e-5)
    last = max(summary["evaluations"], key=lambda e: e["round"])
    assert not math.isclose(evaluated["metrics"]["xent"], last["metrics"]["xent"], rel_tol=1e-3)


def test_tensorboard_events_hold_the_evaluation_series(watched) -> None:
    summary = watched["summary"]
    scalars = _scalars(watched["run"].output / "tensorboard")
    rounds = sorted(summary["evaluations"], key=lambda e: e["round"])
    for name in ("loss", "xent"):
        series = sorted(scalars[f"eval/{name}"])
        expected = sorted((e["model_version"], e["metrics"][name]) for e in rounds)
        assert [s for s, _ in series] == [s for s, _ in expected]
        assert np.allclose([v for _, v in series], [v for _, v in expected], rtol=1e-6)
    assert max(v for _, v in scalars["job/live_workers"]) >= 1
    assert all(v > 0 for _, v in scalars["job/examples_per_second"])


def test_workers_report_the_training_loss_into_summary_and_tensorboard(watched) -> None:
    summary = watched["summary"]
    windows = summary["train_loss"]
    # Every training task reported its loss once: the windows cover every record trained.
    trained = sum(e["records_trained"] for e in summary["epochs"])
    assert sum(w["examples"] for w in windows) == trained
    assert len(windows) >= 2
    # SGD minimizes the loss (minus xent): it falls from the first window to the last.
    assert windows[-1]["loss"] < windows[0]["loss"]
    series = sorted(_scalars(watched["run"].output / "tensorboard")["train/loss"])
    expected = sorted((w["max_model_version"], w["loss"]) for w in windows)
    assert [s for s, _ in series] == [s for s, _ in expected]
    assert np.allclose([v for _, v in series], [v for _, v in expected], rtol=1e-6)


def test_workers_report_the_models_metrics_on_the_training_batches(watched) -> None:
    summary = watched["summary"]
    windows = summary["train_loss"]
    # status.json, written last as the job ended, holds the same windows.
    assert watched["status"]["train_loss"] == windows
    for window in windows:
        assert set(window["metrics"]) == {"xent", "accuracy"}
        assert 0 <= window["metrics"]["accuracy"] <= 1
        # Measured by Keras's metric on the outputs each step trained with, summed over tasks
        # and workers exactly as the loss is: minus the loss, window by window.
        assert math.isclose(window["metrics"]["xent"], -window["loss"], rel_tol=1e-4)
    # Climbing the cross-entropy drives the right class's probability, and accuracy, down:
    # the seeded start gets a few right, the last windows hardly any.
    assert windows[0]["metrics"]["accuracy"] > windows[-1]["metrics"]["accuracy"]
    scalars = _scalars(watched["run"].output / "tensorboard")
    for name in ("xent", "accuracy"):
        series = sorted(scalars[f"train/{name}"])
        expected = sorted((w["max_model_version"], w["metrics"][name]) for w in windows)
        assert [s for s, _ in series] == [s for s, _ in expected]
        assert np.allclose([v for _, v in series], [v for _, v in expected], rtol=1e-6)


def test_a_metric_the_model_does_not_report_is_one_line_and_exit_status_2(
    digits_data, tmp_path, capsys
) -> None:
    from elastic_step.cli import main
    from elastic_step.examples import path_of

    args = ["train", "--model-def", path_of("digits"), "--data", str(digits_data)]
    assert main([*args, "--output", str(tmp_path / "run"), "--keep-best", "auc"]) == 2
    assert capsys.readouterr().err == (
        "elastic-step: error: --keep-best names metric 'auc', but the evaluation reports only "
        "accuracy, loss\n"
    )
    assert not (tmp_path / "run").exists()  # nothing was written or started


def test_status_and_summary_hold_the_documented_fields(watched) -> None:
    """Each field a training writes is in the documentation's reference, and each there is
    written (docs/reference/status-and-summary.md, from report_fields)."""
    from elastic_step.master.reporting.report_fields import STATUS, SUMMARY

    assert set(watched["status"]) == set(STATUS["train"])
    assert set(watched["summary"]) == set(SUMMARY["train"])
