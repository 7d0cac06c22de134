"""The engine on a shared cluster's terms: poisoned tasks end the job, stops resume, and
resumed jobs report the final model. Chaos, a changed definition and a full disk:
test_hostile_conditions.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_runs import TWO_COLUMN_MODEL, classifier_definition, evaluate, run_cli
from conftest import TrainRun, mid_epoch, pid_alive, records_exact

pytestmark = pytest.mark.e2e

# A model over two numeric columns whose feed SIGKILLs the worker that reads the row with
# a == 999, as a segfault in a custom op or an OOM kill would. The master's own check of
# the definition runs the feed too, but only workers die (they have ELASTIC_STEP_INSTANCE).
POISONED_MODEL = classifier_definition(
    TWO_COLUMN_MODEL,
    optimizer="keras.optimizers.SGD(0.1)",
    preamble="""
import os, signal
import numpy as np
import tensorflow as tf
from elastic_step.data.feed import default_feed

def _die_on_poison(records):
    parsed = tf.io.parse_example(records, {"a": tf.io.FixedLenFeature([], tf.float32)})
    def check(a):
        if np.any(a.numpy() == 999.0) and os.environ.get("ELASTIC_STEP_INSTANCE"):
            os.kill(os.getpid(), signal.SIGKILL)
        return 0
    tf.py_function(check, [parsed["a"]], tf.int32)
    return records

def feed(dataset, mode, schema):
    return default_feed(dataset.map(_die_on_poison), mode, schema)
""",
)


def test_a_record_that_kills_every_worker_reading_it_fails_the_job(tmp_path: Path):
    csv = tmp_path / "poisoned.csv"
    rows = [f"{i % 7},{(i * 3) % 5},{i % 2}" for i in range(300)]
    rows[150] = "999,1,0"
    csv.write_text("a,b,label\n" + "\n".join(rows) + "\n")
    data = tmp_path / "data"
    prepared = run_cli(
        "preprocess", "--input", str(csv), "--label", "label", "--output", str(data),
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr
    model_def = tmp_path / "poisoned_model.py"
    model_def.write_text(POISONED_MODEL)

    output = tmp_path / "run"
    started = time.monotonic()
    result = run_cli(
        "train", "--model-def", str(model_def), "--data", str(data), "--output", str(output),
        "--epochs", "2", "--batch-size", "16", "--records-per-task", "40",
        "--workers", "2", "--max-task-retries", "2", "--max-restarts", "10",
        timeout=240,
    )  # fmt: skip
    elapsed = time.monotonic() - started

    assert result.returncode == 1, result.stderr[-3000:]
    [error] = [line for line in result.stderr.splitlines() if line.startswith("elastic-step:")]
    assert "failed 3 times, more than --max-task-retries=2" in error
    # The poisoned row may have gone to either split: its task is named either way (a
    # training task of this small split by its positions in the epoch's permutation).
    named = r"(train|evaluate) task \d+ \((\S+ records|positions) \d+-\d+( of the .*)?\)"
    assert re.search(named, error), error
    assert error.count("killed by SIGKILL") == 3, error
    summary = json.loads((output / "summary.json").read_text())
    assert summary["phase"] == "failed"
    # No endless relaunching: the record is in one task per epoch (or per evaluation round,
    # and two can be open at once), and each such task kills at most 3 workers.
    assert summary["restarts_by_reason"].get("crashed", 0) <= 2 * 3
    assert elapsed < 200
    status = json.loads((output / "status.json").read_text())
    assert all(not pid_alive(m["pid"]) for m in status["workers"] + status["ps"] if m["pid"])


def test_sigterm_while_workers_ask_for_tasks_then_resume(train_run):
    run = train_run("--epochs", "3").start()
    with run.held(mid_epoch) as status:
        first = run.member_pids(status)
        run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(timeout=30) == 128 + signal.SIGTERM
    stopped = run.status()
    assert stopped["phase"] == "interrupted"
    # A stop is never taken for the end of the work: no instance is recorded as succeeded.
    states = {m["id"]: m["state"] for m in stopped["workers"] + stopped["ps"]}
    assert "succeeded" not in states.values(), states
    assert not any(pid_alive(pid) for pid in first.values())

    resumed = train_run("--epochs", "3", output=run.output).start()
    assert resumed.wait() == 0, resumed.log()[-3000:]
    summary = resumed.summary()
    assert records_exact(summary), summary["epochs"]
    final = resumed.status()
    # Every slot was relaunched: one new PS and two new workers finished the job.
    succeeded = sorted(m["id"] for m in final["workers"] + final["ps"] if m["state"] == "succeeded")
    assert len(succeeded) == 3 and not set(succeeded) & set(first), succeeded
    assert summary["restarts"]["master"] == 1


def test_resumed_job_requeues_lost_tasks_at_once_and_reports_the_final_model(
    train_run, digits_data, tmp_path
):
    # A long --task-timeout: a lease left to run out would hold the job for 10 minutes.
    # 8 epochs: at 4 the run could end before the test saw epoch 2 under way.
    args = ("--epochs", "8", "--evaluation-steps", "15", "--task-timeout", "600")
    run = train_run(*args).start()
    with run.held(lambda s: mid_epoch(s) and s["epoch"] >= 2) as status:
        workers = {m["id"]: m["pid"] for m in status["workers"] if m["state"] == "running"}
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
        for pid in workers.values():  # the workers die while no master watches, tasks in hand
            os.killpg(pid, signal.SIGKILL)

    resumed = train_run(*args, output=run.output).start()
    started = time.monotonic()
    assert resumed.wait(timeout=240) == 0, resumed.log()[-3000:]
    assert time.monotonic() - started < 200
    log = resumed.log()
    assert "made no progress" not in log
    assert "re-queued" in log
    summary = resumed.summary()
    assert records_exact(summary)

    # Evaluations are listed in epoch order, each with the model version it measured.
    evaluations = summary["evaluations"]
    assert [(e["epoch"], e["round"]) for e in evaluations] == sorted(
        (e["epoch"], e["round"]) for e in evaluations
    )
    assert evaluations[-1]["trigger"] == "epoch-end" and evaluations[-1]["epoch"] == 8
    assert all(e["min_model_version"] <= e["model_version"] for e in evaluations)

    # The final metrics are the final model's: evaluate on the saved model agrees.
    evaluation = evaluate(resumed.output, digits_data, tmp_path / "metrics.json")
    assert evaluation["metrics"]["accuracy"] == pytest.approx(
        summary["metrics"]["accuracy"], abs=1e-6
    )
    assert evaluation["loss"] == pytest.approx(summary["metrics"]["loss"], rel=1e-4)

    # A finished job run again with other settings is refused, naming what differs.
    other = TrainRun(digits_data, resumed.output, "--epochs", "5")
    result = subprocess.run(other.argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("elastic-step: error")]
    assert "finished job with other settings (--epochs differ)" in line
