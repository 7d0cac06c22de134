"""--auto-workers on real jobs: the master sizes its own job from its examples/s.

The jobs read through a source that serves two readers at a time, as a database with two
connections would: a training batch takes one of two file locks and holds it while the
source "reads" (a sleep per record). Past two workers, an added worker only waits for a
lock, so the job's examples/s stops rising there, whatever the machine's speed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TrainRun

pytestmark = pytest.mark.e2e

GROW_AFTER_S = 4  # the measuring window
SECONDS_PER_RECORD = 0.004  # 250 records/s per reader

TWO_READER_SOURCE = '''
import fcntl, os, time
import tensorflow as tf
from elastic_step.data.feed import default_feed
from elastic_step.examples.digits import loss, metrics, model, optimizer  # noqa: F401

LOCKS = [os.path.join({lock_dir!r}, f"reader-{{i}}.lock") for i in range(2)]


def _read(records):
    """Holds one of the two readers for as long as the batch takes to read."""
    while True:
        for path in LOCKS:
            fd = os.open(path, os.O_CREAT | os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                time.sleep(len(records.numpy()) * {seconds_per_record})
                return records
            finally:
                os.close(fd)
        time.sleep(0.002)


def _through_the_source(records):
    read = tf.py_function(_read, [records], tf.string)
    read.set_shape(records.shape)
    return read


def feed(dataset, mode, schema):
    if mode == "train":
        dataset = dataset.map(_through_the_source)
    return default_feed(dataset, mode, schema)
'''


def two_reader_model(tmp_path: Path) -> str:
    path = tmp_path / "two_readers.py"
    path.write_text(
        TWO_READER_SOURCE.format(lock_dir=str(tmp_path), seconds_per_record=SECONDS_PER_RECORD)
    )
    return str(path)


def _run_two_reader_job(
    tmp_path: Path, data: Path, *flags: str, timeout: float
) -> tuple[TrainRun, dict]:
    """A job on the two-reader source, run to its end within ``timeout`` seconds: the run, and
    its summary (every epoch's records trained exactly)."""
    run = TrainRun(data, tmp_path / "run", *flags, model_def=two_reader_model(tmp_path)).start()
    try:
        return run, run.exact_summary(timeout)
    finally:
        run.kill_all()


def test_a_job_whose_source_serves_two_readers_settles_at_two_or_three(tmp_path, digits_data):
    run, summary = _run_two_reader_job(
        tmp_path, digits_data,
        "--epochs", "14", "--records-per-task", "128", "--workers", "1", "--max-workers", "4",
        "--auto-workers", "--grow-after", str(GROW_AFTER_S),
        timeout=400,
    )  # fmt: skip
    sizing = summary["worker_sizing"]
    assert sizing["policy"] == "throughput"
    decisions = sizing["decisions"]
    # 1 -> 2 pays in full; the third worker is given back, or kept if it measured as paying.
    assert decisions[0]["action"] == "grow" and decisions[0]["workers_to"] == 2, decisions
    assert decisions[1]["action"] == "grow" and decisions[1]["workers_to"] == 3, decisions
    assert decisions[1]["gain"] >= 0.5, decisions
    assert decisions[-1]["action"] in ("shrink", "settle"), decisions
    assert sizing["wanted"] == decisions[-1]["workers_to"] in (2, 3)
    assert all(d["workers_to"] <= 3 for d in decisions), "never a fourth worker"
    for decision in decisions:
        assert decision["reason"] and decision["examples_per_s"] > 0, decision
        line = f"{decision['workers_from']} -> {decision['workers_to']} workers: "
        assert line + decision["reason"] in run.log()
    if decisions[-1]["action"] == "shrink":
        back = decisions[-1]
        assert back["gain"] < 0.5 and "giving it back and settling at 2" in back["reason"]
        # The worker given back finished its task and exited 0: no restart, nothing lost.
        assert summary["restarts"]["worker"] == 0
        assert "its slot was given back; it finishes here" in run.log()
    # It stays there: the live workers never exceed 3, and end at what it settled on.
    live = [n for _, n in summary["workers_timeline"]]
    assert max(live) == 3


def test_a_worker_left_pending_is_given_back_and_not_asked_for_at_once(tmp_path, digits_data):
    # Two local slots: the PS and one worker fill them, so a second worker waits.
    run, summary = _run_two_reader_job(
        tmp_path, digits_data,
        "--epochs", "5", "--records-per-task", "128", "--workers", "1", "--max-workers", "3",
        "--auto-workers", "--grow-after", "2", "--local-slots", "2",
        timeout=300,
    )  # fmt: skip
    decisions = summary["worker_sizing"]["decisions"]
    grow, back, *later = decisions
    assert (grow["action"], grow["workers_to"]) == ("grow", 2), decisions
    assert (back["action"], back["workers_to"]) == ("shrink", 1), decisions
    assert "waiting for a free local slot (all 2 of --local-slots in use)" in back["reason"]
    assert back["at_s"] - grow["at_s"] >= 3 * 2 - 0.01  # pending for three windows
    assert "asking again in 12 s at the earliest" in back["reason"]
    # It stopped asking: the next ask, if the job lasted that long, came after the backoff.
    asks = [d for d in later if d["action"] == "grow"]
    assert all(d["at_s"] >= back["at_s"] + 12 for d in asks), decisions
    # The waiting worker never ran, and its deletion is no restart.
    assert summary["restarts"]["worker"] == 0
    assert max(n for _, n in summary["workers_timeline"]) == 1
    assert "worker-1 is pending: waiting for a free local slot" in run.log()
