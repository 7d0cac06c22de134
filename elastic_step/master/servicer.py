"""The master's gRPC service: a thin layer over the :class:`Coordinator`, on grpc's asyncio
server in a thread of its own.

Every call is authenticated before it gets here (:mod:`elastic_step.rpc.auth`); the caller's
proven name goes to the coordinator. Errors become status codes that tell the caller what
to do: a client's mistake ends it, a master's trouble is retried.

Why asyncio: each call is a fraction of a millisecond under the coordinator's lock, and at
1,000 workers the time goes to the server around it. grpc's threaded server hands every call
to a pool thread through Python conditions; its asyncio server runs the handlers on its
event loop (bench/README.md, "Master at scale", has the figures).
Tests: tests/unit/test_coordinator.py (the coordinator behind this service, over gRPC).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading

import grpc

from elastic_step.errors import InputError
from elastic_step.master.instances.job_keys import JobKeys
from elastic_step.master.job_state.api import CallerError
from elastic_step.master.job_state.coordinator import Coordinator
from elastic_step.master.state_store import StateStoreError
from elastic_step.master.tasks.api import InvalidReportError
from elastic_step.rpc import master_pb2, master_pb2_grpc
from elastic_step.rpc.auth import AsyncAuthInterceptor, add_port, caller_name, caller_token
from elastic_step.rpc.tokens import TokenSigner

log = logging.getLogger("elastic_step.master")


def _status_of(error: Exception) -> grpc.StatusCode:
    if isinstance(error, CallerError):
        return grpc.StatusCode.PERMISSION_DENIED
    if isinstance(error, InvalidReportError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, StateStoreError):
        # The master cannot keep its state: it is failing or being replaced. The caller
        # retries until a master answers or --master-timeout runs out.
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


def _handler(method):
    """An asyncio handler running ``method``, which runs on the event loop (the coordinator's
    calls are short), and turning its errors into status codes."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except Exception as e:
            if isinstance(e, StateStoreError) and self._coordinator.store_failure is None:
                self._coordinator.store_failure = e
            code = _status_of(e)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("%s failed", method.__name__)
            else:
                log.warning("%s rejected (%s): %s", method.__name__, code.name, e)
            await context.abort(code, str(e))

    return wrapper


class MasterServicer(master_pb2_grpc.MasterServicer):
    def __init__(self, coordinator: Coordinator, signer: TokenSigner) -> None:
        self._coordinator = coordinator
        self._signer = signer

    @_handler
    def Register(self, request, context):
        return self._coordinator.register(caller_name(context), request)

    @_handler
    def GetPSAddresses(self, request, context):
        addresses = self._coordinator.ps_addresses()
        return master_pb2.GetPSAddressesResponse(ready=all(addresses), addresses=addresses)

    @_handler
    def NextTask(self, request, context):
        return self._coordinator.next_task(caller_name(context), request)

    @_handler
    def Heartbeat(self, request, context):
        name = caller_name(context)
        finished = self._coordinator.heartbeat(name, request)
        # A token past half its life is replaced here, long before it expires; never one
        # of an instance that is done.
        token = "" if finished else self._signer.renewal(name, caller_token(context))
        return master_pb2.HeartbeatResponse(finished=finished, token=token)


class MasterServer:
    """The master's gRPC server: grpc's asyncio server, its event loop on a daemon thread."""

    #: How long starting may take before it is given up.
    START_TIMEOUT_S = 30.0

    def __init__(self, coordinator: Coordinator, keys: JobKeys) -> None:
        self._coordinator = coordinator
        self._keys = keys
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="master-grpc", daemon=True
        )
        self._server: grpc.aio.Server | None = None

    def start(self, host: str, port: int) -> int:
        """Serves on ``host:port`` (port 0: a free one); returns the port taken. InputError
        when it cannot listen there."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(host, port), self._loop)
        try:
            return future.result(self.START_TIMEOUT_S)
        except RuntimeError as e:
            self._close_loop()
            raise InputError(f"cannot listen on port {port}: {e}") from e

    async def _start(self, host: str, port: int) -> int:
        keys = self._keys
        gate = AsyncAuthInterceptor(keys.verify_key, tls=keys.ca is not None)
        server = grpc.aio.server(interceptors=[gate])
        servicer = MasterServicer(self._coordinator, keys.signer)
        master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
        bound = add_port(server, f"{host}:{port}", keys.tls("master"))
        await server.start()
        self._server = server
        return bound

    def stop(self, grace: float) -> None:
        """Stops serving: calls in flight get ``grace`` seconds; returns when it is down."""
        if self._server is not None:
            stopping = asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop)
            stopping.result(grace + 5)
            self._server = None
        self._close_loop()

    def _close_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._loop.is_running():
            self._loop.close()


def start_master_server(
    coordinator: Coordinator, keys: JobKeys, host: str, port: int
) -> tuple[MasterServer, int]:
    """The master's gRPC server, started on ``host:port`` (port 0: a free one), with every
    call authenticated by a token the master signed (and with TLS, under the job's CA); and
    the port it took, recorded in the job's record for the next master."""
    server = MasterServer(coordinator, keys)
    bound = server.start(host, port)
    with coordinator.lock:
        coordinator.record.set_port(bound)
    return server, bound
