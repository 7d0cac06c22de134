"""The master's gRPC service: a thin layer over the :class:`Coordinator`.

Every call is authenticated before it gets here (:mod:`elastic_step.rpc.auth`); the caller's
proven name goes to the coordinator. Errors become status codes that tell the caller what
to do: a client's mistake ends it, a master's trouble is retried.
Tests: tests/unit/test_coordinator.py (the coordinator behind this service, over gRPC).
"""

from __future__ import annotations

import functools
import logging
from concurrent import futures

import grpc

from elastic_step.errors import InputError
from elastic_step.master.coordinator import CallerError, Coordinator
from elastic_step.master.state_store import StateStoreError
from elastic_step.master.task_manager import InvalidReportError
from elastic_step.rpc import master_pb2, master_pb2_grpc
from elastic_step.rpc.auth import AuthInterceptor, caller_name

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
    @functools.wraps(method)
    def wrapper(self, request, context):
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
            context.abort(code, str(e))

    return wrapper


class MasterServicer(master_pb2_grpc.MasterServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator

    @_handler
    def Register(self, request, context):
        return self._coordinator.register(caller_name(context), request)

    @_handler
    def GetPSAddresses(self, request, context):
        addresses = self._coordinator.ps_addresses()
        return master_pb2.GetPSAddressesResponse(ready=all(addresses), addresses=addresses)

    @_handler
    def GetTask(self, request, context):
        return self._coordinator.next_task(caller_name(context), request.worker)

    @_handler
    def ReportTask(self, request, context):
        self._coordinator.report_task(caller_name(context), request)
        return master_pb2.ReportTaskResponse()

    @_handler
    def Heartbeat(self, request, context):
        finished = self._coordinator.heartbeat(caller_name(context), request)
        return master_pb2.HeartbeatResponse(finished=finished)


def start_master_server(
    coordinator: Coordinator, secret: str, host: str, port: int
) -> tuple[grpc.Server, int]:
    """The master's gRPC server, started on ``host:port`` (port 0: a free one), with every
    call authenticated by the job's secret; and the port it took, recorded in the job's
    record for the next master."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16), interceptors=[AuthInterceptor(secret)]
    )
    master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(coordinator), server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:
        raise InputError(f"cannot listen on port {port}: {e}") from e
    server.start()
    with coordinator.lock:
        coordinator.record.set_port(bound)
    return server, bound
