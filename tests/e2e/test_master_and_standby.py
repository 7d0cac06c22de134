"""A standby takes a killed worker's slot; a master killed with kill -9 and run again adopts
the live workers and PS; SIGTERM to the master removes every process. (Split from
test_fault_tolerance.py so that `make test` can run the two files side by side.)"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conftest import TrainRun, kill_a_running_worker, mid_epoch, pid_alive

from elastic_step.worker.worker import STANDBY_NICENESS

pytestmark = pytest.mark.e2e

EPOCHS = ["--epochs", "4"]  # as digits_run, the reference


@contextmanager
def _held_members(run: TrainRun) -> Iterator[dict[str, int]]:
    """The run held mid-epoch (TrainRun.held): yields the pids of its 2 workers and 1 PS."""
    with run.held(mid_epoch) as status:
        members = run.member_pids(status)
        assert len(members) == 3
        yield members


def test_a_standby_takes_a_killed_workers_slot_and_is_cleaned_up(train_run):
    run = train_run(*EPOCHS, "--standby", "1").start()
    standby_log = run.output / "backend" / "logs" / "standby-0.log"

    def standby_ready(status: dict) -> bool:
        return mid_epoch(status) and "waiting for a slot" in (
            standby_log.read_text() if standby_log.exists() else ""
        )

    with run.held(standby_ready) as status:
        assert [m["id"] for m in status["standby"]] == ["standby-0"]
        # It waits at a lower CPU priority than the workers, so as not to slow them.
        [standby] = status["standby"]
        assert os.getpriority(os.PRIO_PROCESS, standby["pid"]) == STANDBY_NICENESS
        assert {os.getpriority(os.PRIO_PROCESS, m["pid"]) for m in status["workers"]} == {0}
        kill_a_running_worker(status)
    summary = run.exact_summary()
    assert summary["standby"] == {"slots": 1, "promoted": 1}
    assert summary["restarts"]["worker"] == 1
    assert summary["metrics"]["accuracy"] > 0.85
    log = run.log()
    assert "standby-0 is ready to take the next worker slot that frees up" in log
    assert "standby-0 takes worker slot" in log
    assert "launched standby-1 (standby slot 0)" in log
    standby_text = standby_log.read_text()
    assert "built its input pipelines and compiled its training and evaluation windows" in (
        standby_text
    )
    assert "given a worker slot after" in standby_text
    if os.geteuid() == 0:  # raising the priority back needs CAP_SYS_NICE
        assert "keeps niceness" not in standby_text
    final = run.status()
    members = final["workers"] + final["ps"] + final["standby"]
    assert {m["id"] for m in final["standby"]} == {"standby-1"}
    assert not [m for m in members if m["pid"] and pid_alive(m["pid"])]


def test_master_killed_and_rerun_adopts_workers(train_run):
    run = train_run(*EPOCHS).start()
    with _held_members(run) as members:
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
    time.sleep(1)
    assert all(pid_alive(pid) for pid in members.values()), "workers and PS outlive the master"

    rerun = train_run(*EPOCHS, output=run.output).start()
    summary = rerun.exact_summary()
    assert summary["restarts"] == {"worker": 0, "ps": 0, "master": 1}
    after = {m["id"]: m["pid"] for m in rerun.status()["workers"] + rerun.status()["ps"]}
    assert after == members, "the same processes finished the job: adopted, not restarted"
    assert "adopted ps-0, worker-0, worker-1" in rerun.log()


def test_sigterm_to_master_removes_every_process(train_run):
    run = train_run(*EPOCHS).start()
    with _held_members(run) as members:
        run.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    code = run.proc.wait(timeout=30)
    deadline = sent + 10
    while time.monotonic() < deadline and any(pid_alive(p) for p in members.values()):
        time.sleep(0.1)
    alive = {name: pid for name, pid in members.items() if pid_alive(pid)}
    assert not alive, f"still running 10 s after SIGTERM: {alive}"
    assert code != 0
    assert run.status()["phase"] == "interrupted"
