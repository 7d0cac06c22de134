"""The life of one training job in the ``elastic-step train`` process.

It takes the job's lease in the state store, creates the job or resumes it (checking that
the settings are the same), starts the gRPC server, and runs the loop that feeds backend
events and ticks to the :class:`Coordinator`. At the end it saves the model and the summary.
SIGTERM or SIGINT, or a stop of the run that the backend reads from the platform, stops
every instance and exits non-zero, keeping the state: the same command resumes. When the
platform moves the master instead (an eviction, a retried step), the instances stay for the
next master to adopt.
While it runs it writes status.json, TensorBoard events and, with ``--metrics-port``, serves
Prometheus metrics; with ``--keep-best`` it saves the model of each better evaluation round.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import signal
import socket
import sys
import time
from concurrent import futures

import grpc

from elastic_step.backends import BackendParams, Role, create_backend
from elastic_step.backends.api import Backend, LaunchSpec, StopKind, StopRequest
from elastic_step.data import storage
from elastic_step.data.schema import Schema
from elastic_step.errors import InputError, JobFailedError
from elastic_step.master import reports
from elastic_step.master.config import TrainConfig
from elastic_step.master.coordinator import Coordinator, CoordinatorParams, open_coordinator
from elastic_step.master.evaluation import metric_values
from elastic_step.master.instance_manager import MembershipSettings
from elastic_step.master.job_record import JobRecord, check_same_command, command_of
from elastic_step.master.job_view import JobView
from elastic_step.master.metrics_endpoint import MetricsEndpoint
from elastic_step.master.persistence import SavedJob
from elastic_step.master.phase import Phase
from elastic_step.master.servicer import MasterServicer
from elastic_step.master.state_store import (
    StateStore,
    StateStoreError,
    StateStoreFencedError,
    StateStoreLockedError,
    create_state_store,
)
from elastic_step.master.task_manager import TaskSettings
from elastic_step.model_def import ModelDefinition
from elastic_step.output_layout import OutputLayout
from elastic_step.rpc import auth, master_pb2, master_pb2_grpc

log = logging.getLogger("elastic_step.master")

TICK_S = 0.2
STATUS_EVERY_S = 1.0
PROGRESS_EVERY_S = 5.0
STOP_GRACE_S = 3.0
FLUSH_TIMEOUT_S = 30.0
#: Training-loss windows per epoch (each spans a fixed number of model versions).
TRAIN_LOSS_WINDOWS_PER_EPOCH = 10


def launch_spec(role: Role, slot: int, name: str, master_address: str, secret: str) -> LaunchSpec:
    """What the backend is asked to start for instance ``name`` of ``role`` in ``slot``."""
    if role is Role.PS:
        args = ["ps", "--master", master_address, "--shard", str(slot), "--name", name]
        # A PS checks every caller's token, so it holds the secret.
        credentials = {auth.SECRET_ENV: secret}
    else:
        args = ["worker", "--master", master_address, "--name", name]
        credentials = {auth.TOKEN_ENV: auth.token_for(secret, name)}
    return LaunchSpec(
        name,
        role,
        slot,
        [sys.executable, "-m", "elastic_step", *args],
        secret_env=credentials,
    )


def planned_specs(config: TrainConfig, master_address: str, secret: str) -> list[LaunchSpec]:
    """The instances a new job starts with: every PS shard, then the first ``--workers``
    workers, under the names the instance manager gives them (for ``--dry-run``)."""
    specs = [launch_spec(Role.PS, s, f"ps-{s}", master_address, secret) for s in range(config.ps)]
    specs += [
        launch_spec(Role.WORKER, s, f"worker-{s}", master_address, secret)
        for s in range(config.workers)
    ]
    return specs


class Job:
    #: What the job leaves in --output, for its last log line.
    RESULTS = "model.keras, saved_model/ and summary.json"

    def __init__(
        self,
        config: TrainConfig,
        schema: Schema,
        definition: ModelDefinition,
        store: StateStore | None = None,
        backend_options: object = None,
    ) -> None:
        self.config = config
        #: The chosen backend's own options (see ``BackendParams.options``).
        self.backend_options = backend_options
        self.schema = schema
        self.definition = definition
        self.output = config.output
        self.paths = OutputLayout(config.output)
        #: None until run(): the default depends on the backend (see _default_store).
        self.store = store
        self._stop_signal: int | None = None
        self._save_deadline: float | None = None
        self._best_deadline: float | None = None
        self._next_save_log = 0.0
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._events = None  # TrainingEvents, once the coordinator exists
        self.backend: Backend | None = None
        self.coordinator: Coordinator | None = None
        self._master_address = ""
        self._secret = ""

    # -- settings --

    def fixed_settings(self) -> dict:
        settings = self.config.fixed_settings()
        settings["the model definition"] = hashlib.sha256(
            self.definition.source.encode()
        ).hexdigest()
        return settings

    def _task_settings(self) -> TaskSettings:
        c = self.config
        return TaskSettings(
            train_shards=self.schema.shard_paths(c.data, "train"),
            validation_shards=self.schema.shard_paths(c.data, "validation"),
            records_per_task=c.records_per_task,
            epochs=c.epochs,
            evaluation_steps=c.evaluation_steps,
            max_task_retries=c.max_task_retries,
            task_timeout_s=c.task_timeout_s,
            seed=c.seed,
            metric_shapes=tuple(
                tuple(v.shape) for metric in self._metrics.values() for v in metric.variables
            ),
            # --keep-best saves the model a round measured: the round must measure one.
            pause_training_while_evaluating=c.keep_best is not None,
        )

    def _train_loss_window(self) -> int:
        """Model versions per training-loss window: about a tenth of an epoch's steps."""
        records = sum(n for _, n in self.schema.shard_paths(self.config.data, "train"))
        steps = math.ceil(records / self.config.batch_size)
        return max(1, math.ceil(steps / TRAIN_LOSS_WINDOWS_PER_EPOCH))

    def _check_metric_names(self) -> None:
        """--early-stopping and --keep-best name a metric the evaluation reports."""
        names = {"loss", *self.definition.build_metrics()}
        if self.config.stopping is not None:
            self.config.stopping.goal.check_known("--early-stopping", names)
        if self.config.best_goal is not None:
            self.config.best_goal.check_known("--keep-best", names)

    def _membership_settings(self) -> MembershipSettings:
        c = self.config
        return MembershipSettings(
            workers=c.workers,
            min_workers=c.min_workers,
            max_workers=c.worker_limit,
            num_ps=c.ps,
            max_restarts=c.max_restarts,
            grow_after_s=c.grow_after_s,
            starve_timeout_s=c.master_timeout_s,
        )

    def job_settings(self) -> master_pb2.JobSettings:
        c = self.config
        return master_pb2.JobSettings(
            model_def=self.paths.model_def,
            data_dir=c.data,
            output_dir=self.output,
            batch_size=c.batch_size,
            num_ps=c.ps,
            seed=c.seed,
            checkpoint_steps=c.checkpoint_steps,
            keep_checkpoints=c.keep_checkpoints,
            staleness_modulation=c.staleness_modulation,
            master_timeout_s=c.master_timeout_s,
            local_steps=c.local_steps,
            outer_optimizer=c.outer_optimizer,
        )

    def _launch_spec(self, role: Role, slot: int, name: str) -> LaunchSpec:
        return launch_spec(role, slot, name, self._master_address, self._secret)

    # -- the run --

    def run(self) -> int:
        """Runs the job to its end; returns the exit status (raises JobFailedError on failure)."""
        self._check_metric_names()  # before anything is written or started
        storage.makedirs(self.output)
        if storage.exists(self.paths.legacy_state_file):
            raise InputError(
                f"{self.output} holds a job of an older elastic-step version, which cannot be "
                "resumed; use a new --output"
            )
        # The backend's records and logs, like the master's state, stay on local disk.
        work_dir = storage.local_path(OutputLayout(self.config.local_dir).backend_dir)
        self.backend = create_backend(
            self.config.backend,
            BackendParams(self.config.resolved_job_name, work_dir, self.backend_options),
        )
        try:
            if self.store is None:
                self.store = self._default_store()
            return self._run_with_lease()
        finally:
            self.backend.close()

    def _default_store(self) -> StateStore:
        """On Kubernetes the state lives on the cluster (a Lease and ConfigMaps owned by the
        run's object), so a master pod on another node finds it; elsewhere in the local
        directory of TrainConfig.local_dir (--output itself when it is local)."""
        if self.config.backend != "kubernetes":
            return create_state_store("file", self.config.local_dir)
        return create_state_store(
            "kubernetes",
            self.output,
            job_name=self.config.resolved_job_name,
            namespace=getattr(self.backend_options, "namespace", None),
            owner_reference=self.backend.owner_reference(),
            kubeconfig=getattr(self.backend_options, "kubeconfig", None),
        )

    def _run_with_lease(self) -> int:
        owner = f"{socket.gethostname()}:{os.getpid()}"
        try:
            token = self.store.acquire(owner, timeout_s=self.store.takeover_wait_s)
        except StateStoreLockedError as e:
            raise InputError(f"another master is running the job in {self.output}: {e}") from e
        # From here to the end a signal is only noted: the loop acts on it, and one that
        # comes while the job closes down cannot cut that short.
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            status = self._run(token)
        except BaseException:
            self._close_store(quietly=True)  # the first error is the one to report
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        # A stopped run may have been deleted, and its state with it.
        stopped = self.coordinator is not None and self.coordinator.phase is Phase.INTERRUPTED
        self._close_store(quietly=stopped)
        return status

    def _close_store(self, quietly: bool) -> None:
        try:
            self.store.close()
        except StateStoreError as e:
            if not quietly:
                raise
            log.warning("closing the state store failed: %s", e)

    def _run(self, token: int) -> int:
        import keras

        self._secret = self.store.job_secret()
        saved = SavedJob.of(self.store.load())
        record = self._check_saved(saved)
        if record is not None and record.phase is Phase.SUCCEEDED:
            log.info("the job in %s has already finished; nothing to do", self.output)
            return 0
        keras.utils.set_random_seed(self.config.seed)
        self._metrics = self.definition.build_metrics()
        self._build(saved, record, token)
        if record is not None:
            # Before serving: a call from an instance that is not adopted yet would be
            # refused, and the refusal would end it.
            self._adopt()
        self._start_events(resumed=record is not None)
        server = self._start_server()
        try:
            return self._supervise(resumed=record is not None)
        finally:
            server.stop(grace=1)
            if self._metrics_endpoint is not None:
                self._metrics_endpoint.close()
            self._events.close()

    def _check_saved(self, saved: SavedJob) -> JobRecord | None:
        """The saved job's record, after checking it may go on; None for a new job."""
        if saved.snapshot is None:
            return None
        record = JobRecord.restore(saved.part("job"), saved.records["job"])
        settings = self.fixed_settings()
        check_same_command(self.output, command_of(record.settings), command_of(settings))
        differ = record.differing_settings(settings)
        if differ:
            state = "finished" if record.phase is Phase.SUCCEEDED else "saved"
            raise InputError(
                f"{self.output} holds a {state} job with other settings ({', '.join(differ)} "
                "differ); use a new --output to start a new job"
            )
        if record.phase is Phase.FAILED:
            raise InputError(
                f"{self.output} holds a job that failed ({record.error}); "
                "use a new --output to run it again"
            )
        return record

    def _build(self, saved: SavedJob, record: JobRecord | None, token: int) -> None:
        try:
            self._open_coordinator(saved, record, token)
        except ValueError as e:  # the saved state does not fit the data as it is now
            raise InputError(f"cannot resume the job in {self.output}: {e}") from e
        if record is None:
            storage.write_text_atomic(self.paths.model_def, self.definition.source)
            # What `predict` encodes a CSV with: the model's inputs are the data's columns.
            storage.write_text_atomic(self.paths.schema, self.schema.to_json())
            self.store.flush(FLUSH_TIMEOUT_S)

    def _open_coordinator(self, saved: SavedJob, record: JobRecord | None, token: int) -> None:
        self.coordinator = open_coordinator(
            CoordinatorParams(
                tasks=self._task_settings(),
                membership=self._membership_settings(),
                job_settings=self.job_settings(),
                fixed_settings=self.fixed_settings(),
                evaluate_round=lambda round_: metric_values(self._metrics, round_),
                early_stopping=self.config.stopping,
                keep_best=self.config.best_goal,
                train_loss_window=self._train_loss_window(),
            ),
            store=self.store,
            saved=saved,
            record=record,
            token=token,
            backend=self.backend,
            spec_for=self._launch_spec,
        )

    def _start_server(self) -> grpc.Server:
        record = self.coordinator.record
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16),
            interceptors=[auth.AuthInterceptor(self._secret)],
        )
        master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(self.coordinator), server)
        # Listen only where instances reach the master: loopback for local processes.
        host = self.backend.listen_host()
        try:
            port = server.add_insecure_port(f"{host}:{record.port or self.config.port}")
        except RuntimeError as e:
            raise InputError(f"cannot listen on port {record.port or self.config.port}: {e}") from e
        server.start()
        with self.coordinator.lock:
            record.set_port(port)
        self._master_address = self.backend.advertise_master(port)
        if self.config.metrics_port is not None:
            self._metrics_endpoint = MetricsEndpoint(self._view, host, self.config.metrics_port)
            log.info("Prometheus metrics at http://%s/metrics", self._metrics_endpoint.address)
        return server

    def _view(self) -> JobView:
        with self.coordinator.lock:
            return JobView.of(self.coordinator)

    def _start_events(self, resumed: bool) -> None:
        from elastic_step.master.tensorboard_events import TrainingEvents

        already = self._view() if resumed else None
        self._events = TrainingEvents(self.output, self.config.local_dir, already=already)

    def _adopt(self) -> None:
        coordinator = self.coordinator
        with coordinator.lock:
            coordinator.record.count_master_restart()
            coordinator.adopt(self.backend.list_instances())
            self._log_resume()

    def _supervise(self, resumed: bool) -> int:
        coordinator = self.coordinator
        try:
            with coordinator.lock:
                if not resumed:
                    log.info(
                        "starting %d PS and %d workers (master on port %d, backend %s)",
                        self._membership_settings().num_ps,
                        self.config.workers,
                        coordinator.record.port,
                        self.config.backend,
                    )
                coordinator.set_phase(Phase.RUNNING)
            return self._loop()
        except StateStoreFencedError as e:
            # Another master owns the job now: it adopts the instances; touch nothing.
            log.error("%s; this master stops and leaves the job to the new one", e)
            return 1
        except StateStoreError as e:
            # Without its state the master cannot go on; a new master resumes from what was
            # saved and adopts the instances, so they are left running.
            log.error(
                "cannot keep the job's state (%s); leaving workers and PS to the next master", e
            )
            return 1

    def _log_resume(self) -> None:
        coordinator = self.coordinator
        names = sorted(
            i.name for i in coordinator.instances.instances.values() if not i.state.ended
        )
        log.info(
            "resuming the job in %s (master restart %d): epoch %d, model v%d; adopted %s",
            self.output,
            coordinator.record.master_restarts,
            coordinator.tasks.current_epoch,
            coordinator.tasks.model_version,
            ", ".join(names) or "no instances",
        )

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signum

    def _loop(self) -> int:
        coordinator = self.coordinator
        next_status = next_progress = 0.0
        while True:
            coordinator.apply_events(self.backend.next_events(TICK_S))
            coordinator.tick()
            if coordinator.store_failure is not None:
                raise coordinator.store_failure
            request = self.backend.stop_request()
            if self._stop_signal is not None or request is not None:
                return self._interrupt(request)
            if coordinator.record.error:
                self._fail()
            best = coordinator.best_model_due()
            if best is not None:
                self._save_best_model(best)  # training waits for it
            elif coordinator.tasks.finished and self._save_final_model():
                return self._finish()
            now = time.monotonic()
            if now >= next_status:
                self._write_status()
                next_status = now + STATUS_EVERY_S
            if now >= next_progress:
                with coordinator.lock:
                    line = reports.progress_line(
                        coordinator.tasks, coordinator.instances, coordinator.examples_per_second()
                    )
                log.info("%s", line)
                self._events.write(self._view())
                next_progress = now + PROGRESS_EVERY_S

    def _write_status(self) -> None:
        coordinator = self.coordinator
        with coordinator.lock:
            document = reports.status(
                coordinator,
                self._master_address,
                self._metrics_endpoint.address if self._metrics_endpoint else None,
            )
        reports.write_json(self.paths.status, document)

    def _wait_until_gone(self, wait_s: float) -> None:
        """Applies backend events until no worker or PS is live, or ``wait_s`` has passed."""
        coordinator = self.coordinator
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with coordinator.lock:
                instances = coordinator.instances
                if not instances.live(Role.WORKER) and not instances.live(Role.PS):
                    return
            coordinator.apply_events(self.backend.next_events(TICK_S))

    def _stop_all(self, wait_s: float) -> None:
        """Deletes every instance and waits up to ``wait_s`` for them to be gone."""
        with self.coordinator.lock:
            self.coordinator.instances.delete_all(STOP_GRACE_S)
        self._wait_until_gone(wait_s)

    def _interrupt(self, request: StopRequest | None) -> int:
        """Stops the run, or hands it over to the next master, as the platform asks; returns
        the exit status (128 + SIGTERM when no signal came)."""
        status = 128 + (self._stop_signal or signal.SIGTERM)
        if self._stop_signal is not None:
            name = signal.Signals(self._stop_signal).name
            request = self.backend.stop_request(signalled=True) or StopRequest(
                StopKind.STOP, f"{name} received"
            )
        if request.kind is StopKind.HANDOVER:
            # The platform moves the master: the next master adopts the instances.
            log.warning("%s: leaving workers and PS running for the next master", request.reason)
            self.store.flush(FLUSH_TIMEOUT_S)
            self._write_status()
            return status
        log.warning(
            "the run is stopped (%s): stopping all workers and PS; the job's state stays, "
            "and the same command resumes it",
            request.reason,
        )
        self.coordinator.set_phase(Phase.INTERRUPTED)
        self._stop_all(wait_s=STOP_GRACE_S + 4)
        self.store.flush(FLUSH_TIMEOUT_S)
        self.backend.remove_job_objects()
        self._write_status()
        return status

    def _fail(self) -> None:
        error = self.coordinator.record.error
        log.error("the job failed: %s", error)
        self.coordinator.set_phase(Phase.FAILED)
        self._stop_all(wait_s=STOP_GRACE_S + 4)
        self.store.flush(FLUSH_TIMEOUT_S)
        self.backend.remove_job_objects()
        self._write_status()
        self._write_summary()
        raise JobFailedError(error)

    def _save_final_model(self) -> bool:
        """Saves the model from the PS; False while a PS is away (the loop relaunches it).

        A relaunched PS restores its shard from its checkpoint; past --master-timeout without
        one the job fails, rather than saving a model with a shard missing.
        """
        from elastic_step.master.final_model import save_final_model
        from elastic_step.rpc.ps_client import PSUnavailableError

        coordinator = self.coordinator
        with coordinator.lock:
            best, last_epoch = coordinator.record.best_model, coordinator.tasks.last_epoch
        if best is not None:
            from elastic_step.master.best_model import load_round_model
            from elastic_step.master.final_model import save_model

            log.info(
                "all %d epochs trained and evaluated; saving the model of round %d (epoch %d, "
                "model v%d), the best by --keep-best %s",
                last_epoch,
                best["round"],
                best["epoch"],
                best["model_version"],
                self.config.keep_best,
            )
            model = load_round_model(self.definition, best["weights"], self.config.seed)
            save_model(model, self.output, self.definition)
            return True
        addresses = coordinator.ps_addresses()
        now = time.monotonic()
        if self._save_deadline is None:
            log.info("all %d epochs trained and evaluated; saving the model", last_epoch)
            self._save_deadline = now + self.config.master_timeout_s
        try:
            if not all(addresses):
                raise PSUnavailableError(addresses.index(""), "is being relaunched")
            credentials = auth.Credentials.for_instance(self._secret, auth.MASTER_NAME)
            save_final_model(self.definition, addresses, credentials, self.output, self.config.seed)
            return True
        except PSUnavailableError as e:
            if now > self._save_deadline:
                with coordinator.lock:
                    coordinator.record.set_phase(
                        coordinator.phase,
                        f"cannot save the model: {e} for {self.config.master_timeout_s:.0f} s "
                        "(a relaunched PS restores from its checkpoint; see --checkpoint-steps)",
                    )
            elif now >= self._next_save_log:
                log.warning("cannot save the model yet (%s); waiting for the PS", e)
                self._next_save_log = now + PROGRESS_EVERY_S
            return False

    def _save_best_model(self, entry: dict) -> None:
        """Saves the model of ``entry``'s round (--keep-best) while training waits; gives up
        on that round after --master-timeout without every PS, or at once when the PS no
        longer hold its version."""
        from elastic_step.master.best_model import RoundModelGoneError, save_round_model
        from elastic_step.rpc.ps_client import PSUnavailableError

        coordinator = self.coordinator
        now = time.monotonic()
        if self._best_deadline is None:
            self._best_deadline = now + self.config.master_timeout_s
        path = self.paths.best_model_weights(entry["round"])
        try:
            addresses = coordinator.ps_addresses()
            if not all(addresses):
                raise PSUnavailableError(addresses.index(""), "is being relaunched")
            credentials = auth.Credentials.for_instance(self._secret, auth.MASTER_NAME)
            save_round_model(self.definition, addresses, credentials, entry, path, self.config.seed)
        except PSUnavailableError as e:
            if now > self._best_deadline:
                self._best_deadline = None
                coordinator.note_best_model(
                    entry, None, f"{e} for {self.config.master_timeout_s:.0f} s"
                )
            elif now >= self._next_save_log:
                log.warning("cannot save the best model yet (%s); waiting for the PS", e)
                self._next_save_log = now + PROGRESS_EVERY_S
            return
        except RoundModelGoneError as e:
            self._best_deadline = None
            coordinator.note_best_model(entry, None, str(e))
            return
        self._best_deadline = None
        with coordinator.lock:
            previous = coordinator.record.best_model
        coordinator.note_best_model(entry, path)
        if previous is not None and previous["weights"] != path:
            # Only once the record names the new file durably.
            self.store.flush(FLUSH_TIMEOUT_S)
            storage.remove(previous["weights"])

    def _finish(self) -> int:
        self.coordinator.set_phase(Phase.SUCCEEDED)
        self.store.flush(FLUSH_TIMEOUT_S)
        self._write_summary()
        # Workers and PS see the job is over at their next call and exit by themselves.
        self._wait_until_gone(10)
        self._stop_all(wait_s=STOP_GRACE_S + 2)
        self.backend.remove_job_objects()
        self._write_status()
        self._events.write(self._view(), final=True)
        log.info("done: %s are in %s", self.RESULTS, self.output)
        return 0

    def _run_facts(self) -> dict:
        """What every job's summary.json says of its run: restarts, live workers over time,
        elapsed time and speed. Called under the coordinator's lock."""
        coordinator = self.coordinator
        record, instances = coordinator.record, coordinator.instances
        rate = coordinator.examples_per_second()
        return {
            "restarts": {**instances.restarts, "master": record.master_restarts},
            "restarts_by_reason": instances.restarts_by_reason,
            "restart_events": instances.restart_events,
            "workers_timeline": instances.timeline,
            "elapsed_s": instances.elapsed_s(),
            "examples_per_second": round(rate, 2) if rate else None,
        }

    def _write_summary(self) -> None:
        coordinator = self.coordinator
        with coordinator.lock:
            record, tasks = coordinator.record, coordinator.tasks
            document = {
                "phase": record.phase.value,
                "error": record.error,
                "epochs": tasks.epoch_accounting(),
                "metrics": record.final_metrics(),
                "evaluations": record.evaluations,
                **self._run_facts(),
                "ps_restores": record.ps_restores,
                "model_version": tasks.model_version,
                "train_loss": record.train_loss_windows(),
                "early_stop": record.early_stop,
                "kept_model": reports.kept_model(record),
            }
        reports.write_json(self.paths.summary, document)
