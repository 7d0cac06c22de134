"""The local backend, with real subprocesses: what the Backend contract (see
test_local_backend_contract.py) does not cover: pids, the ``instances.json`` record and how
adoption reads it, logs, and start errors."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from backend_contract import wait_for

from elastic_step.backends.api import (
    BackendError,
    EventKind,
    ExitReason,
    LaunchSpec,
    Role,
)
from elastic_step.backends.local import LocalBackend, LocalOptions, process_start_time

SLEEP = "import time; time.sleep(60)"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


class Processes:
    """The processes a test started; all killed at the end, whatever happened."""

    def __init__(self) -> None:
        self._started: list[tuple[int, int | None]] = []
        self.backends: list[LocalBackend] = []

    def track(self, pid: int) -> None:
        self._started.append((pid, process_start_time(pid)))

    def backend(
        self, work_dir: Path, job_name: str = "job-1", slots: int | None = None
    ) -> LocalBackend:
        backend = LocalBackend(job_name, str(work_dir), LocalOptions(slots=slots))
        self.backends.append(backend)
        return backend

    def cleanup(self) -> None:
        for backend in self.backends:
            backend.close()
        for pid, start_time in self._started:
            alive = start_time is not None and process_start_time(pid) == start_time
            if alive:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):  # reap our children
                os.waitpid(pid, 0 if alive else os.WNOHANG)


@pytest.fixture
def procs():
    processes = Processes()
    try:
        yield processes
    finally:
        processes.cleanup()


def launch(backend: LocalBackend, procs: Processes, name: str, code: str, **kw) -> int:
    """Launches ``python -c code`` as worker ``name``; returns its pid from the STARTED event."""
    role = kw.pop("role", Role.WORKER)
    index = kw.pop("index", 0)
    backend.launch(LaunchSpec(name, role, index, python(code), **kw))
    started = wait_for(backend, name, EventKind.STARTED)
    assert started.pid is not None
    procs.track(started.pid)
    return started.pid


def wait_for_text(path: Path, text: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_launch_reports_started_with_the_pid(tmp_path: Path, procs: Processes) -> None:
    backend = procs.backend(tmp_path)
    pid = launch(backend, procs, "worker-0", SLEEP)

    assert process_start_time(pid) is not None
    record = json.loads((tmp_path / "instances.json").read_text())
    assert record["job_name"] == "job-1"
    entry = record["instances"]["worker-0"]
    assert (entry["pid"], entry["role"], entry["index"]) == (pid, "worker", 0)
    assert entry["start_time"] == process_start_time(pid)


def test_exit_status_0_is_completed(tmp_path: Path, procs: Processes) -> None:
    backend = procs.backend(tmp_path)
    pid = launch(backend, procs, "worker-0", "pass")
    event = wait_for(backend, "worker-0", EventKind.EXITED)

    assert (event.reason, event.exit_code, event.pid) == (ExitReason.COMPLETED, 0, pid)
    record = json.loads((tmp_path / "instances.json").read_text())
    assert record["instances"] == {}  # an ended instance leaves the record


def test_a_signal_the_master_did_not_send_is_a_crash(tmp_path: Path, procs: Processes) -> None:
    backend = procs.backend(tmp_path)
    pid = launch(backend, procs, "ps-0", SLEEP, role=Role.PS)
    os.kill(pid, signal.SIGKILL)
    event = wait_for(backend, "ps-0", EventKind.EXITED)

    assert event.reason is ExitReason.CRASHED
    assert event.exit_code == -signal.SIGKILL
    assert "SIGKILL" in event.message


def test_delete_stops_a_process_with_sigterm(tmp_path: Path, procs: Processes) -> None:
    backend = procs.backend(tmp_path)
    launch(backend, procs, "worker-0", SLEEP)
    backend.delete("worker-0", grace_period_s=5)
    event = wait_for(backend, "worker-0", EventKind.EXITED, timeout_s=4)

    assert event.reason is ExitReason.DELETED and not event.reason.is_fault
    assert "SIGTERM" in event.message
    backend.delete("worker-0")  # gone now: a no-op
    backend.delete("no-such-instance")


def test_a_new_backend_adopts_a_live_process_and_reports_its_death(
    tmp_path: Path, procs: Processes
) -> None:
    old = procs.backend(tmp_path)
    pid = launch(old, procs, "worker-4", SLEEP, index=2)
    old.close()  # the old master is gone; its process runs on

    new = procs.backend(tmp_path)
    [info] = new.list_instances()
    assert (info.name, info.role, info.index, info.pid) == ("worker-4", Role.WORKER, 2, pid)
    assert new.next_events(0.3) == []  # still running

    os.kill(pid, signal.SIGKILL)
    event = wait_for(new, "worker-4", EventKind.EXITED)
    assert event.reason is ExitReason.LOST
    assert event.message == "exited (status unknown: not our child)"
    assert event.pid == pid


def test_the_record_adopts_only_a_pid_whose_start_time_matches(
    tmp_path: Path, procs: Processes
) -> None:
    same = subprocess.Popen(python(SLEEP), start_new_session=True)
    procs.track(same.pid)
    reused = subprocess.Popen(python(SLEEP), start_new_session=True)
    procs.track(reused.pid)
    record = {
        "job_name": "job-1",
        "instances": {
            "worker-0": {
                "pid": same.pid,
                "start_time": process_start_time(same.pid),
                "role": "worker",
                "index": 0,
            },
            # The recorded process ended and its pid now belongs to another one.
            "worker-1": {
                "pid": reused.pid,
                "start_time": process_start_time(reused.pid) - 100,
                "role": "worker",
                "index": 1,
            },
            "worker-2": {"pid": 2**22 + 7, "start_time": 1, "role": "worker", "index": 2},
        },
    }
    (tmp_path / "instances.json").write_text(json.dumps(record))

    backend = procs.backend(tmp_path)
    assert [(i.name, i.pid) for i in backend.list_instances()] == [("worker-0", same.pid)]
    saved = json.loads((tmp_path / "instances.json").read_text())
    assert list(saved["instances"]) == ["worker-0"]

    backend.delete("worker-1", grace_period_s=0)  # never adopted: the stranger is left alone
    time.sleep(0.3)
    assert reused.poll() is None


def test_output_goes_to_the_instance_log_and_env_is_passed(
    tmp_path: Path, procs: Processes
) -> None:
    backend = procs.backend(tmp_path)
    code = (
        "import os, sys\n"
        "print('value', os.environ['ES_TEST_VALUE'])\n"
        "print('name', os.environ['ELASTIC_STEP_INSTANCE'])\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    launch(backend, procs, "worker-7", code, env={"ES_TEST_VALUE": "42"})
    event = wait_for(backend, "worker-7", EventKind.EXITED)

    assert event.reason is ExitReason.COMPLETED
    assert backend.log_path("worker-7") == str(tmp_path / "logs" / "worker-7.log")
    log = (tmp_path / "logs" / "worker-7.log").read_text()
    assert "value 42" in log
    assert "name worker-7" in log
    assert "to stderr" in log


def test_a_command_that_cannot_start_is_a_backend_error(tmp_path: Path, procs: Processes) -> None:
    backend = procs.backend(tmp_path)
    spec = LaunchSpec("worker-0", Role.WORKER, 0, [str(tmp_path / "no-such-program")])
    with pytest.raises(BackendError, match=r"cannot start worker-0 .*no-such-program"):
        backend.launch(spec)
    assert backend.list_instances() == []
    assert backend.next_events(0.2) == []


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"job_name": "j"}',
        '{"instances": {"worker-0": {"pid": 1, "role": "worker", "index": 0}}}',
        '{"instances": {"worker-0": {"pid": "1", "start_time": 1, "role": "w", "index": 0}}}',
        '{"instances": {"worker-0": {"pid": 1, "start_time": 1, "role": "chef", "index": 0}}}',
        "[]",
    ],
    ids=["not json", "no instances", "a field missing", "a string pid", "a bad role", "a list"],
)
def test_a_malformed_instance_record_is_set_aside_with_one_line_and_nothing_adopted(
    procs: Processes, tmp_path: Path, content: str, caplog
) -> None:
    (tmp_path / "instances.json").write_text(content)
    with caplog.at_level("WARNING"):
        backend = procs.backend(tmp_path)
    assert backend.list_instances() == []
    (kept,) = (tmp_path / "set-aside").iterdir()
    assert kept.name.endswith("instances.json") and kept.read_text() == content
    (line,) = [r.getMessage() for r in caplog.records]
    assert "instances.json: not a record of instances" in line and str(kept) in line
    # A new record in its place, for the next master.
    assert json.loads((tmp_path / "instances.json").read_text())["instances"] == {}


def test_with_slots_a_launch_beyond_them_waits_pending_and_starts_when_one_ends(
    tmp_path: Path, procs: Processes
) -> None:
    backend = procs.backend(tmp_path, slots=2)
    launch(backend, procs, "ps-0", SLEEP, role=Role.PS)
    first = launch(backend, procs, "worker-0", SLEEP)
    backend.launch(LaunchSpec("worker-1", Role.WORKER, 1, python(SLEEP)))
    backend.launch(LaunchSpec("worker-2", Role.WORKER, 2, python(SLEEP)))
    waiting = [e for e in backend.next_events(1.0) if e.kind is EventKind.PENDING]
    assert [e.name for e in waiting] == ["worker-1", "worker-2"]
    why = "waiting for a free local slot (all 2 of --local-slots in use)"
    assert all(e.message == why for e in waiting)
    assert sorted(i.name for i in backend.list_instances()) == ["ps-0", "worker-0"]

    backend.delete("worker-2")  # never started: gone at once
    gone = wait_for(backend, "worker-2", EventKind.EXITED)
    assert (gone.reason, gone.pid) == (ExitReason.DELETED, None)
    os.kill(first, signal.SIGKILL)  # a slot frees: the oldest waiting launch takes it
    started = wait_for(backend, "worker-1", EventKind.STARTED)
    procs.track(started.pid)
    assert sorted(i.name for i in backend.list_instances()) == ["ps-0", "worker-1"]


def test_slots_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="--local-slots must be at least 1, got 0"):
        LocalOptions(slots=0)
