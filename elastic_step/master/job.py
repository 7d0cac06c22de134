"""The master of one training job: it runs in the ``elastic-step train`` process.

It checks the inputs, starts (or, after a restart, adopts) the PS and workers through a
backend, serves tasks over gRPC, replaces what dies, persists its state after every change,
and at the end saves the model and the summary. SIGTERM or SIGINT stops every instance and
exits non-zero; running the same command again resumes the job.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import sys
import threading
import time
from concurrent import futures

import grpc

from elastic_step.backends import BackendParams, Role, create_backend
from elastic_step.backends.api import Backend, LaunchSpec
from elastic_step.data import storage
from elastic_step.data.schema import Schema
from elastic_step.errors import InputError, JobFailedError
from elastic_step.master import reports
from elastic_step.master.config import TrainConfig
from elastic_step.master.evaluation import metric_values
from elastic_step.master.instance_manager import InstanceManager, MembershipSettings
from elastic_step.master.servicer import MasterServicer, UnknownInstanceError
from elastic_step.master.state_store import StateStore, create_state_store
from elastic_step.master.task_manager import EvaluationResult, TaskKind, TaskManager, TaskSettings
from elastic_step.model_def import ModelDefinition
from elastic_step.rpc import master_pb2, master_pb2_grpc
from elastic_step.rpc.tensors import from_proto

log = logging.getLogger("elastic_step.master")

MODEL_DEF_COPY = "model_def.py"
TICK_S = 0.2
STATUS_EVERY_S = 1.0
PROGRESS_EVERY_S = 5.0
STOP_GRACE_S = 3.0


class Job:
    def __init__(
        self,
        config: TrainConfig,
        schema: Schema,
        definition: ModelDefinition,
        store: StateStore | None = None,
    ) -> None:
        self.config = config
        self.schema = schema
        self.definition = definition
        self.output = config.output
        self.store = store or create_state_store("file", config.output)
        self.lock = threading.RLock()
        self.phase = "starting"
        self.error: str | None = None
        self._stop_signal: int | None = None
        self._ps_addresses = [""] * config.ps
        self._registered: set[str] = set()
        self._history: list[dict] = []
        self._master_restarts = 0
        self._train_window: list[float] | None = None  # [first done, last done, records since]
        self._port = config.port
        self._save_deadline: float | None = None
        self._next_save_log = 0.0
        self.tasks = TaskManager(self._task_settings())
        self.backend: Backend | None = None
        self.instances: InstanceManager | None = None

    # -- settings --

    def _task_settings(self) -> TaskSettings:
        c = self.config
        return TaskSettings(
            train_shards=self.schema.shard_paths(c.data, "train"),
            validation_shards=self.schema.shard_paths(c.data, "validation"),
            records_per_task=c.records_per_task,
            epochs=c.epochs,
            evaluation_steps=c.evaluation_steps,
            max_task_retries=c.max_task_retries,
            lease_s=c.task_lease_s,
            seed=c.seed,
        )

    def job_settings(self) -> master_pb2.JobSettings:
        c = self.config
        return master_pb2.JobSettings(
            model_def=storage.join(self.output, MODEL_DEF_COPY),
            data_dir=c.data,
            output_dir=self.output,
            batch_size=c.batch_size,
            num_ps=c.ps,
            seed=c.seed,
            checkpoint_steps=c.checkpoint_steps,
            keep_checkpoints=c.keep_checkpoints,
            staleness_modulation=c.staleness_modulation,
            master_timeout_s=c.master_timeout_s,
        )

    def _launch_spec(self, role: Role, slot: int, name: str) -> LaunchSpec:
        address = f"{self.backend.master_host()}:{self._port}"
        if role is Role.PS:
            args = ["ps", "--master", address, "--shard", str(slot), "--name", name]
        else:
            args = ["worker", "--master", address, "--name", name]
        return LaunchSpec(name, role, slot, [sys.executable, "-m", "elastic_step", *args])

    # -- state --

    def _state(self) -> dict:
        return {
            "fingerprint": self._fingerprint(),
            "phase": self.phase,
            "error": self.error,
            "port": self._port,
            "ps_addresses": self._ps_addresses,
            "tasks": self.tasks.to_state(),
            "instances": self.instances.to_state(),
            "history": self._history,
            "master_restarts": self._master_restarts,
            "train_window": self._train_window,
        }

    def _fingerprint(self) -> str:
        source = hashlib.sha256(self.definition.source.encode()).hexdigest()[:16]
        return f"{self.config.fingerprint()}-{source}"

    def persist(self) -> None:
        with self.lock:
            self.store.save(self._state())

    def _restore(self, state: dict) -> None:
        if state["fingerprint"] != self._fingerprint():
            raise InputError(
                f"{self.output} holds a job with other settings (the model definition, --data, "
                "--epochs, --batch-size, --ps, --seed or --records-per-task differ); "
                "use a new --output to start a new job"
            )
        self.tasks = TaskManager.from_state(self._task_settings(), state["tasks"])
        self.instances.restore(state["instances"])
        self._port = state["port"]
        self._ps_addresses = state["ps_addresses"]
        self._history = state["history"]
        self._master_restarts = state["master_restarts"] + 1
        self._train_window = state["train_window"]

    # -- gRPC handlers (called from server threads) --

    def register(self, request: master_pb2.RegisterRequest) -> master_pb2.JobSettings:
        with self.lock:
            instance = self.instances.instances.get(request.name)
            if instance is None or instance.state.ended:
                raise UnknownInstanceError(f"{request.name} is not an instance of this job")
            instance.pid = request.pid or instance.pid
            if request.role == master_pb2.PS:
                self._ps_addresses[request.shard] = request.address
                log.info(
                    "%s serves PS shard %d at %s", request.name, request.shard, request.address
                )
            elif request.name not in self._registered:
                log.info("%s registered (pid %d)", request.name, request.pid)
            self._registered.add(request.name)
            self.persist()
            return self.job_settings()

    def ps_addresses(self) -> list[str]:
        with self.lock:
            return list(self._ps_addresses)

    def _over(self) -> bool:
        return self.phase in ("succeeded", "failed", "interrupted")

    def next_task(self, worker: str) -> master_pb2.Task:
        with self.lock:
            instance = self.instances.instances.get(worker)
            if self._over() or instance is None or instance.state.ended:
                return master_pb2.Task(kind=master_pb2.Task.FINISHED)
            # A worker runs one task at a time: what it still holds was never received.
            self.tasks.recover_tasks(worker)
            task = self.tasks.get_task(worker)
            if task is None:
                return master_pb2.Task(kind=master_pb2.Task.WAIT)
            self.persist()
            kind = (
                master_pb2.Task.TRAIN if task.kind is TaskKind.TRAIN else master_pb2.Task.EVALUATE
            )
            return master_pb2.Task(
                kind=kind,
                id=task.id,
                shard=task.shard,
                start=task.start,
                end=task.end,
                epoch=task.epoch,
            )

    def report_task(self, request: master_pb2.ReportTaskRequest) -> None:
        with self.lock:
            if not request.ok:
                task = self.tasks.report_failure(request.task_id, request.error, request.worker)
                if task is not None:
                    log.warning(
                        "%s failed on %s (failure %d): %s",
                        request.worker,
                        task.describe(),
                        task.failures,
                        request.error,
                    )
                self.persist()
                return
            evaluation = None
            if request.metric_states or request.example_count:
                evaluation = EvaluationResult(
                    request.loss_sum,
                    request.example_count,
                    [from_proto(t).astype("float64") for t in request.metric_states],
                )
            task = self.tasks.report_success(
                request.task_id, model_version=request.model_version, evaluation=evaluation
            )
            if task is not None and task.kind is TaskKind.TRAIN:
                self._note_trained(task.records)
            self._collect_evaluations()
            self.persist()

    def heartbeat(self, name: str, model_version: int) -> bool:
        with self.lock:
            self.tasks.renew_leases(name)
            self.tasks.observe_model_version(model_version)
            return self._over()

    # -- bookkeeping --

    def _note_trained(self, records: int) -> None:
        now = time.time()
        if self._train_window is None:
            self._train_window = [now, now, 0]  # the first task warms up: not counted
        else:
            self._train_window[1] = now
            self._train_window[2] += records

    def examples_per_second(self) -> float | None:
        window = self._train_window
        if window is None or window[1] <= window[0]:
            return None
        return window[2] / (window[1] - window[0])

    def _collect_evaluations(self) -> None:
        while self.tasks.completed_rounds:
            round_ = self.tasks.completed_rounds.pop(0)
            values = metric_values(self._metrics, round_)
            entry = {
                "model_version": round_.model_version,
                "trigger": round_.trigger,
                "epoch": round_.epoch,
                "metrics": values,
            }
            self._history.append(entry)
            shown = ", ".join(f"{k}={v:.4f}" for k, v in values.items() if isinstance(v, float))
            log.info(
                "evaluation at model v%d (%s, epoch %d): %s",
                round_.model_version,
                round_.trigger,
                round_.epoch,
                shown or "no metrics",
            )

    # -- the run --

    def run(self) -> int:
        """Runs the job to its end; returns the exit status (raises JobFailedError on failure)."""
        import keras

        storage.makedirs(self.output)
        saved = self.store.load()
        if saved is not None and saved["phase"] == "succeeded":
            log.info("the job in %s has already finished; nothing to do", self.output)
            return 0
        if saved is not None and saved["phase"] == "failed":
            raise InputError(
                f"{self.output} holds a job that failed ({saved['error']}); "
                "use a new --output to run it again"
            )
        keras.utils.set_random_seed(self.config.seed)
        self._metrics = self.definition.build_metrics()
        work_dir = storage.local_path(storage.join(self.output, "backend"))
        self.backend = create_backend(self.config.backend, BackendParams(self.output, work_dir))
        self.instances = InstanceManager(
            self.backend,
            MembershipSettings(
                workers=self.config.workers,
                min_workers=self.config.min_workers,
                max_workers=self.config.worker_limit,
                num_ps=self.config.ps,
                max_restarts=self.config.max_restarts,
                grow_after_s=self.config.grow_after_s,
            ),
            self._launch_spec,
        )
        if saved is None:
            storage.write_text_atomic(
                storage.join(self.output, MODEL_DEF_COPY), self.definition.source
            )
        else:
            self._restore(saved)
        server = self._start_server()
        previous = {signal.SIGTERM: None, signal.SIGINT: None}
        for sig in previous:
            previous[sig] = signal.signal(sig, self._on_signal)
        try:
            with self.lock:
                if saved is None:
                    log.info(
                        "starting %d PS and %d workers (master on port %d, backend %s)",
                        self.config.ps,
                        self.config.workers,
                        self._port,
                        self.config.backend,
                    )
                else:
                    self._adopt()
                self.phase = "running"
                self.instances.reconcile()
                self.persist()
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            server.stop(grace=1)
            self.backend.close()

    def _start_server(self) -> grpc.Server:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(self), server)
        # Listen only where instances reach the master: loopback for local processes.
        host = self.backend.master_host()
        try:
            port = server.add_insecure_port(f"{host}:{self._port}")
        except RuntimeError as e:
            raise InputError(f"cannot listen on port {self._port}: {e}") from e
        server.start()
        self._port = port
        return server

    def _adopt(self) -> None:
        live = self.backend.list_instances()
        lost = self.instances.adopt(live)
        names = sorted(i.name for i in self.instances.instances.values() if not i.state.ended)
        log.info(
            "resuming the job in %s (master restart %d): epoch %d, model v%d; adopted %s",
            self.output,
            self._master_restarts,
            self.tasks.current_epoch,
            self.tasks.model_version,
            ", ".join(names) or "no instances",
        )
        for instance in lost:
            self._on_ended(instance)

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signum

    def _on_ended(self, instance) -> None:
        if instance.role is Role.WORKER:
            lost = self.tasks.recover_tasks(instance.name)
            if lost:
                log.info("re-queued %s of %s", ", ".join(t.describe() for t in lost), instance.name)
        elif self._ps_addresses[instance.slot]:
            self._ps_addresses[instance.slot] = ""

    def _loop(self) -> int:
        next_status = next_progress = 0.0
        while True:
            events = self.backend.next_events(TICK_S)
            with self.lock:
                for event in events:
                    ended = self.instances.handle(event)
                    if ended is not None:
                        self._on_ended(ended)
                for task, worker in self.tasks.expire_leases():
                    log.warning("lease of %s on %s ran out; re-queued", task.describe(), worker)
                self.instances.reconcile()
                self.error = self.error or self.tasks.failure or self.instances.failure
                finished = self.tasks.finished
                if events:
                    self.persist()
            if self._stop_signal is not None:
                return self._interrupt()
            if self.error:
                self._fail()
            if finished and self._save_final_model():
                return self._finish()
            now = time.monotonic()
            if now >= next_status:
                self._write_status()
                next_status = now + STATUS_EVERY_S
            if now >= next_progress:
                with self.lock:
                    line = reports.progress_line(
                        self.tasks, self.instances, self.examples_per_second()
                    )
                log.info("%s", line)
                next_progress = now + PROGRESS_EVERY_S

    def _write_status(self) -> None:
        with self.lock:
            document = reports.status(self.phase, self.tasks, self.instances, self.error)
        reports.write_json(self.output, reports.STATUS_FILE, document)

    def _wait_until_gone(self, wait_s: float) -> None:
        """Applies backend events until no worker or PS is live, or ``wait_s`` has passed."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self.lock:
                if not self.instances.live(Role.WORKER) and not self.instances.live(Role.PS):
                    return
            for event in self.backend.next_events(TICK_S):
                with self.lock:
                    self.instances.handle(event)

    def _stop_all(self, wait_s: float) -> None:
        """Deletes every instance and waits up to ``wait_s`` for them to be gone."""
        with self.lock:
            self.instances.delete_all(STOP_GRACE_S)
        self._wait_until_gone(wait_s)

    def _interrupt(self) -> int:
        name = signal.Signals(self._stop_signal).name
        log.warning(
            "%s received: stopping all workers and PS; run the same command to resume", name
        )
        with self.lock:
            self.phase = "interrupted"
            self.persist()
        self._stop_all(wait_s=STOP_GRACE_S + 4)
        with self.lock:
            self.persist()
        self._write_status()
        return 128 + self._stop_signal

    def _fail(self) -> None:
        log.error("the job failed: %s", self.error)
        with self.lock:
            self.phase = "failed"
            self.persist()
        self._stop_all(wait_s=STOP_GRACE_S + 4)
        self._write_status()
        self._write_summary()
        raise JobFailedError(self.error)

    def _save_final_model(self) -> bool:
        """Saves the model from the PS; False while a PS is away (the loop relaunches it).

        A relaunched PS restores its shard from its checkpoint; past --master-timeout without
        one the job fails, rather than saving a model with a shard missing.
        """
        from elastic_step.master.final_model import save_final_model
        from elastic_step.rpc.ps_client import PSUnavailableError

        with self.lock:
            addresses = list(self._ps_addresses)
        now = time.monotonic()
        if self._save_deadline is None:
            log.info("all %d epochs trained and evaluated; saving the model", self.config.epochs)
            self._save_deadline = now + self.config.master_timeout_s
        try:
            if not all(addresses):
                raise PSUnavailableError(addresses.index(""), "is being relaunched")
            save_final_model(self.definition, addresses, self.output, self.config.seed)
            return True
        except PSUnavailableError as e:
            if now > self._save_deadline:
                with self.lock:
                    self.error = (
                        f"cannot save the model: {e} for {self.config.master_timeout_s:.0f} s "
                        "(a relaunched PS restores from its checkpoint; see --checkpoint-steps)"
                    )
            elif now >= self._next_save_log:
                log.warning("cannot save the model yet (%s); waiting for the PS", e)
                self._next_save_log = now + PROGRESS_EVERY_S
            return False

    def _finish(self) -> int:
        with self.lock:
            self.phase = "succeeded"
            self.persist()
        self._write_summary()
        # Workers and PS see the job is over at their next call and exit by themselves.
        self._wait_until_gone(10)
        self._stop_all(wait_s=STOP_GRACE_S + 2)
        self._write_status()
        log.info("done: model.keras, saved_model/ and summary.json are in %s", self.output)
        return 0

    def _write_summary(self) -> None:
        with self.lock:
            final = self._history[-1]["metrics"] if self._history else {}
            rate = self.examples_per_second()
            document = {
                "phase": self.phase,
                "error": self.error,
                "epochs": self.tasks.epoch_accounting(),
                "metrics": final,
                "evaluations": self._history,
                "restarts": {**self.instances.restarts, "master": self._master_restarts},
                "workers_timeline": self.instances.timeline,
                "examples_per_second": round(rate, 2) if rate else None,
                "model_version": self.tasks.model_version,
            }
        reports.write_json(self.output, reports.SUMMARY_FILE, document)
