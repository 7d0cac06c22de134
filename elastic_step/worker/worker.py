"""The worker process: asks the master for tasks and runs them.

One call to the master per task (``NextTask``): made as a task starts, it reports the task
before and brings the next, whose records are read and queued in the input pipeline while
this task trains (:mod:`elastic_step.worker.stream`; what a task's records are, and their
order: :mod:`elastic_step.worker.task_records`). A training task's batches run in
windows of ``--local-steps`` steps against the PS (see :mod:`elastic_step.worker.windows`);
for a model without embedding tables and K > 1, each window is one compiled call that takes
its batches from the pipeline itself. An evaluation task reports the loss and the metrics'
states, not predictions; for a model without tables its batches, too, are taken in compiled
calls. In a prediction job (``elastic-step predict``) the worker loads the
trained model and writes each task's predictions (:mod:`elastic_step.worker.predictor`); it
has no PS.

An error in the user's code fails the task (the master retries it elsewhere, up to its
limit); a PS that goes away is waited for and reconnected, and the window's update is pushed
again.
A master or PS that answers with an error that retrying cannot cure ends the worker (exit 1).
Before its first task a worker builds its input pipelines and compiles its windows
(:meth:`Worker.prepare_ahead`); a process the master started as a standby does that, then
waits for a worker slot.
Tests: tests/unit/test_rpc_errors.py; killed mid-epoch in tests/e2e/test_fault_tolerance.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from elastic_step.errors import InputError, ModelDefinitionError
from elastic_step.model.tf_runtime import configure_threads
from elastic_step.rpc import master_pb2
from elastic_step.rpc.auth import Credentials, MissingCredentialsError
from elastic_step.rpc.master_client import (
    HEARTBEAT_S,
    MasterClient,
    MasterRejectedError,
    MasterUnreachableError,
)
from elastic_step.rpc.ps_client import PSClient, PSError, PSUnavailableError, Traffic
from elastic_step.rpc.tensors import fill
from elastic_step.worker.task_records import TaskRecords
from elastic_step.worker.windows import TaskLoss, UserCodeError, WindowTrainer

if TYPE_CHECKING:
    from elastic_step.worker.stream import BatchStream

log = logging.getLogger("elastic_step.worker")

#: The input pipeline each kind of task reads through.
_MODES = {
    master_pb2.Task.TRAIN: "train",
    master_pb2.Task.EVALUATE: "evaluate",
    master_pb2.Task.PREDICT: "predict",
}


@dataclass
class Fetched:
    """A task as the worker received it: its records (or the error reading them raised,
    raised when the task runs), and the input pipeline they were queued in, if any, as how
    many batches."""

    task: master_pb2.Task
    records: list[bytes] | Exception
    queued_in: BatchStream | None = None
    batches: int = 0


# Waiting for the PS to come back: the first retry is quick, later ones back off to the cap.
PS_RETRY_FIRST_S = 0.25
PS_RETRY_MAX_S = 2.0
#: How long a worker told to WAIT waits before it asks again.
WAIT_S = 0.3
#: A standby's CPU niceness while it loads and waits: where it shares cores with the workers
#: (one machine), its loading must not slow them. At 160 epochs of bench/goodput.py's digits
#: job, an idle standby at the workers' priority made the undisturbed job 1.15x slower.
STANDBY_NICENESS = 10
#: How often a standby asks whether it has a worker slot: a replacement starts within this.
STANDBY_POLL_S = 0.2


def set_niceness(value: int) -> bool:
    """Sets every thread of this process to CPU niceness ``value`` (on Linux niceness is a
    thread's, and a new thread takes its creator's); says whether it could. Raising the
    priority back needs CAP_SYS_NICE, which a pod's user may lack: its worker then keeps the
    lower one, which matters little where the pod has CPU of its own."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, value)
        except ProcessLookupError:
            continue  # the thread ended since
        except OSError:
            return False
    return True


class Worker:
    def __init__(self, master: MasterClient, name: str, credentials: Credentials) -> None:
        self.master = master
        self.name = name
        self.credentials = credentials
        self.finished = threading.Event()
        self.ps: PSClient | None = None
        self.predictor = None  # a prediction job's (see setup)
        self._streams: dict = {}
        #: The lease of the task in hand and the batches finished on it, for heartbeats.
        self._lease_id = 0
        self._batches_done = 0
        self.steps_trained = 0
        self.traffic = Traffic()  # to every PS this worker connects to

    # -- setup --

    def setup(self) -> bool:
        """Registers, then loads the job's settings, data schema and model; says whether
        the master started this process as a standby. A worker then connects to the PS
        (:meth:`connect_ps`); a standby first waits for a slot (:meth:`wait_for_a_slot`)."""
        from elastic_step.data.schema import Schema
        from elastic_step.model.definition import load_model_definition
        from elastic_step.model.parameters import ModelParameters
        from elastic_step.model.tf_runtime import set_random_seed
        from elastic_step.worker.steps import Steps

        reply = self._register()
        if reply.standby:
            set_niceness(STANDBY_NICENESS)
        self.settings = reply.settings
        self._task_records = TaskRecords(
            self.settings.seed, lambda: self.schema.shard_paths(self.settings.data_dir, "train")
        )
        self.master.timeout_s = self.settings.master_timeout_s
        self.local_steps = max(1, self.settings.local_steps)
        self.schema = Schema.load(self.settings.data_dir)
        self.definition = load_model_definition(
            self.settings.model_def, self.schema, sha256=self.settings.model_def_sha256
        )
        # The same seed in every worker, as the final model is built on the master.
        set_random_seed(self.settings.seed)
        if self.settings.predict_model_dir:
            from elastic_step.model.serving import trained_model_of
            from elastic_step.worker.predictor import Predictor

            model = trained_model_of(self.settings.predict_model_dir, self.definition)
            parts = self.settings.predict_parts_dir
            self.predictor = Predictor(model, self.schema, parts, on_batch=self._count_batch)
            return reply.standby
        self.model = self.definition.build_model()
        self.parameters = ModelParameters(self.model)
        local_optimizer = self.definition.build_optimizer() if self.local_steps > 1 else None
        steps = Steps(
            self.model,
            self.definition.loss,
            self.parameters,
            local_optimizer,
            metrics=self.definition.build_metrics(),
        )
        self.trainer = WindowTrainer(
            self.parameters, steps, self.local_steps, self, on_step=self._count_batch
        )
        return reply.standby

    def _register(self, *, waiting_for_slot: bool = False) -> master_pb2.RegisterResponse:
        request = master_pb2.RegisterRequest(
            role=master_pb2.WORKER,
            name=self.name,
            pid=os.getpid(),
            waiting_for_slot=waiting_for_slot,
        )
        return self.master.call("Register", request)

    def prepare_ahead(self) -> None:
        """The last step of loading, before the first task: the input pipelines built and
        the training and evaluation windows compiled (on zero steps: they run nothing), so
        that neither the first task nor the first evaluation round waits for them; about 1 s
        for the digits example on 2 cores. A standby does it while it waits for a slot. An
        error is logged and left for the first task to meet, where it fails the task as the
        model's code."""
        started = time.monotonic()
        if self.predictor:
            modes = ["predict"]
        else:  # evaluation tasks come only from a validation split
            modes = ["train", *(["evaluate"] if self.schema.splits.get("validation") else [])]
        try:
            streams = {mode: self._stream(mode) for mode in modes}
            compiled = []
            if self.predictor is None:
                iterators = {mode: stream.iterator for mode, stream in streams.items()}
                compiled = self.trainer.steps.warm_up(
                    iterators.get("train"), iterators.get("evaluate")
                )
        except Exception as e:
            log.warning("%s: could not prepare ahead (%s: %s)", self.name, type(e).__name__, e)
            return
        log.info(
            "%s: built its input pipelines%s in %.1f s",
            self.name,
            f" and compiled its {' and '.join(compiled)} window{'s' * (len(compiled) > 1)}"
            if compiled
            else "",
            time.monotonic() - started,
        )

    def wait_for_a_slot(self) -> bool:
        """A standby's wait: everything is loaded; registers again every ``STANDBY_POLL_S``
        until the master gives it a worker slot (True) or the job is over (False)."""
        log.info(
            "%s: a standby, ready (TensorFlow and the model loaded); waiting for a slot", self.name
        )
        started = time.monotonic()
        while not self.finished.wait(STANDBY_POLL_S):
            if not self._register(waiting_for_slot=True).standby:
                restored = set_niceness(0)  # a worker now: the others' priority
                log.info(
                    "%s: given a worker slot after %.1f s as a standby%s",
                    self.name,
                    time.monotonic() - started,
                    "" if restored else f" (it keeps niceness {STANDBY_NICENESS})",
                )
                return True
        return False

    def _count_batch(self) -> None:
        self._batches_done += 1
        self.steps_trained += 1

    def connect_ps(self) -> None:
        """Waits for every PS shard, and offers an empty one this worker's dense values and
        the table rows it has pulled (a relaunched shard without a checkpoint).

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
                ps = PSClient(list(reply.addresses), self.credentials, traffic=self.traffic)
                try:
                    accepted = []
                    if not all(ps.initialized()):
                        accepted = ps.initialize(
                            self.parameters.dense_values(),
                            self.parameters.table_specs(),
                            self.parameters.pulled_rows(),
                            self.ps.model_version if self.ps else 0,
                            self.parameters.state_values(),
                        )
                    if not all(ps.initialized()):  # refused: the shard waits for a pulled worker
                        raise PSUnavailableError(accepted.index(False), "holds no parameters")
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
        """Runs tasks until the master says the job is finished.

        One call per task: while a task trains, a background thread reports the previous
        one, receives the next and reads its records, so the next task is ready when this
        one ends (:meth:`_exchange`).
        """
        # Heartbeats from the start: they tell a standby, too, when the job is over.
        threading.Thread(target=self._heartbeats, daemon=True).start()
        standby = self.setup()
        self.prepare_ahead()
        if standby and not self.wait_for_a_slot():
            return self._finish()
        if self.predictor is None:
            self.connect_ps()
        log.info("%s: ready; asking for tasks", self.name)
        with ThreadPoolExecutor(1, thread_name_prefix="next-task") as calls:
            report = None  # the outcome of the last task, not yet sent
            fetched = self._exchange(None, held=None)
            while True:
                task = fetched.task
                if task.kind == master_pb2.Task.FINISHED:
                    if report is not None:  # its outcome still counts
                        self._exchange(report, held=None, report_only=True)
                    return self._finish()
                if task.kind == master_pb2.Task.WAIT:
                    if report is None:
                        time.sleep(WAIT_S)
                    fetched = self._exchange(report, held=None)
                    report = None
                    continue
                upcoming = calls.submit(self._exchange, report, held=task.lease_id)
                report = self._run_task(fetched)
                fetched = upcoming.result()

    def _exchange(
        self, report: master_pb2.TaskReport | None, *, held: int | None, report_only: bool = False
    ) -> Fetched:
        """Sends ``report`` and gets the next task, holding the lease ``held``; reads the
        task's records and queues them in the input pipeline of its mode, if it has one,
        so that they are parsed while the task in hand trains."""
        request = master_pb2.NextTaskRequest(worker=self.name, report_only=report_only)
        if report is not None:
            request.report.CopyFrom(report)
        if held is not None:
            request.held_leases.append(held)
        task = self.master.call("NextTask", request)
        if task.kind not in _MODES:
            return Fetched(task, [])
        try:
            records = self._task_records.read(task)
        except Exception as e:
            return Fetched(task, e)
        stream = self._streams.get(_MODES[task.kind])
        if stream is None or stream.broken:
            return Fetched(task, records)
        return Fetched(task, records, stream, stream.put(records))

    def _run_task(self, fetched: Fetched) -> master_pb2.TaskReport:
        task = fetched.task
        self._lease_id, self._batches_done = task.lease_id, 0
        report = master_pb2.TaskReport(task_id=task.id, lease_id=task.lease_id, ok=True)
        try:
            if task.kind == master_pb2.Task.SAVE_MODEL:
                self.save_model(task)
                return self._reported(report)
            if isinstance(fetched.records, Exception):
                raise fetched.records
            stream = self._stream(_MODES[task.kind])
            batches = fetched.batches
            if fetched.queued_in is not stream:  # not queued, or in a stream since rebuilt
                batches = stream.put(fetched.records)
            records = len(fetched.records)
            if task.kind == master_pb2.Task.TRAIN:
                self.train(stream, records, batches, report)
            elif task.kind == master_pb2.Task.PREDICT:
                self.predictor.predict(task, self._batches(stream, records))
            else:
                self.evaluate(stream, records, batches, report)
        except (UserCodeError, InputError) as e:  # the model's code, or the task's data
            # The cause's traceback (a compiled step's names the user's frames) stays here;
            # the master gets the one line.
            log.error("%s: task %d failed: %s", self.name, task.id, e, exc_info=e.__cause__)
            report = master_pb2.TaskReport(
                task_id=task.id, lease_id=task.lease_id, ok=False, error=str(e)
            )
        return self._reported(report)

    def _reported(self, report: master_pb2.TaskReport) -> master_pb2.TaskReport:
        report.model_version = self.ps.model_version if self.ps else 0
        self._lease_id = 0
        return report

    def save_model(self, task: master_pb2.Task) -> None:
        """The job's last task: the PS's model pulled whole (or the kept round's weights
        read, with --keep-best) and written to the job's output as ``model.keras`` and
        ``saved_model/``, each through an atomic rename. Each of the three steps counts as a
        batch done, which renews the task's lease. A failure other than the PS's is reported
        (the master hands the save to the next worker that asks, up to its retry limit)."""
        from elastic_step.model.serving import save_trained_model
        from elastic_step.model.weights_file import read_weights

        started = time.monotonic()
        try:
            if task.weights:
                self.model.set_weights(read_weights(task.weights))
            else:
                self.trainer.pull_all()
            self._batches_done += 1
            save_trained_model(
                self.model, self.definition, self.settings.output_dir, on_written=self._saved_one
            )
        except (PSUnavailableError, PSError):
            raise
        except Exception as e:
            raise UserCodeError.of("saving the model", e) from e
        log.info("%s: saved the model in %.1f s", self.name, time.monotonic() - started)

    def _saved_one(self) -> None:
        self._batches_done += 1

    def _finish(self) -> int:
        if self.ps is None:
            log.info("%s: the job is finished; exiting", self.name)
        else:
            traffic = self.traffic
            log.info(
                "%s: the job is finished; exiting. PS traffic: %d training steps, "
                "%d calls, %d bytes sent, %d bytes received",
                self.name,
                self.steps_trained,
                traffic.calls,
                traffic.sent,
                traffic.received,
            )
        for stream in self._streams.values():
            stream.close()
        self.finished.set()
        return 0

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
            self.credentials.renew(reply.token)  # the master's channel and the PS's share it
            time.sleep(HEARTBEAT_S)

    # -- tasks --

    def _stream(self, mode: str) -> BatchStream:
        """The input pipeline of ``mode``, built anew after a feed error broke the last."""
        from elastic_step.worker.stream import BatchStream, FeedContractError

        stream = self._streams.get(mode)
        if stream is None or stream.broken:
            try:
                stream = BatchStream(
                    self.definition.feed, mode, self.schema, self.settings.batch_size
                )
            except FeedContractError as e:
                raise UserCodeError(str(e)) from e
            self._streams[mode] = stream
        return stream

    def _batches(self, stream: BatchStream, records: int):
        from elastic_step.worker.stream import FeedContractError

        try:
            yield from stream.run(records)
        except FeedContractError as e:
            raise UserCodeError(str(e)) from e

    def train(
        self, stream: BatchStream, records: int, batches: int, report: master_pb2.TaskReport
    ) -> None:
        if self.trainer.steps.local_window is None:
            loss = self.trainer.train(self._batches(stream, records))
        else:  # K steps per compiled call, the batches taken in the graph
            loss = self._queued(
                stream,
                records,
                batches,
                lambda: self.trainer.train_queued(stream.iterator, batches),
            )
        report.train_loss, report.train_examples = loss.mean, loss.examples
        report.train_metrics.update(loss.metrics)

    def evaluate(
        self, stream: BatchStream, records: int, batches: int, report: master_pb2.TaskReport
    ) -> None:
        steps = self.trainer.steps
        steps.reset_metrics()
        if steps.evaluation_window is None:
            loss_sum, count = self._evaluate_one_by_one(stream, records)
        else:  # the batches taken in the graph
            loss = self._queued(
                stream,
                records,
                batches,
                lambda: self.trainer.evaluate_queued(stream.iterator, batches, self._evaluated),
            )
            loss_sum, count = loss.loss_sum, loss.examples
        report.loss_sum, report.example_count = loss_sum, count
        for name, metric in steps.metrics.items():
            for i, variable in enumerate(metric.variables):
                fill(report.metric_states.add(), f"{name}/{i}", np.asarray(variable.numpy()))

    def _evaluate_one_by_one(self, stream: BatchStream, records: int) -> tuple[float, int]:
        """A model with tables: each batch's rows pulled, then the batch evaluated."""
        steps = self.trainer.steps
        loss_sum, count = 0.0, 0
        for features, labels in self.trainer.evaluation_batches(self._batches(stream, records)):
            try:
                loss = steps.evaluate(features, labels)  # adds the batch to the metrics
            except Exception as e:
                raise UserCodeError.of("evaluation", e) from e
            n = int(np.shape(labels)[0])
            loss_sum += float(loss) * n
            count += n
            self._batches_done += 1
        return loss_sum, count

    def _evaluated(self, batches: int) -> None:
        self._batches_done += batches

    def _queued(
        self, stream: BatchStream, records: int, batches: int, run: Callable[[], TaskLoss]
    ) -> TaskLoss:
        """``run`` a task's ``batches`` queued batches of ``records`` records in the graph;
        the stream is broken when it fails or the examples do not add up to the records."""
        try:
            loss = run()
        except BaseException:
            stream.broken = True  # what it left queued is unknown
            raise
        if loss.examples != records:
            stream.broken = True
            raise UserCodeError(
                f"the feed gave {loss.examples} examples for {records} records in "
                f"{batches} batches; it must map each batch of records to one batch of as "
                "many examples"
            )
        return loss


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
    except MissingCredentialsError as e:
        log.error("%s: %s; exiting", args.name, e)
        return 1
    worker = Worker(MasterClient(args.master, credentials), args.name, credentials)
    try:
        return worker.run()
    except (MasterUnreachableError, MasterRejectedError, PSUnavailableError, PSError) as e:
        log.error("%s: %s; exiting", args.name, e)
        return 1
    except ModelDefinitionError as e:  # bad input: the master looks at what is wrong
        log.error("%s: %s; exiting", args.name, e)
        return 2
