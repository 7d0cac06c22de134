"""Authentication of gRPC calls: job secret, per-instance tokens, the client interceptor and the
server interceptor, over real gRPC servers on 127.0.0.1."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterator
from concurrent import futures

import grpc
import keras
import numpy as np
import pytest

from elastic_step.ps.server import ParameterServerServicer
from elastic_step.ps.shard import ParameterShard
from elastic_step.rpc import auth, master_pb2, master_pb2_grpc, ps_pb2, ps_pb2_grpc
from elastic_step.rpc.auth import AuthInterceptor, Credentials
from elastic_step.rpc.master_client import MasterClient, MasterRejectedError
from elastic_step.rpc.ps_client import PSClient, PSError

SECRET = auth.new_secret()
WORKER = "worker-3"
PS_SERVICE = "elastic_step.ParameterServer"
MASTER_SERVICE = "elastic_step.Master"


def _serve(add, servicer, interceptors: list) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=interceptors)
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def ps_server() -> Iterator[tuple[ParameterServerServicer, str]]:
    """One real PS shard (SGD, one shard in all) behind the interceptor."""
    servicer = ParameterServerServicer()
    servicer.settings = master_pb2.JobSettings(num_ps=1, keep_checkpoints=1)
    servicer.shard = ParameterShard(0, 1, keras.optimizers.SGD(0.1))
    server, address = _serve(
        ps_pb2_grpc.add_ParameterServerServicer_to_server, servicer, [AuthInterceptor(SECRET)]
    )
    yield servicer, address
    server.stop(None).wait()


class _NamesMaster(master_pb2_grpc.MasterServicer):
    """Register answers nothing but remembers who called, as the master will check it."""

    def __init__(self) -> None:
        self.callers: list[str | Exception] = []

    def Register(self, request, context):
        try:
            self.callers.append(auth.caller_name(context))
        except LookupError as e:
            self.callers.append(e)
        return master_pb2.RegisterResponse()


@pytest.fixture
def master_server() -> Iterator[tuple[_NamesMaster, str]]:
    servicer = _NamesMaster()
    server, address = _serve(
        master_pb2_grpc.add_MasterServicer_to_server, servicer, [AuthInterceptor(SECRET)]
    )
    yield servicer, address
    server.stop(None).wait()


def _auth_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == auth.__name__]


# -- secret and tokens --


def test_token_is_hmac_sha256_of_the_name() -> None:
    expected = hmac.new(SECRET.encode(), WORKER.encode(), hashlib.sha256).hexdigest()
    assert auth.token_for(SECRET, WORKER) == expected
    assert auth.token_for(SECRET, "worker-4") != expected
    assert auth.token_for(auth.new_secret(), WORKER) != expected
    assert Credentials.for_instance(SECRET, WORKER) == Credentials(WORKER, expected)


def test_new_secrets_are_random_256_bit_hex() -> None:
    first, second = auth.new_secret(), auth.new_secret()
    assert first != second
    assert len(first) == 64 and int(first, 16) >= 0


def test_secret_from_the_environment() -> None:
    env = {auth.SECRET_ENV: SECRET}
    assert auth.secret_from_env(env) == SECRET
    assert Credentials.from_env(WORKER, env) == Credentials.for_instance(SECRET, WORKER)
    for missing in ({}, {auth.SECRET_ENV: ""}):
        with pytest.raises(auth.MissingSecretError, match=f"nor {auth.SECRET_ENV} is set"):
            Credentials.from_env(WORKER, missing)


def test_a_worker_gets_only_its_own_token_and_proves_its_name_with_it() -> None:
    token = auth.token_for(SECRET, WORKER)
    credentials = Credentials.from_env(WORKER, {auth.TOKEN_ENV: token})
    assert credentials == Credentials.for_instance(SECRET, WORKER)
    # The token proves nothing else: another name with it is refused by the PS's check.
    assert Credentials("ps-0", token) != Credentials.for_instance(SECRET, "ps-0")


def test_token_is_not_in_the_repr() -> None:
    credentials = Credentials.for_instance(SECRET, WORKER)
    assert WORKER in repr(credentials)
    assert credentials.token not in repr(credentials)


# -- calls through the interceptors --


def test_valid_caller_is_served(ps_server: tuple[ParameterServerServicer, str]) -> None:
    servicer, address = ps_server
    client = PSClient([address], Credentials.for_instance(SECRET, WORKER), timeout_s=10)
    try:
        assert client.initialize({"w": np.ones(2, np.float32)}, {}, {}, model_version=0) == [True]
        np.testing.assert_array_equal(client.pull()[0]["w"], [1, 1])
    finally:
        client.close()
    assert servicer.shard.initialized


BAD_CALLERS = {
    "no metadata": (),
    "wrong token": ((auth.NAME_KEY, WORKER), (auth.TOKEN_KEY, "0" * 64)),
    "another name's token": (
        (auth.NAME_KEY, WORKER),
        (auth.TOKEN_KEY, auth.token_for(SECRET, "worker-4")),
    ),
    "another secret's token": (
        (auth.NAME_KEY, WORKER),
        (auth.TOKEN_KEY, auth.token_for(auth.new_secret(), WORKER)),
    ),
    "name without token": ((auth.NAME_KEY, WORKER),),
    "token without name": ((auth.TOKEN_KEY, auth.token_for(SECRET, WORKER)),),
    "short token": ((auth.NAME_KEY, WORKER), (auth.TOKEN_KEY, "abc")),
}


@pytest.mark.parametrize("case", BAD_CALLERS)
def test_bad_credentials_are_unauthenticated_and_logged_once(
    case: str,
    ps_server: tuple[ParameterServerServicer, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer, address = ps_server
    metadata = BAD_CALLERS[case]
    caplog.set_level(logging.WARNING, logger=auth.__name__)
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        request = ps_pb2.InitializeRequest(model_version=0)
        try:
            stub.Initialize(request, timeout=10, metadata=metadata)
        except grpc.RpcError as e:
            code = e.code()
        else:
            code = grpc.StatusCode.OK
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert not servicer.shard.initialized  # the handler never ran
    records = _auth_records(caplog)
    assert len(records) == 1
    line = records[0].getMessage()
    assert records[0].levelno == logging.WARNING
    assert "\n" not in line
    assert f"/{PS_SERVICE}/Initialize" in line
    if any(key == auth.NAME_KEY for key, _ in metadata):
        assert repr(WORKER) in line
    assert SECRET not in line
    for _, value in metadata:
        if value != WORKER:
            assert value not in line


def _methods(service: str) -> list[str]:
    pool = {PS_SERVICE: ps_pb2, MASTER_SERVICE: master_pb2}[service].DESCRIPTOR
    return [m.name for m in pool.services_by_name[service.split(".")[1]].methods]


def _call_every_method(address: str, service: str, stub_class, module) -> dict[str, object]:
    codes = {}
    descriptor = module.DESCRIPTOR.services_by_name[service.split(".")[1]]
    with grpc.insecure_channel(address) as channel:
        stub = stub_class(channel)
        for method in descriptor.methods:
            request = getattr(module, method.input_type.name)()
            try:
                getattr(stub, method.name)(request, timeout=10)
                codes[method.name] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                codes[method.name] = e.code()
    return codes


def test_every_ps_rpc_needs_credentials(
    ps_server: tuple[ParameterServerServicer, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, address = ps_server
    caplog.set_level(logging.WARNING, logger=auth.__name__)
    codes = _call_every_method(address, PS_SERVICE, ps_pb2_grpc.ParameterServerStub, ps_pb2)
    assert set(codes) == {"Initialize", "Pull", "Push"}
    assert set(codes.values()) == {grpc.StatusCode.UNAUTHENTICATED}
    assert len(_auth_records(caplog)) == len(codes)


def test_every_master_rpc_needs_credentials(master_server: tuple[_NamesMaster, str]) -> None:
    servicer, address = master_server
    codes = _call_every_method(address, MASTER_SERVICE, master_pb2_grpc.MasterStub, master_pb2)
    assert set(codes) == set(_methods(MASTER_SERVICE))
    assert set(codes.values()) == {grpc.StatusCode.UNAUTHENTICATED}
    assert servicer.callers == []


def test_caller_name_is_the_verified_name(master_server: tuple[_NamesMaster, str]) -> None:
    servicer, address = master_server
    client = MasterClient(address, Credentials.for_instance(SECRET, WORKER), timeout_s=5)
    try:
        client.call("Register", master_pb2.RegisterRequest(name=WORKER))
        # A name the caller puts into the metadata itself is replaced, not sent twice.
        client._stub.Register(
            master_pb2.RegisterRequest(), timeout=5, metadata=[(auth.NAME_KEY, "master")]
        )
        # Authenticated, then the servicer's own error: not retried, carries the message.
        with pytest.raises(MasterRejectedError, match=r"^master rejected NextTask: UNIMPLEMENTED"):
            client.call("NextTask", master_pb2.NextTaskRequest(worker=WORKER))
    finally:
        client.close()
    assert servicer.callers == [WORKER, WORKER]


def test_caller_name_without_the_interceptor_is_an_error() -> None:
    servicer = _NamesMaster()
    server, address = _serve(master_pb2_grpc.add_MasterServicer_to_server, servicer, [])
    try:
        with grpc.insecure_channel(address) as channel:
            master_pb2_grpc.MasterStub(channel).Register(master_pb2.RegisterRequest(), timeout=5)
    finally:
        server.stop(None).wait()
    assert len(servicer.callers) == 1
    assert isinstance(servicer.callers[0], LookupError)


def test_the_master_identity_calls_the_ps(ps_server: tuple[ParameterServerServicer, str]) -> None:
    _, address = ps_server
    good = PSClient([address], Credentials.for_instance(SECRET, auth.MASTER_NAME), timeout_s=10)
    forged = PSClient([address], Credentials(auth.MASTER_NAME, "f" * 64), timeout_s=10)
    try:
        good.initialize({"w": np.zeros(2, np.float32)}, {}, {}, model_version=0)
        assert set(good.pull()[0]) == {"w"}
        with pytest.raises(PSError, match=r"^PS shard 0 rejected Pull: UNAUTHENTICATED"):
            forged.pull()
    finally:
        good.close()
        forged.close()


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="secret"):
        AuthInterceptor("")


def test_a_large_unauthenticated_push_is_refused_without_being_parsed() -> None:
    from elastic_step.rpc.ps_client import CHANNEL_OPTIONS

    parsed = []

    def parse(data: bytes) -> ps_pb2.PushRequest:
        parsed.append(len(data))
        return ps_pb2.PushRequest.FromString(data)

    servicer = ParameterServerServicer()  # no shard: an authenticated push is UNAVAILABLE
    handler = grpc.method_handlers_generic_handler(
        PS_SERVICE,
        {
            "Push": grpc.unary_unary_rpc_method_handler(
                servicer.Push,
                request_deserializer=parse,
                response_serializer=ps_pb2.PushResponse.SerializeToString,
            )
        },
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(8),
        interceptors=[AuthInterceptor(SECRET)],
        options=CHANNEL_OPTIONS,
    )
    server.add_generic_rpc_handlers((handler,))
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    big = ps_pb2.PushRequest()
    big.dense.add(name="w", dtype="float32", shape=[16 << 20], content=bytes(64 << 20))
    try:
        with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as stranger:
            push = stranger.unary_unary(f"/{PS_SERVICE}/Push")
            for _ in range(8):
                with pytest.raises(grpc.RpcError) as refused:
                    push(big.SerializeToString(), timeout=30)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert parsed == []  # eight 64 MiB messages, none parsed
        channel = auth.authenticated_channel(
            address, Credentials.for_instance(SECRET, WORKER), options=CHANNEL_OPTIONS
        )
        with channel:
            with pytest.raises(grpc.RpcError) as answered:
                channel.unary_unary(f"/{PS_SERVICE}/Push")(b"", timeout=30)
            assert answered.value.code() == grpc.StatusCode.UNAVAILABLE  # "PS is starting"
        assert parsed == [0]  # an authenticated call is parsed
    finally:
        server.stop(None).wait()
