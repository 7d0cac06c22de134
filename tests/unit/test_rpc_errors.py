"""Which errors are retried and which end the caller: the master client, and the worker's main
against a real (minimal) master and real PS shards over gRPC on 127.0.0.1."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import keras
import pytest
from model_defs import linear_regression

from elastic_step.data.schema import Column, Schema
from elastic_step.master.instances.job_keys import JobKeys
from elastic_step.ps.server import ParameterServerServicer, RestorePolicy
from elastic_step.ps.shard import ParameterShard
from elastic_step.rpc import auth, master_pb2, master_pb2_grpc, ps_pb2_grpc
from elastic_step.rpc.auth import AuthInterceptor, Credentials
from elastic_step.rpc.master_client import (
    MasterClient,
    MasterRejectedError,
    MasterUnreachableError,
)
from elastic_step.rpc.tokens import TokenSigner
from elastic_step.worker.worker import main as worker_main

SECRET = auth.new_secret()
WORKER = "worker-0"

MODEL_DEF = linear_regression(1)


class _Master(master_pb2_grpc.MasterServicer):
    """A master that answers what a worker asks first, counts calls, and fails on request."""

    def __init__(self, settings: master_pb2.JobSettings) -> None:
        self.settings = settings
        self.ps_addresses: list[str] = []
        self.calls: Counter[str] = Counter()
        #: method -> (status, message) to abort with, a given number of times (-1: always).
        self.failures: dict[str, tuple[grpc.StatusCode, str, int]] = {}
        self._lock = threading.Lock()

    def _count(self, method: str, context) -> None:
        with self._lock:
            self.calls[method] += 1
            failure = self.failures.get(method)
            if failure is not None and failure[2] != 0:
                self.failures[method] = (failure[0], failure[1], failure[2] - 1)
        if failure is not None and failure[2] != 0:
            context.abort(failure[0], failure[1])

    def Register(self, request, context):
        self._count("Register", context)
        return master_pb2.RegisterResponse(settings=self.settings)

    def GetPSAddresses(self, request, context):
        self._count("GetPSAddresses", context)
        return master_pb2.GetPSAddressesResponse(ready=True, addresses=self.ps_addresses)

    def NextTask(self, request, context):
        self._count("NextTask", context)
        return master_pb2.Task(kind=master_pb2.Task.FINISHED)

    def Heartbeat(self, request, context):
        self._count("Heartbeat", context)
        return master_pb2.HeartbeatResponse()


def _serve(add, servicer) -> tuple[grpc.Server, str]:
    interceptor = AuthInterceptor(TokenSigner(SECRET).verify_key)
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[interceptor])
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def servers() -> Iterator[list[grpc.Server]]:
    started: list[grpc.Server] = []
    yield started
    for server in started:
        server.stop(None).wait()


@pytest.fixture
def master(tmp_path: Path, servers: list[grpc.Server]) -> tuple[_Master, str]:
    """A master for a job with a one-column data set and a one-layer model."""
    (tmp_path / "model_def.py").write_text(MODEL_DEF)
    Schema("y", "numeric", None, [Column("x", "numeric", 0.0, 1.0)]).save(str(tmp_path))
    settings = master_pb2.JobSettings(
        model_def=str(tmp_path / "model_def.py"),
        data_dir=str(tmp_path),
        output_dir=str(tmp_path),
        batch_size=4,
        num_ps=1,
        keep_checkpoints=1,
        master_timeout_s=30,
    )
    servicer = _Master(settings)
    server, address = _serve(master_pb2_grpc.add_MasterServicer_to_server, servicer)
    servers.append(server)
    return servicer, address


def _start_ps(
    servers: list[grpc.Server],
    servicer_class: type[ParameterServerServicer] = ParameterServerServicer,
    job_model_version: int = 0,
) -> str:
    servicer = servicer_class(RestorePolicy(job_model_version))
    servicer.settings = master_pb2.JobSettings(num_ps=1, keep_checkpoints=1)
    servicer.shard = ParameterShard(0, 1, keras.optimizers.SGD(0.1))
    server, address = _serve(ps_pb2_grpc.add_ParameterServerServicer_to_server, servicer)
    servers.append(server)
    return address


class _RejectingPS(ParameterServerServicer):
    def Initialize(self, request, context):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "dense/kernel has shape (2, 1), not (1, 1)")


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# -- the master client --


def _client(address: str, timeout_s: float = 30) -> MasterClient:
    return MasterClient(address, Credentials.for_instance(SECRET, WORKER), timeout_s=timeout_s)


def test_master_error_status_is_raised_at_once(master: tuple[_Master, str]) -> None:
    servicer, address = master
    servicer.failures["NextTask"] = (grpc.StatusCode.INVALID_ARGUMENT, "unknown worker", -1)
    client = _client(address)
    with pytest.raises(MasterRejectedError) as e:
        client.call("NextTask", master_pb2.NextTaskRequest(worker=WORKER))
    client.close()
    assert str(e.value) == "master rejected NextTask: INVALID_ARGUMENT: unknown worker"
    assert (e.value.method, e.value.code) == ("NextTask", grpc.StatusCode.INVALID_ARGUMENT)
    assert servicer.calls["NextTask"] == 1


def test_wrong_credentials_are_rejected_not_retried(master: tuple[_Master, str]) -> None:
    servicer, address = master
    client = MasterClient(address, Credentials.for_instance(auth.new_secret(), WORKER))
    with pytest.raises(MasterRejectedError, match=r"^master rejected Register: UNAUTHENTICATED"):
        client.call("Register", master_pb2.RegisterRequest(name=WORKER))
    client.close()
    assert servicer.calls["Register"] == 0


@pytest.mark.parametrize(
    "code",
    # CANCELLED: a master handing the job over cancels the calls in flight as it stops; a
    # worker that took it for an answer exited (a CI run of tests/argo/test_argo_stop.py).
    [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED],
    ids=str,
)
def test_unavailable_deadline_and_cancelled_are_retried(
    master: tuple[_Master, str], code: grpc.StatusCode
) -> None:
    servicer, address = master
    servicer.failures["Heartbeat"] = (code, "busy", 2)
    client = _client(address)
    assert not client.call("Heartbeat", master_pb2.HeartbeatRequest(name=WORKER)).finished
    client.close()
    assert servicer.calls["Heartbeat"] == 3


def test_retries_back_off_and_give_up_after_the_timeout(master: tuple[_Master, str]) -> None:
    servicer, address = master
    servicer.failures["NextTask"] = (grpc.StatusCode.UNAVAILABLE, "restarting", -1)
    client = _client(address, timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(MasterUnreachableError, match="unreachable for 2 s"):
        client.call("NextTask", master_pb2.NextTaskRequest(worker=WORKER))
    elapsed = time.monotonic() - started
    client.close()
    assert 1.5 <= elapsed < 3.0
    # Sleeps of 0.2, 0.4, 0.8, then the last 0.1 to the deadline: 5 calls, not a busy loop.
    assert 4 <= servicer.calls["NextTask"] <= 6


# -- the worker's main --


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in JobKeys(SECRET, "job", tls=False).instance_env(WORKER).items():
        monkeypatch.setenv(variable, value)


def test_worker_exits_1_when_the_master_rejects_it(
    master: tuple[_Master, str], worker_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    servicer, address = master
    servicer.failures["Register"] = (grpc.StatusCode.FAILED_PRECONDITION, "not in this job", -1)
    assert worker_main(["--master", address, "--name", WORKER]) == 1
    assert _errors(caplog) == [
        f"{WORKER}: master rejected Register: FAILED_PRECONDITION: not in this job; exiting"
    ]
    assert servicer.calls["Register"] == 1


def test_worker_exits_1_when_a_ps_rejects_it(
    master: tuple[_Master, str],
    servers: list[grpc.Server],
    worker_env: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer, address = master
    servicer.ps_addresses = [_start_ps(servers, _RejectingPS)]
    assert worker_main(["--master", address, "--name", WORKER]) == 1
    assert _errors(caplog) == [
        f"{WORKER}: PS shard 0 rejected Initialize: INVALID_ARGUMENT: dense/kernel has shape "
        "(2, 1), not (1, 1); exiting"
    ]
    assert servicer.calls["GetPSAddresses"] == 1  # no reconnecting


def test_worker_runs_with_a_ps_that_takes_its_values(
    master: tuple[_Master, str], servers: list[grpc.Server], worker_env: None
) -> None:
    servicer, address = master
    servicer.ps_addresses = [_start_ps(servers)]
    assert worker_main(["--master", address, "--name", WORKER]) == 0  # FINISHED at once
    assert servicer.calls["NextTask"] == 1


def test_worker_waits_for_a_ps_with_backoff_then_gives_up(
    master: tuple[_Master, str],
    servers: list[grpc.Server],
    worker_env: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer, address = master
    servicer.settings.master_timeout_s = 1.5
    # Mid-job and without a checkpoint, the shard waits for a worker that has pulled a
    # version: this fresh worker's values are refused, and it waits.
    servicer.ps_addresses = [_start_ps(servers, job_model_version=42)]
    started = time.monotonic()
    assert worker_main(["--master", address, "--name", WORKER]) == 1
    elapsed = time.monotonic() - started
    assert _errors(caplog) == [f"{WORKER}: PS shard 0: holds no parameters; exiting"]
    assert elapsed < 10
    # Sleeps of 0.25, 0.5, 1.0 (cut to the deadline): a handful of tries, not one per tick.
    assert 3 <= servicer.calls["GetPSAddresses"] <= 5


def test_worker_without_its_credentials_exits_1(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    assert worker_main(["--master", "127.0.0.1:1", "--name", WORKER]) == 1
    assert len(_errors(caplog)) == 1
    assert _errors(caplog)[0].startswith(f"{WORKER}: {auth.TOKEN_ENV} is not set")
