"""bench/goodput.py's kill schedule: each set's faulty runs are killed midway through the
training of its undisturbed run, and a set whose faulty run took no kill gets no verdict.
tests/e2e/test_fault_tolerance.py checks that the master logs the line it times them by."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import goodput


def clean_run(trained_s: float | None) -> dict:
    marks = {"master_ready_s": 3.0} | ({} if trained_s is None else {"trained_s": trained_s})
    return {"milestones": marks, "master_log": "/runs/clean-1.master.log"}


def test_kills_come_every_half_of_the_undisturbed_runs_training_unless_given() -> None:
    auto = goodput.parse_args([])
    assert auto.kill_every == 0
    assert goodput.kill_period_s(auto, clean_run(19.3)) == 9.7
    given = goodput.parse_args(["--kill-every", "20"])
    assert goodput.kill_period_s(given, clean_run(19.3)) == 20


def test_an_undisturbed_run_without_the_trained_line_stops_the_bench_naming_it() -> None:
    with pytest.raises(SystemExit, match=r"clean-1\.master\.log\) has no .epochs trained"):
        goodput.kill_period_s(goodput.parse_args([]), clean_run(None))


def test_a_negative_kill_period_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        goodput.parse_args(["--kill-every", "-1"])
    assert exit_info.value.code == 2
    assert "--kill-every must be >= 0" in capsys.readouterr().err
