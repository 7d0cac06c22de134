"""A real MLflow tracking server for the tests: `mlflow server` on a loopback port, with a
SQLite store and the artifacts it serves under one directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

MLFLOW = str(Path(sys.executable).with_name("mlflow"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """`mlflow server` on a loopback port, its store and artifacts under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "server.log", "a")  # noqa: SIM115 - open while it runs
        self.proc = subprocess.Popen(
            [
                MLFLOW, "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--workers", "1",
                "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination", str(self.root / "artifacts"),
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # Its job runner (7 more processes, for GenAI jobs) is not what a job uses.
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        pytest.fail(f"mlflow server did not start:\n{(self.root / 'server.log').read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def client(self) -> MlflowClient:
        return MlflowClient(tracking_uri=self.uri)
