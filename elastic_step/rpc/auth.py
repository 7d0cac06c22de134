"""Who is calling: every gRPC call between the master, the PS and the workers is authenticated.

The master makes one secret per job (:func:`new_secret`), persists it, and gives it to every
instance it launches in the environment variable :data:`SECRET_ENV`, never in argv. An
instance proves its name with ``token_for(secret, name)``, an HMAC-SHA256 of the name: the
client side adds both to the metadata of every call (:func:`authenticated_channel`); the
server side (:class:`AuthInterceptor`) answers a call without a valid pair with
``UNAUTHENTICATED`` before any handler runs. Handlers read the verified name with
:func:`caller_name`. The master calls the PS as :data:`MASTER_NAME`.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

log = logging.getLogger(__name__)

#: The environment variable that carries the job's secret to the PS, which check callers.
SECRET_ENV = "ELASTIC_STEP_JOB_SECRET"
#: The environment variable that carries a worker its own token, and nothing more: the
#: user's code runs in workers, and must not be able to act as another instance.
TOKEN_ENV = "ELASTIC_STEP_TOKEN"
#: The identity of the master when it calls the PS.
MASTER_NAME = "master"
# Metadata keys: lowercase ASCII, and no "-bin" suffix, as gRPC wants for text values.
NAME_KEY = "elastic-step-name"
TOKEN_KEY = "elastic-step-token"
# A claimed name goes into a log line: a flood of long made-up names must not fill the log.
_MAX_LOGGED_NAME = 80


class MissingSecretError(Exception):
    """The job's secret is not in this process's environment."""


def new_secret() -> str:
    """A fresh job secret: 256 random bits, hex."""
    return secrets.token_hex(32)


def token_for(secret: str, name: str) -> str:
    """The token that proves ``name``: HMAC-SHA256(secret, name), hex."""
    return hmac.new(secret.encode(), name.encode(), hashlib.sha256).hexdigest()


def secret_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The job's secret from :data:`SECRET_ENV`; :class:`MissingSecretError` if unset or empty."""
    secret = (os.environ if environ is None else environ).get(SECRET_ENV, "")
    if not secret:
        raise MissingSecretError(
            f"{SECRET_ENV} is not set: the master gives the job's secret to every "
            "instance it launches; workers and PS cannot run without it"
        )
    return secret


@dataclass(frozen=True)
class Credentials:
    """A caller's name and the token that proves it. The token is left out of ``repr``."""

    name: str
    token: str = field(repr=False)

    @classmethod
    def for_instance(cls, secret: str, name: str) -> Credentials:
        return cls(name, token_for(secret, name))

    @classmethod
    def from_env(cls, name: str, environ: Mapping[str, str] | None = None) -> Credentials:
        """Credentials for ``name``: its token from :data:`TOKEN_ENV`, or one made from the
        secret in the environment (see :func:`secret_from_env`)."""
        environ = os.environ if environ is None else environ
        token = environ.get(TOKEN_ENV, "")
        if token:
            return cls(name, token)
        if not environ.get(SECRET_ENV):
            raise MissingSecretError(
                f"neither {TOKEN_ENV} nor {SECRET_ENV} is set: the master gives every "
                "instance it launches its credentials; a worker cannot run without them"
            )
        return cls.for_instance(secret_from_env(environ), name)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((NAME_KEY, self.name), (TOKEN_KEY, self.token))


# -- the client side --


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _CredentialsInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the caller's name and token to the metadata of every call."""

    def __init__(self, credentials: Credentials) -> None:
        self._metadata = credentials.metadata()

    def _details(self, details: grpc.ClientCallDetails) -> _CallDetails:
        # Drop any name or token the caller set itself: exactly one pair goes out.
        keep = [(k, v) for k, v in details.metadata or () if k not in (NAME_KEY, TOKEN_KEY)]
        return _CallDetails(
            details.method,
            details.timeout,
            (*keep, *self._metadata),
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def authenticated_channel(
    address: str, credentials: Credentials, options: list | None = None
) -> grpc.Channel:
    """A channel to ``address`` whose every call carries ``credentials``.

    Plain TCP: the token proves the caller's name to a server that holds the secret; it does
    not hide the traffic.
    """
    channel = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, _CredentialsInterceptor(credentials))


# -- the server side --


class _Gate:
    """The check that both server interceptors make: a name, and its token under the secret."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError(f"{type(self).__name__} needs the job's secret; got an empty one")
        self._secret = secret

    def problem(self, handler_call_details) -> str | None:
        """Why the call is refused (logged as one warning, never with a token or the secret),
        or None when it carries valid credentials."""
        name, token = _credentials_of(handler_call_details.invocation_metadata)
        expected = token_for(self._secret, name) if name else ""
        # compare_digest on bytes: constant time, and no TypeError on non-ASCII input.
        if name and token and hmac.compare_digest(expected.encode(), token.encode()):
            return None
        if not name:
            problem = "no caller name" if not token else "a token but no caller name"
        elif not token:
            problem = f"caller {name[:_MAX_LOGGED_NAME]!r} without a token"
        else:
            problem = f"caller {name[:_MAX_LOGGED_NAME]!r} with a wrong token"
        log.warning("refused %s: %s", handler_call_details.method, problem)
        return problem


class AuthInterceptor(_Gate, grpc.ServerInterceptor):
    """Lets through only calls whose token matches their name under the job's secret.

    Any other call is answered ``UNAUTHENTICATED`` without running its handler, and logged
    as one warning that names the method and the claimed name (never a token or the secret).
    """

    def intercept_service(self, continuation, handler_call_details):
        if self.problem(handler_call_details) is None:
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        return None if handler is None else _refusing(handler, handler_call_details.method)


class AsyncAuthInterceptor(_Gate, grpc.aio.ServerInterceptor):
    """:class:`AuthInterceptor` for grpc's asyncio server (the master's)."""

    async def intercept_service(self, continuation, handler_call_details):
        problem = self.problem(handler_call_details)
        handler = await continuation(handler_call_details)
        if problem is None or handler is None:
            return handler
        method = handler_call_details.method

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: {REFUSAL}")

        return _like(handler, refuse)


#: What a call without valid credentials is told.
REFUSAL = "no valid job credentials"


def _credentials_of(metadata) -> tuple[str, str]:
    name = token = ""
    for key, value in metadata or ():
        if key == NAME_KEY:
            name = value
        elif key == TOKEN_KEY:
            token = value
    return name, token


def _refusing(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that answers UNAUTHENTICATED."""

    def refuse(request_or_iterator, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: {REFUSAL}")

    return _like(handler, refuse)


def _unread(data: bytes) -> bool:
    """What a refused call's message would be parsed with, if it were ever read (it is not:
    see :func:`_like`). Not None: grpc takes None for a message that failed to parse."""
    return True


def _like(handler: grpc.RpcMethodHandler, behaviour) -> grpc.RpcMethodHandler:
    """A handler answering as ``handler`` would, running ``behaviour``, which never reads the
    request. It takes the request as a stream, whatever the method: the server then receives
    no message until the behaviour asks for one, which it never does. A large message is
    neither received nor parsed; on the wire a unary request looks the same."""
    serializers = {
        "request_deserializer": _unread,
        "response_serializer": handler.response_serializer,
    }
    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behaviour, **serializers)
    return grpc.stream_unary_rpc_method_handler(behaviour, **serializers)


def caller_name(context: grpc.ServicerContext) -> str:
    """The caller's name, as :class:`AuthInterceptor` verified it.

    Only meaningful on a server built with the interceptor: there no handler runs for a call
    without a valid name. Raises ``LookupError`` if the call carries no name at all.
    """
    name, _ = _credentials_of(context.invocation_metadata())
    if not name:
        raise LookupError("the call carries no caller name: the server lacks AuthInterceptor")
    return name
