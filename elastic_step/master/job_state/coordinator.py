"""The coordinator: the job's state and every decision on it, behind one lock.

It owns the task manager, the instance manager and the job record, and journals their
changes. The gRPC servicer calls it for workers and PS (:meth:`register`, :meth:`next_task`,
which applies a report too, and :meth:`heartbeat`); the run loop calls it with backend events and
ticks. It needs neither gRPC nor TensorFlow: an evaluation round's metrics are computed by
the ``evaluate_round`` function it is given.

It also judges each evaluation: ``--early-stopping`` ends training after the epoch under way,
and with ``--keep-best`` a round better than every earlier one holds training until the run
loop has saved that round's model (:meth:`best_model_due`, :meth:`note_best_model`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from elastic_step.backends.api import Backend, InstanceEvent, Role
from elastic_step.master.instances.api import Instance, SpecFactory
from elastic_step.master.instances.instance_manager import InstanceManager
from elastic_step.master.instances.model_copies import ModelCopies
from elastic_step.master.instances.process_state import ProcessState
from elastic_step.master.job_state.api import CallerError, CoordinatorParams, Phase
from elastic_step.master.job_state.job_record import JobRecord
from elastic_step.master.job_state.persistence import Recorder, SavedJob
from elastic_step.master.saving.api import EarlyStopping, MetricGoal
from elastic_step.master.state_store import StateStore, StateStoreError
from elastic_step.master.tasks.api import (
    EvaluationResult,
    EvaluationRound,
    InvalidReportError,
    TaskKind,
)
from elastic_step.master.tasks.model_save import SAVE_TASK_ID, ModelSave
from elastic_step.master.tasks.task_manager import TaskManager
from elastic_step.rpc import master_pb2
from elastic_step.rpc.tensors import from_proto

log = logging.getLogger("elastic_step.master")

_TASK_KINDS = {
    TaskKind.TRAIN: master_pb2.Task.TRAIN,
    TaskKind.EVALUATE: master_pb2.Task.EVALUATE,
    TaskKind.PREDICT: master_pb2.Task.PREDICT,
}


def open_coordinator(
    params: CoordinatorParams,
    *,
    store: StateStore,
    saved: SavedJob,
    record: JobRecord | None,
    token: int,
    backend: Backend,
    spec_for: SpecFactory,
    clock: Callable[[], float] | None = None,
) -> Coordinator:
    """A new job's coordinator (``record`` None) or a saved one's, replayed from ``saved``
    (whose job record the caller has restored and checked).

    ``token`` is the store's fencing token: lease ids start above every earlier master's,
    and the job settings carry it to the PS's checkpoints.
    A snapshot is taken at once: a restart always finds one, and the replayed journal is
    compacted. ``clock`` replaces both the monotonic and the wall clock, for tests.
    A saved state whose records do not read (a field missing or mistyped) raises ValueError
    saying so, not the KeyError deep in a replay.
    """
    with _damage_named(saved):
        recorder = Recorder(store)
        lease_base = token << 32
        settings = master_pb2.JobSettings()
        settings.CopyFrom(params.job_settings)
        settings.fencing_token = token
        task_clock = {"clock": clock} if clock else {}
        if record is None:
            record = JobRecord(
                params.fixed_settings, params.membership.num_ps, local_steps=settings.local_steps
            )
            tasks = TaskManager(
                params.tasks, journal=recorder.writer("tasks"), lease_base=lease_base, **task_clock
            )
        else:
            _keep_local_steps(record, settings)
            tasks = TaskManager.restore(
                params.tasks,
                saved.part("tasks"),
                saved.records["tasks"],
                lease_base=lease_base,
                journal=recorder.writer("tasks"),
                **task_clock,
            )
        instances = InstanceManager(
            backend, params.membership, spec_for, journal=recorder.writer("instances"), **task_clock
        )
        if saved.snapshot is not None:  # then ``record`` was restored from it too
            instances.restore(saved.part("instances"))
            for entry in saved.records["instances"]:
                instances.apply(entry)
        record.attach(recorder.writer("job"))
        coordinator = Coordinator(
            record=record,
            tasks=tasks,
            instances=instances,
            recorder=recorder,
            settings=settings,
            evaluate_round=params.evaluate_round,
            early_stopping=params.early_stopping,
            keep_best=params.keep_best,
            train_loss_window=params.train_loss_window,
            **task_clock,
        )
        # A decision journaled, or due, before a restart holds again.
        coordinator._judge_evaluations()
        coordinator.snapshot()
        return coordinator


@contextlib.contextmanager
def _damage_named(saved: SavedJob) -> Iterator[None]:
    """A KeyError, TypeError or AttributeError raised while ``saved`` is replayed becomes a
    ValueError that says the state is damaged; one raised with nothing to replay stays."""
    try:
        yield
    except (KeyError, TypeError, AttributeError) as e:
        if saved.snapshot is None and not any(saved.records.values()):
            raise  # nothing was replayed: not the state's fault
        raise ValueError(
            f"its saved state is damaged: a record lacks or mistypes a field "
            f"({type(e).__name__}: {e}); move the state aside to start the job anew"
        ) from None


def _keep_local_steps(record: JobRecord, settings: master_pb2.JobSettings) -> None:
    """A resumed job's workers run the local steps it started with, which the master chose
    then from its workers (see master/tasks/local_steps.py): the PS's optimizer depends on them."""
    if record.local_steps and record.local_steps != settings.local_steps:
        log.info(
            "local steps: %d, as when the job started (not %d, chosen for this start)",
            record.local_steps,
            settings.local_steps,
        )
        settings.local_steps = record.local_steps


class Coordinator:
    def __init__(
        self,
        *,
        record: JobRecord,
        tasks: TaskManager,
        instances: InstanceManager,
        recorder: Recorder,
        settings: master_pb2.JobSettings,
        evaluate_round: Callable[[EvaluationRound], dict],
        early_stopping: EarlyStopping | None = None,
        keep_best: MetricGoal | None = None,
        train_loss_window: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if train_loss_window < 1:
            raise ValueError(f"train_loss_window is {train_loss_window}; it must be at least 1")
        self.lock = threading.RLock()
        self.record = record
        self.tasks = tasks
        self.instances = instances
        self.recorder = recorder
        self._settings = settings
        self._evaluate_round = evaluate_round
        self.early_stopping = early_stopping
        self.keep_best = keep_best
        self.train_loss_window = train_loss_window
        self._registered: set[str] = set()
        self._train_window: list[float] | None = None  # [first done, last done, records since]
        #: The first state-store error a gRPC handler met; the run loop stops on it.
        self.store_failure: StateStoreError | None = None
        self._clock = clock
        self.copies = ModelCopies(clock)
        #: Instances that exited with status 2 (they refused their input) since the run loop
        #: last looked (:meth:`take_refusals`).
        self._refusals = 0
        #: The model save, once the run loop asked for it (:meth:`save_model`).
        self.model_save: ModelSave | None = None

    @property
    def phase(self) -> Phase:
        return self.record.phase

    # -- calls from workers and PS (gRPC threads) --

    def register(
        self, caller: str, request: master_pb2.RegisterRequest
    ) -> master_pb2.RegisterResponse:
        """Admits an instance the master launched, in the role and slot it was launched for."""
        with self.lock:
            instance = self._instance_of(caller, request.name)
            role = Role.PS if request.role == master_pb2.PS else Role.WORKER
            launched_as = Role.WORKER if instance.role is Role.STANDBY else instance.role
            if role is not launched_as or (role is Role.PS and request.shard != instance.slot):
                what = f"PS shard {request.shard}" if role is Role.PS else "a worker"
                raise CallerError(
                    f"{request.name} registered as {what}, but was launched as "
                    f"{instance.role.value} slot {instance.slot}"
                )
            if role is Role.PS:
                self._check_ps_address(instance.name, request.shard, request.address)
            self.instances.note_pid(instance.name, request.pid)
            if role is Role.PS:
                self.record.set_ps_address(request.shard, request.address, instance.name)
                log.info(
                    "%s serves PS shard %d at %s", request.name, request.shard, request.address
                )
            elif request.name not in self._registered:
                log.info("%s registered (pid %d)", request.name, request.pid)
            self._registered.add(request.name)
            standby = instance.role is Role.STANDBY
            if standby and request.waiting_for_slot:
                self.instances.note_standby_ready(instance.name)
            return master_pb2.RegisterResponse(
                settings=self._settings, model_version=self.tasks.model_version, standby=standby
            )

    def _check_ps_address(self, name: str, shard: int, address: str) -> None:
        """A PS gives its address once: registering again (an answer lost on the way) must
        give the same. Otherwise the holder of a PS's credentials could point the workers'
        pushes, and the master's pull of the final model, at a server of its own."""
        given = self.record.ps_addresses[shard]
        if self.record.ps_servers[shard] == name and given and address != given:
            raise CallerError(
                f"{name} serves PS shard {shard} at {given}; it cannot move to {address} "
                "(a live PS's address does not change)"
            )

    def ps_addresses(self) -> list[str]:
        with self.lock:
            return list(self.record.ps_addresses)

    def next_task(self, caller: str, request: master_pb2.NextTaskRequest) -> master_pb2.Task:
        """Applies the report the request carries (see :meth:`report_task`), then hands the
        worker its next task, or says WAIT or FINISHED.

        A worker holds at most the task it trains while it asks for the next; any other
        lease of its was never received, and goes back to the queue.
        """
        worker = request.worker
        with self.lock:
            instance = self._instance_of(caller, worker, ended_ok=True)
            if len(request.held_leases) > 1:
                raise InvalidReportError(
                    f"{worker} says it holds {len(request.held_leases)} tasks; a worker "
                    "trains one while it asks for the next"
                )
            if request.HasField("report"):
                if request.report.task_id != SAVE_TASK_ID:
                    self.report_task(worker, request.report)
                elif self.model_save is not None:
                    self.model_save.report(worker, request.report)
                else:  # a save handed out by an earlier master
                    self._log_stale(worker, request.report)
            retiring = self.instances.is_retiring(worker)
            if self.phase.dismisses_instances or instance.state.ended or retiring:
                if retiring and worker not in self.instances.dismissed:
                    log.info("%s: its slot was given back; it finishes here", worker)
                self.instances.dismiss(worker)
                return master_pb2.Task(kind=master_pb2.Task.FINISHED)
            if self.phase.over or instance.role is Role.STANDBY:
                return master_pb2.Task(kind=master_pb2.Task.WAIT)
            self.tasks.recover_tasks(worker, keep=request.held_leases)
            task = None if request.report_only else self.tasks.get_task(worker)
            if task is None:
                save = self.model_save
                given = save and save.next_for(worker, request, self.tasks.new_lease_id)
                return given or master_pb2.Task(kind=master_pb2.Task.WAIT)
            return master_pb2.Task(
                kind=_TASK_KINDS[task.kind],
                id=task.id,
                shard=task.shard,
                start=task.start,
                end=task.end,
                epoch=task.epoch,
                lease_id=task.lease_id,
                first_index=task.first_index,
                permuted=task.permuted,
            )

    def report_task(self, worker: str, report: master_pb2.TaskReport) -> None:
        """Applies a task's outcome. Raises InvalidReportError for a malformed one (its task
        is re-queued); a report for a task the worker no longer holds is ignored."""
        with self.lock:
            try:
                evaluation = self._evaluation_of(report)
            except (TypeError, ValueError) as e:
                raise self.tasks.reject_report(
                    report.task_id,
                    worker=worker,
                    lease_id=report.lease_id,
                    problem=f"task {report.task_id}: unreadable metric states ({e})",
                ) from e
            if not report.ok:
                task = self.tasks.report_failure(
                    report.task_id, worker=worker, lease_id=report.lease_id, error=report.error
                )
                if task is None:
                    self._log_stale(worker, report)
                else:
                    log.warning(
                        "%s failed on %s (failure %d): %s",
                        worker,
                        task.describe(),
                        len(task.failures),
                        report.error,
                    )
                return
            task = self.tasks.report_success(
                report.task_id,
                worker=worker,
                lease_id=report.lease_id,
                model_version=report.model_version,
                evaluation=evaluation,
            )
            if task is None:
                self._log_stale(worker, report)
                return
            trained = 0 if task.kind is TaskKind.EVALUATE else task.records
            self.instances.note_task_done(worker, trained)
            if trained:
                self._note_trained(trained)
            if task.kind is TaskKind.TRAIN and report.train_examples > 0:  # measured
                self.note_train_loss(
                    report.model_version,
                    report.train_loss,
                    dict(report.train_metrics),
                    examples=task.records,
                )
            self._collect_evaluations()

    def note_train_loss(
        self, model_version: int, loss: float, metrics: dict[str, float], *, examples: int
    ) -> None:
        """Adds one training task's mean loss and metrics, measured on ``examples`` records
        and reported at ``model_version``, to its window of ``train_loss_window`` versions.
        A NaN or infinite loss is recorded as it is: it is what training measured."""
        if examples < 1:
            raise ValueError(f"examples is {examples}; a training report covers at least 1")
        with self.lock:
            self.record.add_train_loss(
                model_version // self.train_loss_window,
                int(model_version),
                int(examples),
                float(loss) * examples,
                {name: float(value) * examples for name, value in metrics.items()},
            )

    def heartbeat(self, caller: str, request: master_pb2.HeartbeatRequest) -> bool:
        """Notes liveness and progress; True when the instance should exit."""
        with self.lock:
            instance = self._instance_of(caller, request.name, ended_ok=True)
            if instance.role is Role.WORKER:
                if request.lease_id:
                    self.tasks.note_progress(request.name, request.lease_id, request.batches_done)
                    if self.model_save is not None:
                        self.model_save.note_progress(
                            request.name, request.lease_id, request.batches_done
                        )
                self.tasks.observe_model_version(request.model_version)
                if not instance.state.ended:
                    self.copies.note_worker(request.name, request.model_version)
            elif instance.role is Role.PS:
                self._note_ps_version(instance, request.model_version)
            if request.failure and not self.record.error:
                log.error("%s cannot go on: %s", request.name, request.failure)
                self.record.set_phase(self.phase, f"{request.name}: {request.failure}")
            finished = self.phase.dismisses_instances or instance.state.ended
            if finished:
                self.instances.dismiss(request.name)
            return finished

    # -- calls from the run loop --

    def apply_events(self, events: list[InstanceEvent]) -> None:
        with self.lock:
            for event in events:
                ended = self.instances.handle(event)
                if ended is not None:
                    self._on_ended(ended)

    def tick(self) -> None:
        """Expires leases, relaunches what is missing, notes failures, snapshots when due."""
        with self.lock:
            for task, worker in self.tasks.expire_leases():
                log.warning(
                    "%s on %s made no progress for --task-timeout=%.0f s; re-queued",
                    task.describe(),
                    worker,
                    self.tasks.settings.task_timeout_s,
                )
            if self.model_save is not None:
                self.model_save.expire()
            self.instances.reconcile()
            save_failure = self.model_save.failure if self.model_save else None
            error = self.tasks.failure or save_failure or self.instances.failure
            error = error or self._unrecoverable_ps()
            if error and not self.record.error and not self.phase.over:
                self.record.set_phase(self.phase, error)
            if self.recorder.due():
                self.snapshot()

    def snapshot(self) -> None:
        with self.lock:
            self.recorder.snapshot(
                {
                    "job": self.record.snapshot(),
                    "tasks": self.tasks.snapshot(),
                    "instances": self.instances.snapshot(),
                }
            )

    def set_phase(self, phase: Phase, error: str | None = None) -> None:
        with self.lock:
            self.record.set_phase(phase, error if error is not None else self.record.error)

    def adopt(self, live: list) -> None:
        """After a master restart: keeps the live instances, re-queues the others' tasks."""
        with self.lock:
            lost = self.instances.adopt(live)
            for instance in lost:
                self._on_ended(instance)
            # Tasks of workers not adopted go back at once, not when their leases run out.
            for instance in list(self.instances.instances.values()):
                if instance.role is not Role.WORKER or not instance.state.ended:
                    continue
                requeued = self.tasks.recover_tasks(instance.name)
                if requeued:
                    log.info(
                        "re-queued %s of %s, which was not adopted",
                        ", ".join(t.describe() for t in requeued),
                        instance.name,
                    )

    # -- the model save --

    def save_model(self, weights: str) -> bool:
        """Asks for the model save, the job's last task (:mod:`..tasks.model_save`): a worker
        writes the model of the PS, or of the ``weights`` file when not empty. True once a
        worker reported it saved."""
        with self.lock:
            if self.model_save is None:
                self.model_save = ModelSave(weights, self.tasks.settings, self._clock)
            return self.model_save.done

    # -- the best model (--keep-best) --

    def best_model_due(self) -> dict | None:
        """The evaluation entry of a round whose model must be saved now, training held."""
        with self.lock:
            return self.record.best_pending

    def note_best_model(self, entry: dict, weights: str | None, problem: str | None = None) -> None:
        """The run loop saved the model of ``entry``'s round to ``weights``; or could not, for
        ``problem``. Either way training goes on."""
        with self.lock:
            if problem is None:
                self.record.set_best_model({**entry, "weights": weights})
                log.info(
                    "kept the model of evaluation round %d (model v%d) as the best so far",
                    entry["round"],
                    entry["model_version"],
                )
            else:
                self.record.skip_best({"round": entry["round"], "why": problem})
                log.warning(
                    "cannot keep the model of evaluation round %d: %s", entry["round"], problem
                )
            self.tasks.hold_training = False

    # -- reports --

    def eta_s(self) -> float | None:
        """Seconds until the training records of the epochs to run are trained, at the
        steady-state rate; None before the rate is known. Evaluation time is not in it."""
        rate = self.examples_per_second()
        if not rate:
            return None
        tasks = self.tasks
        remaining = sum(
            tasks.records_per_epoch - tasks.records_trained(e)
            for e in range(1, tasks.last_epoch + 1)
        )
        return remaining / rate

    def examples_per_second(self) -> float | None:
        window = self._train_window
        if window is None or window[1] <= window[0]:
            return None
        return window[2] / (window[1] - window[0])

    # -- internals --

    def _evaluation_of(self, request: master_pb2.TaskReport) -> EvaluationResult | None:
        """The evaluation result of a report on an evaluation task (or one a training task
        should not carry); the task manager judges whether it is well formed."""
        task = self.tasks.task(request.task_id)
        is_evaluation = task is not None and task.kind is TaskKind.EVALUATE
        if not (is_evaluation or request.metric_states):
            return None
        states = [from_proto(t).astype("float64") for t in request.metric_states]
        return EvaluationResult(request.loss_sum, request.example_count, states)

    def _instance_of(self, caller: str, name: str, ended_ok: bool = False) -> Instance:
        if caller != name:
            raise CallerError(f"{caller} called on behalf of {name}")
        instance = self.instances.instances.get(name)
        if instance is None or (instance.state.ended and not ended_ok):
            raise CallerError(f"{name} is not a live instance of this job")
        return instance

    def _log_stale(self, worker: str, report: master_pb2.TaskReport) -> None:
        log.info(
            "ignored %s's report on task %d (lease %d): it no longer holds that task",
            worker,
            report.task_id,
            report.lease_id,
        )

    def _unrecoverable_ps(self) -> str | None:
        lost = {int(slot): version for slot, version in self.record.ps_lost_at.items()}
        return self.copies.unrecoverable(lost) if lost else None

    def take_refusals(self) -> int:
        """How many workers or PS exited with status 2 (bad input) since the last call."""
        with self.lock:
            refusals, self._refusals = self._refusals, 0
            return refusals

    def _on_ended(self, instance: Instance) -> None:
        if instance.state is ProcessState.FAILED and instance.exit_code == 2:
            self._refusals += 1
        if instance.role is Role.WORKER:
            self.copies.worker_ended(instance.name)
            death = instance.describe_end() if instance.state is ProcessState.FAILED else None
            lost = self.tasks.recover_tasks(instance.name, death)
            if self.model_save is not None:
                self.model_save.take_back(instance.name, death=death)
            if lost:
                log.info(
                    "re-queued %s of %s%s",
                    ", ".join(t.describe() for t in lost),
                    instance.name,
                    " (each counts as a failure: it died by itself)" if death else "",
                )
            return
        if instance.role is Role.STANDBY:
            return
        self.record.set_ps_address(instance.slot, "")
        self.copies.ps_ended(instance.slot)
        if not self.phase.dismisses_instances:
            self.record.note_ps_lost(instance.slot, self.tasks.model_version)

    def _note_ps_version(self, instance: Instance, version: int) -> None:
        self.tasks.observe_model_version(version)
        if not instance.state.ended:
            self.copies.note_ps(instance.slot, version)
        lost_at = self.record.ps_lost_at.get(str(instance.slot))
        if lost_at is None or version <= 0:
            return
        entry = {
            "ps": instance.name,
            "shard": instance.slot,
            "model_version_when_lost": lost_at,
            "restored_version": version,
            "versions_lost": max(lost_at - version, 0),
        }
        self.record.add_ps_restore(entry)
        log.info(
            "%s came back at model v%d; %d model versions lost",
            instance.name,
            version,
            entry["versions_lost"],
        )

    def _note_trained(self, records: int) -> None:
        now = self._clock()
        if self._train_window is None:
            self._train_window = [now, now, 0]  # the first task warms up: not counted
        else:
            self._train_window[1] = now
            self._train_window[2] += records

    def _collect_evaluations(self) -> None:
        # Recorded before they are taken from the task manager: after a crash in between, a
        # round is recorded twice (the job record keeps one), never lost.
        for round_ in list(self.tasks.completed_rounds):
            try:
                values = self._evaluate_round(round_)
            except Exception as e:  # the user's metric code: a round must not stop the job
                log.exception("cannot compute the metrics of evaluation round %d", round_.id)
                values = {"error": f"{type(e).__name__}: {e}"}
            entry = {
                "round": round_.id,
                "epoch": round_.epoch,
                "trigger": round_.trigger,
                "model_version": round_.model_version,
                "min_model_version": round_.min_model_version,
                "metrics": values,
            }
            self.record.add_evaluation(entry)
            shown = ", ".join(f"{k}={v:.4f}" for k, v in values.items() if isinstance(v, float))
            log.info(
                "evaluation at model v%d (%s, epoch %d): %s",
                round_.model_version,
                round_.trigger,
                round_.epoch,
                shown or "no metrics",
            )
            self._judge_evaluations(entry)
        self.tasks.take_completed_rounds()

    def _judge_evaluations(self, entry: dict | None = None) -> None:
        """Applies --early-stopping to the rounds so far, and with --keep-best holds training
        when ``entry``'s round beats the kept (or pending) best."""
        stopping = self.early_stopping
        if stopping is not None and self.record.early_stop is None:
            decision = stopping.decide(self.record.evaluations)
            if decision is not None:
                last = self.tasks.stop_early()
                self.record.set_early_stop(
                    {**decision, "last_epoch": last, "epochs": self.tasks.settings.epochs}
                )
                log.info("%s: training ends after epoch %d", decision["reason"], last)
        goal = self.keep_best
        if goal is not None and entry is not None:
            value = goal.value_of(entry)
            rival = self.record.best_pending or self.record.best_model
            if value is not None and (rival is None or goal.better(value, goal.value_of(rival))):
                self.record.set_best_pending(entry)
        self.tasks.hold_training = self.record.best_pending is not None
