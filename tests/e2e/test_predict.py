"""`elastic-step predict` as an elastic job: real workers, one killed with SIGKILL mid-run,
and still exactly one prediction per input row, in input order, equal to the trained model's
own outputs.

The session's digits run gives the model; one prediction run serves most
assertions.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TrainRun, pid_alive

from elastic_step.cli import main
from elastic_step.master.reporting.report_fields import STATUS, SUMMARY

pytestmark = pytest.mark.e2e

#: The digits repeated this many times: enough tasks that the job is still running when a
#: worker is killed.
REPEATS = 12


class PredictRun(TrainRun):
    """One `elastic-step predict` process and the files it writes."""

    def __init__(self, model: Path, csv_path: Path, output: Path, *extra: str) -> None:
        self.output = output
        self.argv = [
            sys.executable, "-m", "elastic_step", "predict",
            "--model", str(model), "--input", str(csv_path), "--output", str(output),
            "--records-per-task", "100", "--batch-size", "50", *extra,
        ]  # fmt: skip
        self.log_path = output.parent / f"{output.name}.master.log"
        self.proc = None


@pytest.fixture(scope="module")
def trained(digits_run) -> Path:
    return digits_run.output


@pytest.fixture(scope="module")
def rows(tmp_path_factory, digits_data) -> Path:
    """A CSV of REPEATS copies of the digits, label column included (predict ignores it)."""
    source = (digits_data.parent / "digits.csv").read_text().splitlines()
    path = tmp_path_factory.mktemp("input") / "rows.csv"
    path.write_text("\n".join([source[0], *source[1:] * REPEATS]) + "\n")
    return path


def under_way(status: dict) -> bool:
    """Predictions partly written, by two running workers."""
    progress = status.get("progress", {})
    return (
        0 < progress.get("records_predicted", 0) < progress.get("records", 0)
        and sum(w["state"] == "running" for w in status.get("workers", [])) == 2
    )


@pytest.fixture(scope="module")
def killed(tmp_path_factory, trained, rows):
    """The prediction run with 2 workers, one killed with SIGKILL once tasks are done."""
    run = PredictRun(trained, rows, tmp_path_factory.mktemp("predict") / "out", "--workers", "2")
    run.start()
    try:
        with run.held(under_way) as status:
            progress = status["progress"]
            victim = next(w for w in status["workers"] if w["state"] == "running")
            os.kill(victim["pid"], signal.SIGKILL)
        assert run.wait() == 0, run.log()[-3000:]
    finally:
        run.kill_all()
    return {"run": run, "victim": victim, "progress_at_kill": progress}


def _predictions(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    return table[0], table[1:]


def test_one_prediction_per_input_row_in_input_order(killed, rows) -> None:
    run = killed["run"]
    progress = killed["progress_at_kill"]
    # The worker died mid-run: tasks were done, and tasks were left.
    assert 0 < progress["records_predicted"] < progress["records"]
    assert f"{killed['victim']['id']} crashed (killed by SIGKILL)" in run.log()
    summary = run.summary()
    assert summary["restarts"]["worker"] >= 1
    header, table = _predictions(run.output / "predictions.csv")
    # The digits' classes, in the label vocabulary's order.
    assert header[:2] == ["index", "class"] and len(header) == 12, header
    assert sorted(header[2:]) == [f"output_{j}" for j in range(10)], header
    expected = len(rows.read_text().splitlines()) - 1
    assert [int(r[0]) for r in table] == list(range(expected))
    assert summary["records"] == summary["records_predicted"] == expected
    # One file: the tasks' parts are merged and gone.
    assert not (run.output / "prediction-parts").exists()


def test_the_status_of_a_prediction_is_a_prediction_s(killed, rows, capsys) -> None:
    run = killed["run"]
    status = json.loads((run.output / "status.json").read_text())
    expected = len(rows.read_text().splitlines()) - 1
    assert status["kind"] == "predict" and status["phase"] == "succeeded"
    assert status["progress"] == {
        "records_predicted": expected,
        "records": expected,
        "fraction": 1.0,
    }
    assert not {"epoch", "epochs", "model_version", "ps", "train_loss"} & set(status)
    # The fields of the documentation's reference (report_fields), no more, no fewer.
    assert set(status) == set(STATUS["predict"])
    assert set(run.summary()) == set(SUMMARY["predict"])
    assert main(["status", str(run.output)]) == 0
    shown = capsys.readouterr().out
    assert f"records: {expected}/{expected} predicted" in shown
    assert "epoch" not in shown and "ps:" not in shown and "training" not in shown, shown
    log = run.log()
    assert "starting 2 workers (master on port" in log
    # Its progress lines count records predicted; nothing in its log speaks of epochs or PS.
    line = rf"predicted \[[# ]{{20}}\] +\d+% \(\d+/{expected} records\) \| \d workers"
    assert re.search(line, log), log[-3000:]
    assert "epoch 1/1" not in log and " PS" not in log, log[-3000:]


def test_predictions_are_the_trained_models_outputs(killed, trained, rows) -> None:
    import keras

    import elastic_step.model.serving  # noqa: F401 - registers the raw-input layer for load_model

    schema = json.loads((trained / "schema.json").read_text())
    with open(rows, newline="") as f:
        records = list(csv.DictReader(f))
    # model.keras takes the CSV's raw values and applies the schema's preprocessing itself.
    features = {
        c["input_name"]: np.array([float(r[c["name"]]) for r in records], dtype=np.float32)
        for c in schema["columns"]
    }
    model = keras.models.load_model(trained / "model.keras")
    outputs = np.asarray(model.predict(features, batch_size=512, verbose=0))
    _, table = _predictions(killed["run"].output / "predictions.csv")
    got = np.array([[float(v) for v in r[2:]] for r in table])
    assert np.allclose(got, outputs, atol=1e-4)
    classes = [schema["label_vocabulary"][j] for j in outputs.argmax(axis=1)]
    assert [r[1] for r in table] == classes
    # The model learned the digits: most predicted classes are the rows' labels.
    accuracy = np.mean([r[1] == rec["digit"] for r, rec in zip(table, records, strict=True)])
    assert accuracy > 0.8


def test_parquet_input_gives_the_same_predictions(killed, trained, rows, tmp_path) -> None:
    """The same rows as two Parquet files (pixels as int64, the label a string): the same
    predictions.csv, byte for byte."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pacsv.read_csv(rows)
    table = table.set_column(
        table.column_names.index("digit"), "digit", table["digit"].cast("string")
    )
    parquet = tmp_path / "rows"
    parquet.mkdir()
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), parquet / "a.parquet", row_group_size=1000)
    pq.write_table(table.slice(half), parquet / "b.parquet", row_group_size=1000)
    run = PredictRun(trained, parquet, tmp_path / "out", "--workers", "2")
    run.start()
    try:
        assert run.wait() == 0, run.log()[-3000:]
    finally:
        run.kill_all()
    want = (killed["run"].output / "predictions.csv").read_bytes()
    assert (run.output / "predictions.csv").read_bytes() == want


def test_running_a_finished_job_again_changes_nothing(killed) -> None:
    run = killed["run"]
    before = (run.output / "predictions.csv").read_bytes()
    started = time.monotonic()
    again = subprocess.run(run.argv, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "already finished; nothing to do" in again.stderr
    assert (run.output / "predictions.csv").read_bytes() == before
    assert time.monotonic() - started < 60


def test_columns_that_do_not_match_the_schema_are_one_line_and_exit_status_2(
    trained, tmp_path
) -> None:
    bad = tmp_path / "bad.csv"
    header = [f"pixel_{i}" for i in range(63)] + ["brightness"]
    bad.write_text(",".join(header) + "\n" + ",".join(["0"] * 64) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "elastic_step", "predict", "--model", str(trained),
         "--input", str(bad), "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"elastic-step: error: {bad}: the columns do not match the model's schema (missing "
        "pixel_63; unknown brightness); the model reads "
        + ", ".join(f"pixel_{i}" for i in range(64))
        + " (and ignores its label 'digit')"
    )
    assert not (tmp_path / "out" / "predictions.csv").exists()


def test_master_killed_mid_run_and_run_again_resumes_with_its_workers(
    tmp_path, trained, rows, killed
) -> None:
    run = PredictRun(trained, rows, tmp_path / "out", "--workers", "2")
    again = PredictRun(trained, rows, tmp_path / "out", "--workers", "2")
    run.start()
    try:
        with run.held(under_way) as status:
            workers = run.member_pids(status)
            run.proc.send_signal(signal.SIGKILL)
            run.proc.wait(timeout=10)
        done_at_kill = status["progress"]["records_predicted"]
        assert 0 < done_at_kill < status["progress"]["records"]

        assert again.start().wait() == 0, again.log()[-3000:]
    finally:
        run.kill_all()
        again.kill_all()
    log = again.log()
    # The new master takes over the workers that kept predicting, rather than starting others.
    assert "adopted worker-0, worker-1" in log
    # ... and, once they are dismissed and exit, neither is taken for lost and replaced.
    assert "replacing" not in log, log
    summary = again.summary()
    assert summary["restarts"]["master"] == 1
    assert summary["restarts"]["worker"] == 0
    assert not any(pid_alive(pid) for pid in workers.values())
    # The same predictions as the run that lost a worker, row for row.
    header, table = _predictions(again.output / "predictions.csv")
    reference_header, reference = _predictions(killed["run"].output / "predictions.csv")
    assert header == reference_header
    assert [r[:2] for r in table] == [r[:2] for r in reference]
    got = np.array([[float(v) for v in r[2:]] for r in table])
    assert np.allclose(got, np.array([[float(v) for v in r[2:]] for r in reference]), atol=1e-6)
    assert summary["records"] == summary["records_predicted"] == len(table)
