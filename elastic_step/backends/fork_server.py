"""The local backend's fork server: one process that imports an instance's modules once
(``LaunchSpec.preload``: TensorFlow, Keras, the worker's and PS's code) and forks every
instance from there, so that a new worker starts in a fraction of a second instead of
importing TensorFlow again (3-4 s of CPU, 20-30 s on a busy machine).

The server only imports: it runs no TensorFlow op and opens no gRPC channel, so its only
other threads are the C libraries' own (OpenBLAS's pool, jemalloc's), which keep their locks
safe across ``fork``. A forked instance then runs its ``python -m MODULE ARGS`` command as a
new process would after those imports (it sizes TensorFlow's thread pools and runs its first
op itself), in a session of its own, with its own environment, ``argv``, log file and name.

The protocol is JSON lines over the server's stdin and stdout:

- server: ``{"ready": PID}`` once its imports are done;
- client: ``{"name", "module", "args", "env", "log"}``;
- server: ``{"name", "pid"}`` or ``{"name", "error"}``;
- server, whenever an instance it forked ends: ``{"exited": PID, "code": CODE}``, where CODE
  is ``subprocess``'s: the exit status, or minus the signal that killed it.

The server exits when its stdin closes: the master that started it has gone. The instances
it forked go on (they lead their own sessions) and are adopted by the next master, like
instances started by ``subprocess``.
Tests: tests/unit/test_fork_server.py.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import json
import logging
import os
import queue
import runpy
import select
import signal
import subprocess
import sys
import threading
import time

log = logging.getLogger(__name__)

#: How long the server may take to import TensorFlow before the backend stops waiting for it.
LOAD_TIMEOUT_S = 180.0
#: How long one fork may take to be answered.
FORK_TIMEOUT_S = 30.0
_REAP_INTERVAL_S = 0.05


class ForkServerError(Exception):
    """The fork server cannot start an instance (it is gone, or did not answer in time)."""


class ServerState(enum.Enum):
    LOADING = "loading"  # importing TensorFlow
    READY = "ready"  # forks instances
    GONE = "gone"  # exited, failed, or given up on: instances start as new processes


def forkable(command: list[str], preload: tuple[str, ...]) -> bool:
    """Whether a fork server can start ``command``: ``python -m MODULE ...`` with this
    interpreter, with modules to preload."""
    return bool(preload) and len(command) > 2 and command[:2] == [sys.executable, "-m"]


class ForkServer:
    """The master's side: starts the server process and asks it for forks.

    It imports ``preload``; ``log_path`` takes its own output (its start-up errors). No lock
    is held while it waits for the process; a fork is awaited at most ``FORK_TIMEOUT_S``.
    """

    def __init__(self, preload: tuple[str, ...], log_path: str) -> None:
        self.preload = preload
        self._state = ServerState.LOADING
        self._lock = threading.Lock()  # the state, the exit codes and the awaited name
        self._replies: queue.Queue[dict] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._request_lock = threading.Lock()
        #: The instance whose fork is awaited; a pid answered for any other is killed.
        self._awaited: str | None = None
        self._deadline = time.monotonic() + LOAD_TIMEOUT_S
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        try:
            with open(log_path, "ab") as out:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "elastic_step.backends.fork_server", *preload],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=out,
                    start_new_session=True,
                )
        except OSError as e:
            log.warning("cannot start the fork server (%s); starting instances as new processes", e)
            self._state = ServerState.GONE
            return
        self._reader = threading.Thread(target=self._read, name="fork-server", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def state(self) -> ServerState:
        """The server's state; a server still loading past ``LOAD_TIMEOUT_S`` is given up."""
        with self._lock:
            late = self._state is ServerState.LOADING and time.monotonic() > self._deadline
            state = ServerState.GONE if late else self._state
        if late:
            log.warning(
                "the fork server did not load TensorFlow within %.0f s; "
                "starting instances as new processes",
                LOAD_TIMEOUT_S,
            )
            self._give_up(gently=False)
        return state

    def fork(self, name: str, command: list[str], env: dict[str, str], log_path: str) -> int:
        """Forks instance ``name`` running ``command`` (``python -m MODULE ARGS``, see
        :func:`forkable`) with ``env`` and its output appended to ``log_path``; returns its
        pid. Raises ForkServerError when the server is not ready or does not answer within
        ``FORK_TIMEOUT_S`` (it is then given up)."""
        module, args = command[2], command[3:]
        request = {"name": name, "module": module, "args": args, "env": env, "log": log_path}
        with self._request_lock:
            state = self.state()
            if state is not ServerState.READY or self._process is None:
                raise ForkServerError(f"the fork server is {state.value}")
            with self._lock:
                self._awaited = name
            try:
                self._process.stdin.write(json.dumps(request).encode() + b"\n")
                self._process.stdin.flush()
                reply = self._replies.get(timeout=FORK_TIMEOUT_S)
            except (OSError, ValueError) as e:
                raise ForkServerError(f"the fork server is gone ({e})") from e
            except queue.Empty:
                self._give_up(gently=False)
                raise ForkServerError(
                    f"the fork server did not answer within {FORK_TIMEOUT_S:.0f} s"
                ) from None
            finally:
                with self._lock:
                    self._awaited = None
        if reply.get("name") != name or "pid" not in reply:
            raise ForkServerError(reply.get("error") or f"the fork server answered {reply}")
        return int(reply["pid"])

    def exit_code(self, pid: int) -> int | None:
        """How instance ``pid`` ended (``subprocess``'s return code), or None while it runs,
        or when the server is gone before it could tell."""
        with self._lock:
            return self._exits.get(pid)

    def close(self) -> None:
        """Ends the server; the instances it forked go on."""
        self._give_up(gently=True)
        if self._reader is not None:
            self._reader.join(timeout=2)

    def _give_up(self, *, gently: bool) -> None:
        """Marks the server gone, then ends its process: ``gently``, its stdin closed and 2 s
        to exit before SIGKILL; otherwise (it stopped answering) SIGKILL at once, without
        waiting, as callers may hold the backend's lock. The reader thread reaps it."""
        with self._lock:
            self._state = ServerState.GONE
        process = self._process
        if process is None or process.poll() is not None:
            return
        if not gently:
            with contextlib.suppress(OSError):
                process.kill()
            return
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)

    def _read(self) -> None:
        try:
            for line in self._process.stdout:
                self._take(line)
        finally:
            self._replies.put({"error": "the fork server exited"})  # to a fork waiting for it
            with self._lock:
                unexpected = self._state is not ServerState.GONE
                self._state = ServerState.GONE
            try:
                how = describe_exit(self._process.wait(timeout=5))
            except subprocess.TimeoutExpired:
                how = "its output closed"
            if unexpected:
                log.warning("the fork server exited (%s); starting instances as new processes", how)

    def _take(self, line: bytes) -> None:
        """One message from the server."""
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise ValueError("not an object")
            with self._lock:
                if "exited" in message:
                    self._exits[int(message["exited"])] = int(message["code"])
                elif "ready" in message:
                    if self._state is ServerState.LOADING:
                        self._state = ServerState.READY
                elif message.get("name") == self._awaited:
                    if "pid" in message:  # a pid used again: what ended before is not this
                        self._exits.pop(int(message["pid"]), None)
                    self._replies.put(message)
                elif "pid" in message:
                    self._kill_late(message["name"], int(message["pid"]))
        except (ValueError, TypeError, KeyError) as e:
            log.warning("the fork server wrote %r, which is not a message (%s)", line[:200], e)

    @staticmethod
    def _kill_late(name: str, pid: int) -> None:
        """An instance forked after its launch was given up: it was started as a new process
        instead, so this one must not run."""
        log.warning("%s (pid %d) was forked after its launch was given up; killing it", name, pid)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def describe_exit(code: int) -> str:
    """``subprocess``'s return code in words: "exit status 1", "killed by SIGKILL"."""
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


# -- the server process --


def _preload(modules: list[str]) -> None:
    """Imports ``modules``, with TensorFlow's C++ banner (fd 2) sent to /dev/null, as
    ``import_tensorflow_quietly`` does."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        if os.environ.get("ELASTIC_STEP_TF_LOGS") != "1":
            os.dup2(devnull, 2)
        for module in modules:
            importlib.import_module(module)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _send(fd: int, message: dict) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


def _reap(fd: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(fd, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(preload: list[str]) -> dict | None:
    """The server's loop, once it has imported ``preload``. Returns None in the server when
    its stdin closes, and the request in each forked instance, which then runs it
    (:func:`run_instance`)."""
    # Messages go out on a descriptor of their own; what anything else prints goes to the log.
    proto = os.dup(1)
    os.dup2(2, 1)
    _preload(preload)
    _send(proto, {"ready": os.getpid()})
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], _REAP_INTERVAL_S)
        _reap(proto)
        if not readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            _reap(proto)  # those that ended are accounted to this process, and so to the master
            return None
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            # The answer waits until the instance leads its session under its own name, so
            # that the pid it gives can be signalled as a group at once.
            settled, settled_w = os.pipe()
            try:
                pid = os.fork()
            except OSError as e:
                os.close(settled)
                os.close(settled_w)
                _send(proto, {"name": request["name"], "error": f"cannot fork: {e}"})
                continue
            if pid == 0:
                os.close(settled)
                return {**request, "settled_fd": settled_w, "proto_fd": proto}
            os.close(settled_w)
            os.read(settled, 1)  # b"" if it died first: its exit follows
            os.close(settled)
            _send(proto, {"name": request["name"], "pid": pid})


def run_instance(request: dict) -> int:
    """Becomes instance ``request["name"]`` in a forked child and runs it: its own session,
    output to its log, its environment, then its module as ``python -m`` runs it (which
    exits with the program's status)."""
    os.close(request["proto_fd"])  # the master must see the server's end, not this one's
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    os.environ.clear()
    os.environ.update(request["env"])
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(request["name"][:15])  # what ps and top show
    os.write(request["settled_fd"], b"+")
    os.close(request["settled_fd"])
    sys.argv = ["-m", *request["args"]]  # runpy puts the module's path first, as -m does
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    _request = serve(sys.argv[1:])
    sys.exit(0 if _request is None else run_instance(_request))
