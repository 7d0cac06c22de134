"""The worker process: asks the master for tasks and runs them.

A training task reads its record range, and for each batch computes gradients with
``tf.GradientTape`` inside ``tf.function``, pushes them to the PS and takes back the new
parameters. An evaluation task reports the loss and the metrics' states, not predictions.

An error in the user's code fails the task (the master retries it elsewhere, up to its
limit); a PS that goes away is waited for and reconnected, and the batch is pushed again.
A master or PS that answers with an error that retrying cannot cure ends the worker (exit 1).
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from elastic_step.rpc import master_pb2
from elastic_step.rpc.auth import Credentials, MissingSecretError
from elastic_step.rpc.master_client import (
    MasterClient,
    MasterRejectedError,
    MasterUnreachableError,
)
from elastic_step.rpc.ps_client import PSClient, PSError, PSUnavailableError
from elastic_step.rpc.tensors import to_proto
from elastic_step.tf_runtime import configure_threads

log = logging.getLogger("elastic_step.worker")

HEARTBEAT_S = 2.0
# Waiting for the PS to come back: the first retry is quick, later ones back off to the cap.
PS_RETRY_FIRST_S = 0.25
PS_RETRY_MAX_S = 2.0


class UserCodeError(Exception):
    """The model definition's code failed while running a task."""


class Worker:
    def __init__(self, master: MasterClient, name: str, credentials: Credentials) -> None:
        self.master = master
        self.name = name
        self.credentials = credentials
        self.finished = threading.Event()
        self.ps: PSClient | None = None
        self._streams: dict = {}
        #: The lease of the task in hand and the batches finished on it, for heartbeats.
        self._lease_id = 0
        self._batches_done = 0
        # One push at a time, off the main thread, so it overlaps the next step's compute.
        self._pusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="push")

    # -- setup --

    def setup(self) -> None:
        import keras
        import tensorflow as tf

        from elastic_step.data.schema import Schema
        from elastic_step.model_def import load_model_definition
        from elastic_step.worker.parameters import ModelParameters

        reply = self.master.call(
            "Register",
            master_pb2.RegisterRequest(role=master_pb2.WORKER, name=self.name, pid=os.getpid()),
        )
        self.settings = reply.settings
        self.master.timeout_s = self.settings.master_timeout_s
        self.schema = Schema.load(self.settings.data_dir)
        self.definition = load_model_definition(self.settings.model_def, self.schema)
        # The same seed in every worker: the first to reach an empty PS gives the initial values.
        keras.utils.set_random_seed(self.settings.seed)
        self.model = self.definition.build_model()
        self.metrics = self.definition.build_metrics()
        self.parameters = ModelParameters(self.model)
        loss_fn = self.definition.loss
        model, variables = self.model, self.parameters.variables

        @tf.function(reduce_retracing=True)
        def train_step(features, labels):
            with tf.GradientTape() as tape:
                outputs = model(features, training=True)
                loss = loss_fn(labels, outputs)
                if model.losses:
                    loss += tf.add_n(model.losses)
            return loss, tape.gradient(loss, variables)

        @tf.function(reduce_retracing=True)
        def eval_step(features, labels):
            outputs = model(features, training=False)
            return outputs, loss_fn(labels, outputs)

        self._train_step, self._eval_step = train_step, eval_step
        self.connect_ps()

    def connect_ps(self) -> None:
        """Waits for every PS shard, offers them this worker's parameters, and pulls theirs.

        Retries with capped exponential backoff while a shard is away or empty, and raises
        :class:`PSUnavailableError` after the master timeout. A :class:`PSError` is raised at
        once: a shard that rejects the calls would reject them again.
        """
        deadline = time.monotonic() + self.settings.master_timeout_s
        previous = self.ps.addresses if self.ps else None
        delay = PS_RETRY_FIRST_S
        while True:
            reply = self.master.call("GetPSAddresses", master_pb2.GetPSAddressesRequest())
            if reply.ready:
                ps = PSClient(list(reply.addresses), self.credentials)
                try:
                    version = self.ps.model_version if self.ps else 0
                    accepted = ps.initialize(
                        self.parameters.dense_values(),
                        self.parameters.table_specs(),
                        self.parameters.table_values(),
                        version,
                        self.parameters.state_values(),
                    )
                    self.parameters.pull(ps)
                except PSUnavailableError as e:
                    ps.close()
                    if time.monotonic() > deadline:
                        raise
                    log.info("%s: waiting for the PS (%s)", self.name, e)
                except Exception:
                    ps.close()
                    raise
                else:
                    if self.ps:
                        self.ps.close()
                    self.ps = ps
                    for shard in np.flatnonzero(accepted):
                        log.info("%s: PS shard %d took this worker's parameters", self.name, shard)
                    if previous != ps.addresses:
                        log.info("%s: connected to PS %s", self.name, ", ".join(ps.addresses))
                    return
            now = time.monotonic()
            if now > deadline:
                raise PSUnavailableError(-1, "the PS did not come back in time")
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, PS_RETRY_MAX_S)

    # -- the loop --

    def run(self) -> int:
        self.setup()
        threading.Thread(target=self._heartbeats, daemon=True).start()
        while True:
            task = self.master.call("GetTask", master_pb2.GetTaskRequest(worker=self.name))
            if task.kind == master_pb2.Task.FINISHED:
                log.info("%s: the job is finished; exiting", self.name)
                for stream in self._streams.values():
                    stream.close()
                self.finished.set()
                return 0
            if task.kind == master_pb2.Task.WAIT:
                time.sleep(0.3)
                continue
            self._lease_id, self._batches_done = task.lease_id, 0
            report = master_pb2.ReportTaskRequest(
                worker=self.name, task_id=task.id, lease_id=task.lease_id, ok=True
            )
            try:
                if task.kind == master_pb2.Task.TRAIN:
                    self.train(task)
                else:
                    self.evaluate(task, report)
            except UserCodeError as e:
                log.error("%s: task %d failed: %s", self.name, task.id, e)
                report = master_pb2.ReportTaskRequest(
                    worker=self.name,
                    task_id=task.id,
                    lease_id=task.lease_id,
                    ok=False,
                    error=str(e),
                )
            report.model_version = self.ps.model_version
            self._lease_id = 0
            self.master.call("ReportTask", report)

    def _heartbeats(self) -> None:
        while not self.finished.is_set():
            try:
                reply = self.master.call(
                    "Heartbeat",
                    master_pb2.HeartbeatRequest(
                        name=self.name,
                        model_version=self.ps.model_version if self.ps else 0,
                        lease_id=self._lease_id,
                        batches_done=self._batches_done,
                    ),
                )
            except MasterUnreachableError:
                return
            except MasterRejectedError as e:
                # The main thread's next call to the master ends the worker.
                log.error("%s: heartbeats stopped: %s", self.name, e)
                return
            if reply.finished:
                self.finished.set()
            time.sleep(HEARTBEAT_S)

    # -- tasks --

    def _batches(self, task, mode: str):
        from elastic_step.data.tfrecord import read_records
        from elastic_step.worker.stream import BatchStream, FeedContractError

        records = read_records(task.shard, task.start, task.end)
        try:
            stream = self._streams.get(mode)
            if stream is None or stream.broken:
                stream = self._streams[mode] = BatchStream(
                    self.definition.feed, mode, self.schema, self.settings.batch_size
                )
            yield from stream.run(records)
        except FeedContractError as e:
            raise UserCodeError(str(e)) from e

    def _refresh(self) -> None:
        while True:
            try:
                self.parameters.pull(self.ps)
                return
            except PSUnavailableError as e:
                log.warning("%s: %s; reconnecting", self.name, e)
                self.connect_ps()

    def train(self, task) -> None:
        """Trains on the task's batches; each step's push overlaps the next step's compute.

        Step k is computed on the parameters that push k-2 returned while push k-1 is on
        the wire: one more step of staleness, which asynchronous updates accept, for about
        max(compute, round trip) per step instead of their sum.
        """
        self._refresh()
        in_flight = None
        try:
            for features, labels in self._batches(task, "train"):
                try:
                    _, grads = self._train_step(features, labels)
                except Exception as e:
                    raise UserCodeError(f"the training step failed: {type(e).__name__}: {e}") from e
                dense, rows = self.parameters.split_gradients(grads)
                state = self.parameters.state_values()
                if in_flight is not None:
                    self._finish_push(*in_flight)
                in_flight = (
                    self._pusher.submit(self.ps.push, dense, rows, True, state),
                    dense,
                    rows,
                    state,
                )
                self._batches_done += 1
        finally:
            if in_flight is not None:
                self._finish_push(*in_flight)

    def _finish_push(self, future, dense, rows, state) -> None:
        """Waits for a push, pushing again after a reconnect, and takes the new values."""
        while True:
            try:
                new_dense, new_rows = future.result()
                break
            except PSUnavailableError as e:
                log.warning("%s: %s; reconnecting", self.name, e)
                self.connect_ps()
                future = self._pusher.submit(self.ps.push, dense, rows, True, state)
        self.parameters.assign_dense(new_dense)
        self.parameters.assign_rows(new_rows)

    def evaluate(self, task, report: master_pb2.ReportTaskRequest) -> None:
        self._refresh()
        for metric in self.metrics.values():
            metric.reset_state()
        loss_sum, count = 0.0, 0
        for features, labels in self._batches(task, "evaluate"):
            try:
                outputs, loss = self._eval_step(features, labels)
                for metric in self.metrics.values():
                    metric.update_state(labels, outputs)
            except Exception as e:
                raise UserCodeError(f"evaluation failed: {type(e).__name__}: {e}") from e
            n = int(np.shape(labels)[0])
            loss_sum += float(loss) * n
            count += n
            self._batches_done += 1
        report.loss_sum, report.example_count = loss_sum, count
        for name, metric in self.metrics.items():
            for i, variable in enumerate(metric.variables):
                report.metric_states.append(to_proto(f"{name}/{i}", np.asarray(variable.numpy())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="elastic-step worker", description="Run one worker.")
    parser.add_argument("--master", required=True, help="the master's host:port")
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # Before TensorFlow runs anything: thread pools sized to the container's CPU limit.
    configure_threads()
    try:
        credentials = Credentials.from_env(args.name)
    except MissingSecretError as e:
        log.error("%s: %s; exiting", args.name, e)
        return 1
    worker = Worker(MasterClient(args.master, credentials), args.name, credentials)
    try:
        return worker.run()
    except (MasterUnreachableError, MasterRejectedError, PSUnavailableError, PSError) as e:
        log.error("%s: %s; exiting", args.name, e)
        return 1
