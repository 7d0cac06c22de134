"""MLflow tracking of real training jobs against a real tracking server (`mlflow server`,
SQLite, artifacts served by it, on loopback), read back through MlflowClient:

- a job with 2 workers, one SIGKILLed mid-epoch together with the master, which is run
  again: one run, resumed; params, the loss and metric histories at the model versions of
  summary.json (each point once), evaluations in epoch order, the final metrics, restarts,
  the artifacts, and a model that loads and predicts;
- the same job with the server stopped mid-run: it completes, with warnings;
- the train component under kfp.local with KFP's MLflow variables: a run nested under the
  parent KFP made, or the run KFP made (left for KFP's launcher to end).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import mid_epoch, records_exact
from mlflow.tracking import MlflowClient
from mlflow_server import MlflowServer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()


def job_run(client: MlflowClient, experiment: str, job_name: str):
    """The one run of ``job_name`` in ``experiment``."""
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment}"
    runs = client.search_runs(
        [found.experiment_id], filter_string=f"tags.elastic_step.job_name = '{job_name}'"
    )
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def wait_for_line(run, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in run.log():
        if time.monotonic() > deadline:
            pytest.fail(f"the master never logged {text!r}:\n{run.log()[-3000:]}")
        time.sleep(0.2)


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def assert_history(client, run_id: str, key: str, expected: list[tuple[int, float]]) -> None:
    """``key``'s history is ``expected``: the same steps, the same values (as floats). Both
    sorted: MLflow's history of points sent together (one timestamp) has no set order."""
    got, expected = sorted(history(client, run_id, key)), sorted(expected)
    assert [s for s, _ in got] == [s for s, _ in expected], (key, got, expected)
    assert [v for _, v in got] == pytest.approx([v for _, v in expected]), key


def test_a_job_with_a_killed_worker_and_master_logs_everything_to_mlflow(
    train_run, server, digits_data, tmp_path
) -> None:
    flags = (
        "--epochs", "3", "--workers", "2",
        "--mlflow-tracking-uri", server.uri, "--mlflow-experiment", "killed-worker",
    )  # fmt: skip
    first = train_run(*flags).start()
    with first.held(mid_epoch) as status:
        wait_for_line(first, "MLflow: logging to run")  # the master runs while held
        os.killpg(first.member_pids(status)["worker-1"], signal.SIGKILL)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
    run = train_run(*flags, output=first.output).start()
    assert run.wait() == 0, run.log()[-3000:]
    summary = run.summary()
    assert records_exact(summary) and sum(summary["restarts_by_reason"].values()) >= 1
    assert summary["restarts"]["master"] == 1

    client = server.client()
    mlrun = job_run(client, "killed-worker", summary["job_name"])
    run_id = mlrun.info.run_id
    first_master, second_master = run.log().split("resuming the job in")
    assert f"MLflow: logging to run {run_id}" in first_master
    assert f"MLflow: logging to run {run_id}" in second_master
    assert mlrun.info.status == "FINISHED" and mlrun.info.run_name == summary["job_name"]
    params = mlrun.data.params
    assert params["epochs"] == "3" and params["workers"] == "2"
    assert params["batch_size"] == "32" and params["data"] == str(digits_data)

    # Evaluations in epoch order, each measuring a model no older than the one before.
    evaluations = summary["evaluations"]
    assert [e["epoch"] for e in evaluations] == [1, 2, 3]
    versions = [e["model_version"] for e in evaluations]
    assert all(
        a["model_version"] <= b["min_model_version"] for a, b in itertools.pairwise(evaluations)
    )
    # The histories, at the model versions of summary.json.
    for name in ("loss", "accuracy"):
        assert_history(
            client,
            run_id,
            f"eval/{name}",
            [(v, e["metrics"][name]) for v, e in zip(versions, evaluations, strict=True)],
        )
    windows = summary["train_loss"]
    assert_history(
        client, run_id, "train/loss", [(w["max_model_version"], w["loss"]) for w in windows]
    )
    assert [s for s, _ in history(client, run_id, "train/accuracy")] == [
        w["max_model_version"] for w in windows
    ]
    metrics = mlrun.data.metrics
    for name, value in summary["metrics"].items():
        assert metrics[f"final/{name}"] == pytest.approx(value)
    for reason, count in summary["restarts_by_reason"].items():
        assert metrics[f"restarts/{reason}"] == count
    assert max(v for _, v in history(client, run_id, "job/live_workers")) == 2

    # The artifacts, and a model that loads and predicts as the job's own.
    names = {a.path for a in client.list_artifacts(run_id)}
    assert {"summary.json", "report.html", "model"} <= names
    fetched = Path(client.download_artifacts(run_id, "", str(tmp_path / "artifacts")))
    assert json.loads((fetched / "summary.json").read_text()) == summary
    assert "elastic-step training" in (fetched / "report.html").read_text()
    assert (fetched / "model" / "saved_model" / "saved_model.pb").is_file()
    import keras

    import elastic_step.model.serving  # noqa: F401 - registers the raw-input layer for load_model

    with open(digits_data.parent / "digits.csv", newline="") as f:
        rows = list(itertools.islice(csv.DictReader(f), 200))
    schema = json.loads((run.output / "schema.json").read_text())
    features = {
        c["input_name"]: np.array([float(r[c["name"]]) for r in rows], dtype=np.float32)
        for c in schema["columns"]
    }
    logged = keras.models.load_model(fetched / "model" / "model.keras")
    own = keras.models.load_model(run.output / "model.keras")
    outputs = np.asarray(logged.predict(features, verbose=0))
    assert np.allclose(outputs, np.asarray(own.predict(features, verbose=0)), atol=1e-5)
    accuracy = np.mean(
        [
            schema["label_vocabulary"][j] == r["digit"]
            for j, r in zip(outputs.argmax(1), rows, strict=True)
        ]
    )
    assert accuracy > 0.8


def test_a_server_stopped_mid_run_costs_warnings_only(train_run, tmp_path) -> None:
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        run = train_run(
            "--epochs", "3", "--workers", "2",
            "--mlflow-tracking-uri", server.uri, "--mlflow-experiment", "outage",
        )  # fmt: skip
        run.start()
        with run.held(mid_epoch):
            wait_for_line(run, "MLflow: logging to run")  # the run and its params are in
            server.stop()
        assert run.wait() == 0, run.log()[-3000:]
    finally:
        server.stop()
    log = run.log()
    assert records_exact(run.summary())
    assert "the job goes on, and" in log and "points wait for the server" in log, log[-3000:]
    assert "gave up on the run's last metrics, artifacts and end" in log, log[-3000:]
    assert (run.output / "report.html").is_file()
    # Back up on the same store: what was sent before the outage is there.
    server.start()
    try:
        mlrun = job_run(server.client(), "outage", run.summary()["job_name"])
        assert mlrun.data.params["epochs"] == "3"
        assert mlrun.info.status == "RUNNING"  # its end was never sent
    finally:
        server.stop()
