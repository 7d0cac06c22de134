"""The ``local`` backend: instances are subprocesses of this machine.

Each instance runs in its own session, so that a killed master leaves it running for the next
master to adopt. The backend records its instances (pid and the process's start time, which
tells a reused pid apart) in ``work_dir/instances.json``; a new master reads that record to
find the live ones. Output goes to ``work_dir/logs/NAME.log``.

A ``python -m`` command with modules to preload (``LaunchSpec.preload``: a worker's or PS's
TensorFlow and code) is forked from a fork server (``fork_server.py``) that imported them
once: the first such launch starts it, and launches wait while it loads. Should it fail or
go, instances start as new processes again, and those it forked are watched like adopted
ones. Any other command, or other modules to preload, starts as a new process.

With ``slots`` (``--local-slots``), at most that many instances run at once; a launch beyond
it waits, pending with a message that says so, and starts when one ends, the way a pod waits
for room on a cluster. Without it, every launch starts at once.
Tests: tests/unit/test_local_backend.py, tests/unit/test_local_backend_contract.py,
tests/unit/test_fork_server.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import threading
from dataclasses import dataclass

from elastic_step.backends.api import (
    Backend,
    BackendError,
    EventKind,
    ExitReason,
    InstanceEvent,
    InstanceInfo,
    LaunchSpec,
    Role,
    take_events,
)
from elastic_step.backends.fork_server import (
    ForkServer,
    ForkServerError,
    ServerState,
    describe_exit,
    forkable,
)
from elastic_step.data import storage

log = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.1


def _process_state(pid: int) -> tuple[str, int] | None:
    """The state letter of process ``pid`` and its start time in clock ticks since boot; None
    if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces; the fields after it are space-separated.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def process_start_time(pid: int) -> int | None:
    """The start time of a live process in clock ticks since boot; None if there is none."""
    state = _process_state(pid)
    return None if state is None or state[0] == "Z" else state[1]


@dataclass(frozen=True)
class LocalOptions:
    """The local backend's options."""

    #: At most this many instances run at once; None: no limit.
    slots: int | None = None

    def __post_init__(self) -> None:
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"--local-slots must be at least 1, got {self.slots}")


@dataclass
class _Instance:
    name: str
    role: Role
    index: int
    pid: int
    start_time: int
    #: How to learn its exit status: None for an instance adopted from an earlier master, or
    #: forked by a fork server that has gone since.
    process: subprocess.Popen | _Forked | None
    deleting: bool = False


@dataclass
class _Forked:
    """An instance the fork server started: the server tells how it ended."""

    server: ForkServer
    pid: int

    def poll(self) -> int | None:
        return self.server.exit_code(self.pid)


class LocalBackend(Backend):
    def __init__(self, job_name: str, work_dir: str, options: LocalOptions | None = None) -> None:
        self._job_name = job_name
        self._slots = (options or LocalOptions()).slots
        #: Launches waiting for a free slot, oldest first.
        self._waiting: dict[str, LaunchSpec] = {}
        #: Launches being started now (taken from the waiting, not registered yet), and
        #: those of them deleted meanwhile: they are stopped as soon as they are registered.
        self._starting: set[str] = set()
        self._deleted_while_starting: dict[str, float] = {}  # name: grace period
        self._work_dir = work_dir
        self._registry_path = os.path.join(work_dir, "instances.json")
        self._log_dir = os.path.join(work_dir, "logs")
        os.makedirs(self._log_dir, exist_ok=True)
        self._lock = threading.Lock()
        self._instances: dict[str, _Instance] = {}
        self._fork_server: ForkServer | None = None
        self._events: queue.Queue[InstanceEvent] = queue.Queue()
        self._closed = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="local-backend", daemon=True)
        self._watcher.start()

    def log_path(self, name: str) -> str:
        return os.path.join(self._log_dir, f"{name}.log")

    def launch(self, spec: LaunchSpec) -> None:
        with self._lock:
            if spec.name in self._instances or spec.name in self._waiting:
                return  # already running or waiting: a launch is idempotent
            if self._slots is not None and self._in_use() + len(self._waiting) >= self._slots:
                self._waiting[spec.name] = spec  # first come, first started
                why = f"waiting for a free local slot (all {self._slots} of --local-slots in use)"
                self._events.put(InstanceEvent(spec.name, EventKind.PENDING, message=why))
                return
            if self._waiting or self._loading(spec):
                self._waiting[spec.name] = spec  # started by the watcher once it has loaded
                return
            self._starting.add(spec.name)
        try:
            self._start(spec)
        finally:
            self._started(spec.name)

    def _loading(self, spec: LaunchSpec) -> bool:
        """Whether ``spec`` must wait for the fork server to load, which it starts if none is
        there yet (holding the lock)."""
        if not forkable(spec.command, spec.preload):
            return False
        if self._fork_server is None:
            log_path = os.path.join(self._log_dir, "fork-server.log")
            self._fork_server = ForkServer(spec.preload, log_path)
            if self._fork_server.pid is not None:
                log.info("started the fork server (pid %d)", self._fork_server.pid)
        return self._fork_server.state() is ServerState.LOADING

    def _start(self, spec: LaunchSpec) -> None:
        env = {**os.environ, **spec.env, **spec.secret_env, "ELASTIC_STEP_INSTANCE": spec.name}
        process = self._fork(spec, env) or self._popen(spec, env)
        start_time = process_start_time(process.pid) or 0
        instance = _Instance(spec.name, spec.role, spec.index, process.pid, start_time, process)
        with self._lock:
            self._instances[spec.name] = instance
            self._save_registry()
            grace_period_s = self._deleted_while_starting.get(spec.name)
        self._events.put(InstanceEvent(spec.name, EventKind.STARTED, pid=process.pid))
        if grace_period_s is not None:
            self.delete(spec.name, grace_period_s)

    def _started(self, name: str) -> None:
        with self._lock:
            self._starting.discard(name)
            self._deleted_while_starting.pop(name, None)

    def _fork(self, spec: LaunchSpec, env: dict[str, str]) -> _Forked | None:
        """``spec`` forked by the fork server; None where the server cannot start it."""
        server = self._fork_server
        if server is None or not forkable(spec.command, spec.preload):
            return None
        if spec.preload != server.preload or server.state() is ServerState.GONE:
            return None  # a gone server said once why it went
        try:
            pid = server.fork(spec.name, spec.command, env, self.log_path(spec.name))
        except ForkServerError as e:
            log.warning("%s starts as a new process: %s", spec.name, e)
            return None
        return _Forked(server, pid)

    def _popen(self, spec: LaunchSpec, env: dict[str, str]) -> subprocess.Popen:
        try:
            with open(self.log_path(spec.name), "ab") as out:
                return subprocess.Popen(
                    spec.command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as e:
            raise BackendError(f"cannot start {spec.name} ({spec.command[0]}): {e}") from e

    def delete(self, name: str, grace_period_s: float = 5.0) -> None:
        with self._lock:
            if self._waiting.pop(name, None) is not None:
                gone = "deleted before it started"
                self._events.put(
                    InstanceEvent(name, EventKind.EXITED, reason=ExitReason.DELETED, message=gone)
                )
                return
            instance = self._instances.get(name)
            if instance is None and name in self._starting:
                self._deleted_while_starting[name] = grace_period_s
                return
            if instance is None or instance.deleting:
                return
            instance.deleting = True
        self._signal(instance, signal.SIGTERM)
        timer = threading.Timer(grace_period_s, self._kill_if_alive, args=(instance,))
        timer.daemon = True
        timer.start()

    def list_instances(self) -> list[InstanceInfo]:
        with self._lock:
            self._adopt_recorded()
            return [InstanceInfo(i.name, i.role, i.index, i.pid) for i in self._instances.values()]

    def next_events(self, timeout_s: float) -> list[InstanceEvent]:
        return take_events(self._events, timeout_s)

    def listen_host(self) -> str:
        return "127.0.0.1"

    def advertise_master(self, port: int) -> str:
        return f"127.0.0.1:{port}"

    def close(self) -> None:
        self._closed.set()
        self._watcher.join(timeout=2)
        if self._fork_server is not None:
            self._fork_server.close()

    def _adopt_recorded(self) -> None:
        """Takes over the live instances an earlier master recorded."""
        if not os.path.exists(self._registry_path):
            return
        try:
            recorded = _read_registry(self._registry_path)
        except OSError as e:  # not the file's fault: it is rewritten below
            log.warning("cannot read the instance record %s: %s", self._registry_path, e)
            recorded = []
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            # Nothing is adopted: the master starts what the job misses, and an instance
            # left running finds itself unknown to it and exits.
            why = f"not a record of instances ({type(e).__name__}: {e})"
            storage.set_aside(self._registry_path, why)
            recorded = []
        for instance in recorded:
            if instance.name in self._instances:
                continue
            if process_start_time(instance.pid) != instance.start_time:
                continue  # gone, or the pid now belongs to another process
            self._instances[instance.name] = instance
        self._save_registry()

    def _save_registry(self) -> None:
        record = {
            "job_name": self._job_name,
            "instances": {
                i.name: {
                    "pid": i.pid,
                    "start_time": i.start_time,
                    "role": i.role.value,
                    "index": i.index,
                }
                for i in self._instances.values()
            },
        }
        storage.write_text_atomic(self._registry_path, json.dumps(record, indent=1))

    def _signal(self, instance: _Instance, sig: signal.Signals) -> None:
        # The instance leads its own session; signal the whole group so its children go too.
        if process_start_time(instance.pid) != instance.start_time:
            return
        try:
            os.killpg(instance.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as e:
            log.warning("cannot signal %s (pid %d): %s", instance.name, instance.pid, e)

    def _kill_if_alive(self, instance: _Instance) -> None:
        with self._lock:
            alive = instance.name in self._instances
        if alive:
            self._signal(instance, signal.SIGKILL)

    def _watch(self) -> None:
        while not self._closed.wait(_POLL_INTERVAL_S):
            with self._lock:
                self._forget_gone_fork_server()
                ended = [(i, self._exit_status(i)) for i in list(self._instances.values())]
                ended = [(i, status) for i, status in ended if status is not None]
                for instance, _ in ended:
                    del self._instances[instance.name]
                if ended:
                    self._save_registry()
                starting = []
                while self._waiting and self._may_start(next(iter(self._waiting.values()))):
                    starting.append(self._waiting.pop(next(iter(self._waiting))))
                    self._starting.add(starting[-1].name)
            for instance, (code, reason, message) in ended:
                self._events.put(
                    InstanceEvent(
                        instance.name, EventKind.EXITED, code, reason, message, instance.pid
                    )
                )
            for spec in starting:
                try:
                    self._start(spec)
                except BackendError as e:
                    self._events.put(
                        InstanceEvent(spec.name, EventKind.EXITED, 128, ExitReason.CRASHED, str(e))
                    )
                finally:
                    self._started(spec.name)

    def _may_start(self, spec: LaunchSpec) -> bool:
        """Whether the oldest waiting launch, ``spec``, may start now (holding the lock)."""
        if self._slots is not None and self._in_use() >= self._slots:
            return False
        return not self._loading(spec)

    def _forget_gone_fork_server(self) -> None:
        """Once the fork server has gone, its instances are watched like adopted ones: their
        exit statuses went with it (holding the lock)."""
        server = self._fork_server
        if server is None or server.state() is not ServerState.GONE:
            return
        for instance in self._instances.values():
            if isinstance(instance.process, _Forked) and instance.process.poll() is None:
                instance.process = None

    def _in_use(self) -> int:
        """Slots taken: running instances, and waiting ones being started now."""
        return len(self._instances) + len(self._starting)

    @staticmethod
    def _exit_status(instance: _Instance) -> tuple[int | None, ExitReason, str] | None:
        """How the instance ended, or None while it runs."""
        if instance.process is None:
            if process_start_time(instance.pid) == instance.start_time:
                return None
            _reap_if_ours(instance)
            # Adopted, or forked by a fork server that has gone: its exit status went to init.
            if instance.deleting:
                return None, ExitReason.DELETED, "deleted (status unknown: not our child)"
            return None, ExitReason.LOST, "exited (status unknown: not our child)"
        code = instance.process.poll()
        if code is None:
            return None
        how = describe_exit(code)
        if instance.deleting:
            return code, ExitReason.DELETED, f"deleted ({how})"
        if code == 0:
            return code, ExitReason.COMPLETED, how
        # A signal the master did not send is the program's fault here: this machine has
        # no platform that preempts or evicts (the OOM killer's SIGKILL looks the same).
        return code, ExitReason.CRASHED, how


def _reap_if_ours(instance: _Instance) -> None:
    """Reaps ``instance`` if it has become this process's zombie: a master that is PID 1 (a
    container's) inherits the instances of a fork server that has gone."""
    if _process_state(instance.pid) == ("Z", instance.start_time):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(instance.pid, os.WNOHANG)


def _read_registry(path: str) -> list[_Instance]:
    """The instances ``path`` records; raises ValueError (and the like) naming what is
    wrong with a file that is not such a record."""
    recorded = json.loads(storage.read_text(path))
    instances = []
    for name, entry in recorded["instances"].items():
        pid, start_time, index = entry["pid"], entry["start_time"], entry["index"]
        if not all(type(v) is int for v in (pid, index, start_time)):
            raise ValueError(f"instance {name}: pid, index and start_time must be integers")
        instances.append(_Instance(name, Role(entry["role"]), index, pid, start_time, None))
    return instances
