"""bench/goodput.py's kill schedule: a faulty run's kills come at points of its training (a
fraction of its epochs), not at times, so a job that gets faster still takes them.
tests/e2e/test_fault_tolerance.py checks that the master logs the line the bench stops its
kills at."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import goodput


def status(epoch: int, fraction: float, epochs: int = 80) -> dict:
    """The fields of a training job's status.json that the bench reads (reports.py)."""
    return {"epoch": epoch, "epochs": epochs, "progress": {"fraction": fraction}}


def test_progress_counts_the_epochs_trained_and_the_current_ones_fraction() -> None:
    assert goodput.job_progress(status(1, 0.0)) == 0.0
    assert goodput.job_progress(status(41, 0.0)) == 0.5
    assert goodput.job_progress(status(40, 0.5, epochs=160)) == pytest.approx(39.5 / 160)
    assert goodput.job_progress(status(80, 1.0)) == 1.0
    assert goodput.job_progress({"phase": "starting"}) == 0.0  # before the first write


def test_one_kill_halfway_by_default_and_points_of_the_users_choice() -> None:
    assert goodput.parse_args([]).kill_at == [0.5]
    assert goodput.parse_args(["--kill-at", "0.7,0.3"]).kill_at == [0.3, 0.7]


@pytest.mark.parametrize("points", ["0", "1", "0.5,1.2", "half", ""])
def test_a_kill_point_outside_the_training_is_refused(points: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        goodput.parse_args(["--kill-at", points])
    assert exit_info.value.code == 2
    assert "--kill-at" in capsys.readouterr().err
