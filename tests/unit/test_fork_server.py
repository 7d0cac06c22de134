"""The local backend's fork server, with real processes: workers and PS are forked from one
process that imported TensorFlow, yet each is an instance of its own (session, environment,
name, log, exit status); when the server goes, its instances are watched like adopted ones
and new launches start as new processes."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

from elastic_step.backends.api import EventKind, ExitReason, LaunchSpec, Role
from elastic_step.backends.fork_server import forkable
from elastic_step.backends.local import process_start_time
from elastic_step.master.instances.job_keys import JobKeys
from elastic_step.master.instances.launch import INSTANCE_PRELOAD
from elastic_step.rpc import auth
from tests.unit import test_local_backend
from tests.unit.test_local_backend import SLEEP, Processes, wait_for, wait_for_text

procs = test_local_backend.procs  # the fixture: every process a test started ends with it

# The fork server imports TensorFlow before it answers: seconds on a loaded machine.
LOAD_S = 120.0


def elastic_step(*args: str) -> list[str]:
    return [sys.executable, "-m", "elastic_step", *args]


def closed_port() -> int:
    """A loopback port nobody listens on: a PS there retries its Register for minutes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ps_spec(name: str = "ps-0") -> LaunchSpec:
    """A PS whose master never answers: it runs until it is killed."""
    args = ("ps", "--master", f"127.0.0.1:{closed_port()}", "--shard", "0", "--name", name)
    secret = JobKeys("s" * 32, "job-1", tls=False).instance_env(name)
    return LaunchSpec(
        name, Role.PS, 0, elastic_step(*args), secret_env=secret, preload=INSTANCE_PRELOAD
    )


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def environment(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with (what the fork server had: a forked instance sets
    its own in memory, which /proc does not show)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
    return {k.decode(): v.decode() for k, v in pairs}


def started(backend, procs: Processes, name: str) -> int:
    pid = wait_for(backend, name, EventKind.STARTED, timeout_s=LOAD_S).pid
    assert pid is not None
    procs.track(pid)
    return pid


def test_only_this_interpreters_python_m_commands_with_modules_to_preload_are_forked() -> None:
    worker = elastic_step("worker", "--master", "m:1", "--name", "worker-0")
    assert forkable(worker, INSTANCE_PRELOAD)
    assert forkable([sys.executable, "-m", "elastic_step"], ("tensorflow",))
    assert not forkable(worker, ())  # nothing to share
    assert not forkable([sys.executable, "-c", "pass"], INSTANCE_PRELOAD)
    assert not forkable(["/other/python", "-m", "elastic_step", "worker"], INSTANCE_PRELOAD)


def test_a_forked_instance_is_an_instance_of_its_own(tmp_path: Path, procs: Processes) -> None:
    backend = procs.backend(tmp_path)
    backend.launch(ps_spec())
    pid = started(backend, procs, "ps-0")
    server = parent_pid(pid)

    assert server != os.getpid()  # forked by the server, not started by this process
    assert os.getsid(pid) == pid  # leads its own session: a dead master leaves it running
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "ps-0"
    # Its credentials reached it (without them it exits at once), and only it holds them.
    wait_for_text(tmp_path / "logs" / "ps-0.log", "unreachable (UNAVAILABLE); retrying")
    assert auth.TOKEN_ENV not in environment(server)

    os.kill(pid, signal.SIGKILL)
    event = wait_for(backend, "ps-0", EventKind.EXITED)
    assert (event.reason, event.exit_code, event.pid) == (ExitReason.CRASHED, -9, pid)
    assert "SIGKILL" in event.message

    # Another one is forked by the same server, and its output goes to its own log.
    backend.launch(
        LaunchSpec(
            "ps-1",
            Role.PS,
            1,
            elastic_step("ps", "--master", "m:1", "--shard", "1", "--name", "ps-1"),
            preload=INSTANCE_PRELOAD,
        )
    )
    pid = started(backend, procs, "ps-1")
    assert parent_pid(pid) == server
    event = wait_for(backend, "ps-1", EventKind.EXITED, timeout_s=30)
    assert (event.reason, event.exit_code) == (ExitReason.CRASHED, 1)  # no credentials
    wait_for_text(tmp_path / "logs" / "ps-1.log", "ps-1: ")
    text = (tmp_path / "logs" / "ps-1.log").read_text()
    assert "exiting" in text and "oneDNN" not in text and "ps-0" not in text

    # Other commands, or other modules to preload, start as new processes of this one.
    other = LaunchSpec("ps-2", Role.PS, 2, elastic_step("ps"), preload=("tensorflow",))
    for spec in (other, LaunchSpec("worker-9", Role.WORKER, 0, [sys.executable, "-c", SLEEP])):
        backend.launch(spec)
        assert parent_pid(started(backend, procs, spec.name)) == os.getpid()


def test_when_the_server_goes_its_instances_are_watched_and_new_ones_start_as_processes(
    tmp_path: Path, procs: Processes
) -> None:
    backend = procs.backend(tmp_path)
    backend.launch(ps_spec("ps-0"))
    pid = started(backend, procs, "ps-0")
    os.kill(parent_pid(pid), signal.SIGKILL)  # the fork server

    backend.launch(ps_spec("ps-1"))
    other = started(backend, procs, "ps-1")
    assert parent_pid(other) == os.getpid()  # a new process of this one
    assert process_start_time(pid) is not None  # the forked one runs on

    os.kill(pid, signal.SIGKILL)
    event = wait_for(backend, "ps-0", EventKind.EXITED)
    assert event.reason is ExitReason.LOST  # its exit status went with the server
    assert event.message == "exited (status unknown: not our child)"
    os.kill(other, signal.SIGKILL)
    event = wait_for(backend, "ps-1", EventKind.EXITED)
    assert (event.reason, event.exit_code) == (ExitReason.CRASHED, -9)


def test_a_closed_backends_forked_instances_run_on_for_the_next_to_adopt(
    tmp_path: Path, procs: Processes
) -> None:
    backend = procs.backend(tmp_path)
    backend.launch(ps_spec())
    pid = started(backend, procs, "ps-0")
    server = parent_pid(pid)
    backend.close()  # as a master that ends without deleting its instances

    assert process_start_time(server) is None  # the server has exited
    assert process_start_time(pid) is not None
    adopted = procs.backend(tmp_path).list_instances()
    assert [(i.name, i.pid) for i in adopted] == [("ps-0", pid)]


def test_a_launch_deleted_while_the_server_loads_never_starts(
    tmp_path: Path, procs: Processes
) -> None:
    backend = procs.backend(tmp_path)
    backend.launch(ps_spec("ps-0"))  # the server has just started to import TensorFlow
    backend.delete("ps-0")
    event = wait_for(backend, "ps-0", EventKind.EXITED)
    assert (event.reason, event.message) == (ExitReason.DELETED, "deleted before it started")

    backend.launch(ps_spec("ps-1"))  # the next one waits for the server, then is forked
    pid = started(backend, procs, "ps-1")
    assert parent_pid(pid) != os.getpid()
    assert backend.next_events(0.5) == [] and not (tmp_path / "logs" / "ps-0.log").exists()

    backend.delete("ps-1", grace_period_s=5.0)  # SIGTERM to its session: the PS stops
    event = wait_for(backend, "ps-1", EventKind.EXITED)
    assert (event.reason, event.pid) == (ExitReason.DELETED, pid)
    assert process_start_time(pid) is None
