"""The job survives kill -9 of a worker and of the PS, and of a worker saving the model;
losing the PS with every worker before a checkpoint fails it at once. The standby and the
master: test_master_and_standby.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import evaluate
from conftest import TrainRun, kill_a_running_worker, mid_epoch, records_exact

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import goodput

pytestmark = pytest.mark.e2e

EPOCHS = ["--epochs", "4"]  # as digits_run, the reference


def test_undisturbed_run_outputs(digits_run, digits_data, tmp_path):
    summary = digits_run.summary()
    assert records_exact(summary)
    assert [e["epoch"] for e in summary["epochs"]] == [1, 2, 3, 4]
    assert summary["restarts"] == {"worker": 0, "ps": 0, "master": 0}
    assert summary["metrics"]["accuracy"] > 0.85
    assert summary["examples_per_second"] > 0
    assert summary["workers_timeline"][0] == [0.0, 0]
    assert max(live for _, live in summary["workers_timeline"]) == 2
    assert (digits_run.output / "model.keras").is_file()
    assert (digits_run.output / "saved_model" / "saved_model.pb").is_file()
    # bench/goodput.py stops its kills at this line of the master's.
    assert goodput.TRAINED_LINE in digits_run.log()
    status = digits_run.status()
    assert status["phase"] == "succeeded"
    assert {m["state"] for m in status["workers"] + status["ps"]} == {"succeeded"}

    metrics = evaluate(digits_run.output, digits_data, tmp_path / "metrics.json")
    assert metrics["records"] == 359
    # The saved model is the trained one: evaluate agrees with the master's last evaluation.
    assert metrics["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-6)
    matrix = metrics["confusion_matrix"]["matrix"]
    assert len(matrix) == 10 and sum(map(sum, matrix)) == 359
    assert sum(matrix[i][i] for i in range(10)) / 359 == pytest.approx(
        metrics["metrics"]["accuracy"], abs=1e-6
    )

    printed = subprocess.run(
        [sys.executable, "-m", "elastic_step", "status", str(digits_run.output)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert printed.returncode == 0 and "phase:   succeeded" in printed.stdout

    # A pipeline retry of a finished step: nothing is trained again, nothing changes.
    model_bytes = (digits_run.output / "model.keras").read_bytes()
    again = subprocess.run(digits_run.argv, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "has already finished; nothing to do" in again.stderr
    assert (digits_run.output / "model.keras").read_bytes() == model_bytes


def test_worker_killed_mid_epoch(train_run, digits_run):
    run = train_run(*EPOCHS).start()
    with run.held(mid_epoch) as status:
        victim = kill_a_running_worker(status)
    summary = run.exact_summary()
    assert summary["restarts"]["worker"] >= 1
    # The timeline shows the loss of a worker and its replacement.
    live = [n for _, n in summary["workers_timeline"]]
    assert 1 in live[live.index(2) :]
    accuracy = summary["metrics"]["accuracy"]
    reference = digits_run.summary()["metrics"]["accuracy"]
    # The replacement's optimizer starts fresh (docs/guides/training.md, local steps): a kill
    # late in these 4 epochs cost 2.5 points (9 of the 360 validation digits) in one CI run.
    assert abs(accuracy - reference) <= 0.03, (accuracy, reference)
    assert f"{victim['id']} crashed (killed by SIGKILL); replacing it" in run.log()


def test_only_ps_killed(train_run):
    run = train_run(*EPOCHS, "--checkpoint-steps", "10").start()
    # A checkpoint is written in the background: wait for one to be complete (renamed into
    # place), not for a model version past it, which a loaded machine reaches first.
    written = run.output / "checkpoints" / "ps-0-of-1"

    def checkpointed(status: dict) -> bool:
        return mid_epoch(status) and any(written.glob("version-*.npz"))

    with run.held(checkpointed) as status:
        os.kill(status["ps"][0]["pid"], signal.SIGKILL)
    summary = run.exact_summary()
    assert summary["restarts"]["ps"] == 1
    assert summary["metrics"]["accuracy"] > 0.85
    relaunched = (run.output / "backend" / "logs" / "ps-0-1.log").read_text()
    assert "restored shard 0 from checkpoint version" in relaunched


def test_ps_and_every_worker_lost_before_a_checkpoint_fail_the_job_at_once(train_run):
    # Without this rule the fresh workers wait for a refill of the empty shard that cannot
    # come, --master-timeout per attempt: the job would run past this test's wait.
    run = train_run(*EPOCHS, "--checkpoint-steps", "100000", "--master-timeout", "200").start()
    with run.held(mid_epoch) as status:
        version = status["model_version"]
        for pid in run.member_pids(status).values():
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
    assert run.wait(timeout=200) == 1, run.log()[-3000:]
    took = time.monotonic() - killed
    assert took < 200
    lines = [line for line in run.log().splitlines() if "the job failed" in line]
    assert len(lines) == 1, run.log()[-3000:]
    assert "PS shard 0 was lost at model v" in lines[0]
    assert "no live worker holds a copy of the model" in lines[0]
    status = run.status()
    assert (
        status["phase"] == "failed" and int(lines[0].split(" at model v")[1].split()[0]) >= version
    )
    print(f"failed {took:.1f} s after the kill")


#: The digits model behind a layer whose get_config, which Keras calls as it writes
#: model.keras, kills its worker on the first save and raises on the second.
FLAKY_SAVE_MODEL = """
import os
import signal

import keras

from elastic_step.examples.digits import PIXELS, loss, metrics, optimizer  # noqa: F401

TRIES = {tries!r}


@keras.saving.register_keras_serializable("flaky_save")
class Passing(keras.layers.Layer):
    def call(self, x):
        return x

    def get_config(self):
        tries = len(os.listdir(TRIES))
        open(os.path.join(TRIES, f"try-{{tries}}"), "w").close()
        if tries == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        if tries == 1:
            raise RuntimeError("the second save fails")
        return super().get_config()


def model():
    inputs = {{name: keras.Input(shape=(), name=name) for name in PIXELS}}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in PIXELS])
    x = Passing()(keras.layers.Dense(64, activation="relu")(x))
    return keras.Model(inputs, keras.layers.Dense(10)(x))
"""


def test_model_save_runs_on_a_worker_and_survives_its_death_and_an_error(digits_data, tmp_path):
    """The job's last task, the model save, runs on a worker: a worker killed while saving
    and one whose save raises each count as a failure of the save, which goes to the next
    worker; the third save writes a model that evaluates as the job's last round did."""
    tries = tmp_path / "tries"
    tries.mkdir()
    model_def = tmp_path / "flaky_save.py"
    model_def.write_text(FLAKY_SAVE_MODEL.format(tries=str(tries)))
    run = TrainRun(digits_data, tmp_path / "run", "--epochs", "1", model_def=str(model_def))
    try:
        summary = run.start().exact_summary()
    finally:
        run.kill_all()
    log = run.log()
    assert "a worker saves the model" in log
    assert "failed to save the model (failure 1)" in log, log[-3000:]
    assert "while it saved the model" in log  # the first: its worker died
    assert "(failure 2): saving the model failed: RuntimeError: the second save fails" in log
    assert log.count("saved the model") >= 1 and summary["phase"] == "succeeded"
    assert summary["restarts"]["worker"] == 1
    assert len(list(tries.iterdir())) >= 3

    evaluated = evaluate(run.output, digits_data, tmp_path / "metrics.json")["metrics"]
    assert evaluated["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-6)


def test_evaluate_reads_shards_in_slices_with_the_same_result(
    digits_run, digits_data, tmp_path, monkeypatch
):
    """evaluate reads a shard a slice at a time (bounded memory): slices of 32 records, several
    per shard, give what one slice per shard gives."""
    from elastic_step import evaluate as evaluate_module

    def run(name: str) -> dict:
        return evaluate_module.evaluate(
            model_dir=str(digits_run.output), data_dir=str(digits_data), split="validation",
            metrics_output=str(tmp_path / name), batch_size=16,
        )  # fmt: skip

    whole = run("whole.json")
    monkeypatch.setattr(evaluate_module, "SLICE_RECORDS", 40)  # 32 records a slice
    sliced = run("sliced.json")
    assert sliced["records"] == whole["records"] == 359
    assert sliced["confusion_matrix"] == whole["confusion_matrix"]
    assert sliced["metrics"] == pytest.approx(whole["metrics"], abs=1e-6)
    assert sliced["loss"] == pytest.approx(whole["loss"], rel=1e-5)
