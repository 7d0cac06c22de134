"""End-to-end fixtures: real `elastic-step` processes on scikit-learn's digits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elastic_step.demo import write_digits_csv
from elastic_step.examples import path_of
from elastic_step.master.job_reporter import STATUS_EVERY_S as STATUS_PERIOD_S

#: How long a held job runs between two looks at its status (see TrainRun.held).
HELD_SLICE_S = 0.15


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory) -> Path:
    """The digits preprocessed once for the whole session."""
    root = tmp_path_factory.mktemp("digits")
    write_digits_csv(str(root / "digits.csv"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "elastic_step",
            "preprocess",
            "--input",
            str(root / "digits.csv"),
            "--label",
            "digit",
            "--output",
            str(root / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return root / "data"


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory, digits_data) -> TrainRun:
    """A 4-epoch run on the digits that nobody disturbs, shared by the modules that need a
    trained model or an undisturbed reference. Treat it as read-only."""
    run = TrainRun(digits_data, tmp_path_factory.mktemp("digits-run") / "run", "--epochs", "4")
    try:
        assert run.start().wait() == 0, run.log()[-3000:]
    finally:
        run.kill_all()
    return run


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class TrainRun:
    """One `elastic-step train` process and the files it writes."""

    def __init__(
        self, data: Path, output: Path, *extra: str, model_def: str = path_of("digits")
    ) -> None:
        self.output = output
        self.argv = [
            sys.executable, "-m", "elastic_step", "train",
            "--model-def", model_def, "--data", str(data), "--output", str(output),
            "--batch-size", "32", "--records-per-task", "64", "--seed", "7",
            *extra,
        ]  # fmt: skip
        self.log_path = output.parent / f"{output.name}.master.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> TrainRun:
        log = open(self.log_path, "a")  # noqa: SIM115 - kept open while the process runs
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=15)
            pytest.fail(f"train did not finish in {timeout} s; log:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def status(self) -> dict:
        try:
            return json.loads((self.output / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def summary(self) -> dict:
        return json.loads((self.output / "summary.json").read_text())

    def exact_summary(self, timeout: float = 240) -> dict:
        """The summary of a run that exited 0 within ``timeout`` seconds having trained every
        epoch's records exactly."""
        assert self.wait(timeout) == 0, self.log()[-3000:]
        summary = self.summary()
        assert records_exact(summary), summary["epochs"]
        return summary

    def wait_for(
        self,
        what: str,
        predicate: Callable[[dict], bool],
        timeout: float = 180,
        poll_s: float = 0.2,
    ) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status and predicate(status):
                return status
            if self.proc.poll() is not None:
                pytest.fail(
                    f"train exited ({self.proc.returncode}) before {what}:\n{self.log()[-3000:]}"
                )
            time.sleep(poll_s)
        pytest.fail(f"timed out waiting for {what}; log:\n{self.log()[-3000:]}")

    @contextlib.contextmanager
    def held(self, predicate: Callable[[dict], bool], timeout: float = 180) -> Iterator[dict]:
        """The job held where ``predicate`` holds: yields the status while every worker and
        PS is stopped (SIGSTOP), and lets them go on at exit.

        A job can train all its epochs between two writes of status.json (every second), so
        waiting for a mid-epoch status races it, however slow the job was when the test was
        written. This stops each worker as soon as it is ready to ask for tasks (its log
        says so), so that one cannot train the job through while another still loads (a
        replacement compiles before it is ready); then it lets the job run in short slices,
        each followed by the status the master writes while it is stopped, until that status
        meets ``predicate``.
        """
        deadline = time.monotonic() + timeout
        stopped: set[int] = set()

        def connected(status: dict) -> bool:
            workers = [m for m in status.get("workers", []) if m["state"] == "running"]
            ready = [m for m in workers if "ready; asking for tasks" in self.instance_log(m["id"])]
            waiting = {m["pid"] for m in ready if m["pid"]} - stopped
            _signal_groups(waiting, signal.SIGSTOP)
            stopped.update(waiting)
            return bool(workers) and len(ready) == len(workers)

        try:
            status = self.wait_for("workers ready for tasks", connected, timeout, poll_s=0.02)
        except BaseException:
            _signal_groups(stopped, signal.SIGCONT)
            raise
        members = self.member_pids(status)
        while True:
            _signal_groups(members.values(), signal.SIGSTOP)
            time.sleep(STATUS_PERIOD_S + 0.5)  # the status the master writes while held
            status = self.status()
            if predicate(status) and set(self.member_pids(status)) == set(members):
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                _signal_groups(members.values(), signal.SIGCONT)
                pytest.fail(f"the job was never held where asked; log:\n{self.log()[-3000:]}")
            members = self.member_pids(status) or members
            _signal_groups(members.values(), signal.SIGCONT)
            time.sleep(HELD_SLICE_S)
        try:
            yield status
        finally:
            _signal_groups(members.values(), signal.SIGCONT)

    def instance_log(self, name: str) -> str:
        """What instance ``name`` (local backend) has logged so far."""
        path = self.output / "backend" / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def member_pids(self, status: dict | None = None) -> dict[str, int]:
        status = status or self.status()
        return {
            m["id"]: m["pid"]
            for m in status.get("workers", []) + status.get("ps", [])
            if m["state"] in ("pending", "running") and m["pid"]
        }

    def kill_all(self) -> None:
        """Test clean-up: no process of this run survives the test."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.member_pids().values():
            # Workers and PS lead their own process groups.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def train_run(tmp_path, digits_data):
    runs: list[TrainRun] = []

    def make(*extra: str, output: Path | None = None) -> TrainRun:
        run = TrainRun(digits_data, output or tmp_path / "run", *extra)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.kill_all()


def records_exact(summary: dict) -> bool:
    return all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])


def _signal_groups(pids, sig: int) -> None:
    """Workers and PS lead their own process groups; one that is gone is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)


def kill_a_running_worker(status: dict) -> dict:
    """SIGKILLs the first running worker in ``status``; its entry there."""
    victim = next(m for m in status["workers"] if m["state"] == "running")
    os.kill(victim["pid"], signal.SIGKILL)
    return victim


def mid_epoch(status: dict) -> bool:
    """Training is under way and the current epoch is partly trained (not the last epoch)."""
    progress = status.get("progress", {})
    return (
        status.get("phase") == "running"
        and status.get("model_version", 0) >= 4
        and status.get("epoch", 0) < status.get("epochs", 0)
        and 0 < progress.get("records_trained", 0) < progress.get("records_per_epoch", 0)
    )
