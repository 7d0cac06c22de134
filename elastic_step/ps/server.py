"""The PS process: serves one shard over gRPC, checkpoints it, and restores it when relaunched.

Where a (re)started shard gets its parameters is :class:`RestorePolicy`. SIGTERM or SIGINT
stops serving, writes a final checkpoint of the shard, and exits with 128 + the signal.
Every call must carry the job's credentials (see :mod:`elastic_step.rpc.auth`).
Tests: tests/unit/test_ps.py, tests/unit/test_rpc_errors.py, tests/unit/test_auth.py.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import threading
from concurrent import futures

import grpc
import numpy as np

from elastic_step.errors import InputError, ModelDefinitionError
from elastic_step.model.outer_optimizer import build_outer_optimizer
from elastic_step.model.parameters import embedding_layers
from elastic_step.model.tf_runtime import configure_threads
from elastic_step.output_layout import OutputLayout
from elastic_step.ps import checkpoint
from elastic_step.ps.shard import (
    BadRowsError,
    ParameterShard,
    ShardNotInitializedError,
    TableInitializer,
    TableShape,
)
from elastic_step.rpc import auth, master_pb2, ps_pb2, ps_pb2_grpc
from elastic_step.rpc.master_client import (
    HEARTBEAT_S,
    MasterClient,
    MasterRejectedError,
    MasterUnreachableError,
)
from elastic_step.rpc.ps_client import CHANNEL_OPTIONS
from elastic_step.rpc.tensors import fill, from_proto, rows_from_proto

log = logging.getLogger("elastic_step.ps")

# On SIGTERM, calls in flight get this long to finish before the final checkpoint. The
# master's SIGKILL follows SIGTERM after 3 s: the rest is for the checkpoint.
STOP_GRACE_S = 0.5


class RestorePolicy:
    """Where a (re)started PS shard gets its parameters. These rules live here only.

    (a) A checkpoint exists: the shard restores the newest readable one when it starts
        (:meth:`restore`), and then refuses every Initialize as already filled.
    (b) No checkpoint, and the job is past version 0 (``job_model_version``, which the master
        answers at Register): the shard takes Initialize only from a worker that has pulled a
        version (request ``model_version`` > 0). A fresh worker's values are its initial
        ones: taking them would throw away all training so far.
    (c) No checkpoint, and the job is at version 0 (it is starting): the first Initialize wins.
    """

    def __init__(self, job_model_version: int = 0) -> None:
        self.job_model_version = job_model_version

    def restore(self, shard: ParameterShard, directory: str) -> int | None:
        """Rule (a): fills ``shard`` from the newest readable checkpoint; its version, or None."""
        saved = checkpoint.load_latest(directory)
        if saved is None:
            return None
        shard.restore(*saved)
        return saved[0]

    def accepts(self, offered_version: int) -> bool:
        """Rules (b) and (c): may an empty shard take values a worker offers at this version?"""
        return self.job_model_version == 0 or offered_version > 0


#: Checkpoint writes that fail in a row, on errors that might pass, before the job ends.
CHECKPOINT_ATTEMPTS = 3
#: Errors that retrying cannot cure: the job ends at the first.
_LASTING_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _describe(error: Exception) -> str:
    """The error in words: "no space left on device" for a full disk."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return "no space left on device"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[0].lower() + error.strerror[1:]
    return str(error)


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    def __init__(self, policy: RestorePolicy | None = None) -> None:
        self.shard: ParameterShard | None = None
        self.settings: master_pb2.JobSettings | None = None
        self.policy = policy or RestorePolicy()
        self._checkpoint_lock = threading.Lock()
        #: The version of the newest checkpoint this shard wrote or restored.
        self.saved_version: int | None = None
        self._refusal_logged = False
        #: Why this shard cannot go on (a checkpoint it cannot write), for the master.
        self.failure = ""
        self.report_now = threading.Event()
        self._failed_saves = 0

    def _ready(self, context) -> ParameterShard:
        if self.shard is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "PS is starting")
        return self.shard

    @staticmethod
    def _empty(context, e: ShardNotInitializedError):
        # UNAVAILABLE, as for a shard that is down: the caller reconnects and offers its values.
        context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    def Initialize(self, request, context):
        shard = self._ready(context)
        if not shard.initialized and not self.policy.accepts(request.model_version):
            # Fresh workers retry every second or so until a pulled worker fills the shard.
            if not self._refusal_logged:
                self._refusal_logged = True
                log.warning(
                    "shard %d refuses a fresh worker's initial values: the job is at version "
                    "%d; waiting for a worker that has pulled one",
                    shard.shard,
                    self.policy.job_model_version,
                )
            return ps_pb2.InitializeResponse(accepted=False, model_version=shard.version)
        tables = {t.name: TableShape(t.rows, t.dim, t.dtype) for t in request.tables}
        rows = {r.name: rows_from_proto(r) for r in request.embeddings}
        dense = {t.name: from_proto(t) for t in request.dense}
        state = {t.name: from_proto(t).copy() for t in request.state}
        try:
            accepted = shard.initialize(dense, tables, rows, request.model_version, state)
        except BadRowsError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if accepted:
            log.info("shard initialized from a worker's parameters at version %d", shard.version)
        return ps_pb2.InitializeResponse(accepted=accepted, model_version=shard.version)

    @staticmethod
    def _pull_of(request: ps_pb2.PullRequest) -> tuple[dict[str, np.ndarray], bool]:
        return {t.name: rows_from_proto(t)[0] for t in request.tables}, request.dense

    @staticmethod
    def _answer(response: ps_pb2.PullResponse, version: int, dense: dict, rows: dict) -> None:
        response.initialized, response.model_version = True, version
        for name, value in dense.items():
            fill(response.dense.add(), name, value)
        for name, values in rows.items():
            entry = response.tables.add(name=name)
            fill(entry.values, name, values)

    def Pull(self, request, context):
        shard = self._ready(context)
        try:
            version, dense, rows = shard.pull(*self._pull_of(request))
        except ShardNotInitializedError:
            return ps_pb2.PullResponse(initialized=False)
        except BadRowsError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        response = ps_pb2.PullResponse()
        self._answer(response, version, dense, rows)
        return response

    def Push(self, request, context):
        shard = self._ready(context)
        dense = {t.name: from_proto(t) for t in request.dense}
        rows = {r.name: rows_from_proto(r) for r in request.embeddings}
        state = {t.name: from_proto(t).copy() for t in request.state}
        try:
            version, values, pulled = shard.push(
                dense, rows, request.model_version, state, self._pull_of(request.pull)
            )
        except ShardNotInitializedError as e:
            self._empty(context, e)
        except BadRowsError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        steps = self.settings.checkpoint_steps
        if steps > 0 and version % steps == 0:
            self._checkpoint_at_push()
        response = ps_pb2.PushResponse(model_version=version)
        self._answer(response.pulled, version, values, pulled)
        return response

    def _checkpoint_at_push(self) -> None:
        """The checkpoint a push made due. Failing to write it does not fail the push (the
        worker is not at fault): a full disk, or a store that refuses the write, ends the
        job at once (:attr:`failure`, which the master hears at the next heartbeat); any
        other error is tried again at the next checkpoint, ``CHECKPOINT_ATTEMPTS`` in a row
        at most."""
        try:
            self.save_checkpoint()
        except (OSError, InputError) as e:
            self._failed_saves += 1
            directory = OutputLayout(self.settings.output_dir).checkpoint_dir(
                self.shard.shard, self.shard.num_ps
            )
            lasting = isinstance(e, InputError) or e.errno in _LASTING_ERRNOS
            problem = f"cannot write a checkpoint in {directory}: {_describe(e)}"
            if lasting or self._failed_saves >= CHECKPOINT_ATTEMPTS:
                if not self.failure:
                    log.error("%s", problem)
                    self.failure = problem
                    self.report_now.set()
            else:
                log.warning("%s; trying again at the next checkpoint", problem)
        else:
            self._failed_saves = 0

    def save_checkpoint(self) -> str | None:
        """Checkpoints the shard; the path, or None when this version is already saved."""
        with self._checkpoint_lock:
            shard, settings = self.shard, self.settings
            version, arrays = shard.state_arrays()
            if version == self.saved_version:
                return None
            directory = OutputLayout(settings.output_dir).checkpoint_dir(shard.shard, shard.num_ps)
            path = checkpoint.save(
                directory, version, arrays, settings.keep_checkpoints, settings.fencing_token
            )
            self.saved_version = version
            log.info("checkpoint saved: %s", path)
            return path

    def final_checkpoint(self) -> str | None:
        """The checkpoint before exiting: None when the shard holds nothing (or it is saved)."""
        if self.shard is None or self.settings is None or not self.shard.initialized:
            return None
        return self.save_checkpoint()


class _Stopped(BaseException):
    """SIGTERM or SIGINT arrived: unwinds the main thread wherever it waits, as Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _on_stop_signal(signum, frame) -> None:
    # A second signal ends the process at once, final checkpoint or not.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    raise _Stopped(signum)


def shut_down(
    server: grpc.Server, servicer: ParameterServerServicer, name: str, signum: int
) -> int:
    """Stops serving, lets calls in flight finish, writes the final checkpoint; the exit code.

    Serving stops first, so that no push lands after the checkpoint and is lost.
    """
    log.info("%s: %s received; stopping", name, signal.Signals(signum).name)
    server.stop(grace=STOP_GRACE_S).wait()
    try:
        path = servicer.final_checkpoint()
    except Exception as e:  # the exit code must still say which signal ended the PS
        log.error("%s: final checkpoint failed: %s: %s", name, type(e).__name__, e)
    else:
        if path is None:
            log.info("%s: no final checkpoint (the shard holds nothing new)", name)
    return 128 + signum


def shard_optimizer(definition, settings: master_pb2.JobSettings):
    """The model's own optimizer, or with local steps the outer optimizer."""
    if settings.local_steps > 1:
        return build_outer_optimizer(settings.outer_optimizer or "average")
    return definition.build_optimizer()


def modulates_staleness(settings: master_pb2.JobSettings, optimizer) -> tuple[bool, str]:
    """Whether the shard divides the learning rate by an update's staleness, and why.

    Only where workers push gradients (``--local-steps 1``), and the rate is a constant. With
    local steps a push is a window's change, which the outer optimizer adds once (see
    model/outer_optimizer.py); a schedule's rate cannot be divided for one update.
    """
    import keras

    if not settings.staleness_modulation:
        return False, "--staleness-modulation false"
    if settings.local_steps > 1:
        return False, f"workers push windows of {settings.local_steps} steps, not gradients"
    if not isinstance(optimizer.learning_rate, keras.Variable):
        return False, "the optimizer's learning rate is a schedule"
    return True, "workers push gradients"


def initial_tables(definition, seed: int) -> TableInitializer:
    """Initial table rows from this process's own build of the model (its initializers), so
    that no worker sends a table: every row a worker uses, it pulls first."""
    built: dict[str, np.ndarray] = {}

    def initial(name: str, shape: TableShape) -> np.ndarray:
        import keras

        if not built:
            keras.utils.set_random_seed(seed)
            model = definition.build_model()
            built.update({layer.embeddings.path: layer.embeddings.numpy()
                          for layer in embedding_layers(model)})  # fmt: skip
        values = built.pop(name, None)
        if values is None or values.shape != (shape.rows, shape.dim):
            raise ValueError(f"the model has no table {name} of shape {shape.rows}x{shape.dim}")
        return values

    return initial


def serve(
    master_address: str,
    shard_index: int,
    name: str,
    host: str,
    credentials: auth.Credentials,
    verify_key: str,
) -> int:
    """Runs the PS until the job is finished (0), the master is gone or rejects it (1), or a
    stop signal (128 + signal)."""
    from elastic_step.data.schema import Schema
    from elastic_step.model.definition import load_model_definition

    servicer = ParameterServerServicer()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=CHANNEL_OPTIONS,
        interceptors=[auth.AuthInterceptor(verify_key, tls=credentials.tls is not None)],
    )
    ps_pb2_grpc.add_ParameterServerServicer_to_server(servicer, server)
    port = auth.add_port(server, f"{host}:0", credentials.tls)
    address = f"{host}:{port}"
    master = MasterClient(master_address, credentials)
    # Signal handlers can only be set in the main thread (a PS process runs serve() there).
    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _on_stop_signal) for sig in _STOP_SIGNALS if in_main}
    try:
        server.start()
        reply = master.call(
            "Register",
            master_pb2.RegisterRequest(
                role=master_pb2.PS, name=name, shard=shard_index, address=address, pid=os.getpid()
            ),
        )
        settings = reply.settings
        master.timeout_s = settings.master_timeout_s
        # The schema builds a model that has no variables yet (the initial tables).
        schema = Schema.load(settings.data_dir) if settings.data_dir else None
        definition = load_model_definition(
            settings.model_def, schema, sha256=settings.model_def_sha256
        )
        optimizer = shard_optimizer(definition, settings)
        modulated, why = modulates_staleness(settings, optimizer)
        log.info("staleness modulation %s: %s", "on" if modulated else "off", why)
        shard = ParameterShard(
            shard_index,
            settings.num_ps,
            optimizer,
            modulated,
            initial_tables(definition, settings.seed),
        )
        servicer.policy = RestorePolicy(reply.model_version)
        directory = OutputLayout(settings.output_dir).checkpoint_dir(shard_index, settings.num_ps)
        version = servicer.policy.restore(shard, directory)
        if version is not None:
            servicer.saved_version = version
            log.info("%s restored shard %d from checkpoint version %d", name, shard_index, version)
        else:
            log.info(
                "%s serves shard %d on %s; waiting for parameters (job at version %d)",
                name,
                shard_index,
                address,
                reply.model_version,
            )
        servicer.settings = settings
        servicer.shard = shard
        while True:
            reply = master.call(
                "Heartbeat",
                master_pb2.HeartbeatRequest(
                    name=name, model_version=shard.version, failure=servicer.failure
                ),
            )
            if reply.finished:
                log.info("%s: the job is finished; exiting", name)
                return 0
            credentials.renew(reply.token)
            servicer.report_now.wait(HEARTBEAT_S)  # a failure is told at once
            servicer.report_now.clear()
    except _Stopped as e:
        return shut_down(server, servicer, name, e.signum)
    except (MasterUnreachableError, MasterRejectedError) as e:
        log.error("%s: %s; exiting", name, e)
        return 1
    except ModelDefinitionError as e:  # bad input: the master looks at what is wrong
        log.error("%s: %s; exiting", name, e)
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop(grace=1)
        master.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="elastic-step ps", description="Run one PS shard.")
    parser.add_argument("--master", required=True, help="the master's host:port")
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # Before TensorFlow runs anything: thread pools sized to the container's CPU limit.
    configure_threads()
    try:
        # A PS checks its callers' tokens with the master's public key; it holds no key
        # that makes one, so the user's code that it runs cannot either.
        credentials = auth.Credentials.from_env(args.name)
        verify_key = auth.verify_key_from_env()
    except auth.MissingCredentialsError as e:
        log.error("%s: %s; exiting", args.name, e)
        return 1
    host = os.environ.get("ELASTIC_STEP_HOST", "127.0.0.1")
    return serve(args.master, args.shard, args.name, host, credentials, verify_key)
