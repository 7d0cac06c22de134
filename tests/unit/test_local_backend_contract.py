"""The local backend passes the Backend contract (tests/contracts/backend_contract.py)."""

from __future__ import annotations

import sys

import pytest
from backend_contract import BackendContract, BackendHarness

from elastic_step.backends.local import LocalBackend


class LocalHarness(BackendHarness):
    start_timeout_s = 10.0

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir
        self.backends: list[LocalBackend] = []

    def new_backend(self) -> LocalBackend:
        backend = LocalBackend("job-1", self.work_dir)
        self.backends.append(backend)
        return backend

    def command(self, code: str) -> list[str]:
        return [sys.executable, "-c", code]

    def cleanup(self) -> None:
        backend = LocalBackend("job-1", self.work_dir)  # adopts what is left, then ends it
        for info in backend.list_instances():
            backend.delete(info.name, grace_period_s=0)
        backend.close()
        for b in self.backends:
            b.close()


@pytest.fixture
def harness(tmp_path):
    harness = LocalHarness(str(tmp_path))
    yield harness
    harness.cleanup()


class TestLocalBackendContract(BackendContract):
    pass
