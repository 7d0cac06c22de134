"""Beam's distributed runners on loopback, for the tests of this directory: a Dask scheduler
with two worker processes, and an external pool of Beam SDK workers for Prism (whose binary
`make prism` builds). Each is started once per session and stopped at its end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
STARTUP_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        args, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True, **kwargs
    )


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def wait_until(ready, what: str, processes: list[subprocess.Popen], logs: list[Path]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while not ready():
        dead = [p.args for p in processes if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "\n".join(log.read_text(errors="replace")[-2000:] for log in logs)
            pytest.fail(f"{what} did not start (exited: {dead}):\n{tails}")
        time.sleep(0.2)


class DaskCluster:
    """``address``: the scheduler's; ``workers``: its worker processes' addresses."""

    def __init__(self, address: str, workers: int) -> None:
        self.address = address
        self.workers = workers

    def tasks_run_per_worker(self) -> list[int]:
        """How many tasks each worker has run (its executed count), in worker order."""
        from distributed import Client

        with Client(self.address, timeout=30) as client:
            counts = client.run(lambda dask_worker: dask_worker.state.executed_count)
        return [counts[worker] for worker in sorted(counts)]


@pytest.fixture(scope="session")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskCluster]:
    """A Dask scheduler and 2 worker processes (a thread each) on 127.0.0.1."""
    root = tmp_path_factory.mktemp("dask")
    scheduler_file = root / "scheduler.json"
    logs = [root / "scheduler.log", root / "worker-0.log", root / "worker-1.log"]
    common = ["--no-dashboard"]
    processes = [
        start(
            [
                str(BIN / "dask"),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--scheduler-file",
                str(scheduler_file),
                *common,
            ],
            logs[0],
        )
    ]
    try:
        wait_until(scheduler_file.exists, "the Dask scheduler", processes, logs[:1])
        address = json.loads(scheduler_file.read_text())["address"]
        for log in logs[1:]:
            processes.append(
                start(
                    [
                        str(BIN / "dask"),
                        "worker",
                        address,
                        "--host",
                        "127.0.0.1",
                        "--nworkers",
                        "1",
                        "--nthreads",
                        "1",
                        *common,
                    ],
                    log,
                )
            )
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=STARTUP_S)
        yield DaskCluster(address, workers=2)
    finally:
        stop(processes)


class WorkerPool:
    """Beam's external SDK worker pool: ``address`` for --environment_config; ``log`` says
    which workers it started."""

    def __init__(self, address: str, log: Path) -> None:
        self.address = address
        self.log = log

    def workers_started(self) -> int:
        return self.log.read_text(errors="replace").count("Starting worker with command")


@pytest.fixture(scope="session")
def worker_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPool]:
    """``python -m apache_beam.runners.worker.worker_pool_main`` on 127.0.0.1; the workers
    it starts run this venv's ``python`` (first on its PATH)."""
    port = free_port()
    log = tmp_path_factory.mktemp("pool") / "pool.log"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    pool = start(
        [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
         f"--service_port={port}"], log, env=env,
    )  # fmt: skip

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(listening, "Beam's worker pool", [pool], [log])
        yield WorkerPool(f"localhost:{port}", log)
    finally:
        stop([pool])
