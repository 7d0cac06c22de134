"""The processes of Beam's distributed runners, started on loopback: for bench/preprocess.py,
fresh for each run (a process's peak memory is its lifetime's), with their peak RSS; and for
the tests of tests/beam/ (their conftest.py), once a session.

- dask: a scheduler and 2 workers (``--no-nanny``: the worker is the process started, a thread
  each), on 127.0.0.1;
- prism: Beam's external SDK worker pool; Prism itself (the binary ``make prism`` builds) is
  started by the driver, and the pool starts an SDK worker process for each job (each pass of
  the pipeline).

Peak RSS: the driver's is its ``ru_maxrss`` (bench/preprocess.py). Every other process, and
every process they or the driver start, is sampled every 0.2 s for its ``VmHWM`` (the kernel's
high-water mark of its RSS): exact for the long-lived ones; a short-lived SDK worker's last
0.2 s may be missed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import common

BIN = Path(sys.executable).parent
STARTUP_S = 60
SAMPLE_S = 0.2


def _children() -> dict[int, list[int]]:
    """Each process's children, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(common.proc_stat_fields(f"/proc/{entry}/stat")[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    return children


def _role(pid: int, roles: dict[int, str]) -> str:
    if pid in roles:
        return roles[pid]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    if "SdkHarness" in command:
        return "SDK worker"
    if "prism" in command.split(" ", 1)[0]:
        return "prism"
    return "other"


class PeakMemory:
    """Samples the peak RSS of ``roots`` (pid -> role) and of their descendants, by role: a
    role held by several processes (SDK workers) keeps its largest."""

    def __init__(self) -> None:
        self.roots: dict[int, str] = {}
        self.peaks: dict[str, int] = {}
        self.processes: dict[str, set[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, pid: int, role: str) -> None:
        self.roots[pid] = role

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._sample()
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _sample(self) -> None:
        children = _children()
        pending = list(self.roots)
        while pending:
            pid = pending.pop()
            pending.extend(children.get(pid, []))
            mb = common.peak_rss_mb(pid)
            if mb is None:
                continue
            role = _role(pid, self.roots)
            self.peaks[role] = max(self.peaks.get(role, 0), mb)
            self.processes.setdefault(role, set()).add(pid)


class Cluster:
    """The processes of one runner: ``options`` for ``--beam-option``; ``stop()`` ends them."""

    def __init__(self, runner: str, workdir: str, memory: PeakMemory) -> None:
        self.runner = runner
        self._processes: list[subprocess.Popen] = []
        self._logs = Path(workdir) / f"{runner}-logs"
        self._logs.mkdir(parents=True, exist_ok=True)
        self._memory = memory
        self.options = {"local": [], "dask": self._dask, "prism": self._prism}[runner]
        if callable(self.options):
            self.options = self.options()

    def _start(self, args: list[str], name: str, role: str, **kwargs) -> subprocess.Popen:
        log = (self._logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
        )
        self._processes.append(process)
        self._memory.watch(process.pid, role)
        return process

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + STARTUP_S
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self._processes):
                self.stop()
                raise SystemExit(f"{what} did not start; see {self._logs}")
            time.sleep(0.2)

    def _dask(self) -> list[str]:
        scheduler_file = self._logs / "scheduler.json"
        scheduler_file.unlink(missing_ok=True)
        self._start([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--no-dashboard", "--scheduler-file", str(scheduler_file)],
                    "scheduler", "dask scheduler")  # fmt: skip
        self._wait(scheduler_file.exists, "the Dask scheduler")
        address = self.address = json.loads(scheduler_file.read_text())["address"]
        for i in range(2):
            self._start([str(BIN / "dask"), "worker", address, "--host", "127.0.0.1",
                         "--nthreads", "1", "--no-nanny", "--no-dashboard"],
                        f"worker-{i}", f"dask worker {i}")  # fmt: skip
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=STARTUP_S)
        return ["--runner=DaskRunner", f"--dask_client_address={address}"]

    def _prism(self) -> list[str]:
        port = common.free_port()
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        self._start([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                     f"--service_port={port}"], "pool", "SDK worker pool", env=env)  # fmt: skip

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        self._wait(listening, "Beam's worker pool")
        return ["--runner=PrismRunner", "--environment_type=EXTERNAL",
                f"--environment_config=localhost:{port}"]  # fmt: skip

    def tasks_run_per_worker(self) -> list[int]:
        """Dask: how many tasks each worker has run, in worker order."""
        from distributed import Client

        with Client(self.address, timeout=30) as client:
            counts = client.run(lambda dask_worker: dask_worker.state.executed_count)
        return [counts[worker] for worker in sorted(counts)]

    def workers_started(self) -> int:
        """Prism: the SDK worker processes the pool has started."""
        log = (self._logs / "pool.log").read_text(errors="replace")
        return log.count("Starting worker with command")

    def stop(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
