"""Mutual TLS under the job's CA, over real gRPC servers on 127.0.0.1: who can connect, and
whom a client accepts as its server."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import keras
import numpy as np
import pytest

from elastic_step.master.instances.job_keys import JobKeys
from elastic_step.ps.server import ParameterServerServicer
from elastic_step.ps.shard import ParameterShard
from elastic_step.rpc import auth, master_pb2, ps_pb2, ps_pb2_grpc
from elastic_step.rpc.ps_client import PSClient, PSError, PSUnavailableError
from elastic_step.rpc.tls import JobCA

SECRET = auth.new_secret()
KEYS = JobKeys(SECRET, "job-a", tls=True)


@pytest.fixture
def ps_address() -> Iterator[str]:
    """A real PS shard serving with the PS's certificate, behind the token check."""
    servicer = ParameterServerServicer()
    servicer.settings = master_pb2.JobSettings(num_ps=1, keep_checkpoints=1)
    servicer.shard = ParameterShard(0, 1, keras.optimizers.SGD(0.1))
    server = grpc.server(
        futures.ThreadPoolExecutor(4),
        interceptors=[auth.AuthInterceptor(KEYS.verify_key, tls=True)],
    )
    ps_pb2_grpc.add_ParameterServerServicer_to_server(servicer, server)
    port = auth.add_port(server, "127.0.0.1:0", KEYS.tls("ps"))
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None).wait()


def _pull(address: str, credentials: auth.Credentials, server_role: str = "ps") -> None:
    channel = auth.authenticated_channel(address, credentials, server_role=server_role)
    with channel:
        ps_pb2_grpc.ParameterServerStub(channel).Pull(ps_pb2.PullRequest(), timeout=5)


def test_the_job_instances_connect_with_their_role_certificates(ps_address: str) -> None:
    for name in (auth.MASTER_NAME, "worker-0", "ps-1"):
        credentials = auth.Credentials.from_env(name, KEYS.instance_env(name))
        client = PSClient([ps_address], credentials, timeout_s=10)
        try:
            client.initialize({"w": np.ones(2, np.float32)}, {}, {}, model_version=0)
            np.testing.assert_array_equal(client.pull()[0]["w"], [1, 1])
        finally:
            client.close()


def _unavailable(call) -> str:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    return refused.value.details() or ""


def test_a_client_without_the_job_certificate_cannot_connect(ps_address: str) -> None:
    token = KEYS.signer.token("worker-0")  # a valid token does not make up for it
    # Plain TCP to a TLS port.
    _unavailable(lambda: _pull(ps_address, auth.Credentials("worker-0", token)))
    # TLS that trusts the job's CA, with no certificate of its own.
    with grpc.secure_channel(
        ps_address,
        grpc.ssl_channel_credentials(root_certificates=KEYS.tls("ps").ca_cert),
        options=[("grpc.ssl_target_name_override", "ps.elastic-step")],
    ) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        metadata = ((auth.NAME_KEY, "worker-0"), (auth.TOKEN_KEY, token))
        _unavailable(lambda: stub.Pull(ps_pb2.PullRequest(), timeout=5, metadata=metadata))
    # Another job's certificate: another CA.
    other = JobCA(auth.new_secret(), "job-b").files("worker")
    _unavailable(lambda: _pull(ps_address, auth.Credentials("worker-0", token, other)))


def _client_pull(address: str, credentials: auth.Credentials) -> None:
    """One pull through the PS client of an instance with ``credentials``, closed after."""
    client = PSClient([address], credentials, timeout_s=10)
    try:
        client.pull()
    finally:
        client.close()


def test_a_client_connects_only_to_the_role_it_calls(ps_address: str) -> None:
    """A worker's certificate cannot serve as the PS or the master: clients check the name."""
    credentials = auth.Credentials("worker-0", KEYS.signer.token("worker-0"), KEYS.tls("worker"))
    _unavailable(lambda: _pull(ps_address, credentials, server_role="master"))
    with pytest.raises(PSUnavailableError, match="holds no parameters"):  # the PS answers
        _client_pull(ps_address, credentials)


def test_a_token_is_bound_to_its_role_certificate(
    ps_address: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A token that a PS received from the master or a worker is no use to the PS's user
    code: it holds only the PS's certificate, and the server checks that the certificate is
    of the role the token names."""
    master_token = KEYS.signer.token(auth.MASTER_NAME)
    worker_token = KEYS.signer.token("worker-0")
    replayed = {
        "the master's, with the PS's certificate": (auth.MASTER_NAME, master_token, "ps"),
        "a worker's, with the PS's certificate": ("worker-0", worker_token, "ps"),
        "a worker's, with the master's certificate": ("worker-0", worker_token, "master"),
    }
    for what, (name, token, role) in replayed.items():
        with pytest.raises(PSError, match="UNAUTHENTICATED"):
            _client_pull(ps_address, auth.Credentials(name, token, KEYS.tls(role)))
        assert f"with the certificate of '{role}.elastic-step'" in caplog.text, what
    # The same tokens with their own role's certificate are served.
    for name, token in ((auth.MASTER_NAME, master_token), ("worker-0", worker_token)):
        role = auth.role_of(name)
        with pytest.raises(PSUnavailableError, match="holds no parameters"):
            _client_pull(ps_address, auth.Credentials(name, token, KEYS.tls(role)))


def test_a_restarted_master_issues_certificates_its_old_instances_trust(ps_address: str) -> None:
    again = JobKeys(SECRET, "job-a", tls=True)
    assert again.tls("master").cert != KEYS.tls("master").cert  # issued anew
    client = PSClient([ps_address], again.master_credentials(), timeout_s=10)
    try:
        client.initialize({"w": np.zeros(2, np.float32)}, {}, {}, model_version=0)
    finally:
        client.close()


def test_a_certificate_role_is_one_of_three() -> None:
    with pytest.raises(ValueError, match="one of master, ps, worker; got 'chief'"):
        KEYS.ca.files("chief")
