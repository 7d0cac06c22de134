"""Who is calling: every gRPC call between the master, the PS and the workers is authenticated.

The master makes one secret per job (:func:`new_secret`), persists it, and keeps it: from it
it derives the key that signs instance tokens (:mod:`elastic_step.rpc.tokens`) and, with
TLS, the job's CA (:mod:`elastic_step.rpc.tls`). Every instance it launches gets, in its
environment and never in argv, its own token (:data:`TOKEN_ENV`), the public key that checks
tokens (:data:`VERIFY_KEY_ENV`) and, with TLS, its role's certificate. The client side adds
the name and token to the metadata of every call (:func:`authenticated_channel`); the server
side (:class:`AuthInterceptor`) answers a call without a valid pair with ``UNAUTHENTICATED``
before any handler runs, and before its message is read. Handlers read the verified name
with :func:`caller_name`. The master calls the PS as :data:`MASTER_NAME`.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
from collections.abc import Mapping

import grpc

from elastic_step.rpc.tls import TlsFiles, server_name
from elastic_step.rpc.tokens import TokenSigner, TokenVerifier

log = logging.getLogger(__name__)

#: The environment variable that carries an instance its own token, and nothing more: the
#: user's code runs in workers and PS, and must not be able to act as another instance.
TOKEN_ENV = "ELASTIC_STEP_TOKEN"
#: The public key that checks tokens (hex): a PS checks its callers with it.
VERIFY_KEY_ENV = "ELASTIC_STEP_VERIFY_KEY"
#: With TLS: the job CA's certificate, and the instance's role's certificate and key (PEM).
TLS_CA_ENV = "ELASTIC_STEP_TLS_CA"
TLS_CERT_ENV = "ELASTIC_STEP_TLS_CERT"
TLS_KEY_ENV = "ELASTIC_STEP_TLS_KEY"
#: The identity of the master when it calls the PS.
MASTER_NAME = "master"
# Metadata keys: lowercase ASCII, and no "-bin" suffix, as gRPC wants for text values.
NAME_KEY = "elastic-step-name"
TOKEN_KEY = "elastic-step-token"
# A claimed name goes into a log line: a flood of long made-up names must not fill the log.
_MAX_LOGGED_NAME = 80


class MissingCredentialsError(Exception):
    """This instance's credentials are not in its environment."""


def new_secret() -> str:
    """A fresh job secret: 256 random bits, hex."""
    return secrets.token_hex(32)


def role_of(name: str) -> str:
    """The role whose certificate instance ``name`` holds: master, ps or worker."""
    if name == MASTER_NAME:
        return "master"
    return "ps" if name.startswith("ps-") else "worker"


def _required(environ: Mapping[str, str], variable: str) -> str:
    value = environ.get(variable, "")
    if not value:
        raise MissingCredentialsError(
            f"{variable} is not set: the master gives every instance it launches its "
            "credentials; workers and PS cannot run without them"
        )
    return value


def verify_key_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The key that checks tokens, from :data:`VERIFY_KEY_ENV`."""
    return _required(os.environ if environ is None else environ, VERIFY_KEY_ENV)


class Credentials:
    """A caller's name and the token that proves it, and with TLS its role's certificate.

    The token is renewed in place (:meth:`renew`): channels made with these credentials send
    the newest one. Neither the token nor the key is in ``repr``."""

    def __init__(self, name: str, token: str, tls: TlsFiles | None = None) -> None:
        self.name = name
        self.token = token
        self.tls = tls

    def __repr__(self) -> str:
        return f"Credentials(name={self.name!r}, tls={self.tls is not None})"

    @classmethod
    def for_instance(cls, secret: str, name: str, tls: TlsFiles | None = None) -> Credentials:
        """Credentials for ``name``, minted from the job's secret (the master's side)."""
        return cls(name, TokenSigner(secret).token(name), tls)

    @classmethod
    def from_env(cls, name: str, environ: Mapping[str, str] | None = None) -> Credentials:
        """Credentials for ``name`` from the environment the master gave this instance: its
        token, and with TLS its role's certificate. :class:`MissingCredentialsError` when
        the token is missing."""
        environ = os.environ if environ is None else environ
        token = _required(environ, TOKEN_ENV)
        tls = None
        if environ.get(TLS_CA_ENV):
            tls = TlsFiles(
                _required(environ, TLS_CA_ENV).encode(),
                _required(environ, TLS_CERT_ENV).encode(),
                _required(environ, TLS_KEY_ENV).encode(),
            )
        return cls(name, token, tls)

    def renew(self, token: str) -> None:
        """Sends ``token`` from now on (the master's fresher one)."""
        if token:
            self.token = token

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((NAME_KEY, self.name), (TOKEN_KEY, self.token))


class MintedCredentials(Credentials):
    """The master's own credentials: it holds the signer, and renews its token itself."""

    def __init__(self, signer: TokenSigner, name: str, tls: TlsFiles | None = None) -> None:
        super().__init__(name, signer.token(name), tls)
        self._signer = signer

    def metadata(self) -> tuple[tuple[str, str], ...]:
        self.renew(self._signer.renewal(self.name, self.token))
        return super().metadata()


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
        self._credentials = credentials

    def _details(self, details: grpc.ClientCallDetails) -> _CallDetails:
        # Drop any name or token the caller set itself: exactly one pair goes out.
        keep = [(k, v) for k, v in details.metadata or () if k not in (NAME_KEY, TOKEN_KEY)]
        return _CallDetails(
            details.method,
            details.timeout,
            (*keep, *self._credentials.metadata()),
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
    address: str,
    credentials: Credentials,
    *,
    server_role: str,
    options: list | None = None,
) -> grpc.Channel:
    """A channel to ``address`` whose every call carries ``credentials``.

    With TLS in the credentials, the channel is encrypted, shows the role's certificate,
    and connects only to a server that holds ``server_role``'s certificate of the job's CA.
    Without, it is plain TCP: the token proves the caller's name, and hides nothing.
    """
    if credentials.tls is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        override = [("grpc.ssl_target_name_override", server_name(server_role))]
        channel = grpc.secure_channel(
            address, credentials.tls.channel_credentials(), options=[*(options or []), *override]
        )
    return grpc.intercept_channel(channel, _CredentialsInterceptor(credentials))


def add_port(server, address: str, tls: TlsFiles | None) -> int:
    """Listens on ``address`` (``host:port``; port 0 for a free one), with TLS when ``tls``
    is given; the port taken. Works for grpc's thread and asyncio servers alike."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.server_credentials())


# -- the server side --


class _Gate:
    """The check that both server interceptors make: a name, and its token, signed by the
    master and not expired. With ``tls``, also that the caller's certificate is of the role
    its name says (:func:`_bound`): a token is bound to the connection, so one that a PS
    receives from a worker or the master cannot be replayed by the PS's user code, which
    holds only the PS's certificate."""

    def __init__(self, verify_key: str, *, tls: bool = False) -> None:
        if not verify_key:
            raise ValueError(f"{type(self).__name__} needs the job's verify key; got an empty one")
        self._verifier = TokenVerifier(verify_key)
        self._tls = tls

    def problem(self, handler_call_details) -> str | None:
        """Why the call is refused (logged as one warning, never with a token), or None when
        it carries valid credentials."""
        name, token = _credentials_of(handler_call_details.invocation_metadata)
        if name and token:
            wrong = self._verifier.problem(name, token)
            if wrong is None:
                return None
            problem = f"caller {name[:_MAX_LOGGED_NAME]!r} with {wrong}"
        elif not name:
            problem = "no caller name" if not token else "a token but no caller name"
        else:
            problem = f"caller {name[:_MAX_LOGGED_NAME]!r} without a token"
        log.warning("refused %s: %s", handler_call_details.method, problem)
        return problem


class AuthInterceptor(_Gate, grpc.ServerInterceptor):
    """Lets through only calls whose token, signed by the master, proves their name.

    Any other call is answered ``UNAUTHENTICATED`` without running its handler, and logged
    as one warning that names the method and the claimed name (never a token or the secret).
    """

    def intercept_service(self, continuation, handler_call_details):
        if self.problem(handler_call_details) is None:
            handler = continuation(handler_call_details)
            if not self._tls or handler is None:
                return handler
            return _bound(handler, handler_call_details, asynchronous=False)
        handler = continuation(handler_call_details)
        return None if handler is None else _refusing(handler, handler_call_details.method)


class AsyncAuthInterceptor(_Gate, grpc.aio.ServerInterceptor):
    """:class:`AuthInterceptor` for grpc's asyncio server (the master's)."""

    async def intercept_service(self, continuation, handler_call_details):
        problem = self.problem(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if problem is None:
            if not self._tls:
                return handler
            return _bound(handler, handler_call_details, asynchronous=True)
        method = handler_call_details.method

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: {REFUSAL}")

        return _like(handler, refuse)


#: What a call without valid credentials is told.
REFUSAL = "no valid job credentials"


def _certificate_problem(context, name: str) -> str | None:
    """Why the caller's certificate does not fit ``name``'s role, or None when it does."""
    wanted = server_name(role_of(name))
    names = context.auth_context().get("x509_common_name") or [b""]
    held = names[0].decode(errors="replace")
    if held == wanted:
        return None
    return f"caller {name[:_MAX_LOGGED_NAME]!r} with the certificate of {held!r}, not {wanted!r}"


def _bound(handler: grpc.RpcMethodHandler, details, *, asynchronous: bool):
    """``handler``, run only when the caller's certificate is of its name's role (the
    services here are all unary-unary). A refusal is logged and UNAUTHENTICATED."""
    method, inner = details.method, handler.unary_unary
    name, _ = _credentials_of(details.invocation_metadata)
    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if asynchronous:

        async def behaviour(request, context):
            problem = _certificate_problem(context, name)
            if problem is not None:
                log.warning("refused %s: %s", method, problem)
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: {REFUSAL}")
            return await inner(request, context)

    else:

        def behaviour(request, context):
            problem = _certificate_problem(context, name)
            if problem is not None:
                log.warning("refused %s: %s", method, problem)
                context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: {REFUSAL}")
            return inner(request, context)

    return grpc.unary_unary_rpc_method_handler(behaviour, **serializers)


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


def caller_token(context: grpc.ServicerContext) -> str:
    """The token the caller sent (verified, on a server with the interceptor)."""
    return _credentials_of(context.invocation_metadata())[1]
