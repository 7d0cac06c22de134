"""The master's gRPC service: a thin layer over :class:`elastic_step.master.job.Job`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from elastic_step.rpc import master_pb2, master_pb2_grpc

if TYPE_CHECKING:
    from elastic_step.master.job import Job


class UnknownInstanceError(Exception):
    pass


class MasterServicer(master_pb2_grpc.MasterServicer):
    def __init__(self, job: Job) -> None:
        self._job = job

    def Register(self, request, context):
        try:
            settings = self._job.register(request)
        except UnknownInstanceError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return master_pb2.RegisterResponse(settings=settings)

    def GetPSAddresses(self, request, context):
        addresses = self._job.ps_addresses()
        return master_pb2.GetPSAddressesResponse(ready=all(addresses), addresses=addresses)

    def GetTask(self, request, context):
        return self._job.next_task(request.worker)

    def ReportTask(self, request, context):
        self._job.report_task(request)
        return master_pb2.ReportTaskResponse()

    def Heartbeat(self, request, context):
        finished = self._job.heartbeat(request.name, request.model_version)
        return master_pb2.HeartbeatResponse(finished=finished)
