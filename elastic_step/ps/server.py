"""The PS process: serves one shard over gRPC, checkpoints it, and restores it when relaunched.

A relaunched PS restores its shard from the newest checkpoint; without one it waits for the
first worker to send the parameters it holds. Training goes on either way.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from concurrent import futures

import grpc

from elastic_step.ps import checkpoint
from elastic_step.ps.shard import ParameterShard, ShardNotInitializedError, TableShape
from elastic_step.rpc import master_pb2, ps_pb2, ps_pb2_grpc
from elastic_step.rpc.master_client import MasterClient, MasterUnreachableError
from elastic_step.rpc.ps_client import CHANNEL_OPTIONS
from elastic_step.rpc.tensors import from_proto, rows_from_proto, rows_to_proto, to_proto

log = logging.getLogger("elastic_step.ps")

HEARTBEAT_S = 2.0


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    def __init__(self) -> None:
        self.shard: ParameterShard | None = None
        self.settings: master_pb2.JobSettings | None = None
        self._checkpoint_lock = threading.Lock()

    def _ready(self, context) -> ParameterShard:
        if self.shard is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "PS is starting")
        return self.shard

    def Initialize(self, request, context):
        shard = self._ready(context)
        tables = {t.name: TableShape(t.rows, t.dim, t.dtype) for t in request.tables}
        rows = {r.name: rows_from_proto(r) for r in request.embeddings}
        dense = {t.name: from_proto(t) for t in request.dense}
        state = {t.name: from_proto(t).copy() for t in request.state}
        accepted = shard.initialize(dense, tables, rows, request.model_version, state)
        if accepted:
            log.info("shard initialized from a worker's parameters at version %d", shard.version)
        return ps_pb2.InitializeResponse(accepted=accepted, model_version=shard.version)

    def PullDense(self, request, context):
        shard = self._ready(context)
        try:
            version, values = shard.pull_dense()
        except ShardNotInitializedError:
            return ps_pb2.PullDenseResponse(initialized=False)
        tensors = [to_proto(n, v) for n, v in values.items()]
        return ps_pb2.PullDenseResponse(initialized=True, model_version=version, dense=tensors)

    def PullEmbeddingRows(self, request, context):
        shard = self._ready(context)
        try:
            tables = []
            for table in request.tables:
                ids, _ = rows_from_proto(table)
                tables.append(rows_to_proto(table.name, ids, shard.pull_rows(table.name, ids)))
        except ShardNotInitializedError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return ps_pb2.PullEmbeddingRowsResponse(tables=tables)

    def PushGradients(self, request, context):
        shard = self._ready(context)
        dense = {t.name: from_proto(t) for t in request.dense}
        rows = {r.name: rows_from_proto(r) for r in request.embeddings}
        state = {t.name: from_proto(t).copy() for t in request.state}
        try:
            version, values, new_rows = shard.push(
                dense, rows, request.model_version, request.return_parameters, state
            )
        except ShardNotInitializedError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        steps = self.settings.checkpoint_steps
        if steps > 0 and version % steps == 0:
            self.save_checkpoint()
        return ps_pb2.PushGradientsResponse(
            model_version=version,
            dense=[to_proto(n, v) for n, v in values.items()],
            embeddings=[rows_to_proto(n, rows[n][0], v) for n, v in new_rows.items()],
        )

    def save_checkpoint(self) -> None:
        with self._checkpoint_lock:
            shard, settings = self.shard, self.settings
            version, arrays = shard.state_arrays()
            directory = checkpoint.checkpoint_dir(settings.output_dir, shard.shard, shard.num_ps)
            path = checkpoint.save(directory, version, arrays, settings.keep_checkpoints)
            log.info("checkpoint saved: %s", path)


def serve(master_address: str, shard_index: int, name: str, host: str) -> int:
    from elastic_step.model_def import load_model_definition

    servicer = ParameterServerServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=CHANNEL_OPTIONS)
    ps_pb2_grpc.add_ParameterServerServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    address = f"{host}:{port}"
    master = MasterClient(master_address)
    try:
        settings = master.call(
            "Register",
            master_pb2.RegisterRequest(
                role=master_pb2.PS, name=name, shard=shard_index, address=address, pid=os.getpid()
            ),
        ).settings
        master.timeout_s = settings.master_timeout_s
        definition = load_model_definition(settings.model_def)
        shard = ParameterShard(
            shard_index,
            settings.num_ps,
            definition.build_optimizer(),
            settings.staleness_modulation,
        )
        saved = checkpoint.load_latest(
            checkpoint.checkpoint_dir(settings.output_dir, shard_index, settings.num_ps)
        )
        if saved is not None:
            shard.restore(*saved)
            log.info("%s restored shard %d from checkpoint version %d", name, shard_index, saved[0])
        else:
            log.info("%s serves shard %d on %s; waiting for parameters", name, shard_index, address)
        servicer.settings = settings
        servicer.shard = shard
        while True:
            reply = master.call(
                "Heartbeat", master_pb2.HeartbeatRequest(name=name, model_version=shard.version)
            )
            if reply.finished:
                log.info("%s: the job is finished; exiting", name)
                return 0
            threading.Event().wait(HEARTBEAT_S)
    except MasterUnreachableError as e:
        log.error("%s: %s; exiting", name, e)
        return 1
    finally:
        server.stop(grace=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="elastic-step ps", description="Run one PS shard.")
    parser.add_argument("--master", required=True, help="the master's host:port")
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    host = os.environ.get("ELASTIC_STEP_HOST", "127.0.0.1")
    return serve(args.master, args.shard, args.name, host)
