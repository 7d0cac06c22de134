"""Authentication of gRPC calls: signed, expiring per-instance tokens, the client interceptor
and the server interceptor, over real gRPC servers on 127.0.0.1."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent import futures

import grpc
import keras
import numpy as np
import pytest

from elastic_step.master.instances.job_keys import JobKeys
from elastic_step.ps.server import ParameterServerServicer
from elastic_step.ps.shard import ParameterShard
from elastic_step.rpc import auth, master_pb2, master_pb2_grpc, ps_pb2, ps_pb2_grpc, tokens
from elastic_step.rpc.auth import AuthInterceptor, Credentials
from elastic_step.rpc.master_client import MasterClient, MasterRejectedError
from elastic_step.rpc.ps_client import PSClient, PSError
from elastic_step.rpc.tokens import TokenSigner, TokenVerifier

SECRET = auth.new_secret()
VERIFY_KEY = TokenSigner(SECRET).verify_key
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
        ps_pb2_grpc.add_ParameterServerServicer_to_server, servicer, [AuthInterceptor(VERIFY_KEY)]
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
        master_pb2_grpc.add_MasterServicer_to_server, servicer, [AuthInterceptor(VERIFY_KEY)]
    )
    yield servicer, address
    server.stop(None).wait()


def _auth_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == auth.__name__]


# -- secret and tokens --


def test_a_token_proves_its_name_until_it_expires() -> None:
    now = [1_000_000.0]
    signer = TokenSigner(SECRET, lifetime_s=100, clock=lambda: now[0])
    verifier = TokenVerifier(signer.verify_key, clock=lambda: now[0])
    token = signer.token(WORKER)
    assert verifier.problem(WORKER, token) is None
    assert verifier.problem("worker-4", token) == "a wrong token"
    # One hex digit of the signature changed (to one it is not: a fixed "00" was the same
    # signature once in 256 tokens).
    head, signature = token.split(".")
    changed = f"{head}.{signature[:-1]}{'1' if signature[-1] == '0' else '0'}"
    assert verifier.problem(WORKER, changed) == "a wrong token"
    stranger = TokenSigner(auth.new_secret(), clock=lambda: now[0])
    assert verifier.problem(WORKER, stranger.token(WORKER)) == "a wrong token"
    expiry, signature = token.split(".")
    for malformed in (
        "",
        "abc",
        "12.zz",
        f"99999999999999.{signature}",  # an expiry of more than 12 digits
        f"0{expiry}.{signature}",  # the same expiry, written another way
        f"{expiry}.{signature.upper()}",  # the same signature, written another way
        f"{expiry}.{signature[:64]} {signature[64:]}",
    ):
        assert verifier.problem(WORKER, malformed) == "a wrong token", malformed
    # Only good tokens are remembered: made-up ones cannot fill the verifier's memory.
    assert verifier._verified == {(WORKER, token)}
    # A later expiry with the old signature is not the token that was signed.
    later = f"{int(token.split('.')[0]) + 1000}.{token.split('.')[1]}"
    assert verifier.problem(WORKER, later) == "a wrong token"
    now[0] += 100
    assert verifier.problem(WORKER, token) == "an expired token"


def test_a_token_is_renewed_past_half_its_life() -> None:
    now = [1_000_000.0]
    signer = TokenSigner(SECRET, lifetime_s=100, clock=lambda: now[0])
    token = signer.token(WORKER)
    now[0] += 49
    assert signer.renewal(WORKER, token) == ""
    now[0] += 2
    fresh = signer.renewal(WORKER, token)
    assert tokens.expires_at(fresh) == tokens.expires_at(token) + 51
    # The master's own credentials renew themselves.
    minted = auth.MintedCredentials(signer, auth.MASTER_NAME)
    first = minted.token
    now[0] += 51
    assert dict(minted.metadata())[auth.TOKEN_KEY] != first


def test_keys_come_from_the_secret_alone() -> None:
    """A restarted master signs with the same key, and its instances still trust it."""
    assert TokenSigner(SECRET).verify_key == TokenSigner(SECRET).verify_key
    assert TokenSigner(SECRET).verify_key != TokenSigner(auth.new_secret()).verify_key
    with pytest.raises(ValueError, match="secret"):
        TokenSigner("")
    with pytest.raises(ValueError, match="64 hex digits"):
        TokenVerifier("not-a-key")


def test_new_secrets_are_random_256_bit_hex() -> None:
    first, second = auth.new_secret(), auth.new_secret()
    assert first != second
    assert len(first) == 64 and int(first, 16) >= 0


def test_an_instance_gets_its_token_and_the_verify_key_and_no_secret() -> None:
    keys = JobKeys(SECRET, "job", tls=False)
    for name in ("ps-0", WORKER):
        env = keys.instance_env(name)
        assert set(env) == {auth.TOKEN_ENV, auth.VERIFY_KEY_ENV}
        assert SECRET not in env.values()
        credentials = Credentials.from_env(name, env)
        assert credentials.name == name and credentials.tls is None
        assert TokenVerifier(auth.verify_key_from_env(env)).problem(name, credentials.token) is None
    with pytest.raises(auth.MissingCredentialsError, match=f"{auth.TOKEN_ENV} is not set"):
        Credentials.from_env(WORKER, {})
    tls_env = JobKeys(SECRET, "job", tls=True).instance_env(WORKER)
    assert Credentials.from_env(WORKER, tls_env).tls is not None


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
        (auth.TOKEN_KEY, TokenSigner(SECRET).token("worker-4")),
    ),
    "another secret's token": (
        (auth.NAME_KEY, WORKER),
        (auth.TOKEN_KEY, TokenSigner(auth.new_secret()).token(WORKER)),
    ),
    "an expired token": (
        (auth.NAME_KEY, WORKER),
        (auth.TOKEN_KEY, TokenSigner(SECRET, lifetime_s=-1).token(WORKER)),
    ),
    "name without token": ((auth.NAME_KEY, WORKER),),
    "token without name": ((auth.TOKEN_KEY, TokenSigner(SECRET).token(WORKER)),),
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


def test_empty_verify_key_is_refused() -> None:
    with pytest.raises(ValueError, match="verify key"):
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
        interceptors=[AuthInterceptor(VERIFY_KEY)],
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
            address,
            Credentials.for_instance(SECRET, WORKER),
            server_role="ps",
            options=CHANNEL_OPTIONS,
        )
        with channel:
            with pytest.raises(grpc.RpcError) as answered:
                channel.unary_unary(f"/{PS_SERVICE}/Push")(b"", timeout=30)
            assert answered.value.code() == grpc.StatusCode.UNAVAILABLE  # "PS is starting"
        assert parsed == [0]  # an authenticated call is parsed
    finally:
        server.stop(None).wait()
